// Package engine turns "this model at this source" into "these exact bytes, verified, in this
// directory", as fast as the disk and the network allow. It has no Kubernetes imports: the node
// agent, the inference pods' init container and the command line all use it.
//
// A Fetch lists the source, checks that the files fit, downloads them as parallel ranged reads
// written at their offsets into preallocated files in a partial directory beside the
// destination, verifies every file (size always, and the strongest checksum the source gives),
// writes a manifest, syncs, and renames the partial directory into place. A reader never sees a
// partial result. A Fetch killed at any point resumes from a journal of what was written.
package engine

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Defaults, chosen by measurement (docs/benchmarks.md).
const (
	DefaultConcurrency = 64
	DefaultPartSize    = 16 << 20
	DefaultMaxAttempts = 10
)

// Engine downloads models. It is safe for concurrent use by several Fetch calls, each into its
// own destination.
type Engine struct {
	concurrency      int
	partSize         int64
	maxAttempts      int
	retryBase        time.Duration
	retryMax         time.Duration
	limiter          *rate.Limiter
	budget           *Budget
	progress         func(Progress)
	progressInterval time.Duration
	verifiers        int
	freeSpace        func(dir string) (int64, error)
	claimSpace       ClaimSpace
	syncInterval     time.Duration
	directIO         bool
	metrics          *metrics
	now              func() time.Time
}

// Option configures an Engine.
type Option func(*Engine)

// WithConcurrency sets how many ranged reads are in flight at once, across all files.
func WithConcurrency(n int) Option { return func(e *Engine) { e.concurrency = max(1, n) } }

// WithPartSize sets the size of each ranged read.
func WithPartSize(n int64) Option { return func(e *Engine) { e.partSize = max(64<<10, n) } }

// WithRetry sets how many times a part is tried, and the backoff between tries (doubling from
// base up to maxDelay, with full jitter).
func WithRetry(attempts int, base, maxDelay time.Duration) Option {
	return func(e *Engine) { e.maxAttempts, e.retryBase, e.retryMax = max(1, attempts), base, maxDelay }
}

// WithRateLimit caps the download rate in bytes per second (0: no cap).
func WithRateLimit(bytesPerSecond int64) Option {
	return func(e *Engine) {
		if bytesPerSecond > 0 {
			e.limiter = rate.NewLimiter(rate.Limit(bytesPerSecond), int(min(bytesPerSecond, chunkSize)))
		}
	}
}

// WithProgress calls fn with the download's progress every interval, and once at the end.
func WithProgress(fn func(Progress), interval time.Duration) Option {
	return func(e *Engine) { e.progress, e.progressInterval = fn, interval }
}

// WithFreeSpace replaces the free-space probe (for tests).
func WithFreeSpace(fn func(dir string) (int64, error)) Option {
	return func(e *Engine) { e.freeSpace = fn }
}

// ClaimSpace is asked, before a download writes anything, for the bytes it still needs under
// dir. It returns an *InsufficientSpaceError when they do not fit, or a release that the
// engine calls when the download ends (done or not): a caller that runs several downloads on
// one disk keeps the bytes promised to each from being promised twice.
type ClaimSpace func(dir string, need int64) (release func(), err error)

// WithClaimSpace decides whether a download fits with fn instead of the free-space probe.
func WithClaimSpace(fn ClaimSpace) Option {
	return func(e *Engine) { e.claimSpace = fn }
}

// WithRegisterer exports prewarm_engine_* metrics to reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(e *Engine) { e.metrics = newMetrics(reg) }
}

// New returns an Engine.
func New(opts ...Option) *Engine {
	e := &Engine{
		concurrency:      DefaultConcurrency,
		partSize:         DefaultPartSize,
		maxAttempts:      DefaultMaxAttempts,
		retryBase:        200 * time.Millisecond,
		retryMax:         10 * time.Second,
		progressInterval: time.Second,
		verifiers:        max(1, runtime.GOMAXPROCS(0)),
		freeSpace:        freeBytes,
		syncInterval:     2 * time.Second,
		directIO:         true,
		now:              time.Now,
	}
	for _, o := range opts {
		o(e)
	}
	if e.metrics == nil {
		e.metrics = newMetrics(nil)
	}
	return e
}

