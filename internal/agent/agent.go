package agent

import (
	"context"
	"fmt"
	iofs "io/fs"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
)

// Agent holds one node's caches.
type Agent struct {
	opts   Options
	client client.Client
	// key opens the credentials the controller seals to this agent; it lives only in memory.
	key *credentials.Key
	sem chan struct{}
	// urgent is the one extra download slot for caches a pod waits for.
	urgent chan struct{}
	// env is what the jobs use of the agent (jobEnv); made once, in New.
	env *cachejob.Env
	// life is the agent's lifetime: the jobs run in it, and end when the manager stops (SIGTERM),
	// with their journals synced, before the process exits.
	life context.Context
	stop context.CancelFunc
	// removals queues the caches of removing for the remover.
	removals workqueue.TypedDelayingInterface[string]
	metrics  *metrics
	// verifyLimiter paces re-verification reads across all caches (nil: no cap).
	verifyLimiter *rate.Limiter
	// recorder records events on the pods whose model volume the node plugin serves (nil:
	// none), paced by events (under its own lock).
	recorder events.EventRecorder
	events   pacer
	// budgets are the node's origin budgets, by source type.
	budgets map[inferencev1.ModelSourceType]*engine.Budget
	// disks judges whether a cache root is a disk the node may keep caches on.
	disks *diskCheck
	// kubelet are the kubelet's thresholds that caches on a disk it shares, and the scratch
	// copies, stay clear of; kubeletErr what kept the agent from reading its configuration.
	kubelet    kubeletLimits
	kubeletErr error
	// sharedLogged holds the roots whose shared disk has been logged, with the thresholds.
	sharedLogged sync.Map
	// goroutines are the agent's own goroutines besides the jobs (the scratch copies'): the
	// agent waits for them when it stops.
	goroutines sync.WaitGroup
	// evicting is held while caches are evicted: one eviction at a time.
	evicting sync.Mutex
	// space holds what the downloads under way were promised (under its own lock).
	space space
	// usages are what prewarm's files take under each root, as last measured (under its own
	// lock).
	usages usages
	// names are the caches its pods' volumes name by name resolved to.
	names names
	// reported is set once the status writer has done its first round: the node's NodeCache
	// says what the agent holds (or there is nothing to say yet).
	reported atomic.Bool

	// scratches are the copies of caches kept for the pods of a node with no local disk (under
	// their own lock, taken after mu).
	scratches scratches

	// mu guards the fields below it, and only those: what the agent owns of the node's caches,
	// that is the jobs by cache UID (each job guards its own state, under its own lock, taken
	// after mu), the caches being removed, the NodeCache's requests as last read and the mounts
	// being published, which an eviction checks together. Everything above is set before the
	// agent starts and not changed after, or guards itself.
	mu   sync.Mutex
	jobs map[string]*cachejob.Job // by cache UID
	// removing are the caches whose directories are to go, by UID, with their namespace (only
	// a pod of it can have the cache's volume mounted; "" when unknown).
	removing map[string]string
	inUse    map[string]string // of those, the ones a pod on the node still uses: the pod
	seen     bool              // the NodeCache has been read at least once
	want     []prewarmv1alpha1.CacheRequest
	// publishing counts, by cache UID, the mounts handed out that the node plugin has not
	// finished: a cache being mounted is not evicted.
	publishing map[string]int
}

