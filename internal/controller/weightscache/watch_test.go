package weightscache

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// A NodeCache's writes wake only the caches they concern: a change of state at once, progress
// after progressDelay, a heartbeat not at all.
func TestChangedCaches(t *testing.T) {
	beat := metav1.Now()
	base := &prewarmv1alpha1.NodeCache{
		Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{UID: "a"}, {UID: "b"}}},
		Status: prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: &beat, CredentialsKey: "k", Caches: []prewarmv1alpha1.CacheStatus{
			{UID: "a", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, Reason: "Downloading", BytesDone: 10}},
			{UID: "b", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, Reason: "Verified"}},
		}},
	}
	change := func(f func(nc *prewarmv1alpha1.NodeCache)) *prewarmv1alpha1.NodeCache {
		nc := base.DeepCopy()
		f(nc)
		return nc
	}
	later := metav1.NewTime(beat.Add(60e9))
	tests := []struct {
		name       string
		after      *prewarmv1alpha1.NodeCache
		now, later []string
	}{
		{"a heartbeat", change(func(nc *prewarmv1alpha1.NodeCache) { nc.Status.HeartbeatTime = &later }), nil, nil},
		{"progress", change(func(nc *prewarmv1alpha1.NodeCache) { nc.Status.Caches[0].BytesDone = 20 }), nil, []string{"a"}},
		{"Ready", change(func(nc *prewarmv1alpha1.NodeCache) {
			nc.Status.Caches[0].State, nc.Status.Caches[0].Reason = inferencev1.CacheReady, "Verified"
		}), []string{"a"}, nil},
		{"a request withdrawn", change(func(nc *prewarmv1alpha1.NodeCache) { nc.Spec.Caches = nc.Spec.Caches[:1] }), []string{"b"}, nil},
		{"a new demand", change(func(nc *prewarmv1alpha1.NodeCache) {
			nc.Status.Demands = []prewarmv1alpha1.CacheDemand{{UID: "c", Namespace: "ns"}}
		}), []string{"c"}, nil},
		{"a new agent key", change(func(nc *prewarmv1alpha1.NodeCache) { nc.Status.CredentialsKey = "k2" }), []string{"a", "b"}, nil},
	}
	for _, tt := range tests {
		now, later := changedCaches(base, tt.after)
		slices.Sort(now)
		if !slices.Equal(now, tt.now) || !slices.Equal(later, tt.later) {
			t.Errorf("%s: now %v later %v; want %v, %v", tt.name, now, later, tt.now, tt.later)
		}
	}
}

// A node downloading, or holding the pinned revision, is not asked again only to carry the pin.
func TestPinNotNeeded(t *testing.T) {
	asked := prewarmv1alpha1.CacheRequest{UID: "a", Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "b"}}
	want := asked
	want.Source.Revision = "r1"
	other := want
	other.Root = "/elsewhere"
	tests := []struct {
		name string
		want prewarmv1alpha1.CacheRequest
		rep  *prewarmv1alpha1.CacheStatus
		skip bool
	}{
		{"downloading", want, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading}}, true},
		{"holds the pinned revision", want, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}, Revision: "r1"}, true},
		{"holds another revision", want, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}, Revision: "r0"}, false},
		{"failed", want, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheFailed}}, false},
		{"queued", want, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CachePending}}, false},
		{"no report", want, nil, false},
		{"another change besides the pin", other, &prewarmv1alpha1.CacheStatus{CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading}}, false},
	}
	for _, tt := range tests {
		if got := pinNotNeeded(asked, tt.want, tt.rep); got != tt.skip {
			t.Errorf("%s: pinNotNeeded = %v, want %v", tt.name, got, tt.skip)
		}
	}
}