// Request is one model to fetch.
type Request struct {
	// Source holds the model.
	Source source.Source
	// Dest is the directory that will hold the model's files, and nothing else but prewarm's
	// dot-named manifest. It must not exist, be empty, or hold an earlier Fetch's result.
	Dest string
	// Revision, when set, is the only revision to fetch: a source that now lists another
	// (objects rewritten under the same prefix) fails with ErrSourceChanged, and nothing is
	// downloaded.
	Revision string
	// Swarm, when set, shares parts with other nodes fetching the same revision. Parts are
	// taken from peers only for files the source vouches for with a cryptographic digest
	// (source.Checksums.Cryptographic), and such a file is then verified by that digest before
	// it is published or its peer parts are offered on: a peer can change a part's bytes and
	// keep any CRC, never a SHA-256. The other files are read from the source by every node.
	Swarm Swarm
	// TrustPeers takes parts of every file from peers, including those the source gives only a
	// CRC or a size for: a peer that lies about those is caught by nothing. For clusters whose
	// nodes all trust each other (docs/security.md).
	TrustPeers bool
	// Digests, when set, vouches for parts as a reader this node trusts (a witness:
	// package witness) read them from the source. With it, parts of the files the source gives
	// no digest for may come from peers too: each is taken only once Digests knows it, checked
	// against that SHA-256 as it arrives, and offered on at once. Source should then read
	// through the same reader, so that the parts this node reads are vouched for to its peers.
	Digests PartDigests
}

// PartDigests knows the SHA-256 of parts as a trusted reader read them from the source.
type PartDigests interface {
	// PartSHA256 is the SHA-256 of the n bytes at off of file, for listing revision rev, as
	// the reader read them; false when it has not read them. It must not block: an
	// implementation learns of new parts in the background.
	PartSHA256(rev string, file source.File, off, n int64) ([sha256.Size]byte, bool)
}

// Result says what a Fetch did.
type Result struct {
	// Files and Bytes are the model's.
	Files int
	Bytes int64
	// Fetched is how many bytes this call read from the source (less than Bytes when resumed).
	Fetched int64
	// FromPeers is how many bytes this call took from peers instead of the source.
	FromPeers int64
	// Revision is the source revision that was fetched: a Hugging Face commit, or the content
	// revision of the files (source.ContentRevision).
	Revision string
	// UpToDate is true when Dest already held this revision and nothing was fetched.
	UpToDate bool
	// Duration is the wall time of the call.
	Duration time.Duration
}

// Phase is a step of a Fetch.
type Phase string

const (
	PhaseListing     Phase = "Listing"
	PhaseDownloading Phase = "Downloading"
	PhaseVerifying   Phase = "Verifying"
	PhasePublishing  Phase = "Publishing"
	PhaseDone        Phase = "Done"
)

// Progress is a snapshot of a Fetch.
type Progress struct {
	Phase      Phase
	BytesDone  int64
	BytesTotal int64
	FilesDone  int
	FilesTotal int
	// BytesPerSecond is the recent download rate.
	BytesPerSecond float64
	// Fetched is bytes read from the source by this call.
	Fetched int64
	// FromPeers is bytes taken from peers by this call.
	FromPeers int64
}

// InsufficientSpaceError says a model does not fit.
type InsufficientSpaceError struct {
	Need, Free int64
	Dir        string
}

func (e *InsufficientSpaceError) Error() string {
	return fmt.Sprintf("needs %s, %s free under %s", HumanBytes(e.Need), HumanBytes(e.Free), e.Dir)
}

// VerificationError says a file's bytes are not what the source promised.
type VerificationError struct {
	Path, Kind, Want, Got string
	file                  int
}

func (e *VerificationError) Error() string {
	return fmt.Sprintf("%s: %s mismatch: want %s, got %s", e.Path, e.Kind, e.Want, e.Got)
}

// ErrInvalidModel is matched (errors.Is) by errors for a source whose files cannot be stored as
// they are listed (names that would leave the destination, prewarm's reserved names, names
// longer than a file system takes, a file that is also a directory): fetching again will not help.
var ErrInvalidModel = errors.New("the source's files cannot be stored")

type invalidModelError struct{ err error }

func (e *invalidModelError) Error() string        { return e.err.Error() }
func (e *invalidModelError) Unwrap() error        { return e.err }
func (e *invalidModelError) Is(target error) bool { return target == ErrInvalidModel }

// ErrDestNotOurs is returned when Dest holds something that is not a prewarm download.
var ErrDestNotOurs = errors.New("destination exists and is not a prewarm download")

// HumanBytes formats n in decimal units, e.g. "300.0 GB".
func HumanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}

// partialDir is where a download into dest is assembled: beside dest, dot-named, on the same
// filesystem so the final rename is atomic.
func partialDir(dest string) string {
	return filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".prewarm-partial")
}
