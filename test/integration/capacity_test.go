package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/weightscache"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
)

// capacityBucket holds the capacity tests' model: three files, 6 MiB in all.
const (
	capacityBucket = "capacity-models"
	capacityPrefix = "models/llm"
	modelBytes     = 6 << 20
)

// capacityS3 runs a real S3 server holding the test model, behind a proxy that counts what it
// sends, and returns the proxy.
func capacityS3(t *testing.T, ctx context.Context) *shaper.Proxy {
	t.Helper()
	srv, err := s3fixture.Start(filepath.Join(t.TempDir(), "s3"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.CreateBucket(ctx, capacityBucket); err != nil {
		t.Fatal(err)
	}
	for i, size := range []int{1 << 20, 2 << 20, 3 << 20} {
		if err := srv.PutBytes(ctx, capacityBucket, fmt.Sprintf("%s/part-%d.safetensors", capacityPrefix, i), gen.Bytes(uint64(70+i), size)); err != nil {
			t.Fatal(err)
		}
	}
	counted, err := shaper.Start(srv.Endpoint, shaper.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = counted.Close() })
	return counted
}

// capacityReconcilers are the reconcilers of a configuration that reads the test S3 through
// counted, with each namespace's own credentials (no source is prewarm's to read), and whose
// weights cache reconciler lists sources to learn their sizes.
func capacityReconcilers(t *testing.T, ctx context.Context, counted *shaper.Proxy, operatorNS string, namespaces []string, change func(*controller.Config)) *reconcilers {
	t.Helper()
	rc := newReconcilers(t, ctx, operatorNS, namespaces...).with(func(cfg *controller.Config) {
		cfg.S3.Endpoint, cfg.S3.CredentialsSecret = counted.URL, "prewarm-s3"
		cfg.SourceAccess = nil
		if change != nil {
			change(cfg)
		}
	})
	rc.wc.Sizer = weightscache.SourceSizer{Config: rc.cfg.OperatorConfiguration}
	rc.wc.Recorder = events.NewFakeRecorder(100)
	for _, ns := range namespaces {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prewarm-s3"}, StringData: map[string]string{
			"AWS_ACCESS_KEY_ID": s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY": s3fixture.SecretKey,
		}}
		if err := server.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return rc
}

// reportDisk makes node's NodeCache say, as its agent would, that its cache root has free bytes
// for caches (and holds nothing).
func reportDisk(t *testing.T, ctx context.Context, node string, free int64) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc)
	if apierrors.IsNotFound(err) {
		nc = &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}
		err = server.Client.Create(ctx, nc)
	}
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	nc.Status.HeartbeatTime = &now
	nc.Status.Roots = []prewarmv1alpha1.RootStatus{{Path: config.DefaultCacheRoot, CapacityBytes: 100 << 30, FreeBytes: free, UsedBytes: 1 << 30}}
	if err := server.Client.Status().Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

// capacityParent creates an InferenceEndpointConfig ns/name of the test model on instanceType
// and settles it.
func capacityParent(t *testing.T, ctx context.Context, rc *reconcilers, ns, name, instanceType string) (*inferencev1.InferenceEndpointConfig, *inferencev1.ModelDataCacheConfig) {
	t.Helper()
	parent := builders.MakeInferenceEndpointConfig(ns, name).Location(capacityPrefix).InstanceType(instanceType).Obj()
	parent.Spec.ModelSourceConfig.S3Storage.BucketName = capacityBucket
	parent.Spec.ModelCacheConfig.ImageCache = nil
	if err := server.Client.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	got := rc.endpoint(t, ctx, client.ObjectKeyFromObject(parent))
	caches := &inferencev1.ModelDataCacheConfigList{}
	if err := server.Client.List(ctx, caches, client.InNamespace(ns), client.MatchingLabels{controller.ParentUIDLabel: string(got.UID)}); err != nil || len(caches.Items) != 1 {
		t.Fatalf("the parent's caches: %d, %v", len(caches.Items), err)
	}
	return got, &caches.Items[0]
}

