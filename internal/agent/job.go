package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// job keeps one cache on the node: downloads it, re-checks it, retries after failures.
type job struct {
	a      *Agent
	req    prewarmv1alpha1.CacheRequest
	cancel context.CancelFunc
	done   chan struct{}
	// status, and latest (the request as it is now: its retention, pinned revision and sealed
	// credentials change while the job runs, without a restart), are guarded by a.mu.
	status prewarmv1alpha1.CacheStatus
	latest prewarmv1alpha1.CacheRequest
	// changed wakes the job when latest changes (new credentials, a pin, a retention).
	changed chan struct{}
	// demanded is closed when a pod on the node waits for the cache (fill on a miss).
	demanded   chan struct{}
	demandOnce sync.Once
	// credsDigest is the digest of the credentials the origin last accepted, at credsAt
	// (guarded by a.mu).
	credsChecked bool
	credsDigest  string
	credsAt      time.Time
}

// current returns the request as it is now.
func (j *job) current() prewarmv1alpha1.CacheRequest {
	j.a.mu.Lock()
	defer j.a.mu.Unlock()
	return j.latest
}

func (j *job) retained() bool {
	j.a.mu.Lock()
	defer j.a.mu.Unlock()
	return j.latest.RetainedSince != ""
}

func (j *job) snapshot() prewarmv1alpha1.CacheStatus { return *j.status.DeepCopy() }

// set changes the job's status; a change of state stamps the transition time.
func (j *job) set(fn func(st *prewarmv1alpha1.CacheStatus)) {
	j.a.mu.Lock()
	before := j.status.State
	fn(&j.status)
	if j.status.State != before {
		j.status.LastTransitionTime = j.a.now()
	}
	j.a.mu.Unlock()
}

func (j *job) run(ctx context.Context) {
	defer close(j.done)
	log := ctrl.LoggerFrom(ctx)
	retry := j.a.opts.RetryInterval
	if err := j.a.migrateLayout(j.req.Root, j.req.UID); err != nil {
		log.Error(err, "moving a cache of the earlier layout into place")
	}
	for {
		wait, ok := j.once(ctx)
		if ok {
			retry = j.a.opts.RetryInterval
		} else if wait == 0 {
			wait = retry
			retry = min(2*retry, j.a.opts.MaxRetryInterval)
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
func (j *job) once(ctx context.Context) (time.Duration, bool) {
	dir, wait, ok := j.admit()
	if !ok {
		return wait, false
	}
	model := filepath.Join(dir, prewarmv1alpha1.ModelSubdir)
	if err := j.a.sweepSetAside(model); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "removing copies of the cache no pod mounts any more")
	}
	if wait, ready, done := j.keep(ctx, model); done {
		return wait, ready
	}
	// What is there is replaced: kept aside while a pod's volume mounts it.
	if aside, err := j.a.setAside(model); err != nil {
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
func (j *job) admit() (dir string, wait time.Duration, ok bool) {
	o := &j.a.opts
	if !o.allowedRoot(j.req.Root) {
		j.fail(prewarmv1alpha1.ReasonHostPathNotAllowed, fmt.Sprintf("%s is not an allowed cache root on this node (allowed: %v)", j.req.Root, o.Config.Roots()))
		return "", o.MaxRetryInterval, false
	}
	if _, _, err := o.sourceSpec(j.req.Source); err != nil {
		j.fail(prewarmv1alpha1.ReasonSourceNotAllowed, err.Error())
		return "", o.MaxRetryInterval, false
	}
	if err := o.mayRead(j.current()); err != nil {
		j.fail(prewarmv1alpha1.ReasonSourceNotAllowed, err.Error())
		return "", o.MaxRetryInterval, false
	}
	if c := j.current().Credentials; c != nil && c.KeyID != credentials.KeyID(j.a.key.Public()) {
		// Sealed to the key of an earlier run of this agent: the controller seals them again
		// to the key this agent publishes.
		j.set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.BytesPerSecond = inferencev1.CachePending, prewarmv1alpha1.ReasonWaitingForCredentials, 0
			st.Message = "waiting for the controller to seal this cache's credentials to the agent's current key"
		})
		return "", o.RetryInterval, false
	}
	// A disk mounted after the agent started (the root's mount propagates into its pod) is
	// taken on at the next try.
	err := j.a.checkDisk(j.req.Root)
	if err == nil {
		dir, err = o.ensureCacheDir(j.req.Root, j.req.UID)
	}
	if err != nil {
		switch {
		case errors.Is(err, errNotConfined):
			j.fail(prewarmv1alpha1.ReasonHostPathNotAllowed, err.Error())
			return "", o.MaxRetryInterval, false
		case errors.As(err, new(errNoDisk)):
			j.fail(prewarmv1alpha1.ReasonNoLocalDisk, err.Error())
			return "", o.MaxRetryInterval, false
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
func (j *job) keep(ctx context.Context, model string) (wait time.Duration, ready, done bool) {
	o := &j.a.opts
	log := ctrl.LoggerFrom(ctx)
	m, damaged, err := engine.Check(ctx, model, engine.CheckOptions{})
	if pinned := j.pinnedRevision(); err == nil && len(damaged) == 0 && pinned != "" && m.Revision != "" && m.Revision != pinned {
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
		msg := fmt.Sprintf("holds revision %s, but the cache is pinned to %s; fetching that", m.Revision, j.pinnedRevision())
		j.set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.BytesPerSecond, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonSourceChanged, 0, msg
		})
	case err == nil:
		// Some files are damaged: out of Ready (the node loses its label), and only those files
		// are fetched again.
		j.a.withdraw(j.req.UID) // nothing of it is offered until it is whole again
		j.a.metrics.damaged.Add(float64(len(damaged)))
		msg := damageMessage(damaged, len(m.Files))
		log.Info("cache damaged; repairing", "files", len(damaged), "damage", msg)
		j.a.warnPods(ctx, j, EventCacheDamaged, fmt.Sprintf("re-verification on node %s: %s; fetching them again. "+
			"What this pod read of them before may have been damaged, and a file it holds open stays the damaged copy: restart the pod to read the repaired files",
			j.a.opts.NodeName, msg))
		j.set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonCacheDamaged, msg+"; fetching them again"
		})
		// When the repair is not done, the source changed since: the whole model is fetched
		// again, into a new copy.
		return j.repair(ctx, model, damaged)
	case errors.Is(err, os.ErrNotExist) && j.retained() && !j.isDemanded():
		// Not a current target: keep what is here, fetch nothing new.
		j.set(NotTarget)
		return o.RecheckInterval, false, true
	case !errors.Is(err, os.ErrNotExist) || j.snapshotState() == inferencev1.CacheReady:
		// It was there and cannot be read any more: fetch it again, from scratch.
		log.Info("cache is not whole; fetching it again", "reason", err.Error())
		j.set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonCacheLost, "the cache is not whole: "+err.Error()
		})
		aside, err := j.a.setAside(model) // a pod's volume may still mount it
		if err == nil && !aside {
			err = os.RemoveAll(model)
		}
		if err != nil {
			j.fail(prewarmv1alpha1.ReasonDownloadFailed, err.Error())
			return 0, false, true
		}
	}
	return 0, false, false
}

