package agent

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// A node that cannot hold a cache (NoLocalDisk, InsufficientCapacity, BudgetExceeded) keeps no
// copy of it, but its pods may still get their model: the node plugin downloads it from the
// source, once for all the cache's pods on the node, into a scratch copy under the kubelet's
// directory, where a pod's own download into an emptyDir would have gone. The copy is not a
// cache: the node is not labelled, shares nothing with peers, and the copy is removed when no
// pod on the node uses it, by the pod list and by the mount table (a volume still mounted keeps
// it, even when its pod object is gone). It claims its room first (scratchroom.go): within its
// namespace's per-node limit, the node's bound on copies, and the kubelet filesystem's
// watermark and reserve; past them the pod's mount is refused with the figures, and it waits.

// scratchDir is where scratch copies are kept, under the kubelet's directory (the node
// plugin's own directory there, which the agent mounts).
func (o *Options) scratchDir() string {
	return filepath.Join(o.KubeletDir, "plugins", prewarmv1alpha1.CSIDriverName, "scratch")
}

// scratch is the copy of one cache for the pods of a node with no local disk.
type scratch struct {
	uid, ns string
	dir     string
	// wake gets the copy's download out of its wait after a refusal: room may have been freed.
	wake chan struct{}

	// guarded by the scratches' mu:
	st scratchState
	// asked is when a pod last asked for the copy: it is not removed for RetryInterval after,
	// so that a pod whose mount is under way is not left without it.
	asked time.Time
}

func (s *scratch) model() string { return filepath.Join(s.dir, prewarmv1alpha1.ModelSubdir) }

// scratchState is what is known of a scratch copy at one moment.
type scratchState struct {
	ready    bool
	progress engine.Progress
	err      error
	// mounted says the copy was last kept because a pod's volume mounts it, though no pod on
	// the node uses it by the pod list.
	mounted bool
}

// refused reports whether the copy's last claim of room was refused.
func (st scratchState) refused() bool {
	var no *errNoScratchRoom
	return errors.As(st.err, &no)
}

// scratches are the node's scratch copies by cache UID, with what is known of each. They guard
// themselves; their lock is taken after the agent's mu, never before it.
type scratches struct {
	mu    sync.Mutex
	byUID map[string]*scratch
}

// state is the copy of cache uid (nil: none) and what is known of it.
func (c *scratches) state(uid string) (*scratch, scratchState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.byUID[uid]
	if s == nil {
		return nil, scratchState{}
	}
	return s, s.st
}

// ask notes that a pod asked for the copy of cache uid at now, adding the copy made by mk when
// there is none (made says so), and says what is known of it.
func (c *scratches) ask(uid string, now time.Time, mk func() *scratch) (s *scratch, st scratchState, made bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s = c.byUID[uid]
	if s == nil {
		s, made = mk(), true
		if c.byUID == nil {
			c.byUID = map[string]*scratch{}
		}
		c.byUID[uid] = s
	}
	s.asked = now
	return s, s.st, made
}

// update changes what is known of s by f, and returns what was known before.
func (c *scratches) update(s *scratch, f func(*scratchState)) scratchState {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := s.st
	f(&s.st)
	return before
}

// remove takes s out of the copies and moves its directory out of the way (move), unless a pod
// asked for it within quiet of now. Both happen under the lock, so a pod that asks from then on
// starts a copy of its own and never finds this one half removed.
func (c *scratches) remove(s *scratch, now time.Time, quiet time.Duration, move func() error) (removed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(s.asked) < quiet {
		return false, nil
	}
	delete(c.byUID, s.uid)
	return true, move()
}

// moveUnknown moves the directory of cache uid's copy out of the way (move) unless the copy is
// one of the agent's, under the lock a pod's ask takes.
func (c *scratches) moveUnknown(uid string, move func() error) (moved bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, known := c.byUID[uid]; known {
		return false, nil
	}
	return true, move()
}

