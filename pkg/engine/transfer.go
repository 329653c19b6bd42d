package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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

var chunkPool = sync.Pool{New: func() any { return alignedChunk() }}

type part struct {
	file   int
	off, n int64
	handle *fileHandle
}

// fileHandle is one file being written: opened once, shared by its parts, closed when the
// last part is written.
type fileHandle struct {
	f         *os.File
	direct    *os.File     // the same file with O_DIRECT, or nil
	noDirect  atomic.Bool  // set when a direct write was refused: the page cache from then on
	remaining atomic.Int64 // parts not yet written; the last one's worker closes the file
	metrics   *metrics
}

type record struct {
	file   int
	off, n int64
	crc    uint64
	hasCRC bool
	part   uint32 // the part's CRC32C
	peer   bool   // taken from a peer
}

// download fetches every missing part and verifies every file. It runs as a pipeline: one
// producer hands out parts in file order (with a swarm, a board from which workers pick), workers
// fetch and write them, one goroutine keeps the journal, and verifiers check each file as its
// last part lands, so verification overlaps the download.
func (r *run) download(ctx context.Context) error {
	p := r.newPipeline()
	g, ctx := errgroup.WithContext(ctx)
	var workers sync.WaitGroup
	if r.swarm != nil {
		b, err := p.newBoard()
		if err != nil {
			return p.finish(err)
		}
		// Workers of their own read parts from the source: those never wait behind parts that
		// wait for peers, and the peers waiting for them get them sooner.
		lanes := []Lane{LanePeers, LaneSource}
		b.sourceWorkers = max(1, r.e.concurrency/2)
		for k, n := range []int{r.e.concurrency, b.sourceWorkers} {
			for range n {
				workers.Add(1)
				g.Go(func() error {
					defer workers.Done()
					return p.take(ctx, b, lanes[k])
				})
			}
		}
	} else {
		g.Go(func() error { return p.produce(ctx) })
		for range r.e.concurrency {
			workers.Add(1)
			g.Go(func() error {
				defer workers.Done()
				return p.work(ctx, p.parts)
			})
		}
	}
	for range r.e.verifiers {
		workers.Add(1) // a verifier may journal parts it fetched again
		g.Go(func() error {
			defer workers.Done()
			return p.verify(ctx)
		})
	}
	// Every Add above happens before this Wait starts.
	g.Go(func() error {
		workers.Wait()
		close(p.records)
		return nil
	})
	g.Go(p.keepJournal)
	stopProgress := r.reportProgress()
	err := g.Wait()
	stopProgress()
	return p.finish(err)
}