// fetch downloads the model (resuming what an earlier run left) and makes the cache Ready.
func (j *job) fetch(ctx context.Context, model string) (time.Duration, bool) {
	log := ctrl.LoggerFrom(ctx)
	var res engine.Result
	err := j.download(ctx, func(eng *engine.Engine, src source.Source) error {
		j.set(func(st *prewarmv1alpha1.CacheStatus) { Listing(st, j.req.Source) })
		var err error
		res, err = eng.Fetch(ctx, engine.Request{Source: src, Dest: model, Revision: j.pinnedRevision(), Swarm: j.swarm(ctx), TrustPeers: j.trustsPeers()})
		return err
	})
	if err != nil {
		j.a.withdraw(j.req.UID)
		if ctx.Err() != nil {
			return 0, false
		}
		reason, msg, wait := j.classify(err)
		log.Info("download failed", "reason", reason, "error", msg)
		j.fail(reason, msg)
		return wait, false
	}
	digest := "" // the download listed the source with these credentials
	if c := j.current().Credentials; c != nil {
		digest = c.Digest
	}
	j.credentialsAccepted(digest)
	log.Info("cache ready", "bytes", res.Bytes, "fetched", res.Fetched, "fromPeers", res.FromPeers, "duration", res.Duration.String())
	return j.settle(ctx, model, "published")
}

