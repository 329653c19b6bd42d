package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
)

// What one agent writes into its own NodeCache status is all an attacker holding that node's
// agent identity controls. These tests write it as such an agent would, and check what the
// controller makes of it against a real API server.

// nodeAt creates a node of instanceType whose kubelet reports ip as its InternalIP.
func nodeAt(t *testing.T, ctx context.Context, name, instanceType, ip string) {
	t.Helper()
	upNode(t, ctx, name, instanceType)
	n := &corev1.Node{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	if err := server.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// agentReports writes what node's agent reports: where it serves peers, and its caches.
func agentReports(t *testing.T, ctx context.Context, node, peerAddress string, cs ...prewarmv1alpha1.CacheStatus) {
	t.Helper()
	if err := agent.EnsureNodeCache(ctx, server.Client, node); err != nil {
		t.Fatal(err)
	}
	nc := &prewarmv1alpha1.NodeCache{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.HeartbeatTime = &metav1.Time{Time: time.Now()}
	nc.Status.PeerAddress = peerAddress
	nc.Status.Caches = cs
	if err := server.Client.Status().Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

// peersOf returns the addresses node's request for uid names as its peers.
func peersOf(t *testing.T, ctx context.Context, node, uid string) []string {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range nc.Spec.Caches {
		if r.UID == uid {
			for _, p := range r.Peers {
				out = append(out, p.Address)
			}
		}
	}
	return out
}

// An agent's peer address reaches other agents (who send it their bearer token) only when it
// is an IP and port of the node itself: one of its addresses, or its agent pod's IP. A path, a
// host name or another host's IP makes the node no one's peer.
func TestAForgedPeerAddressIsNoOnesPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "fp-operator", "fp")
	const itype = "ml.fp-suite.xlarge"
	nodes := map[string]struct{ ip, addr string }{
		"fp-a":    {"10.71.0.1", "10.71.0.1:9444"},
		"fp-d":    {"10.71.0.4", "10.71.0.4:9444"},
		"fp-path": {"10.71.0.2", "10.71.0.2:9444/ssrf?x="},
		"fp-host": {"10.71.0.3", "kubernetes.default.svc:443"},
		"fp-else": {"10.71.0.5", "10.71.9.9:9444"},  // the API server's, or any other host's
		"fp-pod":  {"10.71.0.6", "10.244.7.7:9444"}, // its agent pod's IP (below)
	}
	for name, n := range nodes {
		nodeAt(t, ctx, name, itype, n.ip)
		agentReports(t, ctx, name, n.addr)
	}
	// fp-pod's agent runs in a pod whose IP is the one it reports.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "fp-operator", Name: "prewarm-agent-fp-pod",
		Labels: map[string]string{"app.kubernetes.io/name": "prewarm", "app.kubernetes.io/component": "agent"}},
		Spec: corev1.PodSpec{NodeName: "fp-pod", Containers: []corev1.Container{{Name: "agent", Image: "x"}}}}
	if err := server.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIP, pod.Status.PodIPs = "10.244.7.7", []corev1.PodIP{{IP: "10.244.7.7"}}
	if err := server.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	m := servedCache(t, ctx, "fp", "shared", itype)
	got := rc.cache(t, ctx, m)
	if got.Status.TargetNodes != int32(len(nodes)) {
		t.Fatalf("%d targets, want %d", got.Status.TargetNodes, len(nodes))
	}
	handed := map[string]bool{}
	for name := range nodes {
		for _, a := range peersOf(t, ctx, name, string(m.UID)) {
			handed[a] = true
		}
	}
	for _, good := range []string{"fp-a", "fp-d", "fp-pod"} {
		if !handed[nodes[good].addr] {
			t.Errorf("%s's address %s is no one's peer; want it handed out (handed: %v)", good, nodes[good].addr, handed)
		}
	}
	for _, bad := range []string{"fp-path", "fp-host", "fp-else"} {
		if handed[nodes[bad].addr] {
			t.Errorf("%s's forged address %q was handed to other agents", bad, nodes[bad].addr)
		}
	}
}