func condition(conds []metav1.Condition, typ string) metav1.Condition {
	if c := apimeta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// When a parent is created, its cache's source is listed and its target nodes' room checked
// against what their agents report, before any node is asked to download: the shortfall is a
// condition on the cache and on the parent, with the figures, while S3 has sent nothing but
// the listing. With controller.capacityShortfall: Refuse, a parent no node has room for is not
// deployed.
func TestCapacityShortfallIsReportedBeforeAnyDownload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	counted := capacityS3(t, ctx)
	rc := capacityReconcilers(t, ctx, counted, "cap-operator", []string{"cap-a", "cap-b"}, nil)
	for _, n := range []string{"cap-n1", "cap-n2", "cap-n3"} {
		upNode(t, ctx, n, "ml.p5.48xlarge")
		// Gone with the test: other tests' parents of that instance type target no node.
		t.Cleanup(func() {
			_ = server.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
			_ = server.Client.Delete(context.Background(), &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: n}})
		})
	}
	reportDisk(t, ctx, "cap-n1", 100<<20)
	reportDisk(t, ctx, "cap-n2", 1<<20)
	reportDisk(t, ctx, "cap-n3", 2<<20)

	parent, m := capacityParent(t, ctx, rc, "cap-a", "llm", "ml.p5.48xlarge")
	if c := m.Status.Capacity; c == nil || c.ModelBytes != modelBytes || c.FitNodes != 1 || c.ShortNodes != 2 || c.UnknownNodes != 0 {
		t.Errorf("status.capacity %+v; want the model's %d bytes, 1 node fitting and 2 short", c, modelBytes)
	}
	got := condition(m.Status.Conditions, inferencev1.ConditionCapacityAvailable)
	if got.Status != metav1.ConditionFalse || got.Reason != inferencev1.ReasonCapacityShortfall {
		t.Errorf("the cache's CapacityAvailable: %+v; want False CapacityShortfall", got)
	}
	for _, want := range []string{"2 of 3 target nodes cannot hold the model", "cap-n2 has 1.0 MB free for caches and 0 B it may evict",
		"cap-n3 has 2.1 MB free", "the model is 6.3 MB (listed from the source: 3 files)"} {
		if !strings.Contains(got.Message, want) {
			t.Errorf("the cache's CapacityAvailable says %q; want %q in it", got.Message, want)
		}
	}
	if pc := condition(parent.Status.Conditions, inferencev1.ConditionCapacityAvailable); pc.Reason != inferencev1.ReasonCapacityShortfall || pc.Message != got.Message {
		t.Errorf("the parent's CapacityAvailable: %+v; want the cache's", pc)
	}
	// The shortfall is told once, as a Warning with the same figures, however often the cache
	// is reconciled.
	if _, err := rc.wc.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
		t.Fatal(err)
	}
	if told := drainEvents(rc, inferencev1.ReasonCapacityShortfall); len(told) != 1 || !strings.HasPrefix(told[0], "Warning CapacityShortfall 2 of 3 target nodes cannot hold the model") {
		t.Errorf("CapacityShortfall events %q; want one Warning with the figures", told)
	}
	if served := counted.Served.Load(); served >= modelBytes/10 {
		t.Errorf("S3 sent %d bytes; want the listing only, before any node downloads", served)
	}
	// The nodes are asked (their agents check again and serve pods from the source), with
	// nothing downloaded yet: no agent runs here.
	for _, n := range []string{"cap-n1", "cap-n2", "cap-n3"} {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := server.Client.Get(ctx, types.NamespacedName{Name: n}, nc); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == string(m.UID) }) {
			t.Errorf("node %s is not asked for the cache", n)
		}
	}

	// Refuse: a parent none of whose targets has room is stopped, and nothing is deployed.
	refusing := capacityReconcilers(t, ctx, counted, "cap-operator-2", []string{"cap-c"}, func(cfg *controller.Config) {
		cfg.Controller.CapacityShortfall = config.CapacityShortfallRefuse
	})
	for _, n := range []string{"cap-s1", "cap-s2"} {
		upNode(t, ctx, n, "ml.p4d.24xlarge")
		reportDisk(t, ctx, n, 1<<20)
	}
	stopped, _ := capacityParent(t, ctx, refusing, "cap-c", "llm", "ml.p4d.24xlarge")
	ready := condition(stopped.Status.Conditions, inferencev1.ConditionReady)
	if stopped.Status.State != inferencev1.DeploymentFailed || ready.Reason != inferencev1.ReasonCapacityShortfall ||
		!strings.Contains(ready.Message, "no target node of weights cache llm-cache may hold the model (6.3 MB): 2 short of room") {
		t.Errorf("the refused parent: state %s, Ready %+v", stopped.Status.State, ready)
	}
	err := server.Client.Get(ctx, types.NamespacedName{Namespace: "cap-c", Name: "llm"}, &appsv1.Deployment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the refused parent's Deployment: %v; want none", err)
	}
	// Room appears on one node: the parent proceeds.
	reportDisk(t, ctx, "cap-s1", 100<<20)
	again := refusing.endpoint(t, ctx, client.ObjectKeyFromObject(stopped))
	if r := condition(again.Status.Conditions, inferencev1.ConditionReady); r.Reason == inferencev1.ReasonCapacityShortfall {
		t.Errorf("the parent stays refused once a node has room: %+v", r)
	}
}

