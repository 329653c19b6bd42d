package engine

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// A Swarm lets a Fetch take parts from other nodes fetching (or holding) the same revision of
// the same model, instead of from the source, and offers them what this Fetch holds. The engine
// checks every part a Swarm supplies: its bytes must have the CRC32C the peer vouches for, a
// CRC first computed by whichever node read that part from the source, and the file they
// belong to must match the source's own cryptographic digest before it is published or its
// peer parts are offered on (Request.Swarm says which files may come from peers).
// package peer implements it over HTTP.
type Swarm interface {
	// Join is called once the Fetch has its plan; from then until Leave the plan's parts are
	// what this node offers.
	Join(ctx context.Context, plan *Plan)
	// Pick chooses the part a worker of lane takes next among pending: the parts the Fetch
	// still wants that no worker has taken, in file order (the Swarm must not keep the slice).
	// For LanePeers, a part a peer holds; for LaneSource, one this node is to read from the
	// source now. -1 when there is none: the Fetch asks again once Changed is closed, once what
	// it wants changes, or within a second (claims of stalled parts follow the clock).
	Pick(pending []int, lane Lane) int
	// Changed returns a channel closed when what the peers hold or read changes.
	Changed() <-chan struct{}
	// Part returns part i from a peer. ErrFromSource says no peer can send it now.
	Part(ctx context.Context, i int) (PeerPart, error)
	// Bad reports that peer's part i did not arrive whole or did not match: the peer is not
	// asked again by this Fetch.
	Bad(peer string, i int, err error)
	// Leave is called when the Fetch ends.
	Leave()
}

// A SourceSharer is a Swarm that says how many parts this node is to read for its group from
// the source at once (Fetch asks before each; a Swarm without the method: every source worker).
type SourceSharer interface {
	// SourceReads is how many of workers may read parts from the source at once now.
	SourceReads(workers int) int
}

// Lane is the kind of work a download worker does with a Swarm.
type Lane int

const (
	// LanePeers takes parts from peers.
	LanePeers Lane = iota
	// LaneSource reads parts from the source, for this node and the peers that wait for them.
	LaneSource
)

// ErrFromSource is returned by Swarm.Part for a part to read from the source.
var ErrFromSource = errors.New("read the part from the source")

// PeerPart is one part as a peer sends it.
type PeerPart struct {
	// Body is the part's bytes; the engine closes it.
	Body io.ReadCloser
	// CRC32C is what the bytes must hash to (Castagnoli).
	CRC32C uint32
	// Peer names the peer, for Bad and for logs.
	Peer string
}

// PeerMismatchError is a part from a peer whose bytes were not what the peer vouched for, or
// whose file then did not match the source's checksum, or that did not have the SHA-256 a
// trusted reader vouches for (Request.Digests: WantSHA256 and GotSHA256 are set).
type PeerMismatchError struct {
	Peer      string
	Part      int
	Want, Got uint32

	WantSHA256, GotSHA256 string
}

