package fs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	fssrc "github.com/prewarm/prewarm/pkg/engine/source/fs"
)

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestListAndFetchADirectory(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "config.json"), []byte("{}"))
	write(t, filepath.Join(root, "shards", "a.safetensors"), bytes.Repeat([]byte("a"), 3<<20))
	// A link inside the tree is followed; it is listed as the file it points to.
	if err := os.Symlink("config.json", filepath.Join(root, "alias.json")); err != nil {
		t.Fatal(err)
	}
	src, err := fssrc.New(root)
	if err != nil {
		t.Fatal(err)
	}
	l, err := src.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range l.Files {
		got = append(got, f.Path)
	}
	if diff := cmp.Diff([]string{"alias.json", "config.json", "shards/a.safetensors"}, got); diff != "" {
		t.Errorf("listing (-want +got):\n%s", diff)
	}
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := engine.New(engine.WithPartSize(1<<20)).Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dest, "shards", "a.safetensors"))
	if err != nil || !bytes.Equal(b, bytes.Repeat([]byte("a"), 3<<20)) {
		t.Errorf("shard differs (%v)", err)
	}
}

// A link that points out of the tree is an error, not a way to read other files.
func TestSymlinkOutOfTheTreeRefused(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	write(t, outside, []byte("secret"))
	write(t, filepath.Join(root, "config.json"), []byte("{}"))
	if err := os.Symlink(outside, filepath.Join(root, "leak.json")); err != nil {
		t.Fatal(err)
	}
	src, err := fssrc.New(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.List(context.Background()); err == nil || !strings.Contains(err.Error(), "leak.json") {
		t.Fatalf("List err = %v; want leak.json refused", err)
	}
	if _, err := src.OpenRange(context.Background(), "leak.json", 0, 6); err == nil {
		t.Fatal("OpenRange read through a link out of the tree")
	}
}

func TestMissingDirectoryIsNotFound(t *testing.T) {
	_, err := fssrc.New(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, source.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v; want not found, naming the directory", err)
	}
}
