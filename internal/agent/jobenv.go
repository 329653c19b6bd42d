package agent

import (
	"context"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// jobEnv is everything a job uses of the node it runs on: the settings it runs by, what the
// configuration lets it keep and read, the node's download slots, budgets and counters, the
// space its downloads claim, the parts it offers to peers, and the few things it asks of the
// agent. A job holds no *Agent: this is the whole of what it reads and changes outside itself.
// One jobEnv, made by the agent, serves all its jobs; nothing in it changes after.
type jobEnv struct {
	// nodeName names the node in messages and to the peers.
	nodeName string
	// now is the clock.
	now func() time.Time
	// retryInterval is the first wait before a failed download is tried again; it doubles up to
	// maxRetryInterval. recheckInterval is how often a Ready cache is re-checked,
	// verifyInterval how often its content is read back; progressInterval paces the engine's
	// progress reports.
	retryInterval, maxRetryInterval, recheckInterval, verifyInterval, progressInterval time.Duration
	// reserve is the free space, per root, that caches never take.
	reserve int64
	// engine are extra engine options; registerer, when set, receives the engine's metrics.
	engine     []engine.Option
	registerer prometheus.Registerer
	// peers, when set, shares the caches' parts with other agents.
	peers *Peers
	// key opens the credentials the controller seals to this agent.
	key *credentials.Key

	// roots are the allowed cache roots; allowedRoot reports whether root is one of them.
	roots       func() []string
	allowedRoot func(root string) bool
	// sourceSpec is how a source is opened; mayRead refuses a source the agent would read with
	// its own identity for a namespace not allowed it; fileSource opens an FSx source's directory
	// inside what its access rule allows.
	sourceSpec func(prewarmv1alpha1.CacheSource) (sources.Spec, sources.Options, error)
	mayRead    func(prewarmv1alpha1.CacheRequest) error
	fileSource func(ns string, cs prewarmv1alpha1.CacheSource) (*os.Root, error)
	// cacheDir is the directory that holds a cache under its root; ensureCacheDir makes it,
	// confined to the root; checkDisk says whether the node may keep caches under root (an
	// errNoDisk when not); migrateLayout moves a cache of the earlier layout into place.
	cacheDir       func(root, uid string) string
	ensureCacheDir func(root, uid string) (string, error)
	checkDisk      func(root string) (string, error)
	migrateLayout  func(root, uid string) error
	// setAside moves a model a pod's volume mounts out of the way; sweepSetAside removes the
	// copies set aside that no volume mounts any more.
	setAside      func(model string) (bool, error)
	sweepSetAside func(model string) error

	// slots are the node's download slots, urgent its one extra slot for caches a pod waits
	// for; budget is the node's origin budget for a source type (nil: none); verifyLimiter paces
	// re-verification reads (nil: no cap).
	slots, urgent chan struct{}
	budget        func(inferencev1.ModelSourceType) *engine.Budget
	verifyLimiter *rate.Limiter
	// metrics are the node's counters a job adds to.
	metrics jobMetrics

	// claimSpace, freeFor and makeRoom are the node's space: what a download may write under
	// its root, what a cache may still take there without evicting, and room made by evicting
	// other caches (held for the job until release).
	claimSpace func(uid, ns string) engine.ClaimSpace
	freeFor    func(root, uid string) (diskFigures, int64, error)
	makeRoom   func(ctx context.Context, by *job, need int64) (freed int64, release func(), err error)
	// offer offers a Ready cache's parts to the node's peers; withdraw stops offering them.
	offer    func(uid, model string, m *engine.Manifest)
	withdraw func(uid string)
	// warnPods records a Warning event on each pod of the node that uses the job's cache.
	warnPods func(ctx context.Context, j *job, reason, msg string)
}

// jobMetrics are the node's counters that jobs add to.
type jobMetrics struct {
	// failures counts failed tries, by reason.
	failures *prometheus.CounterVec
	// verified counts bytes read back to re-verify caches; damaged files found damaged, repaired
	// files fetched again.
	verified, damaged, repaired prometheus.Counter
}

// jobEnv is what the agent's jobs use of it.
func (a *Agent) jobEnv() *jobEnv {
	o := &a.opts
	return &jobEnv{
		nodeName: o.NodeName, now: o.Now,
		retryInterval: o.RetryInterval, maxRetryInterval: o.MaxRetryInterval, recheckInterval: o.RecheckInterval,
		verifyInterval: o.VerifyInterval, progressInterval: o.StatusInterval,
		reserve: o.Reserve, engine: o.Engine, registerer: o.Registerer, peers: o.Peers, key: a.key,
		roots: o.Config.Roots, allowedRoot: o.allowedRoot,
		sourceSpec: o.sourceSpec, mayRead: o.mayRead, fileSource: o.fileSource,
		cacheDir: o.cacheDir, ensureCacheDir: o.ensureCacheDir, checkDisk: a.checkDisk, migrateLayout: a.migrateLayout,
		setAside: a.setAside, sweepSetAside: a.sweepSetAside,
		slots: a.sem, urgent: a.urgent, budget: a.budget, verifyLimiter: a.verifyLimiter,
		metrics:    jobMetrics{failures: a.metrics.failures, verified: a.metrics.verified, damaged: a.metrics.damaged, repaired: a.metrics.repaired},
		claimSpace: a.claimSpace, freeFor: a.freeFor, makeRoom: a.makeRoom,
		offer: a.offer, withdraw: a.withdraw, warnPods: a.warnPods,
	}
}

// stamp is t as a status records it: to the second.
func stamp(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.Truncate(time.Second))
	return &m
}
