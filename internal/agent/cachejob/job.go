package cachejob

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Job keeps one cache on the node: downloads it, re-checks it, retries after failures.
type Job struct {
	// env is what the job uses of the node.
	env *Env
	// mu guards status, latest, used, evicted and the credentials check. The agent may hold its
	// own lock while it takes it; the job calls nothing of its Env but the clock with mu held.
	mu     sync.Mutex
	req    prewarmv1alpha1.CacheRequest
	cancel context.CancelFunc
	done   chan struct{}
	// status, and latest (the request as it is now: its retention, pinned revision and sealed
	// credentials change while the job runs, without a restart).
	status prewarmv1alpha1.CacheStatus
	latest prewarmv1alpha1.CacheRequest
	// changed wakes the job when latest changes (new credentials, a pin, a retention).
	changed chan struct{}
	// demanded is closed when a pod on the node waits for the cache (fill on a miss).
	demanded   chan struct{}
	demandOnce sync.Once
	// credsDigest is the digest of the credentials the origin last accepted, at credsAt.
	credsChecked bool
	credsDigest  string
	credsAt      time.Time
	// used is when a pod last mounted the cache, or when it was first asked for; evicted says
	// why the node evicted it, when it has not been fetched again since.
	used    time.Time
	evicted string
	// work is held while the job looks after its cache (once): an eviction takes it too, so
	// that a cache is never evicted while it is being checked or fetched.
	work sync.Mutex
}

// New returns the job that keeps the cache of r on the node, Queued; used is when a pod last
// used the cache (as an earlier run of the agent left it), or now. It works once Run is called,
// until the context Run is given ends; cancel ends that context (Stop).
func New(env *Env, r prewarmv1alpha1.CacheRequest, used time.Time, cancel context.CancelFunc) *Job {
	return &Job{env: env, req: r, latest: r, status: Queued(r.UID, stamp(env.Now())), used: used, cancel: cancel,
		done: make(chan struct{}), changed: make(chan struct{}, 1), demanded: make(chan struct{})}
}

// Request is the request the job was started with: its cache, root, source and namespace,
// which do not change while it runs (Current is the request as it is now).
func (j *Job) Request() prewarmv1alpha1.CacheRequest { return j.req }

// Stop ends the job; Done is closed once it has ended.
func (j *Job) Stop() { j.cancel() }

// Done is closed once the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// TryWork takes the job's work lock, which it holds while it looks after its cache, if no one
// holds it: an eviction takes it, so that a cache is never evicted while it is being checked or
// fetched. release gives it back.
func (j *Job) TryWork() (release func(), ok bool) {
	if !j.work.TryLock() {
		return nil, false
	}
	return j.work.Unlock, true
}

// Current returns the request as it is now.
func (j *Job) Current() prewarmv1alpha1.CacheRequest {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.latest
}

func (j *Job) retained() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.latest.RetainedSince != ""
}

// Snapshot is the cache's status now.
func (j *Job) Snapshot() prewarmv1alpha1.CacheStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return *j.status.DeepCopy()
}

// Update takes on r, the request as it is now, and wakes the job when it changed: the job takes
// it on at once, without a restart.
func (j *Job) Update(r prewarmv1alpha1.CacheRequest) {
	j.mu.Lock()
	changed := !equality.Semantic.DeepEqual(j.latest, r)
	j.latest = r
	j.mu.Unlock()
	if changed {
		select {
		case j.changed <- struct{}{}:
		default:
		}
	}
}

// Set changes the job's status; a change of state stamps the transition time.
func (j *Job) Set(fn func(st *prewarmv1alpha1.CacheStatus)) {
	j.mu.Lock()
	before := j.status.State
	fn(&j.status)
	if j.status.State != before {
		j.status.LastTransitionTime = stamp(j.env.Now())
	}
	j.mu.Unlock()
}

