// Command images builds prewarm's container images without a Docker daemon: static Go binaries,
// each image one layer on an empty base, run as a non-root user, with OCI labels. The same commit
// gives the same digests (file times, owners and the image's creation time come from the commit),
// so anyone can check a published image against the source.
//
// It uses go-containerregistry as a library rather than ko: the agent image holds two binaries
// (the agent, and the sleeper the image cache's pods install), which ko's one-binary-per-image
// model would only reach through its data directory, and the library gives the layout, labels and
// reproducibility directly.
//
//	go run ./hack/images --out bin/images                      # an OCI layout with both images
//	go run ./hack/images --out bin/images --push localhost:5000  # and push them
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the user the images run as (distroless's "nonroot").
const NonRoot = "65532:65532"

// image is one of prewarm's images: its binaries (package → path in the image) and entrypoint.
type image struct {
	name        string
	description string
	binaries    []binary
}

type binary struct{ pkg, path string }

var images = []image{
	{name: "controller", description: "prewarm's operator: reconciles the HyperPod-compatible API, asks nodes for caches, creates the Deployments",
		binaries: []binary{{"./cmd/controller", "/controller"}}},
	{name: "agent", description: "prewarm's node agent and the inference pods' init container; with the sleeper the image cache's pods install",
		binaries: []binary{{"./cmd/agent", "/agent"}, {"./cmd/sleeper", "/sleeper"}}},
}

func main() {
	out := flag.String("out", "bin/images", "directory of the OCI layout written")
	push := flag.String("push", "", "registry (and path) to push the images to, e.g. ghcr.io/prewarm; empty: none")
	version := flag.String("version", "", "the images' tag and the binaries' version (default: from git describe)")
	platforms := flag.String("platforms", "linux/amd64", "comma-separated platforms, e.g. linux/amd64,linux/arm64")
	flag.Parse()
	if err := run(*out, *push, *version, strings.Split(*platforms, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(out, push, version string, platforms []string) error {
	src, err := sourceInfo()
	if err != nil {
		return err
	}
	if version == "" {
		version = src.describe
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "prewarm-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	for _, im := range images {
		idx, err := im.build(work, version, src, platforms)
		if err != nil {
			return fmt.Errorf("%s: %w", im.name, err)
		}
		ref := "prewarm/" + im.name + ":" + version
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
			return err
		}
		digest, err := idx.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s\t%s\n", ref, digest)
		if push != "" {
			target, err := name.ParseReference(strings.TrimSuffix(push, "/") + "/" + im.name + ":" + version)
			if err != nil {
				return err
			}
			if err := remote.WriteIndex(target, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return fmt.Errorf("pushing %s: %w", target, err)
			}
			fmt.Printf("pushed %s@%s\n", target, digest)
		}
	}
	return nil
}

// source is what the images say of the commit they were built from.
type source struct {
	commit, describe string
	time             time.Time
}

func sourceInfo() (source, error) {
	git := func(args ...string) (string, error) {
		b, err := exec.Command("git", args...).Output()
		return strings.TrimSpace(string(b)), err
	}
	commit, err := git("rev-parse", "HEAD")
	if err != nil {
		return source{}, fmt.Errorf("reading the commit (run from the repository): %w", err)
	}
	describe, err := git("describe", "--tags", "--always", "--dirty")
	if err != nil {
		return source{}, err
	}
	ct, err := git("log", "-1", "--format=%ct")
	if err != nil {
		return source{}, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return source{}, err
	}
	return source{commit: commit, describe: describe, time: time.Unix(sec, 0).UTC()}, nil
}

// build makes the image for each platform and an index of them.
func (im image) build(work, version string, src source, platforms []string) (v1.ImageIndex, error) {
	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for _, platform := range platforms {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(platform), "/")
		if !ok {
			return nil, fmt.Errorf("platform %q: want os/arch", platform)
		}
		files := map[string]string{}
		for _, b := range im.binaries {
			bin := filepath.Join(work, goos+"-"+goarch, filepath.Base(b.path))
			if err := goBuild(b.pkg, bin, goos, goarch, version); err != nil {
				return nil, err
			}
			files[b.path] = bin
		}
		layer, err := layerOf(files, src.time)
		if err != nil {
			return nil, err
		}
		img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
		if err != nil {
			return nil, err
		}
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cfg = cfg.DeepCopy()
		cfg.OS, cfg.Architecture = goos, goarch
		cfg.Created = v1.Time{Time: src.time}
		cfg.Config.User = NonRoot
		cfg.Config.Entrypoint = []string{im.binaries[0].path}
		cfg.Config.WorkingDir = "/"
		cfg.Config.Labels = map[string]string{
			"org.opencontainers.image.title":       "prewarm-" + im.name,
			"org.opencontainers.image.description": im.description,
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.revision":    src.commit,
			"org.opencontainers.image.created":     src.time.Format(time.RFC3339),
			"org.opencontainers.image.source":      "https://github.com/prewarm/prewarm",
			"org.opencontainers.image.licenses":    "Apache-2.0",
		}
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: goos, Architecture: goarch},
		}})
	}
	return idx, nil
}

// goBuild builds a static, reproducible binary (no cgo, no paths, no VCS stamp, the version
// linked in).
func goBuild(pkg, out, goos, goarch, version string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid= -X github.com/prewarm/prewarm/internal/cli.version="+version, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w", pkg, goos, goarch, err)
	}
	return nil
}

// layerOf is a layer holding files (image path → local file), owned by root, executable by all,
// timestamped at t.
func layerOf(files map[string]string, t time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		b, err := os.ReadFile(files[p])
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(b)), ModTime: t, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}
