package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Fetch downloads req.Source into req.Dest. See the package documentation.
func (e *Engine) Fetch(ctx context.Context, req Request) (Result, error) {
	start := e.now()
	dest, err := filepath.Abs(req.Dest)
	if err != nil {
		return Result{}, err
	}
	e.report(Progress{Phase: PhaseListing})
	listing, err := list(ctx, req.Source, req.Revision)
	if err != nil {
		return Result{}, err // sources say what they were listing
	}
	if err := checkPaths(listing.Files); err != nil {
		return Result{}, &invalidModelError{fmt.Errorf("%s: %w", req.Source, err)}
	}
	res := Result{Files: len(listing.Files), Revision: listing.Revision}
	for _, f := range listing.Files {
		res.Bytes += f.Size
	}

	// Already there?
	if m, err := ReadManifest(dest); err == nil {
		if m.Matches(listing) {
			res.UpToDate = true
			res.Duration = e.now().Sub(start)
			e.report(Progress{Phase: PhaseDone, BytesDone: res.Bytes, BytesTotal: res.Bytes, FilesDone: res.Files, FilesTotal: res.Files})
			return res, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return res, err
	} else if entries, err := os.ReadDir(dest); err == nil && len(entries) > 0 {
		return res, fmt.Errorf("%s: %w (remove it or choose another directory)", dest, ErrDestNotOurs)
	}

	run, err := e.prepare(dest, req.Source, listing, req.TrustPeers, req.Digests)
	if err != nil {
		return res, err
	}
	defer run.close()
	if run.swarm = req.Swarm; run.swarm != nil {
		run.swarm.Join(ctx, run.plan)
		defer run.swarm.Leave()
	}
	err = run.download(ctx)
	res.Fetched, res.FromPeers = run.fetched.Load(), run.fromPeers.Load()
	if err != nil {
		return res, err
	}
	e.report(run.snapshot(PhasePublishing))
	if err := run.publish(dest, req.Source.String()); err != nil {
		return res, err
	}
	run.plan.dir.Store(&dest) // offered from where it now is
	res.Duration = e.now().Sub(start)
	e.report(run.snapshot(PhaseDone))
	return res, nil
}

// run is one Fetch's download into its partial directory: what it reads and where it writes,
// and, each in its own part, its progress, its files' checksums and its exchange with peers.
type run struct {
	e       *Engine
	src     source.Source
	listing source.Listing
	planID  string
	dir     string
	root    *os.Root
	resume  resumeState
	journal *journal

	counters
	checksums
	peering
}

// counters are a run's progress, read by its progress reports while the parts land.
type counters struct {
	done      atomic.Int64 // bytes written (including resumed ones)
	fetched   atomic.Int64 // bytes read from the source by this run
	fromPeers atomic.Int64 // bytes taken from peers by this run
	filesDone atomic.Int64
	total     int64
	allocated int64  // bytes of files already present in the partial directory
	release   func() // gives back the space claimed for the run (nil: none)
	rate      rateMeter
}

// checksums are what a run verifies its files with.
type checksums struct {
	// inline[i] is the CRC file i is checksummed with as its parts stream in (nil: verified by
	// reading it back); crcs[i] are its parts' CRCs so far, guarded by crcMu.
	inline []*crcKind
	crcMu  sync.Mutex
	crcs   [][]partCRC
	// recorded[i] is, for a file the source gave no checksum for, the CRC64NVME the engine
	// computed as it wrote it (base64), kept in the manifest so that the file's content can be
	// re-verified later. Each is written by the file's one verifier.
	recorded []string
}

// peering is a run's exchange of parts with other nodes.
type peering struct {
	// plan is the model cut into parts, with the parts this run holds; swarm, when set, is
	// where parts may come from other than the source. peerOf[i] names the peer part i came
	// from, if any (guarded by peerMu).
	// peerable[i] says file i's parts may come from peers, when there is a swarm (a digest
	// vouches for it, or Request.TrustPeers); tainted[i], that some did (in this run or one it
	// resumes), so that only a digest verifies it. heldBack[i] is the CRC32C of part i taken
	// from a peer: it is offered on only once its file is verified (guarded by peerMu).
	plan     *Plan
	swarm    Swarm
	peerable []bool
	// vouched[i] says file i's peer parts are each checked against the SHA-256 digests vouches
	// for (the source has no digest of the file, and peers are not trusted): such a part is
	// as good as one read from the source once checked.
	vouched  []bool
	digests  PartDigests
	tainted  []atomic.Bool
	peerMu   sync.Mutex
	peerOf   map[int]string
	heldBack map[int]uint32
}

func (e *Engine) prepare(dest string, src source.Source, listing source.Listing, trustPeers bool, digests PartDigests) (*run, error) {
	r := &run{e: e, src: src, listing: listing, planID: planHash(listing.Files, listing.Revision), dir: partialDir(dest)}
	r.peerable, r.tainted = make([]bool, len(listing.Files)), make([]atomic.Bool, len(listing.Files))
	r.vouched, r.digests = make([]bool, len(listing.Files)), digests
	for i, f := range listing.Files {
		r.total += f.Size
		r.vouched[i] = digests != nil && !trustPeers && !f.Checksums.Cryptographic()
		r.peerable[i] = trustPeers || f.Checksums.Cryptographic() || r.vouched[i]
	}
	jpath := filepath.Join(r.dir, journalName)
	st, resuming, err := readJournal(jpath, r.planID)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", jpath, err)
	}
	if !resuming {
		st = newResumeState()
	}
	// A file the journal calls written but whose size on disk is wrong was truncated or
	// replaced: forget it. The others are already allocated.
	var stale []int
	for idx := range st.written {
		f := listing.Files[idx]
		info, err := os.Stat(filepath.Join(r.dir, filepath.FromSlash(f.Path)))
		// A file with parts from peers that no digest can now check (the peers were trusted
		// then, not now) is fetched again from the source.
		untrusted := st.fromPeers[idx] && !st.verified[idx] && !r.peerable[idx]
		if err != nil || info.Size() != f.Size || untrusted {
			stale = append(stale, idx)
			continue
		}
		r.allocated += f.Size
	}
	for _, idx := range stale {
		delete(st.written, idx)
		delete(st.verified, idx)
		delete(st.crcs, idx)
		delete(st.fromPeers, idx)
	}
	r.resume = st
	r.plan, r.peerOf, r.heldBack = newPlan(listing, e.partSize, r.dir), map[int]string{}, map[int]uint32{}
	if digests != nil {
		r.plan.check = r.checkable
	}
	for idx := range st.fromPeers {
		r.tainted[idx].Store(true)
	}
	for k, crc := range st.partCRC {
		if st.fromPeers[k.file] && !st.verified[k.file] {
			continue // offered once the file is verified (fillPartCRCs)
		}
		if i, ok := r.plan.index(k.file, k.off); ok && st.written[k.file] != nil && st.written[k.file].covers(k.off, r.plan.partLen(i)) {
			r.plan.add(i, crc)
		}
	}
	r.inline = make([]*crcKind, len(listing.Files))
	r.crcs = make([][]partCRC, len(listing.Files))
	r.recorded = make([]string, len(listing.Files))
	for i, f := range listing.Files {
		r.inline[i], _ = inlineKind(f.Checksums)
		if f.Checksums.Empty() {
			r.inline[i] = crc64NVMEKind // nothing to check against: record a CRC to re-verify with later
		}
		r.crcs[i] = st.crcs[i]
	}

	// Nothing is written before the model is known to fit.
	if err := e.checkSpace(r, dest); err != nil {
		return nil, err
	}

	if err := r.open(jpath, resuming, stale); err != nil {
		r.close() // gives back the space claimed
		return nil, err
	}
	return r, nil
}

