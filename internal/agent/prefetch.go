package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/prewarm/prewarm/pkg/engine"
)

// PrefetchOptions says what Prefetch copies where.
type PrefetchOptions struct {
	// From is the pod's model volume (read-only); To is the memory-backed volume the inference
	// server reads the model from.
	From, To string
	// SizeLimit is To's size limit in bytes (0: none): a model that does not fit is refused
	// before anything is copied.
	SizeLimit int64
	// SizeLimitFrom says what set SizeLimit and how to raise it, for the error that refuses a
	// model that does not fit.
	SizeLimitFrom string
}

// PrefetchResult says what Prefetch copied.
type PrefetchResult struct {
	Files int
	Bytes int64
}

// Prefetch copies the model under o.From (the pod's cache volume, read-only) into o.To (a
// memory-backed volume), file by file, directories as they are: the inference server then reads
// the model from memory (HyperPod's prefetchEnabled). A symbolic link is copied as what it
// points to inside From, never followed out of it; anything but files and directories is
// refused. A model larger than o.SizeLimit is refused before anything is written. Each file's
// copy is checked to have the size of the file it was copied from.
//
// Prefetch may run again over what an earlier run left in To (the volume outlives its init
// container: a copy killed half way by the memory limit, node pressure or a crash): it first
// empties To, removing files, directories and links without following any link, then copies
// the whole model. An earlier copy is never reused, even a finished one: proving it whole means
// reading it and the model back in full, which costs what copying does, and a record of its
// completion kept in the volume would prove nothing that the pod's other containers, which may
// mount the volume, could not have written.
func Prefetch(o PrefetchOptions) (PrefetchResult, error) {
	var res PrefetchResult
	from, err := os.OpenRoot(o.From)
	if err != nil {
		return res, err
	}
	defer from.Close()
	to, err := os.OpenRoot(o.To)
	if err != nil {
		return res, err
	}
	defer to.Close()
	model, err := listModel(from)
	if err != nil {
		return res, err
	}
	if model.files == 0 {
		return res, errors.New("the model volume holds no file")
	}
	if o.SizeLimit > 0 && model.footprint > o.SizeLimit {
		return res, model.doesNotFit(o)
	}
	if err := emptyRoot(to); err != nil {
		return res, fmt.Errorf("emptying the memory volume of what an earlier attempt left: %w", err)
	}
	for _, e := range model.entries {
		if e.dir {
			if err := to.Mkdir(e.path, 0o755); err != nil {
				return res, err
			}
			continue
		}
		n, err := copyFile(from, to, e.path)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) && o.SizeLimit > 0 {
				err = fmt.Errorf("%w (%w)", err, model.doesNotFit(o))
			}
			return res, fmt.Errorf("copying %s into memory after %d bytes: %w", e.path, res.Bytes+n, err)
		}
		res.Files++
		res.Bytes += n
	}
	return res, nil
}

// prefetchEntry is a directory or file of the model, by its path under the model volume.
type prefetchEntry struct {
	path string
	dir  bool
}

// prefetchModel is the model volume's directories and files, parents first.
type prefetchModel struct {
	entries []prefetchEntry
	files   int
	bytes   int64
	// footprint is what the files take in memory: each a whole number of pages.
	footprint int64
}

// listModel lists the model volume under root: its directories and files, a link as what it
// points to inside root.
func listModel(root *os.Root) (prefetchModel, error) {
	var m prefetchModel
	page := int64(os.Getpagesize())
	err := fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == "." {
			return nil
		}
		if d.IsDir() {
			m.entries = append(m.entries, prefetchEntry{path: path, dir: true})
			return nil
		}
		fi, err := root.Stat(path) // a link, as what it points to inside root
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a file (%s): the model volume may hold only files and directories", path, fi.Mode().Type())
		}
		m.entries = append(m.entries, prefetchEntry{path: path})
		m.files++
		m.bytes += fi.Size()
		m.footprint += (fi.Size() + page - 1) / page * page
		return nil
	})
	return m, err
}

// doesNotFit is the error of a model larger than the memory volume's size limit.
func (m prefetchModel) doesNotFit(o PrefetchOptions) error {
	msg := fmt.Sprintf("the model (%s in %d files) does not fit the memory volume, whose size limit is %s",
		engine.HumanBytes(m.footprint), m.files, engine.HumanBytes(o.SizeLimit))
	if o.SizeLimitFrom != "" {
		msg += " (" + o.SizeLimitFrom + ")"
	}
	return errors.New(msg)
}

// emptyRoot removes everything in root, never following a link: a link is removed, not what it
// points to.
func emptyRoot(root *os.Root) error {
	dir, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := dir.Readdirnames(-1)
	if cerr := dir.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := root.RemoveAll(name); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies from's file path (a link followed within from) to the same path in to, which
// must not exist yet, and checks that the copy has the size of the file it was copied from.
func copyFile(from, to *os.Root, path string) (int64, error) {
	src, err := from.Open(path)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	out, err := to.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("copied %d bytes of a file of %d: the model changed while it was copied", n, fi.Size())
	}
	return n, err
}
