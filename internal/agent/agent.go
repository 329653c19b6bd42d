package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
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
	// life is the agent's lifetime: the jobs run in it, and end when the manager stops (SIGTERM),
	// with their journals synced, before the process exits.
	life context.Context
	stop context.CancelFunc

	mu       sync.Mutex
	jobs     map[string]*job   // by cache UID
	removing map[string]bool   // cache UIDs whose directories are being removed
	inUse    map[string]string // of those, the ones a pod on the node still uses: the pod
	seen     bool              // the NodeCache has been read at least once
	want     []prewarmv1alpha1.CacheRequest
	metrics  *metrics
	// verifyLimiter paces re-verification reads across all caches (nil: no cap).
	verifyLimiter *rate.Limiter
	// recorder records events on the pods whose model volume the node plugin serves (nil:
	// none); events holds when each was last recorded, to pace them.
	recorder events.EventRecorder
	events   map[string]time.Time
	// budgets are the node's origin budgets, by source type.
	budgets map[inferencev1.ModelSourceType]*engine.Budget
	// disks judges whether a cache root is a disk of its own.
	disks *diskCheck
	// scratches are the copies of caches kept for the pods of a node with no local disk, by
	// cache UID.
	scratches map[string]*scratch
	// goroutines are the agent's own goroutines besides the jobs (the scratch copies'): the
	// agent waits for them when it stops.
	goroutines sync.WaitGroup
	// reported is set once the status writer has done its first round: the node's NodeCache
	// says what the agent holds (or there is nothing to say yet).
	reported atomic.Bool
}

// Reported is a readiness check: nil once the agent has reported its node's state.
func (a *Agent) Reported(*http.Request) error {
	if !a.reported.Load() {
		return errors.New("the agent has not reported its node's caches yet")
	}
	return nil
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
		opts: opts, client: c, key: key, sem: make(chan struct{}, opts.MaxParallel), urgent: make(chan struct{}, 1), events: map[string]time.Time{},
		jobs: map[string]*job{}, removing: map[string]bool{}, inUse: map[string]string{}, scratches: map[string]*scratch{},
		metrics: newMetrics(opts.Registerer, opts.Config.Agent.MetricsPerCache), budgets: newBudgets(&opts), disks: newDiskCheck(opts.KubeletDir),
	}
	if opts.VerifyRate > 0 {
		a.verifyLimiter = rate.NewLimiter(rate.Limit(opts.VerifyRate), int(min(opts.VerifyRate, 1<<20)))
	}
	a.life, a.stop = context.WithCancel(context.Background())
	return a, nil
}

// The agent reads its own NodeCache and writes its status, and reads the pods on its node (to
// keep the caches they use); nothing else.
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// It reads its Node to make its NodeCache owned by it, when pods ask for a cache first.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get
// +kubebuilder:rbac:groups=prewarm.io,resources=nodecaches/status,verbs=get;update;patch
// As the node's CSI plugin, it records events on the pods whose model volume it serves.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetRecorder makes the agent record events on the pods whose model volume it serves.
func (a *Agent) SetRecorder(rec events.EventRecorder) { a.recorder = rec }

// SetupWithManager runs the agent under mgr: reconciles on its NodeCache, and writes status.
func (a *Agent) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(statusWriter{a}); err != nil {
		return err
	}
	if err := mgr.Add(lifetime{a}); err != nil {
		return err
	}
	if err := mgr.Add(scratchSweeper{a}); err != nil {
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
		if r, ok := wanted[uid]; ok && r.Root == j.req.Root && sameSource(r.Source, j.req.Source) {
			if !equality.Semantic.DeepEqual(j.latest, r) {
				j.latest = r // guarded by a.mu: the job takes it on at once, without a restart
				select {
				case j.changed <- struct{}{}:
				default:
				}
			}
			continue
		}
		log.Info("stopping cache", "cache", uid)
		j.cancel()
		delete(a.jobs, uid)
		a.removeLocked(ctx, uid, j)
	}
	for uid, r := range wanted {
		if _, ok := a.jobs[uid]; ok || a.removing[uid] {
			continue // running, or to be started once its old directories are gone
		}
		log.Info("starting cache", "cache", uid, "source", r.Source.String(), "root", r.Root)
		// Not the reconcile's context, which ends when Reconcile returns: the agent's lifetime.
		jctx, cancel := context.WithCancel(a.life)
		j := &job{a: a, req: r, latest: r, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{}, 1), demanded: make(chan struct{})}
		j.status = Queued(uid, a.now())
		a.jobs[uid] = j
		go j.run(ctrl.LoggerInto(jctx, log.WithValues("cache", uid)))
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
			if uid == "" || a.removing[uid] {
				continue // not a cache of ours, or already going
			}
			if _, ok := a.jobs[uid]; ok {
				continue
			}
			a.removeLocked(ctx, uid, nil)
		}
	}
}

