package agent

import (
	"reflect"
	"slices"
	"testing"
	"time"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/pkg/engine"
)

func TestWritePolicy(t *testing.T) {
	p := WritePolicy{Interval: 2 * time.Second, ProgressInterval: 10 * time.Second}
	cache := cachejob.Queued("u", nil)
	cachejob.Listing(&cache, prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "b", Prefix: "p"})
	at := func(done int64) prewarmv1alpha1.NodeCacheStatus {
		c := cache
		cachejob.Progressed(&c, engine.Progress{BytesDone: done, BytesTotal: 100, Phase: engine.PhaseDownloading}, engine.Progress{})
		return prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{c}}
	}
	ready := at(100)
	cachejob.Verified(&ready.Caches[0], 3, 100, "rev")
	tests := []struct {
		name       string
		last, next prewarmv1alpha1.NodeCacheStatus
		since      time.Duration
		written    bool
		want       bool
	}{
		{"nothing written yet", at(0), at(0), 0, false, true},
		{"unchanged", at(10), at(10), 30 * time.Second, true, false},
		{"progress only, soon after", at(10), at(20), 3 * time.Second, true, false},
		{"progress only, a progress interval later", at(10), at(20), 10 * time.Second, true, true},
		{"a change of state at once", at(90), ready, 2 * time.Second, true, true},
		{"a demand at once", at(10), withDemand(at(10)), 2 * time.Second, true, true},
		{"no heartbeat: a settled node an hour on", ready, ready, time.Hour, true, false},
		{"a disk that others fill, a progress interval later", onRoot(ready, 500<<30), onRoot(ready, 480<<30), 10 * time.Second, true, true},
		{"a disk that others fill, soon after", onRoot(ready, 500<<30), onRoot(ready, 480<<30), 3 * time.Second, true, false},
		{"a disk's free space moves by less than 1 %", onRoot(ready, 500<<30), onRoot(ready, 500<<30-(5<<30)), time.Hour, true, false},
		{"a settled copy's blocks move by a journal's", onDisk(ready, 50<<20), onDisk(ready, 50<<20+8<<10), 30 * time.Second, true, false},
		{"a copy set aside, a progress interval later", onDisk(ready, 50<<20), onDisk(ready, 90<<20), 10 * time.Second, true, true},
	}
	for _, tt := range tests {
		if got := p.Due(tt.last, tt.next, tt.since, tt.written); got != tt.want {
			t.Errorf("%s: Due = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A change of any field of a cache's report is written (at the next progress interval), but for
// the few sameReport leaves out on purpose: a field added to the report needs nothing more than
// its declaration to reach the NodeCache.
func TestSameStatusSeesEveryField(t *testing.T) {
	notWorthAWrite := map[string]bool{"OriginBytes": true, "PeerBytes": true, "Files": true, "LastTransitionTime": true, "LastVerifiedTime": true}
	base := prewarmv1alpha1.CacheStatus{UID: "u", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, DiskBytes: 100 << 20}}
	of := func(c prewarmv1alpha1.CacheStatus) prewarmv1alpha1.NodeCacheStatus {
		return prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{c}}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[prewarmv1alpha1.CacheStatus]()) {
		if f.Anonymous {
			continue // its fields are visited one by one
		}
		changed := base
		switch v := reflect.ValueOf(&changed).Elem().FieldByIndex(f.Index); v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int32, reflect.Int64:
			v.SetInt(v.Int() + 1<<30) // past closeBytes' tolerance
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		default:
			t.Fatalf("%s is a %s: teach this test to change one", f.Name, v.Kind())
		}
		if got, want := sameStatus(of(base), of(changed)), notWorthAWrite[f.Name]; got != want {
			t.Errorf("a report whose %s changed: sameStatus = %v, want %v", f.Name, got, want)
		}
	}
}

func withDemand(st prewarmv1alpha1.NodeCacheStatus) prewarmv1alpha1.NodeCacheStatus {
	st.Demands = []prewarmv1alpha1.CacheDemand{{UID: "u", Namespace: "ns", Pods: 1}}
	return st
}

func onDisk(st prewarmv1alpha1.NodeCacheStatus, n int64) prewarmv1alpha1.NodeCacheStatus {
	st.Caches = slices.Clone(st.Caches)
	st.Caches[0].DiskBytes = n
	return st
}

// onRoot reports a 1 TiB root with free bytes free (and that much moving in usedBytes).
func onRoot(st prewarmv1alpha1.NodeCacheStatus, free int64) prewarmv1alpha1.NodeCacheStatus {
	st.Roots = []prewarmv1alpha1.RootStatus{{Path: "/nvme", CapacityBytes: 1 << 40, FreeBytes: free, UsedBytes: 1<<40 - free}}
	return st
}
