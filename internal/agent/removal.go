package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
)

// newRemovals is the agent's queue of removals, by cache UID.
func newRemovals() workqueue.TypedDelayingInterface[string] {
	return workqueue.NewTypedDelayingQueue[string]()
}

// removeLocked queues the removal of cache uid's directories under every root, once its job (if
// any) has stopped, and withdraws its report. The remover takes it from there.
func (a *Agent) removeLocked(uid string, j *cachejob.Job) {
	if a.isRemoving(uid) {
		return
	}
	ns := "" // unknown (a cache left from before the agent started): any pod naming it counts
	if j != nil {
		ns = j.Request().Namespace
	}
	a.removing[uid] = ns
	a.withdraw(uid)
	if j == nil {
		a.removals.Add(uid)
		return
	}
	a.goroutines.Add(1)
	go func() {
		defer a.goroutines.Done()
		<-j.Done()
		a.removals.Add(uid)
	}()
}

// remover is the agent's one worker of its removal queue: it takes each cache in turn and
// removes its files, or puts it back to look again after RetryInterval while a pod on the node
// still uses it or its files could not go. Once a cache is gone it syncs the agent again, which
// starts the cache anew if it is wanted again meanwhile. It stops with the manager, and the
// agent waits for it.
type remover struct{ a *Agent }

// NeedLeaderElection is false: every node's agent removes its own caches.
func (remover) NeedLeaderElection() bool { return false }

func (w remover) Start(ctx context.Context) error {
	a := w.a
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			uid, shutdown := a.removals.Get()
			if shutdown {
				return
			}
			if a.removeOnce(ctx, uid) {
				a.mu.Lock()
				want := a.want
				a.mu.Unlock()
				a.sync(ctx, want)
			}
			a.removals.Done(uid)
		}
	}()
	<-ctx.Done()
	a.removals.ShutDown()
	<-done
	return nil
}

// removeOnce removes cache uid's files if no pod on the node uses it, and reports whether they
// are gone; otherwise it queues the cache to be looked at again.
func (a *Agent) removeOnce(ctx context.Context, uid string) bool {
	log := ctrl.LoggerFrom(ctx).WithValues("cache", uid)
	a.mu.Lock()
	ns, ok := a.removing[uid]
	a.mu.Unlock()
	if !ok {
		return false
	}
	// A cache a pod on this node still uses stays until no pod does: by the pod list, and by
	// the mount table (a pod the list does not show yet, or any more).
	pod, err := a.podUsing(ctx, uid, ns)
	if err == nil && pod == "" {
		var mounted bool
		if mounted, err = a.cacheMounted(uid); err == nil && mounted {
			pod = "(a pod's volume, still mounted)"
		}
	}
	switch {
	case err != nil:
		log.Error(err, "listing the node's pods; will retry")
		a.removals.AddAfter(uid, a.opts.RetryInterval)
		return false
	case pod != "":
		a.mu.Lock()
		if a.inUse[uid] != pod {
			log.Info("cache still in use; keeping it", "pod", pod)
			a.inUse[uid] = pod
		}
		a.mu.Unlock()
		a.removals.AddAfter(uid, a.opts.RetryInterval)
		return false
	}
	a.mu.Lock()
	delete(a.inUse, uid)
	a.mu.Unlock()
	if err := a.removeDirs(uid); err != nil {
		log.Error(err, "removing cache directories; will retry")
		a.removals.AddAfter(uid, a.opts.RetryInterval)
		return false
	}
	log.Info("removed cache")
	a.mu.Lock()
	delete(a.removing, uid)
	a.mu.Unlock()
	if ns != "" {
		a.wakeOverBudget(ns) // its room in the namespace's per-node limit is free
	}
	return true
}

// isRemoving reports whether cache uid's files are to go; a.mu must be held.
func (a *Agent) isRemoving(uid string) bool {
	_, ok := a.removing[uid]
	return ok
}

// RemoveEmptyDirs removes, once the agent has stopped, the directories of its own on the node
// that hold nothing: the node plugin's scratch directory and then its directory under the
// kubelet's (<kubelet dir>/plugins/csi.prewarm.io, its sockets already gone), and <root>/prewarm
// under each allowed root. Once every cache is deleted and the agents with them, nothing of
// prewarm's is left on a node; an agent that starts again makes them anew. Only empty
// directories go: one that holds anything (a cache, a copy, a file of another's) stays, and so
// does one that is a mount point of the agent's pod.
func (a *Agent) RemoveEmptyDirs() error {
	var dirs []string
	if a.opts.KubeletDir != "" {
		dirs = append(dirs, a.opts.scratchDir(), filepath.Dir(a.opts.scratchDir()))
	}
	for _, root := range a.opts.Config.Roots() {
		dirs = append(dirs, filepath.Join(a.opts.rootDir(root), prewarmv1alpha1.Directory))
	}
	var errs []error
	for _, d := range dirs {
		err := unix.Rmdir(d)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("removing the empty directory %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
