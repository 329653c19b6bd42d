// Package credentials seals the credentials a node reads a cache's source with to that node's
// agent, so that each agent can open only the credentials of the caches its own node is asked
// for, and no agent reads a Secret. An agent makes a key pair when it starts and publishes the
// public key in its NodeCache's status (which only that node's agent may write); the controller
// seals each cache's credentials to the key with HPKE (RFC 9180), bound to the node and the
// cache, and puts them in the node's request.
package credentials

import (
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// Credentials are what a node may read a source with.
type Credentials struct {
	// HFToken is a Hugging Face token.
	HFToken string `json:"hfToken,omitempty"`
	// AWSAccessKeyID, AWSSecretAccessKey and AWSSessionToken are S3 credentials.
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSSessionToken    string `json:"awsSessionToken,omitempty"`
}

// Empty reports whether c holds nothing.
func (c Credentials) Empty() bool { return c == Credentials{} }

var (
	kem  = hpke.DHKEM(ecdh.X25519())
	kdf  = hpke.HKDFSHA256()
	aead = hpke.ChaCha20Poly1305()
)

// ErrOtherKey says sealed credentials are for another key (the agent restarted since): the
// controller seals them again for the key the agent now publishes.
var ErrOtherKey = errors.New("the credentials are sealed to another key of this node's agent")

// Key is an agent's key pair.
type Key struct {
	priv hpke.PrivateKey
	pub  string
}

// NewKey makes a key pair.
func NewKey() (*Key, error) {
	priv, err := kem.GenerateKey()
	if err != nil {
		return nil, err
	}
	return &Key{priv: priv, pub: base64.StdEncoding.EncodeToString(priv.PublicKey().Bytes())}, nil
}

// Public is the public key, as published in the NodeCache status.
func (k *Key) Public() string { return k.pub }

// Open returns the credentials sealed to k for cache uid on node.
func (k *Key) Open(node, uid string, s *prewarmv1alpha1.SealedCredentials) (Credentials, error) {
	if s.KeyID != KeyID(k.pub) {
		return Credentials{}, ErrOtherKey
	}
	ct, err := base64.StdEncoding.DecodeString(s.Sealed)
	if err != nil {
		return Credentials{}, fmt.Errorf("sealed credentials: %w", err)
	}
	plain, err := hpke.Open(k.priv, kdf, aead, info(node, uid), ct)
	if err != nil {
		return Credentials{}, fmt.Errorf("opening the credentials sealed for this node and cache: %w", err)
	}
	var c Credentials
	if err := json.Unmarshal(plain, &c); err != nil {
		return Credentials{}, fmt.Errorf("sealed credentials: %w", err)
	}
	return c, nil
}

// KeyID identifies a public key: the first 16 bytes of its SHA-256, hex.
func KeyID(public string) string {
	sum := sha256.Sum256([]byte(public))
	return hex.EncodeToString(sum[:16])
}

// Digest identifies credentials of the given version sealed to a key. It is derived from the
// version (where the credentials were read: secrets.SecretVersion), not from the
// credentials: every agent can read every NodeCache, and a digest of the credentials
// themselves would let any of them test guesses of another namespace's keys offline.
func Digest(public, version string) string {
	h := sha256.New()
	h.Write([]byte("prewarm.io/credentials-digest/v2\x00" + public + "\x00" + version))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Seal seals c, of the given version, to the public key of node's agent, for cache uid. A
// request that already holds the same version sealed to the same key is kept as it is (sealing
// is randomized, so sealing again would rewrite the NodeCache for nothing).
func Seal(public, node, uid string, c Credentials, version string, current *prewarmv1alpha1.SealedCredentials) (*prewarmv1alpha1.SealedCredentials, error) {
	id, digest := KeyID(public), Digest(public, version)
	if current != nil && current.KeyID == id && current.Digest == digest {
		return current, nil
	}
	raw, err := base64.StdEncoding.DecodeString(public)
	if err != nil {
		return nil, fmt.Errorf("the agent's key: %w", err)
	}
	pk, err := kem.NewPublicKey(raw)
	if err != nil {
		return nil, fmt.Errorf("the agent's key: %w", err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	ct, err := hpke.Seal(pk, kdf, aead, info(node, uid), b)
	if err != nil {
		return nil, err
	}
	return &prewarmv1alpha1.SealedCredentials{KeyID: id, Digest: digest, Sealed: base64.StdEncoding.EncodeToString(ct)}, nil
}

// info binds sealed credentials to one node and one cache.
func info(node, uid string) []byte {
	return []byte("prewarm.io/credentials\x00" + node + "\x00" + uid)
}
