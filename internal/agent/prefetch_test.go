package agent

import (
	"bytes"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// writeFiles writes files (path: content) under dir.
func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The model is copied whole, directories and all; a link leading out of the model volume is not
// followed; an empty volume is an error.
func TestPrefetchCopiesTheModel(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	files := map[string][]byte{"config.json": []byte(`{}`), "weights/model-00001.safetensors": gen.Bytes(1, 3<<20), "weights/model-00002.safetensors": gen.Bytes(2, 1<<20)}
	writeFiles(t, from, files)
	res, err := Prefetch(PrefetchOptions{From: from, To: to})
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
	if _, err := Prefetch(PrefetchOptions{From: from, To: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "escape") {
		t.Errorf("a link out of the volume: %v, want it refused by name", err)
	}
	if _, err := Prefetch(PrefetchOptions{From: t.TempDir(), To: t.TempDir()}); err == nil {
		t.Error("an empty volume copied without error")
	}
}

// The memory volume outlives the init container: a prefetch killed half way (its memory limit,
// node pressure, a crash) leaves its files there, and the kubelet starts it again. The new run
// empties the volume, removing (never following) links found there, and copies the model
// whole; so does a run over a copy that an earlier run finished.
func TestPrefetchStartsOverAfterAPartialCopy(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	files := map[string][]byte{
		"config.json":                      []byte(`{"model_type": "llama"}`),
		"tokenizer/tokenizer.json":         gen.Bytes(3, 64<<10),
		"weights/model-00001.safetensors":  gen.Bytes(1, 3<<20),
		"weights/model-00002.safetensors":  gen.Bytes(2, 1<<20),
		"weights/model.safetensors.index":  []byte(`{"weight_map": {}}`),
		"weights/nested/generation_config": []byte(`{}`),
	}
	writeFiles(t, from, files)
	var want int64
	for _, data := range files {
		want += int64(len(data))
	}
	run := func(what string) {
		t.Helper()
		res, err := Prefetch(PrefetchOptions{From: from, To: to})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if res.Files != len(files) || res.Bytes != want {
			t.Errorf("%s: copied %+v; want %d files, %d bytes", what, res, len(files), want)
		}
	}
	run("the first run")
	run("a run over a finished copy")

	// What a run killed while it copied weights/model-00001 leaves: that file cut short, the
	// files after it missing.
	if err := os.Truncate(filepath.Join(to, "weights/model-00001.safetensors"), 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"weights/model-00002.safetensors", "weights/model.safetensors.index", "weights/nested"} {
		if err := os.RemoveAll(filepath.Join(to, p)); err != nil {
			t.Fatal(err)
		}
	}
	// And links planted in the volume, leading out of it: where a directory of the model goes,
	// where a file goes, and one of no name of the model's.
	outside := t.TempDir()
	writeFiles(t, outside, map[string][]byte{"keep": []byte("not the model's")})
	if err := os.RemoveAll(filepath.Join(to, "tokenizer")); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"tokenizer":                       outside,
		"weights/model-00002.safetensors": filepath.Join(outside, "keep"),
		"elsewhere":                       outside,
	} {
		if err := os.Symlink(target, filepath.Join(to, link)); err != nil {
			t.Fatal(err)
		}
	}

	run("the run after a partial copy")

	// The volume holds the model and nothing else: every file whole and a file, not a link.
	var got []string
	err := filepath.WalkDir(to, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(to, path)
		if d.Type()&fs.ModeSymlink != 0 {
			t.Errorf("%s is still a link", rel)
		}
		if d.Type().IsRegular() {
			got = append(got, filepath.ToSlash(rel))
			b, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(b, files[filepath.ToSlash(rel)]) {
				t.Errorf("%s: not the model's file (%d bytes, %v)", rel, len(b), err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := slices.Sorted(maps.Keys(files))
	slices.Sort(got)
	if !slices.Equal(got, wantFiles) {
		t.Errorf("the volume holds %v; want the model's files %v", got, wantFiles)
	}
	// Nothing was written through the links.
	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if keep, _ := os.ReadFile(filepath.Join(outside, "keep")); len(entries) != 1 || string(keep) != "not the model's" {
		t.Errorf("the directory the links led to holds %v, keep %q: written through a link", entries, keep)
	}
}

// A model larger than the volume's size limit is refused before anything is copied, the error
// saying what set the limit; anything but files and directories is refused rather than read (a
// named pipe would block the copy for ever).
func TestPrefetchRefusesWhatCannotBeCopied(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	writeFiles(t, from, map[string][]byte{"a": gen.Bytes(1, 3<<20), "b": gen.Bytes(2, 2<<20)})
	from2 := "controller.prefetchSizeLimit of the operator configuration: raise it"
	_, err := Prefetch(PrefetchOptions{From: from, To: to, SizeLimit: 4 << 20, SizeLimitFrom: from2})
	if err == nil || !strings.Contains(err.Error(), "5.2 MB in 2 files") || !strings.Contains(err.Error(), "4.2 MB") || !strings.Contains(err.Error(), from2) {
		t.Errorf("a model of 5 MiB into 4 MiB: %v; want refused with both sizes and what set the limit", err)
	}
	if entries, _ := os.ReadDir(to); len(entries) != 0 {
		t.Errorf("a model refused for its size still copied %v", entries)
	}
	if _, err := Prefetch(PrefetchOptions{From: from, To: to, SizeLimit: 6 << 20}); err != nil {
		t.Errorf("a model of 5 MiB into 6 MiB: %v", err)
	}

	if err := unix.Mkfifo(filepath.Join(from, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Prefetch(PrefetchOptions{From: from, To: t.TempDir()})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "pipe is not a file") {
			t.Errorf("a named pipe in the model: %v; want it refused by name", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a named pipe in the model: the copy still waits on it after a minute")
	}
}
