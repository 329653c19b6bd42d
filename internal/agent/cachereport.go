package agent

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine"
)

// What an agent reports of one cache at each step of a download. The agent's jobs report
// through these, and so do the simulated agents of make bench-scale, which play thousands of
// nodes against a real API server: both write the same shape.

// Queued is a cache's report when the agent has just taken its request.
func Queued(uid string, now *metav1.Time) prewarmv1alpha1.CacheStatus {
	return prewarmv1alpha1.CacheStatus{UID: uid, LastTransitionTime: now,
		CopyStatus: inferencev1.CopyStatus{State: inferencev1.CachePending, Reason: prewarmv1alpha1.ReasonQueued, Message: "waiting to start"}}
}

// Listing marks a cache's report as downloading, listing its source first.
func Listing(st *prewarmv1alpha1.CacheStatus, src prewarmv1alpha1.CacheSource) {
	st.State, st.Reason, st.Message = inferencev1.CacheDownloading, prewarmv1alpha1.ReasonDownloading, "listing "+src.String()
}

// Progressed puts a download's progress into a cache's report; last is the download's progress
// reported before (zero at first): what it read from the origin and took from peers since is
// added to the copy's originBytes and peerBytes.
func Progressed(st *prewarmv1alpha1.CacheStatus, p, last engine.Progress) {
	st.OriginBytes += p.Fetched - last.Fetched
	st.PeerBytes += p.FromPeers - last.FromPeers
	st.BytesDone, st.BytesTotal, st.Files = p.BytesDone, p.BytesTotal, int32(p.FilesTotal)
	st.BytesPerSecond = int64(p.BytesPerSecond)
	if p.Phase != engine.PhaseDone && st.Reason != prewarmv1alpha1.ReasonCacheDamaged {
		st.Message = fmt.Sprintf("%s: %s of %s", p.Phase, engine.HumanBytes(p.BytesDone), engine.HumanBytes(p.BytesTotal))
	}
}

// Verified marks a cache's report Ready: the node holds files files of total bytes, of revision.
func Verified(st *prewarmv1alpha1.CacheStatus, files int, total int64, revision string) {
	st.State, st.Reason = inferencev1.CacheReady, prewarmv1alpha1.ReasonVerified
	st.Message = fmt.Sprintf("%d files, %s, verified", files, engine.HumanBytes(total))
	st.BytesDone, st.BytesTotal, st.BytesPerSecond = total, total, 0
	st.Files, st.Revision = int32(files), revision
}

// NotTarget marks a cache's report for a node that keeps a retained request but holds nothing.
func NotTarget(st *prewarmv1alpha1.CacheStatus) {
	st.State, st.Reason, st.BytesDone, st.BytesPerSecond = inferencev1.CachePending, prewarmv1alpha1.ReasonNotTarget, 0, 0
	st.Message = "the node is not a current target of the cache (cordoned, tainted or unreachable); nothing is downloaded until it is"
}

// WritePolicy is when an agent writes its NodeCache status: a change of any cache's state, or
// of the pods' demands, at the next tick (every Interval); progress alone, or a root's free
// space moving by more than sameRoots allows, at most every ProgressInterval; nothing else. An
// agent that downloads nothing and whose disks do not change writes nothing: that it is alive,
// its Lease says. The writes per node and cache of one download are then bounded by its state
// changes plus its duration / ProgressInterval.
type WritePolicy struct {
	Interval, ProgressInterval time.Duration
}

// Due reports whether next must be written, the last status written being last, since ago;
// written is false when nothing has been written yet (always due).
func (p WritePolicy) Due(last, next prewarmv1alpha1.NodeCacheStatus, since time.Duration, written bool) bool {
	switch {
	case !written, !sameState(last, next):
		return true
	}
	return (!sameStatus(last, next) || !sameRoots(last.Roots, next.Roots)) && since >= p.ProgressInterval
}

// sameRoots reports whether two reports of the roots' filesystems say the same to the
// controller's capacity check: the same roots, each one's free space within 1 GiB or 1 % of
// its capacity. A disk that other files fill or empty is then reported within a
// ProgressInterval of moving that far, and a still one is not written again.
func sameRoots(x, y []prewarmv1alpha1.RootStatus) bool {
	return slices.EqualFunc(x, y, func(p, q prewarmv1alpha1.RootStatus) bool {
		d := max(p.FreeBytes, q.FreeBytes) - min(p.FreeBytes, q.FreeBytes)
		p.FreeBytes, q.FreeBytes, p.CachedBytes, q.CachedBytes, p.UsedBytes, q.UsedBytes = 0, 0, 0, 0, 0, 0
		return p == q && d <= max(1<<30, max(p.CapacityBytes, q.CapacityBytes)/100)
	})
}

// sameState compares two statuses but for the caches' progress (bytes, rate, the progress
// message), the heartbeat and the roots' free bytes.
func sameState(x, y prewarmv1alpha1.NodeCacheStatus) bool {
	return x.CredentialsKey == y.CredentialsKey && slices.Equal(x.Demands, y.Demands) &&
		slices.EqualFunc(x.Caches, y.Caches, func(p, q prewarmv1alpha1.CacheStatus) bool {
			return p.UID == q.UID && p.State == q.State && p.Reason == q.Reason && p.Revision == q.Revision &&
				(p.State == inferencev1.CacheDownloading || p.Message == q.Message) &&
				equalTime(p.LastVerifiedTime, q.LastVerifiedTime)
		})
}

func equalTime(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}