// removeLocked removes cache uid's directories under every root, after its job (if any) stops.
// The removal runs for the agent's lifetime (a.life), not ctx's, which may be a reconcile's:
// ctx gives only its logger.
func (a *Agent) removeLocked(ctx context.Context, uid string, j *job) {
	if a.removing[uid] {
		return
	}
	ctx = ctrl.LoggerInto(a.life, ctrl.LoggerFrom(ctx))
	a.removing[uid] = true
	a.withdraw(uid)
	ns := "" // unknown (a cache left from before the agent started): any pod naming it counts
	if j != nil {
		ns = j.req.Namespace
	}
	go func() {
		log := ctrl.LoggerFrom(ctx).WithValues("cache", uid)
		if j != nil {
			<-j.done
		}
		// A cache a pod on this node still uses stays until no pod does: by the pod list, and
		// by the mount table (a pod the list does not show yet, or any more).
		for {
			pod, err := a.podUsing(ctx, uid, ns)
			if err == nil && pod == "" {
				var mounted bool
				if mounted, err = a.cacheMounted(uid); err == nil && mounted {
					pod = "(a pod's volume, still mounted)"
				}
			}
			if err == nil && pod == "" {
				break
			}
			if err != nil {
				log.Error(err, "listing the node's pods; will retry")
			} else {
				a.mu.Lock()
				if a.inUse[uid] != pod {
					log.Info("cache still in use; keeping it", "pod", pod)
					a.inUse[uid] = pod
				}
				a.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.opts.RetryInterval):
			}
		}
		a.mu.Lock()
		delete(a.inUse, uid)
		a.mu.Unlock()
		for {
			err := a.removeDirs(uid)
			if err == nil {
				break
			}
			log.Error(err, "removing cache directories; will retry")
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.opts.RetryInterval):
			}
		}
		log.Info("removed cache")
		a.mu.Lock()
		delete(a.removing, uid)
		want := a.want
		a.mu.Unlock()
		a.sync(ctx, want) // starts the cache again if it is wanted anew
	}()
}

// podUsing returns a pod on this node (namespace/name) that mounts cache uid and has not
// finished, or "": through prewarm's CSI volume (only a pod of the cache's namespace ns, when
// known, can have it mounted: another namespace's pod naming the cache keeps nothing), or a
// hostPath of its directory (pods made before the CSI volume).
func (a *Agent) podUsing(ctx context.Context, uid, ns string) (string, error) {
	pods, err := a.podsUsing(ctx, uid, ns)
	if err != nil || len(pods) == 0 {
		return "", err
	}
	return pods[0].Namespace + "/" + pods[0].Name, nil
}

// podsUsing returns the pods on this node, not finished, that use cache uid of namespace ns
// (any namespace when ns is empty): by its CSI volume, or by a host path to its directory.
func (a *Agent) podsUsing(ctx context.Context, uid, ns string) ([]corev1.Pod, error) {
	pods, err := a.activePods(ctx)
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, root := range a.opts.Config.Roots() {
		dirs[prewarmv1alpha1.CacheDir(a.opts.nodePath(root), uid)] = true
	}
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool {
		return !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
			return (v.HostPath != nil && dirs[filepath.Clean(v.HostPath.Path)]) ||
				(prewarmv1alpha1.VolumeCacheUID(v) == uid && (ns == "" || p.Namespace == ns))
		})
	}), nil
}

// warnPods records a Warning event on each pod of the node that uses the job's cache.
func (a *Agent) warnPods(ctx context.Context, j *job, reason, msg string) {
	pods, err := a.podsUsing(ctx, j.req.UID, j.req.Namespace)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the node's pods to tell them", "reason", reason)
		return
	}
	for _, p := range pods {
		a.event(MountRequest{CacheUID: j.req.UID, PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID}, corev1.EventTypeWarning, reason, msg)
	}
}

// activePods lists the pods on this node that have not finished (from the agent's cache,
// which holds this node's pods only: CacheOptions).
func (a *Agent) activePods(ctx context.Context) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := a.client.List(ctx, pods); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		return p.Spec.NodeName != a.opts.NodeName || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}), nil
}

