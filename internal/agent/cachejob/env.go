// Package cachejob keeps one cache on a node: downloads it, re-checks and re-verifies it,
// repairs it, and retries after failures, reporting each step in the cache's status. A Job knows
// nothing of the agent that runs it: it reads and changes what lies outside it only through its
// Env.
package cachejob

import (
	"context"
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Env is everything a job uses of the node it runs on: the settings it runs by, what the
// configuration lets it keep and read, the node's download slots, budgets and counters, the
// space its downloads claim, the parts it offers to peers, and the few things it asks of the
// agent. One Env, made by the agent, serves all its jobs; nothing in it changes after.
type Env struct {
	// NodeName names the node in messages and to the peers.
	NodeName string
	// Now is the clock.
	Now func() time.Time
	// RetryInterval is the first wait before a failed download is tried again; it doubles up to
	// MaxRetryInterval. RecheckInterval is how often a Ready cache is re-checked, VerifyInterval
	// how often its content is read back; ProgressInterval paces the engine's progress reports.
	RetryInterval, MaxRetryInterval, RecheckInterval, VerifyInterval, ProgressInterval time.Duration
	// Reserve is the free space, per root, that caches never take.
	Reserve int64
	// Engine are extra engine options; Registerer, when set, receives the engine's metrics.
	Engine     []engine.Option
	Registerer prometheus.Registerer
	// Swarm, when set, is how the node shares parts with its peers: a download's swarm is made
	// from it (Key, Peers, Refresh and Log are the job's). TrustPeers lets files without a
	// source digest come from peers.
	Swarm      *peer.SwarmOptions
	TrustPeers bool
	// Witness, when set with Swarm, is the witness S3 files without a digest of their own are
	// read through (Job.witnessed).
	Witness *Witness
	// Key opens the credentials the controller seals to this agent.
	Key *credentials.Key

	// Roots are the allowed cache roots; AllowedRoot reports whether root is one of them.
	Roots       func() []string
	AllowedRoot func(root string) bool
	// SourceSpec is how a source is opened; MayRead refuses a source the agent would read with
	// its own identity for a namespace not allowed it; FileSource opens an FSx source's
	// directory inside what its access rule allows.
	SourceSpec func(prewarmv1alpha1.CacheSource) (sources.Spec, sources.Options, error)
	MayRead    func(prewarmv1alpha1.CacheRequest) error
	FileSource func(ns string, cs prewarmv1alpha1.CacheSource) (*os.Root, error)
	// CacheDir is the directory that holds a cache under its root; EnsureCacheDir makes it,
	// confined to the root; CheckDisk says whether the node may keep caches under root (an error
	// matching ErrNoDisk when not); MigrateLayout moves a cache of the earlier layout into place.
	CacheDir       func(root, uid string) string
	EnsureCacheDir func(root, uid string) (string, error)
	CheckDisk      func(root string) (string, error)
	MigrateLayout  func(root, uid string) error
	// SetAside moves a model a pod's volume mounts out of the way; SweepSetAside removes the
	// copies set aside that no volume mounts any more.
	SetAside      func(model string) (bool, error)
	SweepSetAside func(model string) error

	// Slots are the node's download slots, Urgent its one extra slot for caches a pod waits
	// for; Budget is the node's origin budget for a source type (nil: none); VerifyLimiter paces
	// re-verification reads (nil: no cap).
	Slots, Urgent chan struct{}
	Budget        func(inferencev1.ModelSourceType) *engine.Budget
	VerifyLimiter *rate.Limiter
	// Metrics are the node's counters a job adds to.
	Metrics Metrics

	// ClaimSpace, RoomFor and MakeRoom are the node's space: what a download may write under its
	// root, what a cache may still take there without evicting, and room made by evicting other
	// caches (held for the job until release).
	ClaimSpace func(uid, ns string) engine.ClaimSpace
	RoomFor    func(root, uid string) (Room, error)
	MakeRoom   func(ctx context.Context, by *Job, need int64) (freed int64, release func(), err error)
	// Offer offers a Ready cache's parts to the node's peers; Withdraw stops offering them.
	Offer    func(uid, model string, m *engine.Manifest)
	Withdraw func(uid string)
	// WarnDamaged tells the pods of the node that use the job's cache that re-verification
	// found files of it damaged.
	WarnDamaged func(ctx context.Context, j *Job, msg string)
}

// Metrics are the node's counters that jobs add to.
type Metrics struct {
	// Failures counts failed tries, by reason.
	Failures *prometheus.CounterVec
	// Verified counts bytes read back to re-verify caches; Damaged files found damaged, Repaired
	// files fetched again.
	Verified, Damaged, Repaired prometheus.Counter
}

// Room is what a cache may still take under its root without evicting another.
type Room struct {
	// Free is what it may take now, less what other downloads were promised; Quiet what of that
	// keeps the disk under its low watermark (a download beyond would evict again at once).
	Free, Quiet int64
	// Disk says, for people, how full the disk is and to where caches may fill it.
	Disk string
}

// Refusal is an error of the node's that says why a cache cannot be had now: its Reason is the
// status reason reported (a namespace's per-node limit, no room even after evicting).
type Refusal interface {
	error
	Reason() string
}

// ErrNoDisk is matched by the errors that say a root is not a disk the node may keep caches on;
// ErrNotConfined by those of paths that would lead out of where the agent may write or read.
var (
	ErrNoDisk      = errors.New("no local disk")
	ErrNotConfined = errors.New("not confined")
)

// CredentialCheckInterval is how long a check of a namespace's credentials against the origin
// holds for mounts: a revoked token stops new mounts at the latest this much later.
const CredentialCheckInterval = 10 * time.Minute

// stamp is t as a status records it: to the second.
func stamp(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.Truncate(time.Second))
	return &m
}

// Witness is where a node reaches the controller's witness (pkg/engine/witness).
type Witness struct {
	// URL is its address (scheme://host:port); Token gives the bearer token for it (the
	// witness audience's); Client sends the requests.
	URL    string
	Token  func() (string, error)
	Client *http.Client
	// Bytes, when set, counts the bytes of files without a digest of their own read for the
	// group, by path: "witness" (through it: peers take them) or "origin" (directly, while the
	// witness is away: peers read them too).
	Bytes *prometheus.CounterVec
}