func (e *PeerMismatchError) Error() string {
	if e.WantSHA256 != "" {
		return fmt.Sprintf("part %d from %s: sha256 %s, want %s", e.Part, e.Peer, e.GotSHA256, e.WantSHA256)
	}
	return fmt.Sprintf("part %d from %s: crc32c %08x, want %08x", e.Part, e.Peer, e.Got, e.Want)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Plan is one revision of a model cut into parts, with which parts this node holds: what a
// Swarm asks peers for, and what it offers them. Part i is at Files[File(i)] from offset
// PartSize × (i − its file's first part). Every node of a swarm cuts the same listing into
// the same parts when its part size is the same.
type Plan struct {
	Revision string
	PartSize int64
	Files    []source.File

	first []int // first[f] is file f's first part; first[len(Files)] is the number of parts

	dir     atomic.Pointer[string] // where the files are read from: the partial directory, then dest
	held    []atomic.Bool
	reading []atomic.Bool    // parts this node is reading from the source now
	readAt  []atomic.Int64   // how far this node has read each of them
	waiting []atomic.Bool    // of them, those whose read waits on the origin, not the network
	waits   atomic.Int32     // how many wait
	moved   atomic.Int64     // when a part being read last made the plan change (Unix ns)
	fromUp  atomic.Bool      // this node takes its parts from an upstream group (SetFromUpstream)
	check   func(i int) bool // whether a peer's copy of part i can be checked (nil: every part's)
	crcs    []atomic.Uint32
	mu      sync.Mutex
	version uint64
	changed chan struct{}
}

func newPlan(listing source.Listing, partSize int64, dir string) *Plan {
	p := &Plan{Revision: listing.Revision, PartSize: partSize, Files: listing.Files, changed: make(chan struct{})}
	p.first = make([]int, len(listing.Files)+1)
	for i, f := range listing.Files {
		p.first[i+1] = p.first[i] + int((f.Size+partSize-1)/partSize)
	}
	p.held = make([]atomic.Bool, p.Parts())
	p.reading = make([]atomic.Bool, p.Parts())
	p.readAt = make([]atomic.Int64, p.Parts())
	p.waiting = make([]atomic.Bool, p.Parts())
	p.crcs = make([]atomic.Uint32, p.Parts())
	p.dir.Store(&dir)
	return p
}

// Parts is the number of parts.
func (p *Plan) Parts() int { return p.first[len(p.Files)] }

// Part returns where part i is: its file's index, offset and length.
func (p *Plan) Part(i int) (file int, off, n int64) {
	lo, hi := 0, len(p.Files)
	for hi-lo > 1 { // the last file whose first part is ≤ i
		mid := (lo + hi) / 2
		if p.first[mid] <= i {
			lo = mid
		} else {
			hi = mid
		}
	}
	for lo < len(p.Files)-1 && p.first[lo+1] <= i { // skip empty files
		lo++
	}
	off = int64(i-p.first[lo]) * p.PartSize
	return lo, off, min(p.PartSize, p.Files[lo].Size-off)
}

// index is the part of file f at offset off, when off is on a part boundary.
func (p *Plan) index(f int, off int64) (int, bool) {
	if off%p.PartSize != 0 {
		return 0, false
	}
	return p.first[f] + int(off/p.PartSize), true
}

// Held returns part i's CRC32C when this node holds it.
func (p *Plan) Held(i int) (uint32, bool) {
	if i < 0 || i >= len(p.held) || !p.held[i].Load() {
		return 0, false
	}
	return p.crcs[i].Load(), true
}

// Activity is which parts this node holds and which it is reading from the source now (bit i
// of byte i/8, lowest bit first), and the version it is at: the version grows with every part
// added, started being read, or given up.
func (p *Plan) Activity() (held, reading []byte, version uint64) {
	p.mu.Lock()
	version = p.version
	p.mu.Unlock()
	held = make([]byte, (p.Parts()+7)/8)
	reading = make([]byte, len(held))
	for i := range p.held {
		if p.held[i].Load() {
			held[i/8] |= 1 << (i % 8)
		}
		if p.reading[i].Load() {
			reading[i/8] |= 1 << (i % 8)
		}
	}
	return held, reading, version
}

// Changed returns a channel closed when the plan changes after version v (at once when the plan
// is already past v).
func (p *Plan) Changed(v uint64) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.version > v {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.changed
}

// add offers part i, no longer being read (one change for the peers' long polls).
func (p *Plan) add(i int, crc uint32) {
	p.crcs[i].Store(crc)
	p.held[i].Store(true)
	p.reading[i].Store(false)
	p.bump()
}

// setReading marks part i as being read from the source now, or no longer (a read given up; a
// part read whole stops with add): the peers waiting for it wait on while it is (Swarm.Part).
func (p *Plan) setReading(i int, on bool) {
	p.readAt[i].Store(0)
	if p.reading[i].Swap(on) != on {
		p.bump()
	}
}

// progressEvery is how often progress alone changes the plan: peers see a part being read move
// at least this often, and so tell it from a stalled one.
const progressEvery = int64(time.Second / 2)

// readTo records that part i, being read from the source, has n bytes read.
func (p *Plan) readTo(i int, n int64) {
	p.readAt[i].Store(n)
	now := time.Now().UnixNano()
	if last := p.moved.Load(); now-last >= progressEvery && p.moved.CompareAndSwap(last, now) {
		p.bump()
	}
}

// setWaiting marks part i, being read from the source, as waiting on the origin or no longer:
// for its budget (a pause after 429 or 503, a cap on rate or reads in flight) or a retry's
// backoff. Such a read is not stalled, and reading the part elsewhere would only ask more of an
// origin that asks for less: ReadProgress says -1, which peers count as moving, and the plan
// changes every progressEvery while any part waits, so that they hear it.
func (p *Plan) setWaiting(i int, on bool) {
	if p.waiting[i].Swap(on) == on {
		return
	}
	if !on {
		p.waits.Add(-1)
		return
	}
	if p.waits.Add(1) > 1 {
		return
	}
	go func() {
		t := time.NewTicker(time.Duration(progressEvery))
		defer t.Stop()
		for range t.C {
			if p.waits.Load() == 0 {
				return
			}
			p.bump()
		}
	}()
}

// SetFromUpstream says whether this node takes its parts from an upstream group, reading from the
// source only as a last resort: its peers then count on it for no part (a change for the long
// polls).
func (p *Plan) SetFromUpstream(on bool) {
	if p.fromUp.Swap(on) != on {
		p.bump()
	}
}

// FromUpstream is what SetFromUpstream said last.
func (p *Plan) FromUpstream() bool { return p.fromUp.Load() }

// Checkable reports whether this node can check a peer's copy of part i now, and so take it
// from a peer: always for a file a digest of the source vouches for; for the others, once a
// trusted reader vouches for the part (Request.Digests). A Swarm counts a peer holding a part
// it cannot check as not holding it.
func (p *Plan) Checkable(i int) bool { return p.check == nil || p.check(i) }

// ReadProgress is how many bytes of part i this node has read from the source, while it reads
// it; -1 while the read waits on the origin (setWaiting).
func (p *Plan) ReadProgress(i int) int64 {
	if i < 0 || i >= len(p.readAt) {
		return 0
	}
	if p.waiting[i].Load() {
		return -1
	}
	return p.readAt[i].Load()
}

func (p *Plan) bump() {
	p.mu.Lock()
	p.version++
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// OpenPart opens part i for reading, when this node holds it: its bytes, and the CRC32C they
// had when they were written.
func (p *Plan) OpenPart(i int) (io.ReadCloser, uint32, error) {
	crc, ok := p.Held(i)
	if !ok {
		return nil, 0, os.ErrNotExist
	}
	f, off, n := p.Part(i)
	file, err := os.OpenInRoot(*p.dir.Load(), filepath.FromSlash(p.Files[f].Path))
	if err != nil {
		return nil, 0, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(file, off, n), file}, crc, nil
}

// OpenPublished returns the plan of a completed destination: every part held, with the CRC32Cs
// the manifest records. A destination published before part CRCs were recorded has none to
// offer (ErrNoPartTable).
func OpenPublished(dest string) (*Plan, error) {
	m, err := CheckDest(dest)
	if err != nil {
		return nil, err
	}
	if m.PartSize <= 0 || m.PartCRC32C == nil {
		return nil, ErrNoPartTable
	}
	p := newPlan(source.Listing{Files: m.Files, Revision: m.Revision}, m.PartSize, dest)
	for f, file := range m.Files {
		raw, err := base64.StdEncoding.DecodeString(m.PartCRC32C[file.Path])
		if err != nil || len(raw) != 4*(p.first[f+1]-p.first[f]) {
			return nil, fmt.Errorf("%s: the manifest's part table for %s is damaged", dest, file.Path)
		}
		for k := range p.first[f+1] - p.first[f] {
			i := p.first[f] + k
			p.crcs[i].Store(binary.BigEndian.Uint32(raw[4*k:]))
			p.held[i].Store(true)
		}
	}
	p.version = 1
	return p, nil
}

// ErrNoPartTable says a destination's manifest has no part CRCs to serve its parts with.
var ErrNoPartTable = errors.New("the manifest records no part checksums")

// partTable encodes file f's part CRC32Cs for the manifest.
func (p *Plan) partTable(f int) string {
	raw := make([]byte, 0, 4*(p.first[f+1]-p.first[f]))
	for i := p.first[f]; i < p.first[f+1]; i++ {
		raw = binary.BigEndian.AppendUint32(raw, p.crcs[i].Load())
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// fillPartCRCs computes, by reading them back, the CRC32Cs of file f's parts this run did not
// write itself (resumed from an earlier run), once the file is verified, and marks them all held.
func (r *run) fillPartCRCs(ctx context.Context, f int) error {
	p := r.plan
	file := r.listing.Files[f]
	var fh *os.File
	defer func() {
		if fh != nil {
			fh.Close()
		}
	}()
	for i := p.first[f]; i < p.first[f+1]; i++ {
		if p.held[i].Load() {
			continue
		}
		_, off, n := p.Part(i)
		r.peerMu.Lock()
		crc, ok := r.heldBack[i]
		delete(r.heldBack, i)
		r.peerMu.Unlock()
		if !ok {
			crc, ok = r.resume.partCRC[partKey{f, off}]
		}
		if ok {
			p.add(i, crc)
			continue
		}
		if fh == nil {
			var err error
			if fh, err = r.root.Open(filepath.FromSlash(file.Path)); err != nil {
				return err
			}
		}
		h := crc32.New(castagnoli)
		if _, err := io.Copy(h, io.NewSectionReader(fh, off, n)); err != nil {
			return fmt.Errorf("reading %s to record its parts: %w", file.Path, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p.add(i, h.Sum32())
	}
	return nil
}

// partLen is part i's length.
func (p *Plan) partLen(i int) int64 {
	_, _, n := p.Part(i)
	return n
}

// whole is the part that n bytes of file f at off are, when they are exactly one part (not a
// range resumed from another part size).
func (p *Plan) whole(f int, off, n int64) (int, bool) {
	i, ok := p.index(f, off)
	return i, ok && n > 0 && n == min(p.PartSize, p.Files[f].Size-off)
}
