package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// The model is copied whole, directories and all; a link leading out of the model volume is not
// followed; an empty volume is an error.
func TestPrefetchCopiesTheModel(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	files := map[string][]byte{"config.json": []byte(`{}`), "weights/model-00001.safetensors": gen.Bytes(1, 3<<20), "weights/model-00002.safetensors": gen.Bytes(2, 1<<20)}
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(from, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(from, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Prefetch(from, to)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 3 || res.Bytes != int64(2+4<<20) {
		t.Errorf("copied %+v", res)
	}
	for p, data := range files {
		got, err := os.ReadFile(filepath.Join(to, p))
		if err != nil || string(got) != string(data) {
			t.Errorf("%s: not copied whole (%v)", p, err)
		}
	}

	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("not the model's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(from, "escape")); err != nil {
		t.Fatal(err)
	}
	if _, err := Prefetch(from, t.TempDir()); err == nil || !strings.Contains(err.Error(), "escape") {
		t.Errorf("a link out of the volume: %v, want it refused by name", err)
	}
	if _, err := Prefetch(t.TempDir(), t.TempDir()); err == nil {
		t.Error("an empty volume copied without error")
	}
}
