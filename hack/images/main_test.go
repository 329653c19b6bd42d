package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The images build without a Docker daemon, run as non-root, carry their labels and version,
// hold exactly their binaries (the agent's without test code), and come out byte for byte the
// same from the same commit.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	first, second := t.TempDir(), t.TempDir()
	for _, out := range []string{first, second} {
		if err := run(out, "", "v0.0.0-test", []string{"linux/amd64"}); err != nil {
			t.Fatal(err)
		}
	}
	got := indexes(t, first)
	again := indexes(t, second)
	for ref, idx := range got {
		d1, _ := idx.Digest()
		d2, _ := again[ref].Digest()
		if d1 != d2 {
			t.Errorf("%s: %s, then %s from the same commit; want the same digest", ref, d1, d2)
		}
	}
	want := map[string][]string{"prewarm/controller:v0.0.0-test": {"controller"}, "prewarm/agent:v0.0.0-test": {"agent", "sleeper"}}
	if len(got) != len(want) {
		t.Fatalf("images %v; want %v", keys(got), keys(want))
	}
	for ref, files := range want {
		idx, ok := got[ref]
		if !ok {
			t.Fatalf("no image %s in the layout (have %v)", ref, keys(got))
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Manifests) != 1 || m.Manifests[0].Platform == nil || m.Manifests[0].Platform.Architecture != "amd64" {
			t.Fatalf("%s: manifests %+v; want one, linux/amd64", ref, m.Manifests)
		}
		img, err := idx.Image(m.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Config.User != NonRoot || cfg.OS != "linux" {
			t.Errorf("%s: user %q, os %q; want %s, linux", ref, cfg.Config.User, cfg.OS, NonRoot)
		}
		if l := cfg.Config.Labels; l["org.opencontainers.image.version"] != "v0.0.0-test" || len(l["org.opencontainers.image.revision"]) != 40 {
			t.Errorf("%s: labels %v; want the version and the commit", ref, l)
		}
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/" + files[0]}) {
			t.Errorf("%s: entrypoint %v; want /%s", ref, cfg.Config.Entrypoint, files[0])
		}
		contents := layerFiles(t, img)
		if !slices.Equal(keys(contents), files) {
			t.Errorf("%s: files %v; want exactly %v", ref, keys(contents), files)
		}
		for _, f := range files {
			for _, test := range []string{"prewarm/prewarm/internal/testutil", "controller-runtime/pkg/envtest", "net/http/httptest"} {
				if bytes.Contains(contents[f], []byte(test)) {
					t.Errorf("%s: /%s links %s", ref, f, test)
				}
			}
		}
		if !bytes.Contains(contents[files[0]], []byte("v0.0.0-test")) {
			t.Errorf("%s: /%s does not carry its version", ref, files[0])
		}
	}
}

func indexes(t *testing.T, dir string) map[string]v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.ImageIndex{}
	for _, d := range m.Manifests {
		idx, err := root.ImageIndex(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[d.Annotations["org.opencontainers.image.ref.name"]] = idx
	}
	return out
}

// layerFiles reads every file of an image's layers, by name.
func layerFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Uid != 0 || hdr.Mode&0o022 != 0 {
				t.Errorf("%s: owner %d, mode %o; want root-owned, writable by none but root", hdr.Name, hdr.Uid, hdr.Mode)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[strings.TrimPrefix(hdr.Name, "/")] = b
		}
		rc.Close()
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