// EnsureNodeCache makes node's NodeCache if it is missing, with no spec (the controller's
// server-side applies own every entry of it) and owned by the Node, as the controller makes it:
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

// demands lists the caches that the node's pods (not finished) ask for through prewarm's CSI
// volume, by namespace: the controller makes the node a target of each, for pods of the cache's
// namespace, so that a pod on a node that was not asked for its cache still gets it.
func (a *Agent) demands(ctx context.Context) ([]prewarmv1alpha1.CacheDemand, error) {
	pods, err := a.activePods(ctx)
	if err != nil {
		return nil, err
	}
	count := map[prewarmv1alpha1.CacheDemand]int32{}
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if uid := prewarmv1alpha1.VolumeCacheUID(v); uidPattern.MatchString(uid) {
				count[prewarmv1alpha1.CacheDemand{UID: uid, Namespace: p.Namespace}]++
			}
		}
	}
	return fairDemands(count, prewarmv1alpha1.MaxDemands), nil
}

// fairDemands lists at most limit of the demands counted (with the pods of each), shared
// fairly among namespaces: in rounds, each namespace's next demand (those most pods ask for
// first), so that one namespace's pods naming many caches cannot crowd out another's. The
// list is sorted by UID and namespace.
func fairDemands(count map[prewarmv1alpha1.CacheDemand]int32, limit int) []prewarmv1alpha1.CacheDemand {
	byNS := map[string][]prewarmv1alpha1.CacheDemand{}
	for d, n := range count {
		d.Pods = n
		byNS[d.Namespace] = append(byNS[d.Namespace], d)
	}
	namespaces := slices.Sorted(maps.Keys(byNS))
	for _, ns := range namespaces {
		slices.SortFunc(byNS[ns], func(x, y prewarmv1alpha1.CacheDemand) int {
			return cmp.Or(cmp.Compare(y.Pods, x.Pods), strings.Compare(x.UID, y.UID))
		})
	}
	var out []prewarmv1alpha1.CacheDemand
	for round := 0; len(out) < limit; round++ {
		took := false
		for _, ns := range namespaces {
			if round < len(byNS[ns]) && len(out) < limit {
				out, took = append(out, byNS[ns][round]), true
			}
		}
		if !took {
			break
		}
	}
	slices.SortFunc(out, func(x, y prewarmv1alpha1.CacheDemand) int {
		return cmp.Or(strings.Compare(x.UID, y.UID), strings.Compare(x.Namespace, y.Namespace))
	})
	return out
}

// ClientOptions are the manager client options an agent needs: its Node is read from the API
// server when needed (rarely), not through a cache of every node.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Node{}}}}
}

// CacheOptions are the manager cache options an agent needs: its own NodeCache and the pods on
// its node, not the whole cluster's.
func CacheOptions(node string) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&prewarmv1alpha1.NodeCache{}: {Field: fields.OneTermEqualSelector("metadata.name", node)},
		&corev1.Pod{}:                {Field: fields.OneTermEqualSelector("spec.nodeName", node)},
	}}
}

// removeDirs deletes <root>/prewarm/<uid> (and what earlier layouts left beside it) under each
// allowed root. Removal goes through an os.Root of <root>/prewarm: a link in the way is removed,
// never followed.
func (a *Agent) removeDirs(uid string) error {
	if !uidPattern.MatchString(uid) {
		return fmt.Errorf("refusing to remove %q: not a cache UID", uid)
	}
	var errs []error
	for _, root := range a.opts.Config.Roots() {
		parent, err := a.opts.openCacheParent(root)
		if errors.Is(err, iofs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range entries(uid) {
			if err := parent.RemoveAll(name); err != nil {
				errs = append(errs, err)
			}
		}
		parent.Close()
	}
	return errors.Join(errs...)
}

// entries are the names cache uid may have under <root>/prewarm: its directory, and what earlier
// layouts and an interrupted migration leave beside it (the partial download, now inside the
// cache directory, was once beside it).
func entries(uid string) []string {
	return []string{uid, "." + uid + ".prewarm-partial", "." + uid + ".prewarm-migrate"}
}

// entryUID returns the cache UID an entry under <root>/prewarm belongs to (one of its
// entries), or "".
func entryUID(name string) string {
	uid, _, _ := strings.Cut(strings.TrimPrefix(name, "."), ".prewarm-")
	if !uidPattern.MatchString(uid) || !slices.Contains(entries(uid), name) {
		return ""
	}
	return uid
}

// migrateLayout moves a cache of the earlier layout (the model's files directly in
// <root>/prewarm/<uid>) to <root>/prewarm/<uid>/model, with renames only: nothing is fetched
// again.
func (a *Agent) migrateLayout(root, uid string) error {
	parent, err := a.opts.openCacheParent(root)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil // a node that holds no cache yet
	}
	if err != nil {
		return err
	}
	defer parent.Close()
	tmp := entries(uid)[2] // .<uid>.prewarm-migrate
	if _, err := parent.Lstat(filepath.Join(uid, engine.ManifestName)); err == nil {
		if err := parent.Rename(uid, tmp); err != nil {
			return err
		}
	}
	if _, err := parent.Lstat(tmp); err != nil {
		return nil // the current layout, or nothing yet
	}
	if err := parent.Mkdir(uid, 0o755); err != nil && !errors.Is(err, iofs.ErrExist) {
		return err
	}
	return parent.Rename(tmp, filepath.Join(uid, prewarmv1alpha1.ModelSubdir))
}