// pipeline is the channels between download's stages.
type pipeline struct {
	r        *run
	parts    chan part   // producer → workers (without a swarm)
	records  chan record // workers → journal
	toVerify chan int    // files fully written → verifiers
	verified chan int    // files verified → journal

	// pending counts files still to verify; allVerified is closed when it reaches zero, which
	// is how the verifiers know to stop.
	pending     atomic.Int64
	allVerified chan struct{}

	opened []*fileHandle // by the producer; finish closes those a failure left open
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
	return p.eachMissing(func(pt part) error {
		select {
		case p.parts <- pt:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// eachMissing calls fn with every part not yet written, in file order, each with its file
// opened; files with nothing left to write go to the verifiers.
func (p *pipeline) eachMissing(fn func(part) error) error {
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
		p.opened = append(p.opened, h)
		if f.Size == 0 {
			if err := h.close(); err != nil {
				return err
			}
			p.toVerify <- idx
			continue
		}
		h.remaining.Store(int64(len(todo)))
		for _, pt := range todo {
			pt.handle = h
			if err := fn(pt); err != nil {
				return err
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

// work fetches parts from the source, records each in the journal, and hands a file to the
// verifiers when its last part is written.
func (p *pipeline) work(ctx context.Context, parts <-chan part) error {
	for pt := range parts {
		got, err := p.r.partFromSource(ctx, pt, -1)
		if err != nil {
			return err
		}
		if err := p.written(ctx, pt, fetched{sums: got}); err != nil {
			return err
		}
	}
	return nil
}

// written records a part written in the journal, offers it to peers when it came from the
// source, and hands its file to the verifiers when it was the file's last part.
func (p *pipeline) written(ctx context.Context, pt part, got fetched) error {
	r := p.r
	crc, sum, fromPeer := got.sums.crc, got.sums.part, got.fromPeer && !got.checked
	if i, ok := r.plan.whole(pt.file, pt.off, pt.n); ok && !fromPeer {
		r.plan.add(i, sum) // offered to peers from now on; an unchecked peer's part once its file is verified
	}
	rec := record{file: pt.file, off: pt.off, n: pt.n, crc: crc, hasCRC: r.inline[pt.file] != nil, part: sum, peer: fromPeer}
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
		if err := pt.handle.close(); err != nil {
			return err
		}
		p.toVerify <- pt.file
	}
	return nil
}

// take is a worker of lane with a swarm: it picks parts from the board until none is left.
// A part a peer could not send after all goes back on the board; a part read from the source
// is announced as being read before its first byte, and its progress as it goes, so that the
// peers wait for it, and claim it if it stalls.
func (p *pipeline) take(ctx context.Context, b *board, lane Lane) error {
	r := p.r
	for {
		asked := time.Now()
		pt, i, ok, err := b.next(ctx, r.swarm, lane)
		if !ok || err != nil {
			return err
		}
		if lane == LanePeers {
			r.e.metrics.peerWait.Add(time.Since(asked).Seconds()) // waiting for a peer to hold a part
		}
		if lane == LanePeers {
			got, err := r.partFromPeers(ctx, pt)
			if err != nil {
				return err
			}
			if !got.fromPeer {
				b.put(i)
				continue
			}
			if err := p.written(ctx, pt, got); err != nil {
				return err
			}
			b.done()
			continue
		}
		if i >= 0 {
			r.plan.setReading(i, true)
		}
		got, err := r.partFromSource(ctx, pt, i)
		b.sourceRead(i)
		if err != nil {
			if i >= 0 {
				r.plan.setReading(i, false)
			}
			return err
		}
		if err := p.written(ctx, pt, fetched{sums: got}); err != nil {
			return err
		}
		b.done()
	}
}

// sourceRead ends a worker's read of a part from the source taken from the board (i ≥ 0).
func (b *board) sourceRead(i int) {
	if i < 0 {
		return
	}
	b.mu.Lock()
	b.reading--
	b.notify()
	b.mu.Unlock()
}

// board is the parts a download with a swarm still wants, which its workers pick from.
type board struct {
	mu      sync.Mutex
	pending []int        // parts no worker has taken, by plan index, in file order
	parts   map[int]part // every part that may come from peers, by plan index
	direct  []part       // parts read from the source whatever peers hold: files no peer may supply, ranges resumed from another part size
	left    int          // parts not yet written
	changed chan struct{}
	// reading is how many parts of pending the source workers read now, of sourceWorkers; a
	// SourceSharer swarm may allow fewer.
	reading, sourceWorkers int
}

// newBoard opens every file with parts missing and puts its parts on a board.
func (p *pipeline) newBoard() (*board, error) {
	r := p.r
	b := &board{parts: map[int]part{}, changed: make(chan struct{})}
	err := p.eachMissing(func(pt part) error {
		b.left++
		if i, ok := r.plan.whole(pt.file, pt.off, pt.n); ok && r.peerable[pt.file] {
			b.pending = append(b.pending, i)
			b.parts[i] = pt
			return nil
		}
		b.direct = append(b.direct, pt)
		return nil
	})
	return b, err
}

// next is the part a worker of lane takes next, with its plan index (-1 for a direct part);
// ok is false once every part is written. It waits while the swarm picks none, until the
// peers or the board change, or half a second passes.
func (b *board) next(ctx context.Context, sw Swarm, lane Lane) (_ part, _ int, ok bool, _ error) {
	for {
		peers := sw.Changed()
		b.mu.Lock()
		if b.left == 0 {
			b.mu.Unlock()
			return part{}, -1, false, nil
		}
		if lane == LaneSource && len(b.direct) > 0 {
			pt := b.direct[0]
			b.direct = b.direct[1:]
			b.mu.Unlock()
			return pt, -1, true, nil
		}
		if len(b.pending) > 0 && (lane != LaneSource || b.reading == 0 || b.reading < sourceReads(sw, b.sourceWorkers)) {
			i := sw.Pick(b.pending, lane)
			if k, found := slices.BinarySearch(b.pending, i); i >= 0 && found {
				b.pending = slices.Delete(b.pending, k, k+1)
				if lane == LaneSource {
					b.reading++
				}
				pt := b.parts[i]
				b.mu.Unlock()
				return pt, i, true, nil
			}
		}
		mine := b.changed
		b.mu.Unlock()
		t := time.NewTimer(time.Second / 2)
		select {
		case <-mine:
		case <-peers:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return part{}, -1, false, ctx.Err()
		}
		t.Stop()
	}
}

// sourceReads is how many of workers sw lets read parts from the source at once (at least one:
// next asks only while one reads already).
func sourceReads(sw Swarm, workers int) int {
	if s, ok := sw.(SourceSharer); ok {
		return min(workers, max(1, s.SourceReads(workers)))
	}
	return workers
}

// put returns part i to the board, for any worker to pick again.
func (b *board) put(i int) {
	b.mu.Lock()
	k, _ := slices.BinarySearch(b.pending, i)
	b.pending = slices.Insert(b.pending, k, i)
	b.notify()
	b.mu.Unlock()
}

// done notes that a part taken from the board is written.
func (b *board) done() {
	b.mu.Lock()
	b.left--
	b.notify()
	b.mu.Unlock()
}

func (b *board) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
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
			r.journal.written(rec)
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
			if err := p.checkFile(ctx, idx); err != nil {
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

// checkFile verifies file idx. When it does not match and parts of it came from peers, those
// parts are read again from the source (a peer whose part then differs is reported and
// dropped), and the file is verified once more. A verified file's parts are all offered.
func (p *pipeline) checkFile(ctx context.Context, idx int) error {
	r := p.r
	err := r.verifyFile(ctx, idx)
	var verr *VerificationError
	if errors.As(err, &verr) {
		if again, rerr := p.refetchPeerParts(ctx, idx); rerr != nil {
			return rerr
		} else if again {
			err = r.verifyFile(ctx, idx)
		}
	}
	if err != nil {
		return err
	}
	return r.fillPartCRCs(ctx, idx)
}

// refetchPeerParts reads again from the source the parts of file idx that came from peers,
// reporting it true when there were any.
func (p *pipeline) refetchPeerParts(ctx context.Context, idx int) (bool, error) {
	r := p.r
	r.peerMu.Lock()
	var parts []int
	for i := r.plan.first[idx]; i < r.plan.first[idx+1]; i++ {
		if r.peerOf[i] != "" {
			parts = append(parts, i)
		}
	}
	r.peerMu.Unlock()
	if len(parts) == 0 {
		return false, nil
	}
	f := r.listing.Files[idx]
	fh, err := r.root.OpenFile(filepath.FromSlash(f.Path), os.O_WRONLY, 0)
	if err != nil {
		return false, err
	}
	defer fh.Close()
	h := &fileHandle{f: fh, metrics: r.e.metrics}
	for _, i := range parts {
		_, off, n := r.plan.Part(i)
		had := r.plan.crcs[i].Load()
		r.plan.held[i].Store(false)
		got, err := r.partFromSource(ctx, part{file: idx, off: off, n: n, handle: h}, -1)
		if err != nil {
			return false, err
		}
		crc, partCRC := got.crc, got.part
		r.peerMu.Lock()
		peer := r.peerOf[i]
		delete(r.peerOf, i)
		delete(r.heldBack, i)
		r.peerMu.Unlock()
		if partCRC != had {
			r.e.metrics.peerFailures.Inc()
			r.swarm.Bad(peer, i, &PeerMismatchError{Peer: peer, Part: i, Want: partCRC, Got: had})
		}
		r.crcMu.Lock()
		for k, pc := range r.crcs[idx] {
			if pc.off == off {
				r.crcs[idx][k].crc = crc
			}
		}
		r.crcMu.Unlock()
		r.plan.add(i, partCRC)
		select {
		case p.records <- record{file: idx, off: off, n: n, crc: crc, hasCRC: r.inline[idx] != nil, part: partCRC}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return true, fh.Sync()
}

// finish flushes and syncs what the journal knows, whatever happened, so that a rerun resumes
// from here; a file that failed verification is removed, so that the next run fetches it again.
func (p *pipeline) finish(err error) error {
	r := p.r
	for _, h := range p.opened {
		if h.remaining.Load() > 0 { // the others were closed when their last part was written
			_ = h.close()
		}
	}
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
	h := &fileHandle{f: file, metrics: r.e.metrics}
	if r.e.directIO && r.inline[idx] != nil && f.Size >= directAlign {
		if h.direct, err = r.openDirect(rel); err != nil {
			file.Close()
			return nil, err
		}
	}
	return h, nil
}

// sums are the checksums of the bytes a copy has written: the file's inline CRC (when it is
// verified inline) and the part's CRC32C. A copy that resumes after a failure continues them.
type sums struct {
	crc  uint64
	part uint32
}

// fetched is one part as it was written: its checksums, and whether a peer supplied it.
type fetched struct {
	sums     sums
	fromPeer bool
	// checked: the peer's part had the SHA-256 a trusted reader vouches for, and is as good as
	// one read from the source.
	checked bool
}

// partFromSource reads one part from the source, retrying transient failures from the byte it
// had reached. When it is part i of the plan (i ≥ 0) being read for peers, its progress is
// recorded there.
func (r *run) partFromSource(ctx context.Context, p part, i int) (sums, error) {
	e := r.e
	f := r.listing.Files[p.file]
	req := copyReq{h: p.handle, path: f.Path, off: p.off, n: p.n, kind: r.inline[p.file], fromSource: true, track: i, base: p.off, clock: newPartClock()}
	end := p.off + p.n
	var lastErr error
	for attempt := 0; attempt < e.maxAttempts; attempt++ {
		// Marked only when there may be a wait: most reads have none, and this is every part's path.
		waited := func() {}
		if attempt > 0 || e.budget.mayWait() {
			waited = r.waitOnOrigin(i)
		}
		if attempt > 0 {
			e.metrics.retries.Inc()
			if err := sleep(ctx, e.backoff(attempt)); err != nil {
				waited()
				return sums{}, err
			}
		}
		release, err := e.budget.acquire(ctx)
		waited()
		if err != nil {
			return sums{}, err
		}
		got, err := r.copyRange(ctx, req)
		release()
		e.budget.observe(err)
		req.off, req.n, req.sums = req.off+got.n, req.n-got.n, got.sums
		if err == nil && req.off == end {
			req.clock.observe(e.metrics, "source")
			return req.sums, nil
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if ctx.Err() != nil {
			return sums{}, ctx.Err()
		}
		if !source.Retryable(err) {
			return sums{}, fmt.Errorf("%s: %w", f.Path, err)
		}
		if got.n > 0 {
			attempt = 0 // progress was made: the budget is for a stuck part, not a long one
		}
		lastErr = err
	}
	return sums{}, fmt.Errorf("%s: giving up after %d tries: %w", f.Path, e.maxAttempts, lastErr)
}

// maxPeerTries is how many peers one part is asked of before it is read from the source.
const maxPeerTries = 3

// partFromPeers asks the swarm for one part. A part that does not arrive whole, or whose bytes
// do not have the CRC32C the peer vouches for, or (a vouched file's) the SHA-256 the trusted
// reader vouches for, is reported (the peer is dropped) and asked of another peer; fromPeer is
// false when the part is to be read from the source.
func (r *run) partFromPeers(ctx context.Context, p part) (fetched, error) {
	idx, whole := r.plan.whole(p.file, p.off, p.n)
	if !whole {
		return fetched{}, nil // resumed from another part size: not a part peers know
	}
	f := r.listing.Files[p.file]
	req := copyReq{h: p.handle, path: f.Path, off: p.off, n: p.n, kind: r.inline[p.file], clock: newPartClock()}
	var want [sha256.Size]byte
	if r.vouched[p.file] {
		var ok bool
		if want, ok = r.digests.PartSHA256(r.listing.Revision, f, p.off, p.n); !ok {
			return fetched{}, nil // nothing to check it by yet
		}
	}
	for range maxPeerTries {
		asked := time.Now()
		pp, err := r.swarm.Part(ctx, idx)
		r.e.metrics.peerWait.Add(time.Since(asked).Seconds())
		switch {
		case ctx.Err() != nil:
			return fetched{}, ctx.Err()
		case errors.Is(err, ErrFromSource):
			return fetched{}, nil
		case err != nil:
			continue
		}
		if r.vouched[p.file] {
			req.sha = sha256.New()
		}
		c, err := r.copyBody(ctx, pp.Body, req)
		pp.Body.Close()
		var gotSHA []byte
		if req.sha != nil {
			gotSHA = req.sha.Sum(nil)
		}
		switch {
		case err == nil && c.n == p.n && c.sums.part == pp.CRC32C && (req.sha == nil || bytes.Equal(gotSHA, want[:])):
			r.fromPeers.Add(c.n)
			r.done.Add(c.n)
			r.e.metrics.peerBytes.Add(float64(c.n))
			req.clock.observe(r.e.metrics, "peer")
			if req.sha != nil {
				return fetched{sums: c.sums, fromPeer: true, checked: true}, nil
			}
			r.tainted[p.file].Store(true)
			r.peerMu.Lock()
			r.peerOf[idx] = pp.Peer
			r.heldBack[idx] = c.sums.part
			r.peerMu.Unlock()
			return fetched{sums: c.sums, fromPeer: true}, nil
		case ctx.Err() != nil:
			return fetched{}, ctx.Err()
		case err == nil && c.n == p.n && c.sums.part != pp.CRC32C:
			err = &PeerMismatchError{Peer: pp.Peer, Part: idx, Want: pp.CRC32C, Got: c.sums.part}
		case err == nil && c.n == p.n:
			err = &PeerMismatchError{Peer: pp.Peer, Part: idx, Want: pp.CRC32C, Got: c.sums.part,
				WantSHA256: hex.EncodeToString(want[:]), GotSHA256: hex.EncodeToString(gotSHA)}
		case err == nil:
			err = io.ErrUnexpectedEOF
		}
		r.e.metrics.peerFailures.Inc()
		r.swarm.Bad(pp.Peer, idx, err)
	}
	return fetched{}, nil
}

// copyReq is one copy of a byte range into a file being written.
type copyReq struct {
	h    *fileHandle
	path string
	// off and n are the range, at the same offsets in the source file and in h.
	off, n int64
	// kind is the file's inline checksum (nil: the file is verified by reading it back).
	kind *crcKind
	// sums are the checksums of the part's bytes before off, which the copy continues.
	sums sums
	// fromSource marks bytes read from the source: paced by the origin budget, and counted as
	// done and fetched as they land (a peer's count once the whole part is checked).
	fromSource bool
	// track, when ≥ 0, is the plan's part these bytes are, from base on: how far it is read is
	// recorded in the plan as the bytes arrive, for the peers waiting for it.
	track int
	base  int64
	// sha, when set, hashes the bytes too (a peer's part of a vouched file).
	sha hash.Hash
	// clock, when set, is told of every read that brings bytes.
	clock *partClock
}

// copied is what a copy wrote: n bytes, all good even when the copy ended in an error, and
// the checksums through them.
type copied struct {
	n    int64
	sums sums
}

// copyRange streams the range of the source file into the request's file.
func (r *run) copyRange(ctx context.Context, req copyReq) (copied, error) {
	body, err := r.src.OpenRange(ctx, req.path, req.off, req.n)
	if err != nil {
		return copied{sums: req.sums}, err
	}
	defer body.Close()
	if req.track >= 0 {
		// Every read from the network moves the part for the peers, not each chunk: a chunk
		// can be the whole part, and take longer than a peer waits for a part to move.
		return r.copyBody(ctx, &progressReader{r: body, plan: r.plan, part: req.track, at: req.off - req.base}, req)
	}
	return r.copyBody(ctx, body, req)
}

// progressReader records in the plan how far a part being read from the source is.
type progressReader struct {
	r    io.Reader
	plan *Plan
	part int
	at   int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.at += int64(n)
		p.plan.readTo(p.part, p.at)
	}
	return n, err
}

// copyBody is copyRange's loop over a body already open.
func (r *run) copyBody(ctx context.Context, body io.Reader, req copyReq) (copied, error) {
	body = req.clock.reader(body)
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	buf := *bufp
	out := copied{sums: req.sums}
	for out.n < req.n {
		at := req.off + out.n
		want := writeLen(at, min(int64(len(buf)), req.n-out.n))
		if err := r.paced(ctx, req, int(want)); err != nil {
			return out, err
		}
		got, rerr := io.ReadFull(body, buf[:want])
		if got > 0 {
			if werr := req.h.writeAt(buf[:got], at); werr != nil {
				return out, fmt.Errorf("writing %s: %w", req.path, werr)
			}
			if req.kind != nil {
				out.sums.crc = req.kind.update(out.sums.crc, buf[:got])
			}
			out.sums.part = crc32.Update(out.sums.part, castagnoli, buf[:got])
			if req.sha != nil {
				req.sha.Write(buf[:got])
			}
			out.n += int64(got)
			if req.fromSource {
				r.done.Add(int64(got))
				r.fetched.Add(int64(got))
				r.e.metrics.bytes.Add(float64(got))
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) && out.n < req.n {
				rerr = io.ErrUnexpectedEOF
			}
			return out, rerr
		}
	}
	return out, nil
}

// paced waits for n bytes of the engine's rate limit and, for the source, of the origin's
// budget; a part read for the peers meanwhile says it waits on the origin (Plan.setWaiting).
func (r *run) paced(ctx context.Context, req copyReq, n int) error {
	if r.e.limiter == nil && (!req.fromSource || r.e.budget == nil || r.e.budget.limiter == nil) {
		return nil
	}
	if req.fromSource {
		defer r.waitOnOrigin(req.track)()
	}
	if lim := r.e.limiter; lim != nil {
		if err := lim.WaitN(ctx, n); err != nil {
			return err
		}
	}
	if req.fromSource {
		return r.e.budget.wait(ctx, n)
	}
	return nil
}

// waitOnOrigin marks part i (when ≥ 0: a part read for the peers) as waiting on the origin, until
// the function it returns is called.
func (r *run) waitOnOrigin(i int) func() {
	if i < 0 {
		return func() {}
	}
	r.plan.setWaiting(i, true)
	return func() { r.plan.setWaiting(i, false) }
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
