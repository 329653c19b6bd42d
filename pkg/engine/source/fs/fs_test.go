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

// A link that points out of the tree (or nowhere) is skipped, never a way to read other files;
// the rest of the model is listed.
func TestSymlinkOutOfTheTreeSkipped(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	write(t, outside, []byte("secret"))
	write(t, filepath.Join(root, "config.json"), []byte("{}"))
	if err := os.Symlink(outside, filepath.Join(root, "leak.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../etc/passwd", filepath.Join(root, "up.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nothing-here", filepath.Join(root, "dangling.json")); err != nil {
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
	var paths []string
	for _, f := range l.Files {
		paths = append(paths, f.Path)
	}
	if diff := cmp.Diff([]string{"config.json"}, paths); diff != "" {
		t.Errorf("listed files (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"dangling.json", "leak.json", "up.json"}, src.Skipped()); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	if _, err := src.OpenRange(context.Background(), "leak.json", 0, 6); err == nil {
		t.Fatal("OpenRange read through a link out of the tree")
	}
}

// NewIn confines the model's own directory to its parent: a model directory that is (or passes
// through) a link out of the parent is refused; a link that stays inside is followed.
func TestNewInConfinesTheModelDirectory(t *testing.T) {
	parent := t.TempDir()
	outside := t.TempDir()
	write(t, filepath.Join(outside, "model", "host.bin"), []byte("host file"))
	write(t, filepath.Join(parent, "real", "m", "config.json"), []byte("{}"))
	for link, target := range map[string]string{
		"escape": filepath.Join(outside, "model"), // the model directory itself is a link out
		"via":    outside,                         // a link on the way: via/model
		"inside": "real",                          // stays inside: followed
	} {
		if err := os.Symlink(target, filepath.Join(parent, link)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := os.OpenRoot(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, rel := range []string{"escape", "via/model", "real/../../x"} {
		if src, err := fssrc.NewIn(r, rel, "/fsx/"+rel); err == nil {
			l, _ := src.List(context.Background())
			t.Errorf("NewIn(%s) = a source listing %v; want it refused", rel, l.Files)
		} else if !strings.Contains(err.Error(), "/fsx/"+rel) {
			t.Errorf("NewIn(%s) error %q does not name the source", rel, err)
		}
	}
	src, err := fssrc.NewIn(r, "inside/m", "/fsx/inside/m")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	l, err := src.List(context.Background())
	if err != nil || len(l.Files) != 1 || l.Files[0].Path != "config.json" {
		t.Fatalf("List = %v, %v; want config.json", l.Files, err)
	}
	if _, err := fssrc.NewIn(r, "missing", "/fsx/missing"); !errors.Is(err, source.ErrNotFound) {
		t.Errorf("NewIn(missing) = %v; want not found", err)
	}
}

func TestMissingDirectoryIsNotFound(t *testing.T) {
	_, err := fssrc.New(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, source.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("err = %v; want not found, naming the directory", err)
	}
}

// A tree with more files than MaxFiles fails the listing, naming the directory and the bound;
// one of exactly MaxFiles files is listed.
func TestListStopsAtMaxFiles(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"a", "b", "c/d", "c/e"} {
		write(t, filepath.Join(root, name), []byte(name))
	}
	src, err := fssrc.New(root)
	if err != nil {
		t.Fatal(err)
	}
	src.MaxFiles = 3
	_, err = src.List(context.Background())
	var tooMany *source.TooManyFilesError
	if !errors.As(err, &tooMany) || !errors.Is(err, source.ErrTooManyFiles) || !strings.Contains(err.Error(), root+" holds more than 3 files") {
		t.Fatalf("List: %v; want a TooManyFilesError naming %s and the bound", err, root)
	}
	src.MaxFiles = 4
	if l, err := src.List(context.Background()); err != nil || len(l.Files) != 4 {
		t.Errorf("exactly MaxFiles files: %d listed, %v", len(l.Files), err)
	}
}