func (a *Agent) now() *metav1.Time {
	t := metav1.NewTime(a.opts.Now().Truncate(time.Second))
	return &t
}

// rootStatus measures the filesystem under root, and says why the node keeps no cache there
// when it is not a disk it may.
func (a *Agent) rootStatus(root string) prewarmv1alpha1.RootStatus {
	rs := prewarmv1alpha1.RootStatus{Path: root, ReservedBytes: a.opts.Reserve}
	if p := a.opts.nodePath(root); p != root {
		rs.NodePath = p
	}
	if err := a.checkDisk(root); err != nil {
		rs.Reason, rs.Message = prewarmv1alpha1.ReasonNoLocalDisk, truncate(err.Error(), 1024)
		if !errors.As(err, new(errNoDisk)) {
			rs.Reason = ""
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(a.opts.rootDir(root), &st); err == nil && rs.Reason == "" {
		rs.CapacityBytes = int64(st.Blocks) * st.Bsize
		rs.FreeBytes = max(0, int64(st.Bavail)*st.Bsize-a.opts.Reserve)
	}
	return rs
}

// checkDisk returns nil when the node may keep caches under root: it is a disk of its own, or
// the configuration allows it where it is. Otherwise it returns an errNoDisk (or the error that
// kept the agent from telling).
func (a *Agent) checkDisk(root string) error {
	if r, ok := a.opts.Config.Root(root); !ok || r.AllowRootFilesystem {
		return nil
	}
	err := a.disks.cached(a.opts.rootDir(root), a.opts.nodePath(root), a.opts.Now())
	var nd errNoDisk
	if errors.As(err, &nd) {
		return errNoDisk{fmt.Sprintf("%s: the node keeps no cache there, and its pods read their model from the source "+
			"(mount a local disk there, map the root to where the disk is with cacheRoots[].nodePath, or allow the root filesystem with cacheRoots[].allowRootFilesystem)", nd.msg)}
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n-len("…")] + "…"
	}
	return s
}

// freeSpace is the engine's view of free space: the filesystem's, less the reserve.
func (a *Agent) freeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return max(0, int64(st.Bavail)*st.Bsize-a.opts.Reserve), nil
}

