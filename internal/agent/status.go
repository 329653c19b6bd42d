package agent

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// Reported is a readiness check: nil once the agent has reported its node's state.
func (a *Agent) Reported(*http.Request) error {
	if !a.reported.Load() {
		return errors.New("the agent has not reported its node's caches yet")
	}
	return nil
}

// status builds the NodeCache status from the jobs.
func (a *Agent) status() prewarmv1alpha1.NodeCacheStatus {
	st := prewarmv1alpha1.NodeCacheStatus{AgentVersion: a.opts.Version, HeartbeatTime: a.now(), CredentialsKey: a.key.Public()}
	// The disks, measured outside the lock that the jobs and the node plugin share.
	onDisk := map[string]int64{}
	for _, root := range a.opts.Config.Roots() {
		rs := a.rootStatus(root)
		u := a.rootUsage(root)
		rs.CachedBytes = u.total
		for uid, n := range u.byUID {
			onDisk[uid] += n
		}
		st.Roots = append(st.Roots, rs)
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
		cs.DiskBytes = onDisk[uid]
		st.Caches = append(st.Caches, cs)
	}
	for uid := range a.removing {
		if _, ok := a.jobs[uid]; !ok {
			cs := prewarmv1alpha1.CacheStatus{UID: uid, State: inferencev1.CacheDeleting,
				Reason: prewarmv1alpha1.ReasonRemoving, Message: "removing the cache's files", LastTransitionTime: a.now()}
			if pod := a.inUse[uid]; pod != "" {
				cs.Reason, cs.Message = prewarmv1alpha1.ReasonInUse, "no longer wanted here, kept while pod "+pod+" uses it"
			}
			cs.DiskBytes = onDisk[uid]
			st.Caches = append(st.Caches, cs)
		}
	}
	slices.SortFunc(st.Caches, func(x, y prewarmv1alpha1.CacheStatus) int { return strings.Compare(x.UID, y.UID) })
	return st
}

// statusWriter writes the agent's status to its NodeCache as its WritePolicy says: a change of
// state at the next StatusInterval tick, progress at most every ProgressInterval, nothing when
// nothing changes (the agent's Lease says it is alive).
type statusWriter struct{ a *Agent }

// NeedLeaderElection is false: every node's agent writes its own status.
func (statusWriter) NeedLeaderElection() bool { return false }

// sameStatus compares two statuses, ignoring the heartbeat and the roots' free bytes (which
// move with every write).
func sameStatus(x, y prewarmv1alpha1.NodeCacheStatus) bool {
	return slices.Equal(x.Demands, y.Demands) && slices.EqualFunc(x.Caches, y.Caches, func(p, q prewarmv1alpha1.CacheStatus) bool {
		return p.UID == q.UID && p.State == q.State && p.BytesDone == q.BytesDone && p.BytesTotal == q.BytesTotal &&
			p.BytesPerSecond == q.BytesPerSecond && closeBytes(p.DiskBytes, q.DiskBytes) && p.Reason == q.Reason && p.Message == q.Message && p.Revision == q.Revision
	})
}

// closeBytes reports whether two measurements of what a cache takes on disk differ by no more
// than a journal or a directory's blocks (1 MiB, or 1 % of the larger): such a change is not
// worth a status write of its own, and a settled cache writes none.
func closeBytes(x, y int64) bool {
	d := max(x, y) - min(x, y)
	return d <= max(1<<20, max(x, y)/100)
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

func (a *Agent) now() *metav1.Time {
	t := metav1.NewTime(a.opts.Now().Truncate(time.Second))
	return &t
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n-len("…")] + "…"
	}
	return s
}