// settle makes the cache Ready after a download or a repair, which verified every file it
// wrote, once the result checks.
func (j *job) settle(ctx context.Context, model, what string) (time.Duration, bool) {
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

// download runs fn with an engine that reports into the job's status and the cache's source,
// once one of the node's download slots is free.
func (j *job) download(ctx context.Context, fn func(*engine.Engine, source.Source) error) error {
	var last engine.Progress
	return j.downloadReporting(ctx, func(p engine.Progress) {
		// What this copy cost the origin and the peers adds up over every download of it
		// since the agent started.
		j.set(func(st *prewarmv1alpha1.CacheStatus) { Progressed(st, p, last) })
		last = p
	}, fn)
}

// downloadReporting runs fn with an engine that reports to progress and reads the cache's
// source, once one of the node's download slots is free.
func (j *job) downloadReporting(ctx context.Context, progress func(engine.Progress), fn func(*engine.Engine, source.Source) error) error {
	release, err := j.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	src, closeSrc, err := j.openSource(ctx)
	if err != nil {
		return err
	}
	defer closeSrc()
	o := &j.a.opts
	eng := engine.New(append(append([]engine.Option{}, o.Engine...),
		engine.WithFreeSpace(j.a.freeSpace), engine.WithRegisterer(o.Registerer), engine.WithBudget(j.a.budget(j.req.Source.Type)),
		engine.WithProgress(progress, o.StatusInterval))...)
	err = fn(eng, src)
	if fs, ok := src.(*fs.Source); ok && len(fs.Skipped()) > 0 {
		ctrl.LoggerFrom(ctx).Info("links that lead out of the model's directory were skipped", "links", fs.Skipped())
	}
	return err
}

// slot waits for one of the node's download slots. A cache a pod waits for (fill on a miss)
// may also take the node's one extra slot for such caches, so it does not queue behind caches
// no pod waits for.
func (j *job) slot(ctx context.Context) (func(), error) {
	sem, urgent := j.a.sem, j.a.urgent
	for {
		if j.isDemanded() {
			select {
			case sem <- struct{}{}:
				return func() { <-sem }, nil
			case urgent <- struct{}{}:
				return func() { <-urgent }, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		select {
		case sem <- struct{}{}:
			return func() { <-sem }, nil
		case <-j.demanded:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// openSource opens the cache's source. File sources are opened inside their allowed root, so
// no link on the way leads out of it.
func (j *job) openSource(ctx context.Context) (source.Source, func(), error) {
	o := &j.a.opts
	cs := j.req.Source
	if cs.Type == inferencev1.ModelSourceFSx {
		root, rel, err := o.fileSource(j.req.Namespace, cs)
		if err != nil {
			return nil, nil, err
		}
		src, err := fs.NewIn(root, rel, cs.String())
		if err != nil {
			root.Close()
			return nil, nil, err
		}
		return src, func() { src.Close(); root.Close() }, nil
	}
	spec, srcOpts, err := o.sourceSpec(cs)
	if err != nil {
		return nil, nil, err
	}
	if c := j.current().Credentials; c != nil {
		creds, err := j.a.key.Open(o.NodeName, j.req.UID, c)
		if err != nil {
			return nil, nil, &source.AccessError{Err: err}
		}
		srcOpts.Token = creds.HFToken
		srcOpts.AccessKeyID, srcOpts.SecretAccessKey, srcOpts.SessionToken = creds.AWSAccessKeyID, creds.AWSSecretAccessKey, creds.AWSSessionToken
	}
	src, err := sources.Open(ctx, spec, srcOpts)
	if err != nil {
		return nil, nil, err
	}
	return src, func() {}, nil
}

// repair fetches the damaged files again. done is false when the source has changed since the
// cache was made, and the whole model must be fetched again instead.
func (j *job) repair(ctx context.Context, model string, damaged []engine.Damage) (wait time.Duration, ok, done bool) {
	paths := make([]string, len(damaged))
	for i, d := range damaged {
		paths[i] = d.Path
	}
	var res engine.Result
	err := j.download(ctx, func(eng *engine.Engine, src source.Source) error {
		var err error
		res, err = eng.Repair(ctx, src, model, paths)
		return err
	})
	switch {
	case errors.Is(err, engine.ErrSourceChanged):
		ctrl.LoggerFrom(ctx).Info("the source changed since the cache was made; fetching the whole model again")
		return 0, false, false
	case err != nil:
		if ctx.Err() != nil {
			return 0, false, true
		}
		reason, msg, wait := j.classify(err)
		j.fail(reason, "repairing: "+msg)
		return wait, false, true
	}
	j.a.metrics.repaired.Add(float64(len(paths)))
	ctrl.LoggerFrom(ctx).Info("cache repaired", "files", len(paths), "fetched", res.Fetched)
	wait, ok = j.settle(ctx, model, "repaired")
	return wait, ok, true
}

// verifyContent reads the whole cache back against its checksums, at most VerifyRate bytes per
// second. The cache stays Ready meanwhile: it was whole by size, and was verified when written.
func (j *job) verifyContent(ctx context.Context, model string) (*engine.Manifest, []engine.Damage, error) {
	var last int64
	m, damaged, err := engine.Check(ctx, model, engine.CheckOptions{Content: true, Limiter: j.a.verifyLimiter, Read: func(n int64) {
		j.a.metrics.verified.Add(float64(n - last))
		last = n
	}})
	if err == nil && len(damaged) == 0 {
		j.setVerified()
		ctrl.LoggerFrom(ctx).Info("cache content verified", "bytes", last)
	}
	return m, damaged, err
}

func (j *job) verifyDue() bool {
	j.a.mu.Lock()
	defer j.a.mu.Unlock()
	v := j.status.LastVerifiedTime
	return v == nil || j.a.opts.Now().Sub(v.Time) >= j.a.opts.VerifyInterval
}

func (j *job) setVerified() {
	j.set(func(st *prewarmv1alpha1.CacheStatus) { st.LastVerifiedTime = j.a.now() })
}

// untilNextCheck is the wait before a Ready cache is checked again: the cheap re-check, or the
// content verification if that comes first.
func (j *job) untilNextCheck() time.Duration {
	o := &j.a.opts
	j.a.mu.Lock()
	v := j.status.LastVerifiedTime
	j.a.mu.Unlock()
	wait := o.RecheckInterval
	if v != nil {
		wait = min(wait, max(time.Second, o.VerifyInterval-o.Now().Sub(v.Time)))
	}
	return wait
}

// damageMessage says, for people, which files are damaged (the first few) out of how many.
func damageMessage(damaged []engine.Damage, files int) string {
	var parts []string
	for i, d := range damaged {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(damaged)-3))
			break
		}
		parts = append(parts, d.Path+": "+d.Problem)
	}
	return fmt.Sprintf("%d of %d files damaged (%s)", len(damaged), files, strings.Join(parts, "; "))
}

func (j *job) snapshotState() inferencev1.CacheState {
	j.a.mu.Lock()
	defer j.a.mu.Unlock()
	return j.status.State
}

func (j *job) ready(model string, m *engine.Manifest) {
	j.a.offer(j.req.UID, model, m)
	var total int64
	for _, f := range m.Files {
		total += f.Size
	}
	j.set(func(st *prewarmv1alpha1.CacheStatus) { Verified(st, len(m.Files), total, m.Revision) })
}

func (j *job) fail(reason, msg string) {
	j.a.metrics.failures.WithLabelValues(reason).Inc()
	if len(msg) > 1000 {
		msg = msg[:1000] + "…"
	}
	j.set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.Message, st.BytesPerSecond = inferencev1.CacheFailed, reason, msg, 0
	})
}

// errOtherRevision says the cache on disk holds another revision than the one it is pinned to.
var errOtherRevision = errors.New("another revision than the pinned one")

// pinnedRevision is the only content revision the cache may hold (S3 and FSx sources, once the
// controller has pinned it); a Hugging Face source is pinned by its commit instead.
func (j *job) pinnedRevision() string {
	if j.req.Source.Type == inferencev1.ModelSourceHuggingFace {
		return ""
	}
	return j.current().Source.Revision
}

// classify turns a Fetch error into a reason, a message for people and the wait before the
// next try (0: the backoff).
func (j *job) classify(err error) (string, string, time.Duration) {
	o := &j.a.opts
	var space *engine.InsufficientSpaceError
	var verify *engine.VerificationError
	switch {
	case errors.As(err, &space):
		msg := fmt.Sprintf("needs %s, %s free under %s", engine.HumanBytes(space.Need), engine.HumanBytes(space.Free), j.req.Root)
		if o.Reserve > 0 {
			msg += fmt.Sprintf(" (after keeping %s free)", engine.HumanBytes(o.Reserve))
		}
		return prewarmv1alpha1.ReasonInsufficientCapacity, msg, o.MaxRetryInterval
	case errors.Is(err, source.ErrNotFound):
		return prewarmv1alpha1.ReasonSourceNotFound, err.Error(), o.MaxRetryInterval
	case errors.Is(err, source.ErrAccessDenied):
		return prewarmv1alpha1.ReasonAccessDenied, err.Error(), o.MaxRetryInterval
	case errors.As(err, &verify):
		return prewarmv1alpha1.ReasonVerificationFailed, err.Error(), 0
	case errors.Is(err, engine.ErrSourceChanged):
		return prewarmv1alpha1.ReasonSourceChanged, err.Error() + "; the objects were rewritten under the same location: use a new modelLocation for new weights", o.MaxRetryInterval
	case errors.Is(err, engine.ErrInvalidModel), errors.Is(err, errNotConfined), permanentRefusal(err):
		return prewarmv1alpha1.ReasonInvalidSource, err.Error(), o.MaxRetryInterval
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