// A namespace's quota in the cluster caps its caches' copies: a cache is asked of as many target
// nodes as the limit leaves room for, the others keep none (BudgetExceeded, on the cache, its
// nodes and its parent, with the figures), a target whose pods ask for the cache is told why
// it keeps no copy, and a second cache of the namespace gets what is left. Another namespace's
// cache on the same nodes is unaffected.
func TestNamespaceQuotaInTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	counted := capacityS3(t, ctx)
	limit := resource.MustParse(fmt.Sprint(5 * modelBytes / 2)) // two copies and a half
	rc := capacityReconcilers(t, ctx, counted, "quota-operator", []string{"quota-a", "quota-b"}, func(cfg *controller.Config) {
		cfg.NamespaceQuotas = []config.NamespaceQuota{{Namespaces: []string{"quota-a"}, MaxBytes: &limit}}
	})
	nodes := []string{"quota-n1", "quota-n2", "quota-n3", "quota-n4"}
	for _, n := range nodes {
		upNode(t, ctx, n, "ml.g6.48xlarge")
		reportDisk(t, ctx, n, 1<<30)
	}

	parent, m := capacityParent(t, ctx, rc, "quota-a", "first", "ml.g6.48xlarge")
	asked := askedOf(t, ctx, string(m.UID), nodes)
	if len(asked) != 2 {
		t.Errorf("the first cache is asked of %v; want 2 of the 4 nodes (two copies fit the quota)", asked)
	}
	within := condition(m.Status.Conditions, inferencev1.ConditionWithinBudget)
	if within.Status != metav1.ConditionFalse || within.Reason != inferencev1.ReasonBudgetExceeded ||
		!strings.Contains(within.Message, "namespace quota-a may hold 15.7 MB of caches in the cluster (namespaceQuotas[0].maxBytes); its other caches hold 0 B: this cache (6.3 MB) fits on 2 of its 4 target nodes, and is not asked of 2") {
		t.Errorf("the first cache's WithinBudget: %+v", within)
	}
	if pc := condition(parent.Status.Conditions, inferencev1.ConditionWithinBudget); pc.Reason != inferencev1.ReasonBudgetExceeded {
		t.Errorf("the parent's WithinBudget: %+v; want BudgetExceeded", pc)
	}
	if told := drainEvents(rc, inferencev1.ReasonBudgetExceeded); len(told) != 1 || !strings.HasPrefix(told[0], "Warning BudgetExceeded namespace quota-a may hold 15.7 MB") {
		t.Errorf("BudgetExceeded events %q; want one Warning with the figures", told)
	}
	refusedNodes := 0
	for _, ns := range m.Status.Nodes {
		if ns.State == inferencev1.CacheFailed && ns.Reason == prewarmv1alpha1.ReasonBudgetExceeded && strings.Contains(ns.Message, "no room for another copy") {
			refusedNodes++
		}
	}
	if refusedNodes != 2 || m.Status.Capacity == nil || m.Status.Capacity.OverBudgetNodes != 2 {
		t.Errorf("status.nodes has %d nodes BudgetExceeded, capacity %+v; want 2", refusedNodes, m.Status.Capacity)
	}

	// The copies are counted at the size the controller listed, so the nodes are asked for
	// exactly what it listed: a source grown since (a node lists another revision, twice the
	// size) is not held in its place, and the quota's figures stay.
	pin := ""
	for _, n := range asked {
		r := requestOn(t, ctx, n, string(m.UID))
		if r.Source.Revision == "" || pin != "" && r.Source.Revision != pin {
			t.Fatalf("%s's request for the first cache pins %q (another node's %q); want the revision the controller listed", n, r.Source.Revision, pin)
		}
		pin = r.Source.Revision
	}
	agentReports(t, ctx, asked[0], "", prewarmv1alpha1.CacheStatus{
		UID:        string(m.UID),
		CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 2 * modelBytes, BytesTotal: 2 * modelBytes},
		Revision:   "sha256:grown",
	})
	if grown := rc.cache(t, ctx, m); grown.Status.ResolvedRevision == "sha256:grown" || grown.Status.ReadyNodes != 0 ||
		grown.Status.Capacity == nil || grown.Status.Capacity.ModelBytes != modelBytes {
		t.Errorf("a node holding the grown source: pinned %q, %d Ready, capacity %+v; want it not counted, the model at its listed size", grown.Status.ResolvedRevision, grown.Status.ReadyNodes, grown.Status.Capacity)
	}
	agentReports(t, ctx, asked[0], "")
	reportDisk(t, ctx, asked[0], 1<<30)

	// A pod of quota-a on a node that is not asked: the node is told why it keeps no copy.
	left := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return slices.Contains(asked, n) })
	demandOn(t, ctx, left[0], string(m.UID), "quota-a")
	rc.cache(t, ctx, m)
	if r := requestOn(t, ctx, left[0], string(m.UID)); r == nil || r.Refused == nil || r.Refused.Reason != prewarmv1alpha1.ReasonBudgetExceeded {
		t.Errorf("the node whose pods ask for the cache: request %+v; want one refused for the quota", r)
	}
	if r := requestOn(t, ctx, left[1], string(m.UID)); r != nil {
		t.Errorf("a node the quota keeps the cache off, with no pod asking, is asked: %+v", r)
	}

	// The second cache of quota-a: half a copy left, no node.
	_, second := capacityParent(t, ctx, rc, "quota-a", "second", "ml.g6.48xlarge")
	if got := askedOf(t, ctx, string(second.UID), nodes); len(got) != 0 {
		t.Errorf("the second cache is asked of %v; want none (its namespace's quota holds two copies of the first)", got)
	}
	if second.Status.State != inferencev1.CacheFailed || condition(second.Status.Conditions, inferencev1.ConditionReady).Reason != prewarmv1alpha1.ReasonBudgetExceeded ||
		!strings.Contains(condition(second.Status.Conditions, inferencev1.ConditionWithinBudget).Message, "its other caches hold 12.6 MB") {
		t.Errorf("the second cache: %s, conditions %+v", second.Status.State, second.Status.Conditions)
	}

	// Another namespace, the same nodes: every node asked, no quota condition.
	_, other := capacityParent(t, ctx, rc, "quota-b", "first", "ml.g6.48xlarge")
	if got := askedOf(t, ctx, string(other.UID), nodes); len(got) != 4 {
		t.Errorf("quota-b's cache is asked of %v; want all 4 nodes", got)
	}
	if c := apimeta.FindStatusCondition(other.Status.Conditions, inferencev1.ConditionWithinBudget); c != nil {
		t.Errorf("quota-b has no quota, yet its cache says %+v", c)
	}
}