// open makes the partial directory and its journal (or reopens them, resuming), and opens the
// directory for the run's writes.
func (r *run) open(jpath string, resuming bool, stale []int) error {
	var err error
	if !resuming {
		// Nothing to resume, or the source changed since: start clean.
		if err := os.RemoveAll(r.dir); err != nil {
			return err
		}
		if err := os.MkdirAll(r.dir, 0o755); err != nil {
			return err
		}
		r.journal, err = createJournal(jpath, r.planID)
	} else {
		r.journal, err = appendJournal(jpath)
	}
	if err != nil {
		return err
	}
	for _, idx := range stale {
		r.journal.reset(idx)
	}
	if r.root, err = os.OpenRoot(r.dir); err != nil {
		return err
	}
	return r.journal.flush()
}

func (r *run) close() {
	if r.release != nil {
		r.release()
	}
	if r.root != nil {
		r.root.Close()
	}
	if r.journal != nil {
		r.journal.close()
	}
}

// checkSpace fails before any byte is written when the rest of the model cannot fit.
func (e *Engine) checkSpace(r *run, dest string) error {
	need := r.total - r.allocated
	if e.claimSpace != nil {
		release, err := e.claimSpace(existingAncestor(r.dir), need)
		r.release = release
		return err
	}
	free, err := e.freeSpace(existingAncestor(r.dir))
	if err != nil {
		return fmt.Errorf("checking free space under %s: %w", filepath.Dir(dest), err)
	}
	if need > free {
		return &InsufficientSpaceError{Need: need, Free: free, Dir: filepath.Dir(dest)}
	}
	return nil
}

