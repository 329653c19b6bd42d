package agent

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// A node whose cache root is not a disk of its own (NoLocalDisk) keeps no cache, but its pods
// still get their model: the node plugin downloads it from the source, once for all the
// cache's pods on the node, into a scratch copy under the kubelet's directory, where a pod's
// own download into an emptyDir would have gone. The copy is not a cache: the node is not
// labelled, shares nothing with peers, and the copy is removed when the last pod that uses it
// has gone.

// scratchDir is where scratch copies are kept, under the kubelet's directory (the node
// plugin's own directory there, which the agent mounts).
func (o *Options) scratchDir() string {
	return filepath.Join(o.KubeletDir, "plugins", prewarmv1alpha1.CSIDriverName, "scratch")
}

// scratch is the copy of one cache for the pods of a node with no local disk.
type scratch struct {
	uid, ns string
	dir     string
	// guarded by the agent's mu:
	ready    bool
	progress engine.Progress
	err      error
	// asked is when a pod last asked for the copy: it is not removed for RetryInterval after,
	// so that a pod whose mount is under way is not left without it.
	asked time.Time
}

func (s *scratch) model() string { return filepath.Join(s.dir, prewarmv1alpha1.ModelSubdir) }

// scratchToMount answers a pod's mount of j's cache on a node with no local disk: the scratch
// copy's model once it is whole, else why the pod waits (the first ask starts the download).
func (a *Agent) scratchToMount(ctx context.Context, req MountRequest, j *job, st prewarmv1alpha1.CacheStatus) (string, bool, error) {
	if a.opts.KubeletDir == "" {
		return "", false, a.refuse(req, codes.FailedPrecondition, fmt.Sprintf("node %s cannot hold cache %s: %s: %s", a.opts.NodeName, req.CacheUID, st.Reason, st.Message))
	}
	ns := j.current().Namespace
	j.demand() // a pod waits: the download may take the node's extra slot
	a.mu.Lock()
	s := a.scratches[req.CacheUID]
	if s == nil {
		s = &scratch{uid: req.CacheUID, ns: ns, dir: filepath.Join(a.opts.scratchDir(), req.CacheUID)}
		a.scratches[s.uid] = s
		a.goroutines.Add(1)
		go a.keepScratch(ctrl.LoggerInto(a.life, ctrl.Log.WithName("scratch").WithValues("cache", s.uid)), s, j)
	}
	s.asked = a.opts.Now()
	ready, p, err := s.ready, s.progress, s.err
	a.mu.Unlock()
	if !ready {
		msg := truncate(fmt.Sprintf("node %s cannot hold cache %s (%s: %s); downloading a copy of it for its pods from the source: %s",
			a.opts.NodeName, req.CacheUID, st.Reason, st.Message, progressText(p)), 1024)
		if err != nil {
			msg += fmt.Sprintf("; the last try failed, trying again: %v", err)
		}
		a.event(req, corev1.EventTypeNormal, EventCacheFilling, msg)
		return "", true, status.Error(codes.Unavailable, msg)
	}
	if err := j.checkCredentials(ctx); err != nil {
		if errors.Is(err, source.ErrAccessDenied) {
			return "", false, a.refuse(req, codes.PermissionDenied, fmt.Sprintf("the origin refused namespace %s's credentials for %s: %v", req.PodNamespace, j.current().Source, err))
		}
		return "", false, a.refuse(req, codes.Unavailable, fmt.Sprintf("checking namespace %s's credentials for %s with the origin: %v", req.PodNamespace, j.current().Source, err))
	}
	return s.model(), false, nil
}

func progressText(p engine.Progress) string {
	if p.BytesTotal == 0 {
		return "listing the source"
	}
	return fmt.Sprintf("%d%%: %s of %s", p.BytesDone*100/p.BytesTotal, engine.HumanBytes(p.BytesDone), engine.HumanBytes(p.BytesTotal))
}

