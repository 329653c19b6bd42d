package engine

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Direct I/O. A file verified as its parts stream in (a CRC the source vouches for, or none)
// is never read back, so its bytes need not pass through the page cache: the 4 KiB-aligned body
// of every write goes to the disk with O_DIRECT, from a buffer aligned to match, and only what
// is left over (the tail of a file, or a chunk after a read that broke off mid-page) goes
// through the page cache. That saves the copy into the page cache and the writeback after it,
// which on a small machine is most of a download's CPU (docs/performance.md), and leaves the
// node's page cache to the workloads using it.
//
// A file checked by reading it back once written (sha256, MD5, git blob ids) is written through
// the page cache, so that the read-back finds it there instead of reading the disk again. A
// filesystem that refuses O_DIRECT (ramfs, some network and FUSE filesystems) gets the page
// cache for every file. The journal's guarantees do not change: a part is journalled once
// its write has returned, and marked durable only after syncfs, which covers both kinds of
// write.

// directAlign is the alignment O_DIRECT needs of offsets, lengths and buffers: the logical
// block size, 4 KiB on every disk that matters (512-byte devices take it too).
const directAlign = 4096

// WithDirectIO turns direct writes on (the default) or off.
func WithDirectIO(on bool) Option { return func(e *Engine) { e.directIO = on } }

// alignedChunk returns a chunkSize buffer whose first byte is directAlign-aligned.
func alignedChunk() *[]byte {
	b := make([]byte, chunkSize+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	b = b[skip : skip+chunkSize : skip+chunkSize]
	return &b
}

// openDirect opens a second, O_DIRECT descriptor on a file already open for writing, or returns
// nil when the filesystem refuses it.
func (r *run) openDirect(rel string) (*os.File, error) {
	f, err := r.root.OpenFile(rel, os.O_WRONLY|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
		return nil, nil // not supported here: the page cache it is
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s for direct writes: %w", rel, err)
	}
	return f, nil
}

// writeAt writes p at off: its aligned body directly when the handle can, the rest through the
// page cache.
func (h *fileHandle) writeAt(p []byte, off int64) error {
	if h.direct != nil && !h.noDirect.Load() && off%directAlign == 0 && len(p) >= directAlign &&
		uintptr(unsafe.Pointer(&p[0]))%directAlign == 0 {
		n := len(p) &^ (directAlign - 1)
		_, err := h.direct.WriteAt(p[:n], off)
		switch {
		case err == nil:
			h.metrics.directBytes.Add(float64(n))
			p, off = p[n:], off+int64(n)
		case errors.Is(err, unix.EINVAL):
			// Opened, but this device wants another alignment: stop trying.
			h.noDirect.Store(true)
		default:
			return err
		}
	}
	if len(p) == 0 {
		return nil
	}
	_, err := h.f.WriteAt(p, off)
	return err
}

// close closes both descriptors.
func (h *fileHandle) close() error {
	var derr error
	if h.direct != nil {
		derr = h.direct.Close()
	}
	return errors.Join(h.f.Close(), derr)
}

// writeLen is how much of want bytes to read next into an aligned buffer for a write at pos:
// up to the next aligned offset when pos is not aligned (a read that broke off mid-page), so
// that the writes after it are aligned again.
func writeLen(pos, want int64) int64 {
	if r := pos % directAlign; r != 0 {
		return min(want, directAlign-r)
	}
	return want
}