// status builds the NodeCache status from the jobs.
func (a *Agent) status() prewarmv1alpha1.NodeCacheStatus {
	st := prewarmv1alpha1.NodeCacheStatus{AgentVersion: a.opts.Version, HeartbeatTime: a.now(), CredentialsKey: a.key.Public()}
	// The disks, measured outside the lock that the jobs and the node plugin share.
	for _, root := range a.opts.Config.Roots() {
		st.Roots = append(st.Roots, a.rootStatus(root))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.servesPeers() {
		st.PeerAddress = a.opts.Peers.Address
	}
	for uid, j := range a.jobs {
		cs := j.snapshot()
		if note := a.scratchNote(uid); note != "" {
			cs.Message = truncate(cs.Message+note, 1024)
		}
		st.Caches = append(st.Caches, cs)
	}
	for uid := range a.removing {
		if _, ok := a.jobs[uid]; !ok {
			cs := prewarmv1alpha1.CacheStatus{UID: uid, State: inferencev1.CacheDeleting,
				Reason: prewarmv1alpha1.ReasonRemoving, Message: "removing the cache's files", LastTransitionTime: a.now()}
			if pod := a.inUse[uid]; pod != "" {
				cs.Reason, cs.Message = prewarmv1alpha1.ReasonInUse, "no longer wanted here, kept while pod "+pod+" uses it"
			}
			st.Caches = append(st.Caches, cs)
		}
	}
	slices.SortFunc(st.Caches, func(x, y prewarmv1alpha1.CacheStatus) int { return strings.Compare(x.UID, y.UID) })
	return st
}

// lifetime ends the jobs when the manager stops, and waits for them: a download stops at a
// consistent journal (it resumes from there), well within the pod's termination grace period.
type lifetime struct{ a *Agent }

// NeedLeaderElection is false: every node's agent runs its own jobs.
func (lifetime) NeedLeaderElection() bool { return false }

func (l lifetime) Start(ctx context.Context) error {
	<-ctx.Done()
	a := l.a
	a.stop()
	a.mu.Lock()
	var running []*job
	for _, j := range a.jobs {
		running = append(running, j)
	}
	a.mu.Unlock()
	for _, j := range running {
		<-j.done
	}
	a.goroutines.Wait()
	ctrl.LoggerFrom(ctx).Info("every cache job has stopped", "jobs", len(running))
	return nil
}

// statusWriter writes the agent's status to its NodeCache as its WritePolicy says: a change of
// state at the next StatusInterval tick, progress at most every ProgressInterval, at least
// once per HeartbeatInterval.
type statusWriter struct{ a *Agent }

// NeedLeaderElection is false: every node's agent writes its own status.
func (statusWriter) NeedLeaderElection() bool { return false }

func (w statusWriter) Start(ctx context.Context) error {
	a := w.a
	log := ctrl.LoggerFrom(ctx).WithName("status")
	var last prewarmv1alpha1.NodeCacheStatus
	var lastWrite time.Time
	written := false
	policy := a.opts.WritePolicy()
	tick := time.NewTicker(a.opts.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		a.mu.Lock()
		seen := a.seen
		a.mu.Unlock()
		demands, err := a.demands(ctx)
		if err != nil {
			log.Error(err, "listing the node's pods for their caches")
		}
		if !seen && len(demands) == 0 && !a.servesPeers() {
			a.reported.Store(err == nil)
			continue // nothing to say before the NodeCache is read
		}
		st := a.status()
		st.Demands = demands
		a.metrics.observe(st)
		if !policy.Due(last, st, a.opts.Now().Sub(lastWrite), written) {
			continue
		}
		if err := a.writeStatus(ctx, st, seen); err != nil {
			log.Error(err, "writing NodeCache status")
			continue
		}
		a.reported.Store(true)
		last, lastWrite, written = st, a.opts.Now(), seen
	}
}

// sameStatus compares two statuses, ignoring the heartbeat and the roots' free bytes (which
// move with every write).
func sameStatus(x, y prewarmv1alpha1.NodeCacheStatus) bool {
	return slices.Equal(x.Demands, y.Demands) && slices.EqualFunc(x.Caches, y.Caches, func(p, q prewarmv1alpha1.CacheStatus) bool {
		return p.UID == q.UID && p.State == q.State && p.BytesDone == q.BytesDone && p.BytesTotal == q.BytesTotal &&
			p.BytesPerSecond == q.BytesPerSecond && p.Reason == q.Reason && p.Message == q.Message && p.Revision == q.Revision
	})
}

// servesPeers reports whether the agent shares parts with other agents.
func (a *Agent) servesPeers() bool { return a.opts.Peers != nil && a.opts.Peers.Server != nil }

// writeStatus writes st to the node's NodeCache. Before the agent has read it (seen false), it
// only makes a missing NodeCache to carry the pods' demands.
func (a *Agent) writeStatus(ctx context.Context, st prewarmv1alpha1.NodeCacheStatus, seen bool) error {
	nc := &prewarmv1alpha1.NodeCache{}
	err := a.client.Get(ctx, types.NamespacedName{Name: a.opts.NodeName}, nc)
	if err == nil && !seen {
		return nil // read soon (the agent's reconcile): its status is written then
	}
	if err != nil {
		if !apierrors.IsNotFound(err) {
			return err
		}
		if len(st.Demands) == 0 && st.PeerAddress == "" {
			return nil // the controller has asked nothing of this node, and no pod asks for a cache
		}
		// Pods here ask for caches the controller has not asked this node for, or the agent
		// serves peers (the controller hands its address to the nodes that download with it,
		// from their first request on): the agent makes its NodeCache to say so.
		if err := EnsureNodeCache(ctx, a.client, a.opts.NodeName); err != nil {
			return err
		}
		if err := a.client.Get(ctx, types.NamespacedName{Name: a.opts.NodeName}, nc); err != nil {
			return err
		}
	}
	orig := nc.DeepCopy()
	nc.Status = st
	return a.client.Status().Patch(ctx, nc, client.MergeFrom(orig))
}
