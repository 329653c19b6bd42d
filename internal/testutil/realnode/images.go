package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// Push writes img to the loopback registry as repoTag (e.g. "vllm/vllm-openai:latest"), where
// containerd's mirrors find it.
func (c *Cluster) Push(repoTag string, img v1.Image) error {
	ref, err := name.ParseReference(c.Registry + "/" + repoTag)
	if err != nil {
		return err
	}
	return remote.Write(ref, img)
}

// BuildStatic builds a static linux binary of the Go package pkg (run in the module root).
func BuildStatic(root, pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// File is a file of a layer.
type File struct {
	Data []byte
	Mode int64
}

// Image is an image of these layers on an empty base, for linux/amd64, with the entrypoint.
func ImageOf(entrypoint []string, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = entrypoint
	return mutate.ConfigFile(img, cf)
}

// FilesLayer is an uncompressed layer holding files (path → file), owned by root.
func FilesLayer(files map[string]File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		parts := strings.Split(strings.Trim(p, "/"), "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
					return nil, err
				}
			}
		}
		f := files[p]
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.Trim(p, "/"), Mode: mode, Size: int64(len(f.Data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return newStreamLayer(func() io.ReadCloser { return io.NopCloser(bytes.NewReader(data)) })
}

// RandomLayer is an uncompressed layer of one file, path, of size incompressible bytes from
// seed: a large layer generated as it is read, never held in memory.
func RandomLayer(path string, seed uint64, size int64) (v1.Layer, error) {
	return newStreamLayer(func() io.ReadCloser {
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.Trim(path, "/"), Mode: 0o644, Size: size, ModTime: time.Unix(0, 0)})
			if err == nil {
				_, err = io.Copy(tw, io.LimitReader(gen.Reader(seed), size))
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		return pr
	})
}

// streamLayer is an uncompressed layer whose bytes come from open, read once to digest them.
type streamLayer struct {
	open   func() io.ReadCloser
	digest v1.Hash
	size   int64
}

func newStreamLayer(open func() io.ReadCloser) (*streamLayer, error) {
	h := sha256.New()
	r := open()
	defer r.Close()
	n, err := io.Copy(h, r)
	if err != nil {
		return nil, err
	}
	return &streamLayer{open: open, size: n, digest: v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}}, nil
}

func (l *streamLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *streamLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *streamLayer) Size() (int64, error)                 { return l.size, nil }
func (l *streamLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
func (l *streamLayer) Compressed() (io.ReadCloser, error)   { return l.open(), nil }
func (l *streamLayer) Uncompressed() (io.ReadCloser, error) { return l.open(), nil }
