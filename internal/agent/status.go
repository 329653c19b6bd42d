package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/text"
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
		cs := j.Snapshot()
		if note := a.scratches.note(uid); note != "" {
			cs.Message = text.Clip(cs.Message+note, text.MaxMessage)
		}
		cs.DiskBytes = onDisk[uid]
		st.Caches = append(st.Caches, cs)
	}
	for uid := range a.removing {
		if _, ok := a.jobs[uid]; !ok {
			cs := prewarmv1alpha1.CacheStatus{UID: uid, LastTransitionTime: a.now(), CopyStatus: inferencev1.CopyStatus{
				State: inferencev1.CacheDeleting, Reason: prewarmv1alpha1.ReasonRemoving, Message: "removing the cache's files"}}
			if pod := a.inUse[uid]; pod != "" {
				cs.Reason, cs.Message = prewarmv1alpha1.ReasonInUse, "no longer wanted here, kept while pod "+pod+" uses it"
			}
			cs.DiskBytes = onDisk[uid]
			st.Caches = append(st.Caches, cs)
		}
	}
	slices.SortFunc(st.Caches, func(x, y prewarmv1alpha1.CacheStatus) int { return strings.Compare(x.UID, y.UID) })
	bound(a.life, &st)
	return st
}

// sameStatus compares two statuses' caches and demands, ignoring the heartbeat and the roots
// (sameRoots compares those).
func sameStatus(x, y prewarmv1alpha1.NodeCacheStatus) bool {
	return slices.Equal(x.Demands, y.Demands) && slices.EqualFunc(x.Caches, y.Caches, sameReport)
}

// sameReport compares two reports of one cache whole, but for what is not worth a status write
// of its own: what the copy takes on disk within closeBytes; the bytes it read from the origin
// and took from peers, and its files, which move with bytesDone and bytesTotal; and its times
// (lastTransitionTime moves with state, and sameState compares lastVerifiedTime). A field added
// to the report (inferencev1.CopyStatus, or the agent's own fields) is compared as it is.
func sameReport(p, q prewarmv1alpha1.CacheStatus) bool {
	if !closeBytes(p.DiskBytes, q.DiskBytes) {
		return false
	}
	for _, c := range []*prewarmv1alpha1.CacheStatus{&p, &q} {
		c.DiskBytes, c.OriginBytes, c.PeerBytes, c.Files = 0, 0, 0, 0
		c.LastTransitionTime, c.LastVerifiedTime = nil, nil
	}
	return p == q
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
	for {
		nc.Status = st
		err := a.client.Status().Patch(ctx, nc, client.MergeFrom(orig))
		left, dropped := withoutRefused(st, err)
		if !dropped {
			return err
		}
		ctrl.LoggerFrom(ctx).Error(err, "the API server refused a cache's report; the node's other caches are reported without it")
		st = left
	}
}

func (a *Agent) now() *metav1.Time {
	t := metav1.NewTime(a.opts.Now().Truncate(time.Second))
	return &t
}

// bound keeps every value of the report within what the NodeCache schema holds: the status is
// written whole, for every cache of the node, and one message the API server refused (a
// source's address or an error quoting one can be long) would keep every other cache on the
// node from being reported. Messages and reasons are clipped; an entry still refused (which no
// agent makes) is left out, and logged.
func bound(ctx context.Context, st *prewarmv1alpha1.NodeCacheStatus) {
	caches := st.Caches[:0]
	for i, c := range st.Caches {
		c.Message, c.Reason = text.Clip(c.Message, text.MaxMessage), text.Clip(c.Reason, text.MaxReason)
		if errs := c.Validate(field.NewPath("status", "caches").Index(i)); len(errs) > 0 {
			ctrl.LoggerFrom(ctx).Error(errs.ToAggregate(), "a cache's report the NodeCache schema refuses; not reported", "cache", c.UID)
			continue
		}
		caches = append(caches, c)
	}
	st.Caches = caches[:min(len(caches), maxReportedCaches)]
	for i := range st.Roots {
		r := &st.Roots[i]
		r.Message, r.Reason = text.Clip(r.Message, text.MaxMessage), text.Clip(r.Reason, text.MaxReason)
	}
}

// maxReportedCaches is the most caches a NodeCache's status holds.
const maxReportedCaches = 512

// withoutRefused returns st without the cache entry the API server's refusal err names
// (status.caches[i]), and whether there was one: the others are then written.
func withoutRefused(st prewarmv1alpha1.NodeCacheStatus, err error) (prewarmv1alpha1.NodeCacheStatus, bool) {
	var se apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return st, false
	}
	for _, c := range se.Status().Details.Causes {
		var i int
		if _, scanErr := fmt.Sscanf(c.Field, "status.caches[%d]", &i); scanErr == nil && i >= 0 && i < len(st.Caches) {
			st.Caches = slices.Delete(slices.Clone(st.Caches), i, i+1)
			return st, true
		}
	}
	return st, false
}