// Run looks after the cache until ctx ends: brings it to Ready, re-checks it, and retries after
// failures, with a backoff.
func (j *Job) Run(ctx context.Context) {
	defer close(j.done)
	log := ctrl.LoggerFrom(ctx)
	retry := j.env.RetryInterval
	if err := j.env.MigrateLayout(j.req.Root, j.req.UID); err != nil {
		log.Error(err, "moving a cache of the earlier layout into place")
	}
	for {
		j.work.Lock()
		wait, ok := j.once(ctx)
		j.work.Unlock()
		if ok {
			retry = j.env.RetryInterval
		} else if wait == 0 {
			wait = retry
			retry = min(2*retry, j.env.MaxRetryInterval)
		}
		log.V(1).Info("next check", "after", wait)
		select {
		case <-ctx.Done():
			log.Info("cache job stopped")
			return
		case <-j.changed:
		case <-time.After(wait):
		}
	}
}

// once brings the cache to Ready if it can. It returns how long to wait before the next
// check (0: the retry backoff decides) and whether the cache is Ready.
func (j *Job) once(ctx context.Context) (time.Duration, bool) {
	dir, wait, ok := j.admit()
	if !ok {
		return wait, false
	}
	model := filepath.Join(dir, prewarmv1alpha1.ModelSubdir)
	if err := j.env.SweepSetAside(model); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "removing copies of the cache no pod mounts any more")
	}
	if wait, ready, done := j.keep(ctx, model); done {
		return wait, ready
	}
	// What is there is replaced: kept aside while a pod's volume mounts it.
	if aside, err := j.env.SetAside(model); err != nil {
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, "setting aside the copy pods mount: "+err.Error())
		return 0, false
	} else if aside {
		ctrl.LoggerFrom(ctx).Info("the copy being replaced is mounted by pods: kept aside until they go")
	}
	return j.fetch(ctx, model)
}

// admit checks that this node may keep the cache as requested (its root, its source, the
// credentials' key) and returns the cache's directory, made if need be. When it may not, the
// job's status says why, and wait is how long until the next try.
func (j *Job) admit() (dir string, wait time.Duration, ok bool) {
	e := j.env
	if !e.AllowedRoot(j.req.Root) {
		j.fail(prewarmv1alpha1.ReasonHostPathNotAllowed, fmt.Sprintf("%s is not an allowed cache root on this node (allowed: %v)", j.req.Root, e.Roots()))
		return "", e.MaxRetryInterval, false
	}
	if _, _, err := e.SourceSpec(j.req.Source); err != nil {
		j.fail(prewarmv1alpha1.ReasonSourceNotAllowed, err.Error())
		return "", e.MaxRetryInterval, false
	}
	if err := e.MayRead(j.Current()); err != nil {
		j.fail(prewarmv1alpha1.ReasonSourceNotAllowed, err.Error())
		return "", e.MaxRetryInterval, false
	}
	if r := j.Current().Refused; r != nil {
		// The controller asks about the cache only for the node's pods: it keeps no copy here
		// (its namespace's quota in the cluster), and they read the model from the source. A
		// new request wakes the job.
		j.fail(r.Reason, r.Message)
		return "", e.MaxRetryInterval, false
	}
	if c := j.Current().Credentials; c != nil && c.KeyID != credentials.KeyID(j.env.Key.Public()) {
		// Sealed to the key of an earlier run of this agent: the controller seals them again
		// to the key this agent publishes.
		j.Set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.BytesPerSecond = inferencev1.CachePending, prewarmv1alpha1.ReasonWaitingForCredentials, 0
			st.Message = "waiting for the controller to seal this cache's credentials to the agent's current key"
		})
		return "", e.RetryInterval, false
	}
	// A disk mounted after the agent started (the root's mount propagates into its pod) is
	// taken on at the next try.
	_, err := j.env.CheckDisk(j.req.Root)
	if err == nil {
		dir, err = e.EnsureCacheDir(j.req.Root, j.req.UID)
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrNotConfined):
			j.fail(prewarmv1alpha1.ReasonHostPathNotAllowed, err.Error())
			return "", e.MaxRetryInterval, false
		case errors.Is(err, ErrNoDisk):
			j.fail(prewarmv1alpha1.ReasonNoLocalDisk, err.Error())
			return "", e.MaxRetryInterval, false
		}
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, err.Error())
		return "", 0, false
	}
	return dir, 0, true
}