// keepScratch downloads s (again after a failure, with the job's backoff) while pods on the node
// use it, and removes it when none does.
func (a *Agent) keepScratch(ctx context.Context, s *scratch, j *job) {
	defer a.goroutines.Done()
	log := ctrl.LoggerFrom(ctx)
	retry := a.opts.RetryInterval
	for {
		a.mu.Lock()
		ready := s.ready
		a.mu.Unlock()
		wait := a.opts.RetryInterval
		if !ready {
			err := a.fetchScratch(ctx, s, j)
			a.mu.Lock()
			s.ready, s.err = err == nil, err
			a.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				log.Info("downloading the scratch copy failed", "error", err.Error())
				wait, retry = retry, min(2*retry, a.opts.MaxRetryInterval)
			} else {
				log.Info("scratch copy ready for the node's pods", "dir", s.dir)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		pod, err := a.podUsing(ctx, s.uid, s.ns)
		if err != nil || pod != "" {
			continue
		}
		// Out of the way at once, under the lock: a pod that asks from now on starts a copy
		// of its own, and never finds this one half removed.
		a.mu.Lock()
		if a.opts.Now().Sub(s.asked) < a.opts.RetryInterval {
			a.mu.Unlock()
			continue
		}
		delete(a.scratches, s.uid)
		trash := filepath.Join(a.opts.scratchDir(), fmt.Sprintf("%s%s-%d", trashPrefix, s.uid, a.opts.Now().UnixNano()))
		err = os.Rename(s.dir, trash)
		a.mu.Unlock()
		if err == nil {
			err = os.RemoveAll(trash)
		}
		if err != nil && !errors.Is(err, iofs.ErrNotExist) {
			log.Error(err, "removing the scratch copy (the sweep tries again)")
		} else {
			log.Info("removed the scratch copy: no pod on the node uses it")
		}
		return
	}
}

// trashPrefix begins the names of scratch copies being removed.
const trashPrefix = ".removing-"

// fetchScratch downloads j's source into s (resuming a partial copy), unless it is whole there.
func (a *Agent) fetchScratch(ctx context.Context, s *scratch, j *job) error {
	if _, err := engine.CheckDest(s.model()); err == nil {
		return nil // left by an earlier run of the agent, for pods still there
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	return j.downloadReporting(ctx, func(p engine.Progress) {
		a.mu.Lock()
		s.progress = p
		a.mu.Unlock()
	}, func(eng *engine.Engine, src source.Source) error {
		_, err := eng.Fetch(ctx, engine.Request{Source: src, Dest: s.model(), Revision: j.pinnedRevision()})
		return err
	})
}

// scratchNote is what a cache's report says of its scratch copy on this node ("": none).
// Guarded by a.mu.
func (a *Agent) scratchNote(uid string) string {
	s := a.scratches[uid]
	switch {
	case s == nil:
		return ""
	case s.ready:
		return "; the node's pods read the model from a copy under the kubelet's directory, removed when they end"
	}
	return "; downloading a copy for the node's pods from the source, " + progressText(s.progress)
}

// sweepScratch removes the scratch copies that no pod on the node uses and no download keeps
// (left by an earlier run of the agent): each is first renamed out of the way, so that a pod
// asking for it at that moment starts a copy of its own.
func (a *Agent) sweepScratch(ctx context.Context) error {
	if a.opts.KubeletDir == "" {
		return nil
	}
	root := a.opts.scratchDir()
	entries, err := os.ReadDir(root)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		trash := strings.HasPrefix(name, trashPrefix)
		if !trash && !uidPattern.MatchString(name) {
			continue // not ours
		}
		if !trash {
			pod, err := a.podUsing(ctx, name, "")
			if err != nil {
				return err
			}
			a.mu.Lock()
			_, kept := a.scratches[name]
			if kept || pod != "" {
				a.mu.Unlock()
				continue
			}
			to := fmt.Sprintf("%s%s-%d", trashPrefix, name, a.opts.Now().UnixNano())
			err = os.Rename(filepath.Join(root, name), filepath.Join(root, to))
			a.mu.Unlock()
			if err != nil {
				return err
			}
			name = to
		}
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			return err
		}
		ctrl.LoggerFrom(ctx).Info("removed a scratch copy no pod uses", "entry", name)
	}
	return nil
}

// scratchSweeper sweeps the scratch copies when the agent starts and every RecheckInterval.
type scratchSweeper struct{ a *Agent }

// NeedLeaderElection is false: every node's agent sweeps its own.
func (scratchSweeper) NeedLeaderElection() bool { return false }

func (w scratchSweeper) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("scratch")
	for {
		if err := w.a.sweepScratch(ctrl.LoggerInto(ctx, log)); err != nil {
			log.Error(err, "sweeping the scratch copies; will retry")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.a.opts.RecheckInterval):
		}
	}
}