// wakeRefused gets the copies that were refused room out of their wait, to claim it again.
func (c *scratches) wakeRefused() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.byUID {
		if s.st.refused() {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// scratchToMount answers a pod's mount of j's cache on a node with no local disk: the scratch
// copy's model once it is whole, else why the pod waits (the first ask starts the download).
func (a *Agent) scratchToMount(ctx context.Context, req MountRequest, j *cachejob.Job, st prewarmv1alpha1.CacheStatus) (string, bool, error) {
	if a.opts.KubeletDir == "" {
		return "", false, a.refuse(req, codes.FailedPrecondition, fmt.Sprintf("node %s cannot hold cache %s: %s: %s", a.opts.NodeName, req.CacheUID, st.Reason, st.Message))
	}
	ns := j.Current().Namespace
	if st.Reason == prewarmv1alpha1.ReasonBudgetExceeded && j.Current().Refused == nil {
		// The namespace may not hold the cache's bytes on the node (its per-node limit; the
		// controller's refusal is for the cluster's): not as a copy either, unless a whole one
		// is here already (made when the node had no room for the cache).
		if _, cur := a.scratches.state(req.CacheUID); !cur.ready {
			return "", false, a.refuse(req, codes.ResourceExhausted, text.Clip(fmt.Sprintf("node %s cannot hold cache %s for namespace %s's pods, nor a copy of it (%s): %s; the pod waits, and its mount is tried again",
				a.opts.NodeName, req.CacheUID, ns, st.Reason, st.Message), text.MaxMessage))
		}
	}
	j.Demand() // a pod waits: the download may take the node's extra slot
	s, cur, made := a.scratches.ask(req.CacheUID, a.opts.Now(), func() *scratch {
		a.goroutines.Add(1) // under the scratches' lock: the copy has one keeper
		return &scratch{uid: req.CacheUID, ns: ns, dir: filepath.Join(a.opts.scratchDir(), req.CacheUID), wake: make(chan struct{}, 1)}
	})
	if made {
		go a.keepScratch(ctrl.LoggerInto(a.life, ctrl.Log.WithName("scratch").WithValues("cache", s.uid)), s, j)
	}
	ready, p, err, refused := cur.ready, cur.progress, cur.err, cur.refused()
	if refused {
		// The pod waits, and says why: the kubelet asks again, and the copy claims its room
		// again meanwhile.
		return "", false, a.refuse(req, codes.ResourceExhausted, text.Clip(fmt.Sprintf("node %s cannot hold cache %s (%s), nor a copy of it for its pods: %v; the pod waits, and its mount is tried again",
			a.opts.NodeName, req.CacheUID, st.Reason, err), text.MaxMessage))
	}
	if !ready {
		msg := text.Clip(fmt.Sprintf("node %s cannot hold cache %s (%s: %s); downloading a copy of it for its pods from the source: %s",
			a.opts.NodeName, req.CacheUID, st.Reason, st.Message, progressText(p)), text.MaxMessage)
		if err != nil {
			msg += fmt.Sprintf("; the last try failed, trying again: %v", err)
		}
		a.event(req, corev1.EventTypeNormal, EventCacheFilling, msg)
		return "", true, status.Error(codes.Unavailable, msg)
	}
	if err := j.CheckCredentials(ctx); err != nil {
		if errors.Is(err, source.ErrAccessDenied) {
			return "", false, a.refuse(req, codes.PermissionDenied, fmt.Sprintf("the origin refused namespace %s's credentials for %s: %v", req.PodNamespace, j.Current().Source, err))
		}
		return "", false, a.refuse(req, codes.Unavailable, fmt.Sprintf("checking namespace %s's credentials for %s with the origin: %v", req.PodNamespace, j.Current().Source, err))
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
// use it and the node cannot hold the cache, and removes it when none does.
func (a *Agent) keepScratch(ctx context.Context, s *scratch, j *cachejob.Job) {
	defer a.goroutines.Done()
	log := ctrl.LoggerFrom(ctx)
	retry := a.opts.RetryInterval
	for {
		_, cur := a.scratches.state(s.uid)
		wait := a.opts.RetryInterval
		// Once the node holds the cache, its pods mount it: no copy is begun any more.
		if !cur.ready && j.State() != inferencev1.CacheReady {
			err := a.fetchScratch(ctx, s, j)
			a.scratches.update(s, func(st *scratchState) { st.ready, st.err = err == nil, err })
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
		case <-s.wake:
		}
		if pod, mounted, err := a.scratchKept(ctx, s.uid, s.ns); err != nil || pod != "" || mounted {
			if before := a.scratches.update(s, func(st *scratchState) { st.mounted = mounted }); mounted && !before.mounted {
				log.Info("keeping the scratch copy: a pod's volume still mounts it")
			}
			continue
		}
		// Out of the way at once, under the scratches' lock: a pod that asks from now on
		// starts a copy of its own, and never finds this one half removed.
		now := a.opts.Now()
		trash := filepath.Join(a.opts.scratchDir(), fmt.Sprintf("%s%s-%d", trashPrefix, s.uid, now.UnixNano()))
		removed, err := a.scratches.remove(s, now, a.opts.RetryInterval, func() error { return os.Rename(s.dir, trash) })
		if !removed {
			continue
		}
		// What is left of it (a removal that failed) is measured on disk from now on.
		a.releaseScratch(s.uid)
		if err == nil {
			err = os.RemoveAll(trash)
		}
		if err != nil && !errors.Is(err, iofs.ErrNotExist) {
			log.Error(err, "removing the scratch copy (the sweep tries again)")
		} else {
			log.Info("removed the scratch copy: no pod on the node uses it")
		}
		a.wakeOverBudget(s.ns) // its room is free
		return
	}
}

// scratchKept says what keeps the scratch copy of cache uid (of namespace ns; "": any): a pod
// on the node that uses it (namespace/name), else whether a pod's volume still mounts it, by
// the mount table, which knows of a pod the pod list no longer shows (or does not yet).
func (a *Agent) scratchKept(ctx context.Context, uid, ns string) (pod string, mounted bool, err error) {
	if pod, err = a.podUsing(ctx, uid, ns); err != nil || pod != "" {
		return pod, false, err
	}
	model := filepath.Join(a.opts.scratchDir(), uid, prewarmv1alpha1.ModelSubdir)
	inodes, err := a.mountedDirs(model)
	if err != nil {
		return "", false, err
	}
	var st unix.Stat_t
	return "", unix.Lstat(model, &st) == nil && inodes[st.Ino], nil
}

// trashPrefix begins the names of scratch copies being removed.
const trashPrefix = ".removing-"

// fetchScratch downloads j's source into s (resuming a partial copy), unless it is whole there.
func (a *Agent) fetchScratch(ctx context.Context, s *scratch, j *cachejob.Job) error {
	if _, err := engine.CheckDest(s.model()); err == nil {
		return nil // left by an earlier run of the agent, for pods still there
	}
	// Its directory is made once its room is claimed (claimScratch): a copy refused room leaves
	// nothing on the kubelet's filesystem.
	return j.DownloadReporting(ctx, a.claimScratch(s), func(p engine.Progress) {
		a.scratches.update(s, func(st *scratchState) { st.progress = p })
	}, func(eng *engine.Engine, src source.Source) error {
		_, err := eng.Fetch(ctx, engine.Request{Source: src, Dest: s.model(), Revision: j.PinnedRevision()})
		return err
	})
}

// note is what a cache's report says of its scratch copy on this node ("": none).
func (c *scratches) note(uid string) string {
	s, st := c.state(uid)
	switch {
	case s == nil:
		return ""
	case st.ready && st.mounted:
		return "; the copy under the kubelet's directory that the node's pods read the model from is kept while a pod's volume still mounts it"
	case st.ready:
		return "; the node's pods read the model from a copy under the kubelet's directory, removed when they end"
	case st.refused():
		return "; no copy for the node's pods either: " + st.err.Error()
	}
	return "; downloading a copy for the node's pods from the source, " + progressText(st.progress)
}

// sweepScratch removes the scratch copies that no pod on the node uses, no pod's volume mounts
// and no download keeps (left by an earlier run of the agent): each is first renamed out of the
// way, so that a pod asking for it at that moment starts a copy of its own.
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
			// Used by a pod of the node, or mounted by a pod's volume whose pod is gone.
			pod, mounted, err := a.scratchKept(ctx, name, "")
			if err != nil {
				return err
			}
			if pod != "" || mounted {
				continue
			}
			to := fmt.Sprintf("%s%s-%d", trashPrefix, name, a.opts.Now().UnixNano())
			moved, err := a.scratches.moveUnknown(name, func() error { return os.Rename(filepath.Join(root, name), filepath.Join(root, to)) })
			if err != nil {
				return err
			}
			if !moved {
				continue // the agent's own copy
			}
			name = to
		}
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			return err
		}
		ctrl.LoggerFrom(ctx).Info("removed a scratch copy no pod uses", "entry", name)
		a.wakeScratches() // its room is free
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
