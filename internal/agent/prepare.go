package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// PrepareOptions configure Prepare: the init container of inference pods.
type PrepareOptions struct {
	// CacheDir is the node's copy of the cache, as mounted (read-only) in the pod.
	CacheDir string
	// Dest is the directory the inference container reads the model from.
	Dest string
	// Source is the model's original address, for a node without the cache (Kind empty: none).
	Source sources.Spec
	// Sources configures the source (endpoint, token).
	Sources sources.Options
	// Engine are extra engine options.
	Engine []engine.Option
}

// PrepareResult says what Prepare did.
type PrepareResult struct {
	// Warm is true when the node's cache was used.
	Warm bool
	// Files and Bytes are the model's.
	Files int
	Bytes int64
	// Fetched is what was read from the source (0 when warm).
	Fetched int64
	// Reason says why the cache was not used, when it was not.
	Reason string
}

// Prepare makes the model appear at o.Dest. On a warm node (o.CacheDir holds a whole, verified
// cache) it links every file into o.Dest: no byte is copied, so the time does not depend on the
// model's size. On a cold node it downloads the model from o.Source into o.Dest with the engine.
func Prepare(ctx context.Context, o PrepareOptions) (PrepareResult, error) {
	if o.Dest == "" {
		return PrepareResult{}, errors.New("prepare: no destination")
	}
	if o.CacheDir != "" {
		m, err := engine.CheckDest(o.CacheDir)
		if err == nil {
			res := PrepareResult{Warm: true, Files: len(m.Files)}
			for _, f := range m.Files {
				res.Bytes += f.Size
			}
			return res, link(m, o.CacheDir, o.Dest)
		}
		reason := err.Error()
		if errors.Is(err, os.ErrNotExist) {
			reason = "no cache on this node"
		}
		return cold(ctx, o, reason)
	}
	return cold(ctx, o, "no cache directory given")
}

// link makes dest a tree of symbolic links to the cache's files.
func link(m *engine.Manifest, cacheDir, dest string) error {
	if err := os.RemoveAll(dest); err != nil {
		return err
	}
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, f := range m.Files {
		rel := filepath.FromSlash(f.Path)
		if d := filepath.Dir(rel); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := root.Symlink(filepath.Join(cacheDir, rel), rel); err != nil {
			return fmt.Errorf("linking %s: %w", f.Path, err)
		}
	}
	return nil
}

func cold(ctx context.Context, o PrepareOptions, reason string) (PrepareResult, error) {
	res := PrepareResult{Reason: reason}
	if o.Source.Kind == "" {
		return res, fmt.Errorf("the node has no cache (%s) and no source to download from", reason)
	}
	src, err := sources.Open(ctx, o.Source, o.Sources)
	if err != nil {
		return res, err
	}
	eng := engine.New(o.Engine...)
	req := engine.Request{Source: src, Dest: o.Dest}
	if o.Source.Kind != sources.HuggingFace {
		req.Revision = o.Source.Revision // the revision the node caches hold, and nothing else
	}
	r, err := eng.Fetch(ctx, req)
	if errors.Is(err, engine.ErrDestNotOurs) {
		// Links from an earlier run on a cache that has since gone: start clean.
		if err := os.RemoveAll(o.Dest); err != nil {
			return res, err
		}
		r, err = eng.Fetch(ctx, req)
	}
	res.Files, res.Bytes, res.Fetched = r.Files, r.Bytes, r.Fetched
	return res, err
}
