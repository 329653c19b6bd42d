// Package fs reads a model from a local or mounted directory (FSx for Lustre is mounted like
// this on nodes).
package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Source is a directory tree. Symbolic links are not followed out of it: a link is listed as
// the file it points to only when that file is inside the root; a link that leads out of the
// tree, or nowhere, is skipped (and named in Skipped).
type Source struct {
	// MaxFiles is the most files List returns; a tree with more fails the listing with a
	// *source.TooManyFilesError when the walk passes the bound. Zero means
	// source.DefaultMaxFiles.
	MaxFiles int

	root string
	dir  *os.Root // opened once; every read goes through it
	// skipped are the links the last List skipped.
	skipped []string
}

// Skipped returns the symbolic links the last List skipped because they lead out of the tree
// or to nothing.
func (s *Source) Skipped() []string { return s.skipped }

// New returns a source for the directory root.
func New(root string) (*Source, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(abs)
	if err != nil {
		return nil, &source.NotFoundError{Err: err}
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", abs)
	}
	dir, err := os.OpenRoot(abs)
	if err != nil {
		return nil, err
	}
	return &Source{root: abs, dir: dir}, nil
}

// NewIn returns a source for the directory rel inside parent, looked up through parent: links
// on the way are followed only while they stay inside parent. name names the source in
// messages (the directory's path as people know it).
func NewIn(parent *os.Root, rel, name string) (*Source, error) {
	info, err := parent.Stat(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &source.NotFoundError{Err: fmt.Errorf("%s: %w", name, err)}
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", name)
	}
	dir, err := parent.OpenRoot(rel)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Source{root: name, dir: dir}, nil
}

// Close releases the source's directory.
func (s *Source) Close() error { return s.dir.Close() }

func (s *Source) String() string { return s.root }

// List walks the tree and returns its regular files, up to MaxFiles of them.
func (s *Source) List(ctx context.Context) (source.Listing, error) {
	maxFiles := source.MaxFiles(s.MaxFiles)
	var files []source.File
	var skipped []string
	root := s.dir
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if d.IsDir() {
			return nil
		}
		// Stat through the root: a symlink that leaves the tree (or leads nowhere) fails here
		// and is skipped; any other failure fails the listing.
		info, err := root.Stat(p)
		if err != nil {
			if d.Type()&fs.ModeSymlink != 0 {
				skipped = append(skipped, filepath.ToSlash(p))
				return nil
			}
			return fmt.Errorf("%s: %w", p, err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		if len(files) == maxFiles {
			return &source.TooManyFilesError{Source: s.root, Max: maxFiles, Hint: "point the source at the model's own directory"}
		}
		files = append(files, source.File{
			Path:    filepath.ToSlash(p),
			Size:    info.Size(),
			Version: fmt.Sprintf("%d-%d", info.Size(), info.ModTime().UnixNano()),
		})
		return nil
	})
	var tooMany *source.TooManyFilesError
	switch {
	case errors.As(err, &tooMany):
		return source.Listing{}, tooMany
	case err != nil:
		return source.Listing{}, fmt.Errorf("listing %s: %w", s.root, err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	s.skipped = skipped
	return source.Listing{Files: files}, nil
}

// OpenRange opens a byte range of a file, confined to the root.
func (s *Source) OpenRange(_ context.Context, path string, offset, length int64) (io.ReadCloser, error) {
	f, err := s.dir.Open(filepath.FromSlash(path))
	if err != nil {
		return nil, err
	}
	return &rangeReader{Reader: io.NewSectionReader(f, offset, length), f: f, want: length}, nil
}

type rangeReader struct {
	io.Reader
	f    *os.File
	want int64
	got  int64
}

func (r *rangeReader) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	r.got += int64(n)
	if err == io.EOF && r.got < r.want {
		err = io.ErrUnexpectedEOF // the file shrank under us
	}
	return n, err
}

func (r *rangeReader) Close() error { return r.f.Close() }
