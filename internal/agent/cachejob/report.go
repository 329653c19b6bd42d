package cachejob

import (
	"fmt"

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
