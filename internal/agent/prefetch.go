package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// PrefetchResult says what Prefetch copied.
type PrefetchResult struct {
	Files int
	Bytes int64
}

// Prefetch copies the model under from (the pod's cache volume, read-only) into to (a
// memory-backed volume), file by file, directories as they are: the inference server then reads
// the model from memory (HyperPod's prefetchEnabled). A symbolic link is copied as what it
// points to inside from, never followed out of it. A copy that cannot complete (the volume's
// size limit, the pod's memory) fails with the file it stopped at.
func Prefetch(from, to string) (PrefetchResult, error) {
	var res PrefetchResult
	root, err := os.OpenRoot(from)
	if err != nil {
		return res, err
	}
	defer root.Close()
	err = fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(to, path)
		if d.IsDir() {
			if path == "." {
				return nil
			}
			return os.MkdirAll(dst, 0o755)
		}
		n, err := copyFile(root, path, dst)
		if err != nil {
			return fmt.Errorf("copying %s into memory after %d bytes: %w", path, res.Bytes+n, err)
		}
		res.Files++
		res.Bytes += n
		return nil
	})
	if err == nil && res.Files == 0 {
		err = errors.New("the model volume holds no file")
	}
	return res, err
}

// copyFile copies root's file path (followed within root) to dst.
func copyFile(root *os.Root, path, dst string) (int64, error) {
	src, err := root.Open(path)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}