// An honest agent may report its address before the API server shows it as the node's: the
// kubelet writes its pod's IP a moment after the agent starts. The refusal is not final: the
// cache is looked at again soon, and the address is handed out once the pod's IP is written.
func TestAPeerAddressNotYetBorneOutIsCheckedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "la-operator", "la")
	now := time.Now()
	rc.wc.Now = func() time.Time { return now }
	const itype = "ml.la-suite.xlarge"
	nodeAt(t, ctx, "la-a", itype, "10.72.0.1")
	agentReports(t, ctx, "la-a", "10.72.0.1:9444")
	nodeAt(t, ctx, "la-b", itype, "10.72.0.2")
	agentReports(t, ctx, "la-b", "10.244.9.9:9444")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "la-operator", Name: "prewarm-agent-la-b",
		Labels: map[string]string{"app.kubernetes.io/name": "prewarm", "app.kubernetes.io/component": "agent"}},
		Spec: corev1.PodSpec{NodeName: "la-b", Containers: []corev1.Container{{Name: "agent", Image: "x"}}}}
	if err := server.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	m := servedCache(t, ctx, "la", "shared", itype)
	rc.cache(t, ctx, m)
	res, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)})
	if err != nil {
		t.Fatal(err)
	}
	if got := peersOf(t, ctx, "la-a", string(m.UID)); len(got) != 0 {
		t.Fatalf("la-a was handed %v before la-b's pod IP was written", got)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Minute {
		t.Errorf("a refused address left the cache to be looked at again after %s; want soon", res.RequeueAfter)
	}
	pod.Status.PodIP, pod.Status.PodIPs = "10.244.9.9", []corev1.PodIP{{IP: "10.244.9.9"}}
	if err := server.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	now = now.Add(res.RequeueAfter)
	if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
		t.Fatal(err)
	}
	if got := peersOf(t, ctx, "la-a", string(m.UID)); !slices.Contains(got, "10.244.9.9:9444") {
		t.Errorf("la-a's peers %v, want la-b's agent pod address once its IP is written", got)
	}
}

// A node's report that it holds the cache Ready at some revision does not pin the cache to it:
// honest nodes would then fail with SourceChanged. The pin is what at least two target nodes
// agree on, even while the other targets have failed for now, and no node never asked for the
// cache is heard.
func TestAForgedReadyDoesNotPinTheRevision(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "fr-operator", "fr")
	const itype = "ml.fr-suite.xlarge"
	for i, name := range []string{"fr-liar", "fr-b", "fr-c"} {
		nodeAt(t, ctx, name, itype, "10.72.0."+string(rune('1'+i)))
	}
	m := servedCache(t, ctx, "fr", "pinned", itype)
	uid := string(m.UID)
	rc.cache(t, ctx, m)
	ready := func(rev string) prewarmv1alpha1.CacheStatus {
		return prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady}, Revision: rev}
	}
	downloading := prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading}}
	failed := prewarmv1alpha1.CacheStatus{UID: uid, CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheFailed, Reason: prewarmv1alpha1.ReasonSourceUnreachable}}
	agentReports(t, ctx, "fr-liar", "", ready("sha256:bogus"))
	agentReports(t, ctx, "fr-b", "", failed)
	agentReports(t, ctx, "fr-c", "", failed)
	if got := rc.cache(t, ctx, m); got.Status.ResolvedRevision != "" {
		t.Fatalf("one node's Ready, the other targets failed for now, pinned the cache to %q", got.Status.ResolvedRevision)
	}
	// Two nodes never asked for the cache agree on another revision: not heard.
	for _, name := range []string{"fr-stranger-1", "fr-stranger-2"} {
		nodeAt(t, ctx, name, "ml.fr-other.xlarge", "10.72.1."+name[len(name)-1:])
		agentReports(t, ctx, name, "", ready("sha256:bogus"))
	}
	if got := rc.cache(t, ctx, m); got.Status.ResolvedRevision != "" {
		t.Fatalf("nodes never asked for the cache pinned it to %q", got.Status.ResolvedRevision)
	}
	agentReports(t, ctx, "fr-b", "", downloading)
	agentReports(t, ctx, "fr-c", "", downloading)
	if got := rc.cache(t, ctx, m); got.Status.ResolvedRevision != "" {
		t.Fatalf("one node's Ready pinned the cache to %q", got.Status.ResolvedRevision)
	}
	agentReports(t, ctx, "fr-b", "", ready("rev-good"))
	agentReports(t, ctx, "fr-c", "", ready("rev-good"))
	got := rc.cache(t, ctx, m)
	if got.Status.ResolvedRevision != "rev-good" {
		t.Fatalf("pinned %q once two of three nodes hold rev-good; want rev-good", got.Status.ResolvedRevision)
	}
	for _, ns := range got.Status.Nodes {
		switch {
		case ns.Name == "fr-liar" && ns.Reason != prewarmv1alpha1.ReasonSourceChanged:
			t.Errorf("the node holding another revision: %s %s; want SourceChanged", ns.State, ns.Reason)
		case ns.Name != "fr-liar" && ns.State != inferencev1.CacheReady:
			t.Errorf("%s: %s %s; want Ready", ns.Name, ns.State, ns.Reason)
		}
	}
	if got.Status.ReadyNodes != 2 {
		t.Errorf("%d Ready nodes, want 2", got.Status.ReadyNodes)
	}
}