// keep looks after a cache already on disk: checked cheaply first (the manifest is there,
// every file has its size), then, when due, by reading it all back against its checksums;
// damaged files are repaired. done reports that the cache needs no download (wait and ready
// are then once's results); otherwise the model is fetched, into what keep left of it.
func (j *Job) keep(ctx context.Context, model string) (wait time.Duration, ready, done bool) {
	e := j.env
	log := ctrl.LoggerFrom(ctx)
	m, damaged, err := engine.Check(ctx, model, engine.CheckOptions{})
	if pinned := j.PinnedRevision(); err == nil && len(damaged) == 0 && pinned != "" && m.Revision != "" && m.Revision != pinned {
		// Another revision than the one the cache is pinned to (downloaded while the source was
		// rewritten): not served; the pinned revision is fetched, if the source still holds it.
		log.Info("the cache holds another revision than the one it is pinned to", "holds", m.Revision, "pinned", pinned)
		err = errOtherRevision
	}
	if err == nil && len(damaged) == 0 {
		j.ready(model, m)
		if !j.verifyDue() {
			return j.untilNextCheck(), true, true
		}
		m, damaged, err = j.verifyContent(ctx, model)
		if err == nil && len(damaged) == 0 {
			return j.untilNextCheck(), true, true
		}
		if ctx.Err() != nil {
			return 0, false, true
		}
	}
	switch {
	case errors.Is(err, errOtherRevision):
		msg := fmt.Sprintf("holds revision %s, but the cache is pinned to %s; fetching that", m.Revision, j.PinnedRevision())
		j.Set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.BytesPerSecond, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonSourceChanged, 0, msg
		})
	case err == nil:
		return j.damaged(ctx, model, m, damaged)
	case errors.Is(err, os.ErrNotExist) && j.waitsForRoom():
		// Evicted: fetched again only when it fits under the low watermark, evicting nothing
		// (up to the high one, the next download would evict again at once).
		if room, rerr := j.env.RoomFor(j.req.Root, j.req.UID); rerr == nil {
			if need := j.Snapshot().BytesTotal; need > room.Quiet {
				j.waitForRoom(room.Disk, need, room.Quiet)
				return e.RecheckInterval, false, true
			}
		}
	case errors.Is(err, os.ErrNotExist) && j.retained() && !j.isDemanded():
		// Not a current target: keep what is here, fetch nothing new.
		j.Set(NotTarget)
		return e.RecheckInterval, false, true
	case !errors.Is(err, os.ErrNotExist) || j.State() == inferencev1.CacheReady:
		// It was there and cannot be read any more: fetch it again, from scratch.
		return j.lost(ctx, model, err)
	}
	return 0, false, false
}

// damaged takes the cache out of Ready (the node loses its label) when some of its files
// (damaged, of m's) are damaged, warns the pods that read them, and fetches only those again.
func (j *Job) damaged(ctx context.Context, model string, m *engine.Manifest, damaged []engine.Damage) (wait time.Duration, ready, done bool) {
	j.env.Withdraw(j.req.UID) // nothing of it is offered until it is whole again
	j.env.Metrics.Damaged.Add(float64(len(damaged)))
	msg := damageMessage(damaged, len(m.Files))
	ctrl.LoggerFrom(ctx).Info("cache damaged; repairing", "files", len(damaged), "damage", msg)
	j.env.WarnDamaged(ctx, j, fmt.Sprintf("re-verification on node %s: %s; fetching them again. "+
		"What this pod read of them before may have been damaged, and a file it holds open stays the damaged copy: restart the pod to read the repaired files",
		j.env.NodeName, msg))
	j.Set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonCacheDamaged, msg+"; fetching them again"
	})
	// When the repair is not done, the source changed since: the whole model is fetched again,
	// into a new copy.
	return j.repair(ctx, model, damaged)
}