// existingAncestor returns dir or its nearest ancestor that exists.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	if st.Blocks == 0 {
		// A filesystem that keeps no count of its blocks (ramfs, some FUSE filesystems) says
		// none are free and none exist: there is nothing to check against.
		return math.MaxInt64, nil
	}
	return int64(st.Bavail) * st.Bsize, nil
}

func (r *run) snapshot(phase Phase) Progress {
	return Progress{
		Phase:          phase,
		BytesDone:      r.done.Load(),
		BytesTotal:     r.total,
		FilesDone:      int(r.filesDone.Load()),
		FilesTotal:     len(r.listing.Files),
		BytesPerSecond: r.rate.rate(r.e.now(), r.fetched.Load()+r.fromPeers.Load()),
		Fetched:        r.fetched.Load(),
		FromPeers:      r.fromPeers.Load(),
	}
}

func (e *Engine) report(p Progress) {
	if e.progress != nil {
		e.progress(p)
	}
}

// rateMeter turns a byte counter into a recent rate (an exponentially weighted average).
type rateMeter struct {
	mu    sync.Mutex
	last  time.Time
	bytes int64
	value float64
}

func (m *rateMeter) rate(now time.Time, total int64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last.IsZero() {
		m.last, m.bytes = now, total
		return 0
	}
	dt := now.Sub(m.last).Seconds()
	if dt < 0.05 {
		return m.value
	}
	inst := float64(total-m.bytes) / dt
	if m.value == 0 {
		m.value = inst
	} else {
		m.value = 0.5*m.value + 0.5*inst
	}
	m.last, m.bytes = now, total
	return m.value
}

// Manifest records what a destination holds; it is written last, just before the rename.
type Manifest struct {
	Version  int           `json:"version"`
	Source   string        `json:"source"`
	Revision string        `json:"revision,omitempty"`
	Files    []source.File `json:"files"`
	// Recorded are CRC64NVME checksums (base64, by path) the engine computed while writing the
	// files the source gave no checksum for: what the content can be re-verified against.
	Recorded map[string]string `json:"recorded,omitempty"`
	// PartSize and PartCRC32C are the parts the files were cut into and each part's CRC32C
	// (base64 of big-endian uint32s, by path): what the node offers peers each part with.
	PartSize    int64             `json:"partSize,omitempty"`
	PartCRC32C  map[string]string `json:"partCRC32C,omitempty"`
	CompletedAt time.Time         `json:"completedAt"`
}

// checksums returns what file f's content can be checked against: the source's checksums, or
// the one the engine recorded.
func (m *Manifest) checksums(f source.File) source.Checksums {
	if f.Checksums.Empty() && m.Recorded[f.Path] != "" {
		return source.Checksums{CRC64NVME: m.Recorded[f.Path]}
	}
	return f.Checksums
}

// list lists src, names the content when the source has no revision of its own, and refuses
// another revision than want (when set).
func list(ctx context.Context, src source.Source, want string) (source.Listing, error) {
	l, err := src.List(ctx)
	if err != nil {
		return l, err
	}
	if l.Revision == "" {
		l.Revision = source.ContentRevision(l.Files)
	}
	if want != "" && l.Revision != want {
		return l, fmt.Errorf("%s now holds revision %s, not %s: %w", src, l.Revision, want, ErrSourceChanged)
	}
	return l, nil
}

// Matches reports whether the manifest records exactly this listing. A manifest written before
// content revisions were recorded matches on its files alone.
func (m *Manifest) Matches(l source.Listing) bool {
	return (m.Revision == l.Revision || (m.Revision == "" && l.Revision == source.ContentRevision(l.Files))) && slices.EqualFunc(m.Files, l.Files, func(a, b source.File) bool {
		return a.Path == b.Path && a.Size == b.Size && a.Version == b.Version
	})
}

// ReadManifest reads the manifest of a completed destination.
func ReadManifest(dest string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dest, manifestName))
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	if err := json.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dest, manifestName), err)
	}
	return m, nil
}

// CheckDest re-checks a completed destination cheaply: the manifest is there and every file
// has its recorded size. It reads no file contents. The error names the first file that does
// not match.
func CheckDest(dest string) (*Manifest, error) {
	m, damaged, err := Check(context.Background(), dest, CheckOptions{})
	if err == nil && len(damaged) > 0 {
		err = fmt.Errorf("%s: %s", damaged[0].Path, damaged[0].Problem)
	}
	return m, err
}

// checkable reports whether a peer's copy of part i can be checked now (Plan.Checkable): a
// part of a vouched file once the trusted reader knows it, any other part a peer may supply.
func (r *run) checkable(i int) bool {
	f, off, n := r.plan.Part(i)
	if !r.vouched[f] {
		return true
	}
	_, ok := r.digests.PartSHA256(r.listing.Revision, r.listing.Files[f], off, n)
	return ok
}
