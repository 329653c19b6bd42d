package integration

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// The weights cache reconciler, called directly against the real API server, through one cache's
// life on two nodes: its finalizer and the request on each target node; the whole status as the
// agents' reports change (nobody reporting; one Ready and one failed for good; the failed one
// downloading again); the label on exactly the Ready node; and on deletion the requests
// withdrawn, the label removed, the status waiting for the nodes' files, and the finalizer lifted
// once no node holds the cache.
func TestWeightsCacheReconcile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "wc-operator", "wc")
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rc.wc.Now = func() time.Time { return now }
	stamp := &metav1.Time{Time: now}
	const itype = "ml.wc-suite.xlarge"
	upNode(t, ctx, "wc-a", itype)
	upNode(t, ctx, "wc-b", itype)
	parent := builders.MakeInferenceEndpointConfig("wc", "served").Obj()
	parent.Spec.InstanceType = itype
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	m := builders.MakeModelDataCacheConfig("wc", "served-cache")
	madeBy(m, parent)
	m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{itype}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	uid := string(m.UID)
	label := inferencev1.WeightsCacheReadyLabel(uid)
	ignoreConditionTime := cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")
	wantStatus := func(step string, got *inferencev1.ModelDataCacheConfig, want inferencev1.ModelDataCacheConfigStatus) {
		t.Helper()
		if diff := cmp.Diff(want, got.Status, ignoreConditionTime); diff != "" {
			t.Errorf("%s: status (-want +got):\n%s", step, diff)
		}
	}
	ready := func(reason, msg string, st metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: inferencev1.ConditionReady, Status: st, Reason: reason, Message: msg, ObservedGeneration: 1}}
	}
	// The capacity forecast beside Ready (the figures are checked by capacity_test.go).
	withCapacity := func(conds []metav1.Condition, st metav1.ConditionStatus, reason, msg string) []metav1.Condition {
		return append(conds, metav1.Condition{Type: inferencev1.ConditionCapacityAvailable, Status: st, Reason: reason, Message: msg, ObservedGeneration: 1})
	}
	report := func(node string, cs ...prewarmv1alpha1.CacheStatus) {
		t.Helper()
		reportCaches(t, ctx, node, stamp, cs...)
	}
	labelled := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		for _, name := range []string{"wc-a", "wc-b"} {
			n := &corev1.Node{}
			if err := c.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
				t.Fatal(err)
			}
			if n.Labels[label] == inferencev1.LabelTrue {
				out[name] = true
			}
		}
		return out
	}

	// Asked of both nodes; no agent reports yet.
	got := rc.cache(t, ctx, m)
	if diff := cmp.Diff([]string{inferencev1.CacheFinalizer}, got.Finalizers); diff != "" {
		t.Errorf("finalizers (-want +got):\n%s", diff)
	}
	wantEntry := prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "wc", Name: "served-cache", Root: m.Spec.HostPath,
		Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "example-bucket", Prefix: "models/example-model", Region: "us-west-2"}}
	for _, node := range []string{"wc-a", "wc-b"} {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			t.Fatalf("node %s was not asked: %v", node, err)
		}
		if diff := cmp.Diff([]prewarmv1alpha1.CacheRequest{wantEntry}, nc.Spec.Caches); diff != "" {
			t.Errorf("node %s's request (-want +got):\n%s", node, diff)
		}
	}
	silent := func(name string) inferencev1.NodeCacheStatus {
		return inferencev1.NodeCacheStatus{
			Name:               name,
			CopyStatus:         inferencev1.CopyStatus{State: inferencev1.CachePending, Reason: "AgentNotReporting", Message: "no prewarm agent reports on this node; is the agent DaemonSet running here?"},
			LastTransitionTime: stamp,
		}
	}
	wantStatus("no agent reports", got, inferencev1.ModelDataCacheConfigStatus{
		ObservedGeneration: 1, State: inferencev1.CachePending, TargetNodes: 2,
		Nodes:    []inferencev1.NodeCacheStatus{silent("wc-a"), silent("wc-b")},
		Capacity: &inferencev1.CapacityStatus{UnknownNodes: 2},
		Conditions: withCapacity(ready(inferencev1.ReasonWaitingForCache, "0 of 2 target nodes hold the cache; 2 waiting, 0 failed", metav1.ConditionFalse),
			metav1.ConditionUnknown, inferencev1.ReasonSizeUnknown, "the model's size is not known yet: the controller does not list sources; the size is known once a node lists it"),
	})

	// One node holds it; the other has no room (a failure waiting will not fix).
	const size, revision = 3 << 30, "etag-set-1"
	report("wc-a", prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: size, BytesTotal: size, Message: "verified"}, Revision: revision})
	const noRoom = "needs 3.0 GiB, 1.0 GiB free under /opt/dlami/nvme"
	report("wc-b", prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheFailed, Reason: prewarmv1alpha1.ReasonInsufficientCapacity, Message: noRoom}})
	got = rc.cache(t, ctx, m)
	holds := inferencev1.NodeCacheStatus{Name: "wc-a", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: size, BytesTotal: size, Message: "verified"}, LastTransitionTime: stamp}
	wantStatus("one Ready, one out of room", got, inferencev1.ModelDataCacheConfigStatus{
		ObservedGeneration: 1, State: inferencev1.CacheFailed, TargetNodes: 2, ReadyNodes: 1, FailedNodes: 1, SettledNodes: 2,
		TotalBytes: size,
		// The node that needs attention first.
		Nodes: []inferencev1.NodeCacheStatus{
			{Name: "wc-b", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheFailed, Reason: prewarmv1alpha1.ReasonInsufficientCapacity, Message: noRoom}, LastTransitionTime: stamp},
			holds},
		Capacity: &inferencev1.CapacityStatus{ModelBytes: size, FitNodes: 1, ShortNodes: 1},
		Conditions: withCapacity(ready(prewarmv1alpha1.ReasonInsufficientCapacity, "1 of 2 target nodes hold the cache; 1 failed: wc-b: "+noRoom, metav1.ConditionFalse),
			metav1.ConditionFalse, inferencev1.ReasonCapacityShortfall, "1 of 2 target nodes cannot hold the model, even after evicting what the policy lets go: wc-b (its agent: "+noRoom+
				"); the model is 3.2 GB (as the nodes listed it); pods there read the model from the source"),
	})
	if diff := cmp.Diff(map[string]bool{"wc-a": true}, labelled()); diff != "" {
		t.Errorf("labelled nodes (-want +got):\n%s", diff)
	}
	// One node's word pins nothing while another target is asked, even one failed for now: the
	// requests are not pinned.
	pinned := func(node string) string {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		if len(nc.Spec.Caches) != 1 {
			t.Fatalf("%s's requests: %+v; want the cache's", node, nc.Spec.Caches)
		}
		return nc.Spec.Caches[0].Source.Revision
	}
	if rev := pinned("wc-b"); rev != "" {
		t.Errorf("wc-b's request is pinned to %s on one node's word", rev)
	}

	// Room was made: the second node downloads, and the cache is Downloading, not Failed.
	later := now.Add(time.Minute)
	rc.wc.Now = func() time.Time { return later }
	report("wc-b", prewarmv1alpha1.CacheStatus{
		UID:        uid,
		CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, Reason: prewarmv1alpha1.ReasonDownloading, BytesDone: 1 << 30, BytesTotal: size, BytesPerSecond: 400 << 20, Message: "downloading: 1.0 GiB of 3.0 GiB"},
	})
	got = rc.cache(t, ctx, m)
	wantStatus("one Ready, one downloading", got, inferencev1.ModelDataCacheConfigStatus{
		ObservedGeneration: 1, State: inferencev1.CacheDownloading, TargetNodes: 2, ReadyNodes: 1, DownloadingNodes: 1, SettledNodes: 1,
		TotalBytes: size,
		Nodes: []inferencev1.NodeCacheStatus{
			{
				Name:               "wc-b",
				CopyStatus:         inferencev1.CopyStatus{State: inferencev1.CacheDownloading, Reason: prewarmv1alpha1.ReasonDownloading, BytesDone: 1 << 30, BytesTotal: size, BytesPerSecond: 400 << 20, Message: "downloading: 1.0 GiB of 3.0 GiB"},
				LastTransitionTime: &metav1.Time{Time: later},
			},
			holds},
		Capacity: &inferencev1.CapacityStatus{ModelBytes: size, FitNodes: 1, UnknownNodes: 1},
		Conditions: withCapacity(ready(inferencev1.ReasonDownloading, "1 of 2 target nodes hold the cache; 1 downloading, 0 waiting, 0 failed", metav1.ConditionFalse),
			metav1.ConditionTrue, inferencev1.ReasonFits, "the 1 target nodes that reported their disks can hold the model (3.2 GB, as the nodes listed it); 1 have not reported their disks yet"),
	})

	// The second node holds the same revision: the two agree, and the cache is pinned to it.
	report("wc-b", prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: size, BytesTotal: size, Message: "verified"}, Revision: revision})
	if got = rc.cache(t, ctx, m); got.Status.ResolvedRevision != revision || got.Status.ReadyNodes != 2 {
		t.Errorf("two nodes hold %s: pinned %q, %d Ready; want it pinned, 2 Ready", revision, got.Status.ResolvedRevision, got.Status.ReadyNodes)
	}

	// Deleted: withdrawn from both nodes and unlabelled at once; kept until the agents have
	// removed the files.
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	got = rc.cache(t, ctx, m)
	if got.Status.State != inferencev1.CacheDeleting {
		t.Errorf("state %s while nodes hold the files; want Deleting", got.Status.State)
	}
	// (The deletion raised the generation: the API server counts it as a change of the object.)
	deletingCond := ready("Deleting", "waiting for 2 node(s) to remove the cache's files: wc-a, wc-b", metav1.ConditionFalse)
	deletingCond[0].ObservedGeneration = got.Generation
	if diff := cmp.Diff(deletingCond, got.Status.Conditions, ignoreConditionTime); diff != "" {
		t.Errorf("condition while the nodes hold the files (-want +got):\n%s", diff)
	}
	for _, node := range []string{"wc-a", "wc-b"} {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		if len(nc.Spec.Caches) != 0 {
			t.Errorf("node %s is still asked for %+v", node, nc.Spec.Caches)
		}
	}
	if diff := cmp.Diff(map[string]bool{}, labelled()); diff != "" {
		t.Errorf("labelled nodes after deletion (-want +got):\n%s", diff)
	}
	report("wc-a")
	report("wc-b")
	if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); !apierrors.IsNotFound(err) {
		t.Errorf("the cache remains once no node holds it: finalizers %v, %v", got.Finalizers, err)
	}
}
