package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// job keeps one cache on the node: downloads it, re-checks it, retries after failures.
type job struct {
	a      *Agent
	req    prewarmv1alpha1.CacheRequest
	cancel context.CancelFunc
	done   chan struct{}
	// status is guarded by a.mu.
	status prewarmv1alpha1.CacheStatus
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
	j.a.markDirty()
}

func (j *job) run(ctx context.Context) {
	defer close(j.done)
	log := ctrl.LoggerFrom(ctx)
	dir := j.a.opts.cacheDir(j.req.Root, j.req.UID)
	retry := j.a.opts.RetryInterval
	for {
		wait, ok := j.once(ctx, dir)
		if ok {
			retry = j.a.opts.RetryInterval
		} else if wait == 0 {
			wait = retry
			retry = min(2*retry, j.a.opts.MaxRetryInterval)
		}
		log.V(1).Info("next check", "after", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// once brings the cache to Ready if it can. It returns how long to wait before the next
// check (0: the retry backoff decides) and whether the cache is Ready.
func (j *job) once(ctx context.Context, dir string) (time.Duration, bool) {
	o := &j.a.opts
	if !o.allowedRoot(j.req.Root) {
		j.fail(prewarmv1alpha1.ReasonHostPathNotAllowed, fmt.Sprintf("%s is not an allowed cache root on this node (allowed: %v)", j.req.Root, o.Roots))
		return o.MaxRetryInterval, false
	}
	if err := o.checkSource(j.req.Source); err != nil {
		j.fail(prewarmv1alpha1.ReasonSourceNotAllowed, err.Error())
		return o.MaxRetryInterval, false
	}
	// A cache already on disk is checked cheaply: the manifest is there, every file has its size.
	m, err := engine.CheckDest(dir)
	if err == nil {
		j.ready(m)
		return o.RecheckInterval, true
	}
	if !errors.Is(err, os.ErrNotExist) || j.snapshotState() == inferencev1.CacheReady {
		// It was there and is not whole any more: fetch it again, from scratch.
		ctrl.LoggerFrom(ctx).Info("cache is not whole; fetching it again", "reason", err.Error())
		j.set(func(st *prewarmv1alpha1.CacheStatus) {
			st.State, st.Reason, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonCacheLost, "the cache is not whole: "+err.Error()
		})
		if err := os.RemoveAll(dir); err != nil {
			j.fail(prewarmv1alpha1.ReasonDownloadFailed, err.Error())
			return 0, false
		}
	}

	// Wait for a download slot.
	select {
	case j.a.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, false
	}
	defer func() { <-j.a.sem }()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, err.Error())
		return 0, false
	}
	srcOpts := o.Sources
	srcOpts.Region = j.req.Region
	uri := j.req.Source
	if strings.HasPrefix(uri, "hf://") {
		srcOpts.Endpoint, srcOpts.PathStyle = o.HFEndpoint, false
		if j.req.TokenSecret != "" {
			sec := &corev1.Secret{}
			if err := j.a.secrets.Get(ctx, types.NamespacedName{Namespace: o.Namespace, Name: j.req.TokenSecret}, sec); err != nil {
				j.fail(prewarmv1alpha1.ReasonAccessDenied, fmt.Sprintf("reading the token Secret %s/%s: %v", o.Namespace, j.req.TokenSecret, err))
				return 0, false
			}
			srcOpts.Token = string(sec.Data["token"])
		}
	}
	if filepath.IsAbs(uri) {
		uri = o.local(uri)
	}
	src, err := sources.Open(ctx, uri, srcOpts)
	if err != nil {
		reason, msg, wait := j.classify(err)
		j.fail(reason, msg)
		return wait, false
	}
	j.set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.Message = inferencev1.CacheDownloading, prewarmv1alpha1.ReasonDownloading, "listing "+j.req.Source
	})
	eng := engine.New(append(append([]engine.Option{}, o.Engine...),
		engine.WithFreeSpace(j.a.freeSpace), engine.WithRegisterer(o.Registerer),
		engine.WithProgress(func(p engine.Progress) {
			j.set(func(st *prewarmv1alpha1.CacheStatus) {
				st.BytesDone, st.BytesTotal, st.Files = p.BytesDone, p.BytesTotal, int32(p.FilesTotal)
				st.BytesPerSecond = int64(p.BytesPerSecond)
				if p.Phase != engine.PhaseDone {
					st.Message = fmt.Sprintf("%s: %s of %s", p.Phase, engine.HumanBytes(p.BytesDone), engine.HumanBytes(p.BytesTotal))
				}
			})
		}, o.StatusInterval))...)
	res, err := eng.Fetch(ctx, engine.Request{Source: src, Dest: dir})
	if err != nil {
		if ctx.Err() != nil {
			return 0, false
		}
		reason, msg, wait := j.classify(err)
		ctrl.LoggerFrom(ctx).Info("download failed", "reason", reason, "error", msg)
		j.fail(reason, msg)
		return wait, false
	}
	ctrl.LoggerFrom(ctx).Info("cache ready", "bytes", res.Bytes, "fetched", res.Fetched, "duration", res.Duration.String())
	m, err = engine.CheckDest(dir)
	if err != nil {
		j.fail(prewarmv1alpha1.ReasonDownloadFailed, "the published cache does not check: "+err.Error())
		return 0, false
	}
	j.ready(m)
	return o.RecheckInterval, true
}

func (j *job) snapshotState() inferencev1.CacheState {
	j.a.mu.Lock()
	defer j.a.mu.Unlock()
	return j.status.State
}

func (j *job) ready(m *engine.Manifest) {
	var total int64
	for _, f := range m.Files {
		total += f.Size
	}
	j.set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason = inferencev1.CacheReady, prewarmv1alpha1.ReasonVerified
		st.Message = fmt.Sprintf("%d files, %s, verified", len(m.Files), engine.HumanBytes(total))
		st.BytesDone, st.BytesTotal, st.BytesPerSecond = total, total, 0
		st.Files, st.Revision = int32(len(m.Files)), m.Revision
	})
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
	case source.Retryable(err):
		return prewarmv1alpha1.ReasonSourceUnreachable, err.Error(), 0
	}
	return prewarmv1alpha1.ReasonDownloadFailed, err.Error(), 0
}