// New returns an agent that reads and writes NodeCache objects through c. It makes the key pair
// the controller seals credentials to; the private key never leaves the process.
func New(c client.Client, opts Options) (*Agent, error) {
	opts.Defaults()
	key, err := credentials.NewKey()
	if err != nil {
		return nil, fmt.Errorf("making the agent's credentials key: %w", err)
	}
	a := &Agent{
		opts: opts, client: c, key: key, sem: make(chan struct{}, opts.MaxParallel), urgent: make(chan struct{}, 1),
		jobs: map[string]*cachejob.Job{}, removing: map[string]string{}, removals: newRemovals(), usages: usages{byRoot: map[string]usage{}}, inUse: map[string]string{}, publishing: map[string]int{}, space: space{claims: map[string]claim{}, scratch: map[string]scratchClaim{}},
		metrics: newMetrics(opts.Registerer, opts.Config.Agent.MetricsPerCache), budgets: newBudgets(&opts), disks: newDiskCheck(opts.KubeletDir), names: newNames(opts.Now),
	}
	a.kubelet, a.kubeletErr = loadKubeletLimits(opts.Config.Agent.Kubelet, opts.local)
	registerBudgets(opts.Registerer, a.budgets)
	if opts.VerifyRate > 0 {
		a.verifyLimiter = rate.NewLimiter(rate.Limit(opts.VerifyRate), int(min(opts.VerifyRate, 1<<20)))
	}
	a.life, a.stop = context.WithCancel(context.Background())
	a.env = a.jobEnv()
	return a, nil
}

// The agent reads its own NodeCache and writes its status, and reads the pods on its node (to
// keep the caches they use); nothing else.
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// It reads its Node to make its NodeCache owned by it, when pods ask for a cache first.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches/status,verbs=get;update;patch
// As the node's CSI plugin, it records events on the pods whose model volume it serves, and
// reads the cache a volume names by name (in the pod's namespace): get only, no list or watch.
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=modelweightscacheconfigs;modeldatacacheconfigs,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetRecorder makes the agent record events on the pods whose model volume it serves.
func (a *Agent) SetRecorder(rec events.EventRecorder) { a.recorder = rec }

