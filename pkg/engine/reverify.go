package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Damage is one file of a published destination that is not what its manifest records.
type Damage struct {
	// Path is the file's path, slash-separated.
	Path string
	// Problem says what is wrong: missing, a size, a checksum mismatch.
	Problem string
}

// CheckOptions configure Check.
type CheckOptions struct {
	// Content reads every file and compares it with the checksum its manifest records (without
	// it, only presence and sizes are checked, reading no content).
	Content bool
	// Limiter, when set, caps the bytes read per second (re-verification shares the disk with
	// the inference pods that read the same files).
	Limiter *rate.Limiter
	// Read, when set, is told the bytes read so far.
	Read func(n int64)
}

// Check re-checks a published destination against its manifest and returns the files that do
// not match it. An error means dest could not be checked at all (no manifest, say).
func Check(ctx context.Context, dest string, o CheckOptions) (*Manifest, []Damage, error) {
	m, err := ReadManifest(dest)
	if err != nil {
		return nil, nil, err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return m, nil, err
	}
	defer root.Close()
	var damaged []Damage
	var read int64
	for _, f := range m.Files {
		rel := filepath.FromSlash(f.Path)
		info, err := root.Lstat(rel)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			damaged = append(damaged, Damage{Path: f.Path, Problem: "missing"})
			continue
		case err != nil:
			damaged = append(damaged, Damage{Path: f.Path, Problem: err.Error()})
			continue
		case !info.Mode().IsRegular():
			damaged = append(damaged, Damage{Path: f.Path, Problem: "not a regular file"})
			continue
		case info.Size() != f.Size:
			damaged = append(damaged, Damage{Path: f.Path, Problem: fmt.Sprintf("size %d, want %d", info.Size(), f.Size)})
			continue
		}
		if !o.Content {
			continue
		}
		before := read
		err = readAndCompare(ctx, root, f.Path, m.checksums(f), f.Size, o.Limiter, func(n int64) {
			read = before + n
			if o.Read != nil {
				o.Read(read)
			}
		})
		var stop *stopped
		var verr *VerificationError
		switch {
		case errors.As(err, &stop):
			return m, nil, stop.err // cancelled, or out of time at this rate: nothing is known
		case errors.As(err, &verr):
			damaged = append(damaged, Damage{Path: f.Path, Problem: fmt.Sprintf("%s mismatch: want %s, got %s", verr.Kind, verr.Want, verr.Got)})
		case err != nil:
			damaged = append(damaged, Damage{Path: f.Path, Problem: err.Error()})
		}
	}
	return m, damaged, nil
}

// ErrSourceChanged is returned by Repair when the source no longer holds what the destination
// recorded (repairing would mix two versions of the model), and by Fetch when the source holds
// another revision than the one asked for.
var ErrSourceChanged = errors.New("the source has changed since the destination was downloaded")

// Repair re-fetches the named files of a published destination from src, verifies them, and
// puts each in place with a rename: the rest of the destination is not touched or re-read. The
// source must still list exactly what the manifest records (else ErrSourceChanged).
func (e *Engine) Repair(ctx context.Context, src source.Source, dest string, paths []string) (Result, error) {
	start := e.now()
	m, err := ReadManifest(dest)
	if err != nil {
		return Result{}, err
	}
	listing, err := list(ctx, src, "")
	if err != nil {
		return Result{}, err
	}
	if !m.Matches(listing) {
		return Result{}, fmt.Errorf("%s: %w", src, ErrSourceChanged)
	}
	sub := subset{Source: src, listing: source.Listing{Revision: listing.Revision}}
	for _, f := range listing.Files {
		if slices.Contains(paths, f.Path) {
			sub.listing.Files = append(sub.listing.Files, f)
		}
	}
	if len(sub.listing.Files) != len(paths) {
		return Result{}, fmt.Errorf("repairing %s: %d of the %d files are not in the manifest", dest, len(paths)-len(sub.listing.Files), len(paths))
	}
	tmp := filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".prewarm-repair")
	if err := os.RemoveAll(tmp); err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(tmp)
	res, err := e.Fetch(ctx, Request{Source: sub, Dest: tmp})
	if err != nil {
		return res, err
	}
	for _, f := range sub.listing.Files {
		rel := filepath.FromSlash(f.Path)
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dest, rel)), 0o755); err != nil {
			return res, err
		}
		if err := os.Rename(filepath.Join(tmp, rel), filepath.Join(dest, rel)); err != nil {
			return res, fmt.Errorf("putting the repaired %s in place: %w", f.Path, err)
		}
	}
	if err := syncDir(dest); err != nil {
		return res, err
	}
	res.Files, res.Bytes = len(listing.Files), 0
	for _, f := range listing.Files {
		res.Bytes += f.Size
	}
	res.Duration = e.now().Sub(start)
	return res, nil
}

// subset is a source restricted to some of its files.
type subset struct {
	source.Source
	listing source.Listing
}

func (s subset) List(context.Context) (source.Listing, error) { return s.listing, nil }