// drainEvents takes the events the weights cache reconciler has recorded so far and returns
// those of reason.
func drainEvents(rc *reconcilers, reason string) []string {
	var told []string
	for rec := rc.wc.Recorder.(*events.FakeRecorder); len(rec.Events) > 0; {
		if e := <-rec.Events; strings.Contains(e, " "+reason+" ") {
			told = append(told, e)
		}
	}
	return told
}

// askedOf lists the nodes asked to hold cache uid (requests not refused).
func askedOf(t *testing.T, ctx context.Context, uid string, nodes []string) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		if r := requestOn(t, ctx, n, uid); r != nil && r.Refused == nil {
			out = append(out, n)
		}
	}
	return out
}

// requestOn is node's request for cache uid, or nil.
func requestOn(t *testing.T, ctx context.Context, node, uid string) *prewarmv1alpha1.CacheRequest {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	for _, r := range nc.Spec.Caches {
		if r.UID == uid {
			return &r
		}
	}
	return nil
}

// demandOn makes node's NodeCache report, as its agent would, that pods of ns on it ask for
// cache uid.
func demandOn(t *testing.T, ctx context.Context, node, uid, ns string) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := server.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.Demands = append(nc.Status.Demands, prewarmv1alpha1.CacheDemand{UID: uid, Namespace: ns, Pods: 1})
	if err := server.Client.Status().Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
}
