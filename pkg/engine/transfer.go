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

// download fetches every missing part and verifies every file. It runs as a pipeline: one
// producer hands out parts in file order, workers fetch and write them, one goroutine keeps the
// journal, and verifiers check each file as its last part lands, so verification overlaps the
// download.
func (r *run) download(ctx context.Context) error {
	p := r.newPipeline()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.produce(ctx) })
	var workers sync.WaitGroup
	for range r.e.concurrency {
		workers.Add(1)
		g.Go(func() error {
			defer workers.Done()
			return p.work(ctx)
		})
	}
	g.Go(func() error {
		workers.Wait()
		close(p.records)
		return nil
	})
	g.Go(p.keepJournal)
	for range r.e.verifiers {
		g.Go(func() error { return p.verify(ctx) })
	}
	stopProgress := r.reportProgress()
	err := g.Wait()
	stopProgress()
	return p.finish(err)
}

// pipeline is the channels between download's stages.
type pipeline struct {
	r        *run
	parts    chan part   // producer → workers
	records  chan record // workers → journal
	toVerify chan int    // files fully written → verifiers
	verified chan int    // files verified → journal

	// pending counts files still to verify; allVerified is closed when it reaches zero, which
	// is how the verifiers know to stop.
	pending     atomic.Int64
	allVerified chan struct{}
}

func (r *run) newPipeline() *pipeline {
	n := len(r.listing.Files)
	p := &pipeline{
		r:           r,
		parts:       make(chan part, r.e.concurrency),
		records:     make(chan record, 4*r.e.concurrency),
		toVerify:    make(chan int, n),
		verified:    make(chan int, n),
		allVerified: make(chan struct{}),
	}
	// Files verified by an earlier run are done; the rest each pass through a verifier once.
	// Counted before any goroutine starts.
	for idx, f := range r.listing.Files {
		if r.resume.verified[idx] {
			r.filesDone.Add(1)
			r.done.Add(f.Size)
		} else {
			p.pending.Add(1)
		}
	}
	if p.pending.Load() == 0 {
		close(p.allVerified)
	}
	return p
}

// produce hands out the parts not yet written, file by file, so that files finish early.
func (p *pipeline) produce(ctx context.Context) error {
	defer close(p.parts)
	r := p.r
	for idx, f := range r.listing.Files {
		if r.resume.verified[idx] {
			continue
		}
		todo := r.missingParts(idx, f)
		if len(todo) == 0 && f.Size > 0 {
			p.toVerify <- idx // written before, not yet verified
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
			p.toVerify <- idx
			continue
		}
		h.remaining.Store(int64(len(todo)))
		for _, pt := range todo {
			pt.handle = h
			select {
			case p.parts <- pt:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// missingParts is file idx cut into parts, less those an earlier run wrote (counted as done).
func (r *run) missingParts(idx int, f source.File) []part {
	cov := r.resume.written[idx]
	var todo []part
	for off := int64(0); off < f.Size; off += r.e.partSize {
		n := min(r.e.partSize, f.Size-off)
		if cov != nil && cov.covers(off, n) {
			r.done.Add(n)
			continue
		}
		todo = append(todo, part{file: idx, off: off, n: n})
	}
	return todo
}

// work fetches parts, records each in the journal, and hands a file to the verifiers when
// its last part is written.
func (p *pipeline) work(ctx context.Context) error {
	r := p.r
	for pt := range p.parts {
		crc, err := r.fetchPart(ctx, pt)
		if err != nil {
			return err
		}
		rec := record{file: pt.file, off: pt.off, n: pt.n, crc: crc, hasCRC: r.inline[pt.file] != nil}
		if rec.hasCRC {
			r.crcMu.Lock()
			r.crcs[pt.file] = append(r.crcs[pt.file], partCRC{pt.off, pt.n, crc})
			r.crcMu.Unlock()
		}
		select {
		case p.records <- rec:
		case <-ctx.Done(): // the journal stopped on an error
			return ctx.Err()
		}
		if pt.handle.remaining.Add(-1) == 0 {
			if err := pt.handle.f.Close(); err != nil {
				return err
			}
			p.toVerify <- pt.file
		}
	}
	return nil
}

// keepJournal is the journal's one writer: records reach the kernel at once, and the
// filesystem is synced now and then. It ends when the workers have all stopped.
func (p *pipeline) keepJournal() error {
	r := p.r
	tick := time.NewTicker(r.e.syncInterval)
	defer tick.Stop()
	for {
		select {
		case rec, ok := <-p.records:
			if !ok {
				return r.journal.flush()
			}
			r.journal.written(rec.file, rec.off, rec.n, rec.crc, rec.hasCRC)
			if len(p.records) == 0 {
				if err := r.journal.flush(); err != nil {
					return err
				}
			}
		case idx := <-p.verified:
			r.journal.verified(idx)
		case <-tick.C:
			if err := r.syncJournal(); err != nil {
				return err
			}
		}
	}
}

// verify checks files as they are handed over, until every file is verified.
func (p *pipeline) verify(ctx context.Context) error {
	for {
		select {
		case <-p.allVerified:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case idx := <-p.toVerify:
			if err := p.r.verifyFile(ctx, idx); err != nil {
				return err
			}
			p.r.filesDone.Add(1)
			p.verified <- idx
			if p.pending.Add(-1) == 0 {
				close(p.allVerified)
			}
		}
	}
}

// finish flushes and syncs what the journal knows, whatever happened, so that a rerun resumes
// from here; a file that failed verification is removed, so that the next run fetches it again.
func (p *pipeline) finish(err error) error {
	r := p.r
	for len(p.verified) > 0 {
		r.journal.verified(<-p.verified)
	}
	var verr *VerificationError
	if errors.As(err, &verr) {
		r.journal.reset(verr.file)
		_ = r.root.Remove(filepath.FromSlash(verr.Path))
	}
	if serr := r.syncJournal(); err == nil {
		err = serr
	}
	return err
}

// reportProgress reports the run's progress every progressInterval until the returned
// function is called; that function returns once the reporter has stopped.
func (r *run) reportProgress() (stop func()) {
	e := r.e
	if e.progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(e.progressInterval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				e.report(r.snapshot(PhaseDownloading))
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
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