// SetupWithManager runs the agent under mgr: reconciles on its NodeCache, and writes status.
func (a *Agent) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(statusWriter{a}); err != nil {
		return err
	}
	if a.opts.Leases != nil {
		keeper := NewLeaseKeeper(a.opts.Leases, a.opts.LeaseNamespace, a.opts.NodeName, a.opts.LeaseHolder, a.opts.Config.Agent.LeaseDuration.Duration)
		if err := mgr.Add(leaseKeeper{keeper}); err != nil {
			return err
		}
	}
	if err := mgr.Add(lifetime{a}); err != nil {
		return err
	}
	if err := mgr.Add(scratchSweeper{a}); err != nil {
		return err
	}
	if err := mgr.Add(watermarkKeeper{a}); err != nil {
		return err
	}
	if err := mgr.Add(remover{a}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("agent").
		// Only spec changes matter here; the agent's own status writes (every few seconds while
		// downloading) bump no generation and need no sync.
		For(&prewarmv1alpha1.NodeCache{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(a)
}

// Reconcile makes the node's disk match its NodeCache: starts the caches it lists, stops and
// removes the ones it no longer lists.
func (a *Agent) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name != a.opts.NodeName {
		return ctrl.Result{}, nil
	}
	nc := &prewarmv1alpha1.NodeCache{}
	if err := a.client.Get(ctx, req.NamespacedName, nc); err != nil {
		// No NodeCache: the controller has asked nothing of this node yet. Keep what is on
		// disk; it is removed only when a NodeCache says it is not wanted.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	a.sync(ctx, nc.Spec.Caches)
	return ctrl.Result{}, nil
}

// sameSource reports whether two requests name the same source. The content revision of an S3
// or FSx source is not part of it: the controller pins it once a node holds the cache, and a job
// takes the pin on without starting again (a Hugging Face commit is the source itself).
func sameSource(a, b prewarmv1alpha1.CacheSource) bool {
	if a.Type != inferencev1.ModelSourceHuggingFace {
		a.Revision, b.Revision = "", ""
	}
	return a == b
}

// sync starts, restarts and stops jobs so that they match want, and removes unwanted caches.
func (a *Agent) sync(ctx context.Context, want []prewarmv1alpha1.CacheRequest) {
	log := ctrl.LoggerFrom(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = true
	a.want = want
	wanted := map[string]prewarmv1alpha1.CacheRequest{}
	for _, r := range want {
		wanted[r.UID] = r
	}
	for uid, j := range a.jobs {
		if r, ok := wanted[uid]; ok && r.Root == j.Request().Root && sameSource(r.Source, j.Request().Source) {
			j.Update(r)
			continue
		}
		log.Info("stopping cache", "cache", uid)
		j.Stop()
		delete(a.jobs, uid)
		a.removeLocked(uid, j)
	}
	for uid, r := range wanted {
		if _, ok := a.jobs[uid]; ok || a.isRemoving(uid) {
			continue // running, or to be started once its old directories are gone
		}
		log.Info("starting cache", "cache", uid, "source", r.Source.String(), "root", r.Root)
		// Not the reconcile's context, which ends when Reconcile returns: the agent's lifetime.
		jctx, cancel := context.WithCancel(a.life)
		j := cachejob.New(a.env, r, a.firstUsed(r), cancel)
		a.jobs[uid] = j
		go j.Run(ctrl.LoggerInto(jctx, log.WithValues("cache", uid)))
	}
	// Directories under the roots that no job wants: left by a cache removed while the agent
	// was down.
	for _, root := range a.opts.Config.Roots() {
		parent, err := a.opts.openCacheParent(root)
		if err != nil {
			continue // none yet, or not a directory prewarm may use (reported by the jobs)
		}
		entries, err := iofs.ReadDir(parent.FS(), ".")
		parent.Close()
		if err != nil {
			continue
		}
		for _, e := range entries {
			uid := entryUID(e.Name())
			if uid == "" || a.isRemoving(uid) {
				continue // not a cache of ours, or already going
			}
			if _, ok := a.jobs[uid]; ok {
				continue
			}
			a.removeLocked(uid, nil)
		}
	}
}

// EnsureNodeCache makes node's NodeCache if it is missing, with no spec (the controller writes
// every entry of it, with JSON patches) and owned by the Node, as the controller makes it:
// it goes with the node. A node that no longer exists gets none. An agent may make only its own
// node's (the chart's admission policy).
func EnsureNodeCache(ctx context.Context, c client.Client, node string) error {
	n := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: node}, n); err != nil {
		return fmt.Errorf("reading node %s to make its NodeCache: %w", node, err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": prewarmv1alpha1.GroupVersion.String(), "kind": "NodeCache",
		"metadata": map[string]any{"name": node, "ownerReferences": []any{map[string]any{
			"apiVersion": "v1", "kind": "Node", "name": node, "uid": string(n.UID),
		}}},
	}}
	return client.IgnoreAlreadyExists(c.Create(ctx, u))
}

// ClientOptions are the manager client options an agent needs: its Node is read from the API
// server when needed (rarely), not through a cache of every node.
//
// The cache objects a pod's volume names by name are read as they are, one at a time: an agent
// keeps no informer of every namespace's caches.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{
		&corev1.Node{}, &inferencev1.ModelWeightsCacheConfig{}, &inferencev1.ModelDataCacheConfig{},
	}}}
}

// CacheOptions are the manager cache options an agent needs: its own NodeCache and the pods on
// its node, not the whole cluster's.
func CacheOptions(node string) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&prewarmv1alpha1.NodeCache{}: {Field: fields.OneTermEqualSelector("metadata.name", node)},
		&corev1.Pod{}:                {Field: fields.OneTermEqualSelector("spec.nodeName", node)},
	}}
}

// lifetime ends the jobs when the manager stops, and waits for them: a download stops at a
// consistent journal (it resumes from there), well within the pod's termination grace period.
type lifetime struct{ a *Agent }

func (l lifetime) Start(ctx context.Context) error {
	<-ctx.Done()
	a := l.a
	a.stop()
	a.mu.Lock()
	var running []*cachejob.Job
	for _, j := range a.jobs {
		running = append(running, j)
	}
	a.mu.Unlock()
	for _, j := range running {
		<-j.Done()
	}
	a.goroutines.Wait()
	ctrl.LoggerFrom(ctx).Info("every cache job has stopped", "jobs", len(running))
	return nil
}

// NeedLeaderElection is false: every node's agent runs its own jobs.
func (lifetime) NeedLeaderElection() bool { return false }
