package cachejob

import (
	"fmt"
	"os"
	"time"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/pkg/engine"
)

// waitsForRoom reports whether the job may not evict others to be fetched: it was evicted
// itself, and no pod on the node waits for it.
func (j *Job) waitsForRoom() bool { return j.isEvicted() && !j.isDemanded() }

func (j *Job) isEvicted() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.evicted != ""
}

// SetEvicted records why the cache was evicted ("": it is whole again).
func (j *Job) SetEvicted(why string) {
	j.mu.Lock()
	j.evicted = why
	j.mu.Unlock()
}

// LastUsed is when a pod last mounted the cache, or when it was first asked for.
func (j *Job) LastUsed() time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.used
}

// Touch records that a pod mounted the cache now, also in its directory's times (which the
// next run of the agent starts from).
func (j *Job) Touch(now time.Time) {
	j.mu.Lock()
	j.used = now
	j.mu.Unlock()
	_ = os.Chtimes(j.env.CacheDir(j.req.Root, j.req.UID), now, now)
}

// waitForRoom leaves an evicted cache's status saying what it waits for: need bytes more to
// fit in free, on disk (how full it is, for people).
func (j *Job) waitForRoom(disk string, need, free int64) {
	j.mu.Lock()
	why := j.evicted
	j.mu.Unlock()
	msg := fmt.Sprintf("%s; fetched again when %s more fit under the low watermark without evicting another cache, or when a pod on the node asks for it: now %s, %s free for caches",
		why, engine.HumanBytes(need), disk, engine.HumanBytes(free))
	j.Set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.BytesDone, st.BytesPerSecond, st.Message = inferencev1.CachePending, prewarmv1alpha1.ReasonEvicted, 0, 0, text.Clip(msg, text.MaxMessage)
	})
}

// Wake gets the job out of its wait, to look at its cache again now.
func (j *Job) Wake() {
	select {
	case j.changed <- struct{}{}:
	default:
	}
}
