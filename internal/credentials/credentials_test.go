package credentials_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/credentials"
)

func TestSealOpen(t *testing.T) {
	a, err := credentials.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := credentials.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	c := credentials.Credentials{AWSAccessKeyID: "AKIA0000", AWSSecretAccessKey: "secret/with+chars", HFToken: "hf_x"}
	s, err := credentials.Seal(a.Public(), "node-a", "uid-1", c, "uid-s/41/token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.Sealed, "secret") || strings.Contains(s.Digest, "secret") {
		t.Fatalf("the sealed form shows the secret: %+v", s)
	}
	got, err := a.Open("node-a", "uid-1", s)
	if err != nil || got != c {
		t.Fatalf("Open = %+v, %v; want %+v", got, err, c)
	}
	// Bound to its node and cache, and to its key.
	if _, err := a.Open("node-b", "uid-1", s); err == nil {
		t.Error("credentials sealed for node-a opened as node-b's")
	}
	if _, err := a.Open("node-a", "uid-2", s); err == nil {
		t.Error("credentials sealed for cache uid-1 opened for uid-2")
	}
	if _, err := b.Open("node-a", "uid-1", s); !errors.Is(err, credentials.ErrOtherKey) {
		t.Errorf("another agent's key: %v; want ErrOtherKey", err)
	}
	forged := *s
	forged.KeyID = credentials.KeyID(b.Public())
	if _, err := b.Open("node-a", "uid-1", &forged); err == nil || errors.Is(err, credentials.ErrOtherKey) {
		t.Errorf("credentials sealed to a, relabelled for b: %v; want a failure to open", err)
	}
	// Sealing again the same credentials to the same key keeps the request as it is; a change
	// of either seals anew.
	again, err := credentials.Seal(a.Public(), "node-a", "uid-1", c, "uid-s/41/token", s)
	if err != nil || again != s {
		t.Errorf("sealing unchanged credentials gave a new request: %v", err)
	}
	c2 := c
	c2.HFToken = "hf_rotated"
	rotated, err := credentials.Seal(a.Public(), "node-a", "uid-1", c2, "uid-s/42/token", s)
	if err != nil || rotated.Digest == s.Digest {
		t.Errorf("a rotated token kept the old seal: %v", err)
	}
	if got, err := a.Open("node-a", "uid-1", rotated); err != nil || got != c2 {
		t.Errorf("the rotated seal opens to %+v, %v; want %+v", got, err, c2)
	}
	// The digest, which every agent can read, says nothing of what is sealed: other credentials
	// of the same version give the same digest (no offline test of guessed keys against it).
	if credentials.Digest(a.Public(), "uid-s/41/token") != s.Digest {
		t.Error("the digest is not the version's")
	}
	if guess, err := credentials.Seal(a.Public(), "node-a", "uid-1", c2, "uid-s/41/token", nil); err != nil || guess.Digest != s.Digest {
		t.Errorf("the digest depends on the credentials sealed: %v", err)
	}
	if other, err := credentials.Seal(b.Public(), "node-a", "uid-1", c, "uid-s/41/token", s); err != nil || other.KeyID == s.KeyID {
		t.Errorf("a new agent key kept the old seal: %v", err)
	}
}