// A node that keeps saying it holds a deleted cache holds the cache's finalizer, and so its
// namespace's deletion, only if it was asked for the cache, and for controller.deletionTimeout
// at most; a node never asked for it (a forged status entry) holds nothing.
func TestAForgedHolderDoesNotBlockDeletionForever(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "fh-operator", "fh")
	const itype = "ml.fh-suite.xlarge"
	nodeAt(t, ctx, "fh-a", itype, "10.73.0.1")
	nodeAt(t, ctx, "fh-liar", "ml.fh-other.xlarge", "10.73.0.2")
	reconcile := func(m *inferencev1.ModelDataCacheConfig) {
		t.Helper()
		if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
			t.Fatal(err)
		}
	}
	deleteAndReconcile := func(m *inferencev1.ModelDataCacheConfig) {
		t.Helper()
		if err := server.Client.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
		reconcile(m)
		reconcile(m)
	}

	// A node never asked for the cache says it is still removing it: the cache goes at once.
	forged := servedCache(t, ctx, "fh", "forged", itype)
	rc.cache(t, ctx, forged)
	agentReports(t, ctx, "fh-liar", "", prewarmv1alpha1.CacheStatus{UID: string(forged.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDeleting}})
	deleteAndReconcile(forged)
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(forged), &inferencev1.ModelDataCacheConfig{}); !apierrors.IsNotFound(err) {
		t.Errorf("a node never asked for the cache holds its deletion: %v", err)
	}

	// The node asked for it says it is still removing it: the cache waits for it, naming it,
	// up to the timeout.
	m := servedCache(t, ctx, "fh", "gone", itype)
	rc.cache(t, ctx, m)
	agentReports(t, ctx, "fh-a", "", prewarmv1alpha1.CacheStatus{UID: string(m.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDeleting}})
	agentReports(t, ctx, "fh-liar", "", prewarmv1alpha1.CacheStatus{UID: string(m.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDeleting}})
	deleteAndReconcile(m)
	held := &inferencev1.ModelDataCacheConfig{}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(m), held); err != nil {
		t.Fatalf("the cache went at once: %v; want it kept while the node asked for it reports it, within the timeout", err)
	}
	cond := meta.FindStatusCondition(held.Status.Conditions, inferencev1.ConditionReady)
	if cond == nil || !strings.Contains(cond.Message, "fh-a") || strings.Contains(cond.Message, "fh-liar") {
		t.Errorf("Ready condition %+v; want it to name the node asked for the cache that still reports it, and no other", cond)
	}
	// Past the timeout, it goes.
	rc.wc.Now = func() time.Time { return time.Now().Add(rc.cfg.DeletionTimeout() + time.Second) }
	reconcile(m)
	err := server.Client.Get(ctx, client.ObjectKeyFromObject(m), &inferencev1.ModelDataCacheConfig{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("after controller.deletionTimeout the cache is still there (%v); a node's entry holds it forever", err)
	}
}

// A node never asked for a cache cannot size it: its report of a petabyte model changes neither
// the cache's size nor what its namespace's quota and the capacity check count it at.
func TestANodeNeverAskedCannotSizeACache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "fs-operator", "fs")
	nodeAt(t, ctx, "fs-a", "ml.fs-suite.xlarge", "10.74.0.1")
	nodeAt(t, ctx, "fs-liar", "ml.fs-other.xlarge", "10.74.0.2")
	m := servedCache(t, ctx, "fs", "sized", "ml.fs-suite.xlarge")
	rc.cache(t, ctx, m)
	const size, petabyte = 3 << 30, 1 << 50
	agentReports(t, ctx, "fs-a", "", prewarmv1alpha1.CacheStatus{UID: string(m.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, BytesDone: 1 << 30, BytesTotal: size}})
	agentReports(t, ctx, "fs-liar", "", prewarmv1alpha1.CacheStatus{UID: string(m.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, BytesDone: 1, BytesTotal: petabyte}})
	got := rc.cache(t, ctx, m)
	if got.Status.TotalBytes != size || got.Status.Capacity == nil || got.Status.Capacity.ModelBytes != size {
		t.Errorf("total %d, capacity %+v; want the %d bytes the node asked for it reports", got.Status.TotalBytes, got.Status.Capacity, size)
	}
}