// lost puts aside (or removes) a cache that was there and cannot be read any more (why), to be
// fetched again from scratch.
func (j *Job) lost(ctx context.Context, model string, why error) (wait time.Duration, ready, done bool) {
	ctrl.LoggerFrom(ctx).Info("cache is not whole; fetching it again", "reason", why.Error())
	j.Set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonCacheLost, "the cache is not whole: "+why.Error()
	})
	aside, err := j.env.SetAside(model) // a pod's volume may still mount it
	if err == nil && !aside {
		err = os.RemoveAll(model)
	}
	if err != nil {
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, err.Error())
		return 0, false, true
	}
	return 0, false, false
}

// fetch downloads the model (resuming what an earlier run left) and makes the cache Ready.
func (j *Job) fetch(ctx context.Context, model string) (time.Duration, bool) {
	log := ctrl.LoggerFrom(ctx)
	var res engine.Result
	var err error
	for evicted := false; ; {
		err = j.download(ctx, func(eng *engine.Engine, src source.Source) error {
			j.Set(func(st *prewarmv1alpha1.CacheStatus) { Listing(st, j.req.Source) })
			var err error
			src, digests, stop := j.witnessed(ctx, src)
			defer stop()
			res, err = eng.Fetch(ctx, engine.Request{Source: src, Dest: model, Revision: j.PinnedRevision(), Swarm: j.swarm(ctx), TrustPeers: j.trustsPeers(), Digests: digests})
			return err
		})
		// The engine writes nothing before the model is known to fit: the room is made then,
		// by evicting other caches, and the download tried once more.
		var space *engine.InsufficientSpaceError
		if evicted || !errors.As(err, &space) || ctx.Err() != nil {
			break
		}
		if j.waitsForRoom() {
			if room, rerr := j.env.RoomFor(j.req.Root, j.req.UID); rerr == nil {
				j.env.Withdraw(j.req.UID)
				j.waitForRoom(room.Disk, space.Need, room.Free)
				return j.env.RecheckInterval, false
			}
			break
		}
		freed, release, rerr := j.env.MakeRoom(ctx, j, space.Need)
		if rerr != nil {
			err = rerr
			break
		}
		defer release()
		log.Info("made room for the cache", "need", space.Need, "freed", freed)
		evicted = true
	}
	if err != nil {
		j.env.Withdraw(j.req.UID)
		if ctx.Err() != nil {
			return 0, false
		}
		reason, msg, wait := j.classify(err)
		log.Info("download failed", "reason", reason, "error", msg)
		j.fail(reason, msg)
		return wait, false
	}
	digest := "" // the download listed the source with these credentials
	if c := j.Current().Credentials; c != nil {
		digest = c.Digest
	}
	j.credentialsAccepted(digest)
	log.Info("cache ready", "bytes", res.Bytes, "fetched", res.Fetched, "fromPeers", res.FromPeers, "duration", res.Duration.String())
	return j.settle(ctx, model, "published")
}

// settle makes the cache Ready after a download or a repair, which verified every file it
// wrote, once the result checks.
func (j *Job) settle(ctx context.Context, model, what string) (time.Duration, bool) {
	m, damaged, err := engine.Check(ctx, model, engine.CheckOptions{})
	if err == nil && len(damaged) > 0 {
		err = errors.New(damageMessage(damaged, len(m.Files)))
	}
	if err != nil {
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, fmt.Sprintf("the %s cache does not check: %v", what, err))
		return 0, false
	}
	j.ready(model, m)
	j.setVerified()
	return j.untilNextCheck(), true
}

// State is the cache's state now.
func (j *Job) State() inferencev1.CacheState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.status.State
}

