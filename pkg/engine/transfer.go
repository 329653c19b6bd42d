package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// chunkSize is the unit of one read from the network and one positioned write: large enough
// that syscalls cost nothing next to the copy, small enough that memory stays near
// concurrency × chunkSize whatever the part size.
const chunkSize = 1 << 20

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

type part struct {
	file   int
	off, n int64
	handle *fileHandle
}

// fileHandle is one file being written: opened once, shared by its parts, closed when the
// last part is written.
type fileHandle struct {
	f         *os.File
	remaining atomic.Int64 // parts not yet written
}

type record struct {
	file   int
	off, n int64
	crc    uint64
	hasCRC bool
}

// download fetches every missing part and verifies every file.
func (r *run) download(ctx context.Context) error {
	e := r.e
	g, ctx := errgroup.WithContext(ctx)

	parts := make(chan part, e.concurrency)
	records := make(chan record, 4*e.concurrency)
	toVerify := make(chan int, len(r.listing.Files))
	verified := make(chan int, len(r.listing.Files))

	// Files verified by an earlier run are done; the rest will each pass through a verifier
	// once. Counted here, before any goroutine starts, so the verifiers know when to stop.
	toCheck := int64(0)
	for idx, f := range r.listing.Files {
		if r.resume.verified[idx] {
			r.filesDone.Add(1)
			r.done.Add(f.Size)
		} else {
			toCheck++
		}
	}

	// Producer: parts in file order, so files finish early and verification overlaps download.
	g.Go(func() error {
		defer close(parts)
		for idx, f := range r.listing.Files {
			if r.resume.verified[idx] {
				continue
			}
			cov := r.resume.written[idx]
			var todo []part
			for off := int64(0); off < f.Size; off += e.partSize {
				n := min(e.partSize, f.Size-off)
				if cov != nil && cov.covers(off, n) {
					r.done.Add(n)
					continue
				}
				todo = append(todo, part{file: idx, off: off, n: n})
			}
			if len(todo) == 0 && f.Size > 0 {
				toVerify <- idx // written before, not yet verified
				continue
			}
			h, err := r.openFile(idx, f)
			if err != nil {
				return err
			}
			if f.Size == 0 {
				if err := h.f.Close(); err != nil {
					return err
				}
				toVerify <- idx
				continue
			}
			h.remaining.Store(int64(len(todo)))
			for _, p := range todo {
				p.handle = h
				select {
				case parts <- p:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return nil
	})

	// Workers.
	var workers sync.WaitGroup
	for range e.concurrency {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			for p := range parts {
				crc, err := r.fetchPart(ctx, p)
				if err != nil {
					return err
				}
				rec := record{file: p.file, off: p.off, n: p.n, crc: crc, hasCRC: r.inline[p.file] != nil}
				if rec.hasCRC {
					r.crcMu.Lock()
					r.crcs[p.file] = append(r.crcs[p.file], partCRC{p.off, p.n, crc})
					r.crcMu.Unlock()
				}
				select {
				case records <- rec:
				case <-ctx.Done(): // the journal stopped on an error
					return ctx.Err()
				}
				if p.handle.remaining.Add(-1) == 0 {
					if err := p.handle.f.Close(); err != nil {
						return err
					}
					toVerify <- p.file
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		workers.Wait()
		close(records)
		return nil
	})

	// Journal: records reach the kernel at once, and the filesystem is synced now and then.
	journalDone := make(chan struct{})
	g.Go(func() error {
		defer close(journalDone)
		tick := time.NewTicker(e.syncInterval)
		defer tick.Stop()
		for {
			select {
			case rec, ok := <-records:
				if !ok {
					return r.journal.flush()
				}
				r.journal.written(rec.file, rec.off, rec.n, rec.crc, rec.hasCRC)
				if len(records) == 0 {
					if err := r.journal.flush(); err != nil {
						return err
					}
				}
			case idx := <-verified:
				r.journal.verified(idx)
			case <-tick.C:
				if err := r.syncJournal(); err != nil {
					return err
				}
			}
		}
	})

	// Verifiers.
	var verifiersWG sync.WaitGroup
	var pendingVerify atomic.Int64
	pendingVerify.Store(toCheck)
	allVerified := make(chan struct{})
	if pendingVerify.Load() == 0 {
		close(allVerified)
	}
	for range e.verifiers {
		verifiersWG.Add(1)
		g.Go(func() error {
			defer verifiersWG.Done()
			for {
				select {
				case <-allVerified:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case idx := <-toVerify:
					if err := r.verifyFile(ctx, idx); err != nil {
						return err
					}
					r.filesDone.Add(1)
					verified <- idx
					if pendingVerify.Add(-1) == 0 {
						close(allVerified)
					}
				}
			}
		})
	}

	// Progress.
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		if e.progress == nil {
			return
		}
		tick := time.NewTicker(e.progressInterval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				e.report(r.snapshot(PhaseDownloading))
			case <-stopProgress:
				return
			}
		}
	}()

	err := g.Wait()
	close(stopProgress)
	<-progressDone
	// Whatever happened, flush and sync what the journal knows, so a rerun resumes from here.
	for len(verified) > 0 {
		r.journal.verified(<-verified)
	}
	var verr *VerificationError
	if errors.As(err, &verr) {
		// Bad bytes are not kept: the next run fetches this file again.
		r.journal.reset(verr.file)
		_ = r.root.Remove(filepath.FromSlash(verr.Path))
	}
	if serr := r.syncJournal(); err == nil {
		err = serr
	}
	return err
}

// syncJournal makes everything written so far durable, then marks the journal so.
func (r *run) syncJournal() error {
	if err := r.journal.flush(); err != nil {
		return err
	}
	if err := unix.Syncfs(int(r.journal.f.Fd())); err != nil {
		return fmt.Errorf("syncing %s: %w", r.dir, err)
	}
	r.journal.synced()
	return r.journal.flush()
}

// openFile creates (or reopens, when resuming) a file in the partial directory, with its full
// size allocated up front.
func (r *run) openFile(idx int, f source.File) (*fileHandle, error) {
	rel := filepath.FromSlash(f.Path)
	if dir := filepath.Dir(rel); dir != "." {
		if err := r.root.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	fresh := r.resume.written[idx] == nil
	flags := os.O_CREATE | os.O_WRONLY
	if fresh {
		flags |= os.O_TRUNC
	}
	file, err := r.root.OpenFile(rel, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", f.Path, err)
	}
	if f.Size > 0 {
		if err := unix.Fallocate(int(file.Fd()), 0, 0, f.Size); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) {
				file.Close()
				return nil, fmt.Errorf("allocating %s for %s: %w", HumanBytes(f.Size), f.Path, err)
			}
			if err := file.Truncate(f.Size); err != nil {
				file.Close()
				return nil, err
			}
		}
	}
	return &fileHandle{f: file}, nil
}

// fetchPart reads one part from the source and writes it at its offset, retrying transient
// failures from the byte it had reached. It returns the part's CRC when the file is verified
// inline.
func (r *run) fetchPart(ctx context.Context, p part) (uint64, error) {
	e := r.e
	f := r.listing.Files[p.file]
	off, end := p.off, p.off+p.n
	var crc uint64
	var lastErr error
	for attempt := 0; attempt < e.maxAttempts; attempt++ {
		if attempt > 0 {
			e.metrics.retries.Inc()
			if err := sleep(ctx, e.backoff(attempt)); err != nil {
				return 0, err
			}
		}
		n, err := r.copyRange(ctx, p.handle.f, f.Path, off, end-off, r.inline[p.file], &crc)
		off += n
		if err == nil && off == end {
			return crc, nil
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !source.Retryable(err) {
			return 0, fmt.Errorf("%s: %w", f.Path, err)
		}
		if n > 0 {
			attempt = 0 // progress was made: the budget is for a stuck part, not a long one
		}
		lastErr = err
	}
	return 0, fmt.Errorf("%s: giving up after %d tries: %w", f.Path, e.maxAttempts, lastErr)
}

// copyRange streams [off, off+n) of the source file into w at the same offsets, updating *crc
// with the bytes written when kind is set. It returns the bytes written, which are all good
// even when err is not nil.
func (r *run) copyRange(ctx context.Context, w io.WriterAt, path string, off, n int64, kind *crcKind, crc *uint64) (int64, error) {
	body, err := r.src.OpenRange(ctx, path, off, n)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	buf := *bufp
	var written int64
	for written < n {
		want := min(int64(len(buf)), n-written)
		if lim := r.e.limiter; lim != nil {
			if err := lim.WaitN(ctx, int(want)); err != nil {
				return written, err
			}
		}
		got, rerr := io.ReadFull(body, buf[:want])
		if got > 0 {
			if _, werr := w.WriteAt(buf[:got], off+written); werr != nil {
				return written, fmt.Errorf("writing %s: %w", path, werr)
			}
			if kind != nil {
				*crc = kind.update(*crc, buf[:got])
			}
			written += int64(got)
			r.done.Add(int64(got))
			r.fetched.Add(int64(got))
			r.e.metrics.bytes.Add(float64(got))
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) && written < n {
				rerr = io.ErrUnexpectedEOF
			}
			return written, rerr
		}
	}
	return written, nil
}

func (e *Engine) backoff(attempt int) time.Duration {
	d := e.retryBase << min(attempt-1, 20)
	if d > e.retryMax || d <= 0 {
		d = e.retryMax
	}
	return time.Duration(rand.Int64N(int64(d) + 1)) // full jitter
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