func (j *Job) ready(model string, m *engine.Manifest) {
	j.SetEvicted("")
	j.env.Offer(j.req.UID, model, m)
	var total int64
	for _, f := range m.Files {
		total += f.Size
	}
	j.Set(func(st *prewarmv1alpha1.CacheStatus) { Verified(st, len(m.Files), total, m.Revision) })
}

func (j *Job) fail(reason, msg string) {
	j.env.Metrics.Failures.WithLabelValues(reason).Inc()
	if len(msg) > 1000 {
		msg = msg[:1000] + "…"
	}
	j.Set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.Message, st.BytesPerSecond = inferencev1.CacheFailed, reason, msg, 0
	})
}

// errOtherRevision says the cache on disk holds another revision than the one it is pinned to.
var errOtherRevision = errors.New("another revision than the pinned one")

// PinnedRevision is the only content revision the cache may hold (S3 and FSx sources, once the
// controller has pinned it); a Hugging Face source is pinned by its commit instead.
func (j *Job) PinnedRevision() string {
	if j.req.Source.Type == inferencev1.ModelSourceHuggingFace {
		return ""
	}
	return j.Current().Source.Revision
}

// classify turns a Fetch error into a reason, a message for people and the wait before the
// next try (0: the backoff).
func (j *Job) classify(err error) (string, string, time.Duration) {
	e := j.env
	var space *engine.InsufficientSpaceError
	var verify *engine.VerificationError
	var refused Refusal
	switch {
	case errors.As(err, &refused):
		return refused.Reason(), refused.Error(), e.MaxRetryInterval
	case errors.As(err, &space):
		msg := fmt.Sprintf("needs %s, %s free under %s", engine.HumanBytes(space.Need), engine.HumanBytes(space.Free), j.req.Root)
		if e.Reserve > 0 {
			msg += fmt.Sprintf(" (after keeping %s free)", engine.HumanBytes(e.Reserve))
		}
		return prewarmv1alpha1.ReasonInsufficientCapacity, msg, e.MaxRetryInterval
	case errors.Is(err, source.ErrNotFound):
		return prewarmv1alpha1.ReasonSourceNotFound, err.Error(), e.MaxRetryInterval
	case errors.Is(err, source.ErrAccessDenied):
		return prewarmv1alpha1.ReasonAccessDenied, err.Error(), e.MaxRetryInterval
	case errors.As(err, &verify):
		return prewarmv1alpha1.ReasonVerificationFailed, err.Error(), 0
	case errors.Is(err, engine.ErrSourceChanged):
		return prewarmv1alpha1.ReasonSourceChanged, err.Error() + "; the objects were rewritten under the same location: use a new modelLocation for new weights", e.MaxRetryInterval
	case errors.Is(err, engine.ErrInvalidModel), errors.Is(err, source.ErrTooManyFiles), errors.Is(err, ErrNotConfined), permanentRefusal(err):
		return prewarmv1alpha1.ReasonInvalidSource, err.Error(), e.MaxRetryInterval
	case source.Retryable(err):
		return prewarmv1alpha1.ReasonSourceUnreachable, err.Error(), 0
	}
	return prewarmv1alpha1.ReasonDownloadFailed, err.Error(), 0
}

// permanentRefusal reports whether err is a source's answer that another try will not change:
// a 4xx other than throttling and timeouts (access and not-found are classified before).
func permanentRefusal(err error) bool {
	var se *source.StatusError
	return errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500 && !source.Retryable(err)
}

// Demand makes the job download now, ahead of the caches no pod waits for, even on a node that
// is no longer a target. It reports whether this is the first demand.
func (j *Job) Demand() bool {
	first := false
	j.demandOnce.Do(func() {
		first = true
		close(j.demanded)
		select {
		case j.changed <- struct{}{}: // out of a retry wait
		default:
		}
	})
	return first
}

func (j *Job) isDemanded() bool {
	select {
	case <-j.demanded:
		return true
	default:
		return false
	}
}
