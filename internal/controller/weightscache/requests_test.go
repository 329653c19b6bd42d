package weightscache

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
)

// cacheUID is the UID of test cache i.
func cacheUID(i int) string { return fmt.Sprintf("%08d-0000-4000-8000-000000000000", i) }

// request is test cache i's request.
func request(i int) *prewarmv1alpha1.CacheRequest {
	return &prewarmv1alpha1.CacheRequest{UID: cacheUID(i), Namespace: "default", Name: fmt.Sprintf("cache-%d", i), Root: "/mnt/nvme",
		Source: prewarmv1alpha1.CacheSource{Type: "s3", Bucket: "models"}}
}

// uidsOf lists the caches node's NodeCache asks for, in order.
func uidsOf(ctx context.Context, c client.Reader, node string) ([]string, error) {
	nc, err := readNodeCache(ctx, c, node)
	if err != nil || nc == nil {
		return nil, err
	}
	var out []string
	for _, e := range nc.Spec.Caches {
		out = append(out, e.UID)
	}
	return out, nil
}

// eventually polls cond until it holds, or fails the test when ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, got := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %s", what, got)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startAPI starts a test API server with nodes of the given names.
func startAPI(t *testing.T, ctx context.Context, nodes ...string) (*testutil.APIServer, map[string]types.UID) {
	t.Helper()
	api := testutil.APIServerFor(t)
	direct, err := client.NewWithWatch(api.Config, client.Options{Scheme: testutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	api.Client = direct
	uids := map[string]types.UID{}
	for _, name := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := api.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		uids[name] = n.UID
	}
	return api, uids
}

// Three caches' requests of two nodes, and the withdrawal of a request an earlier controller
// wrote as its cache's own server-side-apply field manager, against a real API server: the first
// cache's write of each node is held in flight while the others are put, and those then go in
// one write per node. Each node ends with exactly the three caches, in the order asked.
func TestRequestsWriteEachNodeOnceForEveryCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, nodeUIDs := startAPI(t, ctx, "n1", "n2")
	// n2 has a request applied by the per-cache field manager of earlier versions.
	legacy, err := runtime.DefaultUnstructuredConverter.ToUnstructured(request(9))
	if err != nil {
		t.Fatal(err)
	}
	apply := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": prewarmv1alpha1.GroupVersion.String(), "kind": "NodeCache",
		"metadata": map[string]any{"name": "n2"}, "spec": map[string]any{"caches": []any{legacy}},
	}}
	if err := api.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner("prewarm-cache-"+cacheUID(9))); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	writes := map[string]int{}
	entered := make(chan string, 2)
	release := make(chan struct{})
	var held atomic.Int64
	hold := func(node string) {
		mu.Lock()
		writes[node]++
		mu.Unlock()
		if held.Add(1) <= 2 {
			entered <- node
			<-release
		}
	}
	c := interceptor.NewClient(api.Client.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			hold(obj.GetName())
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			hold(obj.GetName())
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	q := &Requests{Client: c, Window: time.Millisecond}
	done := make(chan error)
	go func() { done <- q.Start(ctx) }()

	put := func(changes ...change) {
		t.Helper()
		if full, err := q.Put(ctx, nil, changes); err != nil || len(full) > 0 {
			t.Fatalf("Put: %v, full %v", err, full)
		}
	}
	ask := func(i int, node string) change {
		return change{node: node, nodeUID: nodeUIDs[node], uid: cacheUID(i), entry: request(i)}
	}
	put(ask(1, "n1"), ask(1, "n2"))
	for range 2 {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the first writes never came")
		}
	}
	put(ask(2, "n1"), ask(2, "n2"))
	put(ask(3, "n2"), ask(3, "n1"), change{node: "n2", uid: cacheUID(9)})
	close(release)

	want := []string{cacheUID(1), cacheUID(2), cacheUID(3)}
	for _, node := range []string{"n1", "n2"} {
		eventually(t, ctx, node+" asked for the three caches", func() (bool, string) {
			got, err := uidsOf(ctx, api.Client, node)
			return err == nil && slices.Equal(got, want), fmt.Sprintf("%v (%v)", got, err)
		})
	}
	mu.Lock()
	if writes["n1"] != 2 || writes["n2"] != 2 {
		t.Errorf("writes by node: %v; want 2 each (the held one, then one for the other caches)", writes)
	}
	mu.Unlock()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, types.NamespacedName{Name: "n1"}, nc); err != nil {
		t.Fatal(err)
	}
	if refs := nc.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != nodeUIDs["n1"] {
		t.Errorf("the NodeCache made for n1 is owned by %+v; want its Node", refs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}

// A list read from a view older than the NodeCache is never written over it: after a restart
// (no write of its own remembered), the write's generation test fails against the real API
// server and the node is written again from a newer view; after a write of its own, the writer
// waits for a view that has it, and makes no write that would fail.
func TestRequestsNeverWriteOverANewerList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, nodeUIDs := startAPI(t, ctx, "n1")
	if _, err := (*Requests)(nil).Put(ctx, api.Client, []change{{node: "n1", nodeUID: nodeUIDs["n1"], uid: cacheUID(1), entry: request(1)}}); err != nil {
		t.Fatal(err)
	}
	before := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, types.NamespacedName{Name: "n1"}, before); err != nil {
		t.Fatal(err)
	}
	// Cache 2 is asked by someone else's write since (another leader's, just before this one's).
	if _, err := (*Requests)(nil).Put(ctx, api.Client, []change{{node: "n1", uid: cacheUID(2), entry: request(2)}}); err != nil {
		t.Fatal(err)
	}

	var stale atomic.Int64 // the reads of n1 still to answer with before
	var refused, patches atomic.Int64
	c := interceptor.NewClient(api.Client.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if nc, ok := obj.(*prewarmv1alpha1.NodeCache); ok && stale.Add(-1) >= 0 {
				before.DeepCopyInto(nc)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches.Add(1)
			err := c.Patch(ctx, obj, patch, opts...)
			if apierrors.IsInvalid(err) {
				refused.Add(1)
			}
			return err
		},
	})
	q := &Requests{Client: c, Window: time.Millisecond}
	go func() { _ = q.Start(ctx) }()

	stale.Store(1)
	if _, err := q.Put(ctx, nil, []change{{node: "n1", uid: cacheUID(3), entry: request(3)}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n1 asked for caches 1, 2 and 3", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Equal(got, []string{cacheUID(1), cacheUID(2), cacheUID(3)}), fmt.Sprintf("%v (%v)", got, err)
	})
	if refused.Load() != 1 {
		t.Errorf("%d writes refused; want 1 (the one from the old view)", refused.Load())
	}

	// Once the writer has written the node itself, a view older than its write is waited out.
	if _, err := (*Requests)(nil).Put(ctx, api.Client, []change{{node: "n1", uid: cacheUID(4), entry: request(4)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Put(ctx, nil, []change{{node: "n1", uid: cacheUID(2)}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n1 withdrawn from cache 2", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Equal(got, []string{cacheUID(1), cacheUID(3), cacheUID(4)}), fmt.Sprintf("%v (%v)", got, err)
	})
	latest := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, types.NamespacedName{Name: "n1"}, latest); err != nil {
		t.Fatal(err)
	}
	before = latest.DeepCopy()
	before.Generation--
	before.Spec.Caches = before.Spec.Caches[:1]
	patchesBefore, refusedBefore := patches.Load(), refused.Load()
	stale.Store(3)
	if _, err := q.Put(ctx, nil, []change{{node: "n1", uid: cacheUID(5), entry: request(5)}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n1 asked for cache 5 too", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Equal(got, []string{cacheUID(1), cacheUID(3), cacheUID(4), cacheUID(5)}), fmt.Sprintf("%v (%v)", got, err)
	})
	if stale.Load() >= 0 {
		t.Errorf("the old view was read %d times less than served", stale.Load()+1)
	}
	if p, r := patches.Load()-patchesBefore, refused.Load()-refusedBefore; p != 1 || r != 0 {
		t.Errorf("%d writes, %d refused, for cache 5; want 1 and none refused (the old view waited out)", p, r)
	}
}

// A node whose list is full takes no new cache: the write leaves the list as it is and the
// nil Requests reports the node full; a cache already there is still changed.
func TestRequestsLeaveAFullListAsItIs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, nodeUIDs := startAPI(t, ctx, "n1")
	var fill []change
	for i := range prewarmv1alpha1.MaxCachesPerNode {
		fill = append(fill, change{node: "n1", nodeUID: nodeUIDs["n1"], uid: cacheUID(i + 1), entry: request(i + 1)})
	}
	if full, err := (*Requests)(nil).Put(ctx, api.Client, fill); err != nil || len(full) > 0 {
		t.Fatalf("filling the list: %v, full %v", err, full)
	}
	changed := request(1)
	changed.RetainedSince = "2026-01-01T00:00:00Z"
	full, err := (*Requests)(nil).Put(ctx, api.Client, []change{
		{node: "n1", uid: cacheUID(1000), entry: request(1000)},
		{node: "n1", uid: cacheUID(1), entry: changed},
	})
	if err != nil || full["n1"].reason != prewarmv1alpha1.ReasonNodeCacheFull {
		t.Fatalf("Put past the limit: %v, left out %v; want n1 full", err, full)
	}
	nc, err := readNodeCache(ctx, api.Client, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(nc.Spec.Caches) != prewarmv1alpha1.MaxCachesPerNode || nc.Spec.Caches[0].RetainedSince != changed.RetainedSince ||
		slices.ContainsFunc(nc.Spec.Caches, func(e prewarmv1alpha1.CacheRequest) bool { return e.UID == cacheUID(1000) }) {
		t.Errorf("list of %d, first %+v; want the %d caches, the first changed, not cache 1000", len(nc.Spec.Caches), nc.Spec.Caches[0], prewarmv1alpha1.MaxCachesPerNode)
	}
}

// A reconcile withdraws the cache from the nodes it no longer targets or retains: those whose
// NodeCache has the request, and those whose request is not written yet (the writer's pending
// changes, which the informer cannot show).
func TestWithdrawalsIncludeRequestsNotWrittenYet(t *testing.T) {
	uid := cacheUID(1)
	q := &Requests{}
	nodeUID := types.UID("node-uid")
	if _, err := q.Put(context.Background(), nil, []change{
		{node: "pending", nodeUID: nodeUID, uid: uid, entry: request(1)},
		{node: "target", nodeUID: nodeUID, uid: uid, entry: request(1)},
		{node: "kept", nodeUID: nodeUID, uid: uid, entry: request(1)},
		{node: "withdrawing", uid: uid},
		{node: "other", nodeUID: nodeUID, uid: cacheUID(2), entry: request(2)},
	}); err != nil {
		t.Fatal(err)
	}
	pending := q.pendingFor(uid)
	if want := []string{"kept", "pending", "target"}; !slices.Equal(pending, want) {
		t.Fatalf("pendingFor = %v; want %v", pending, want)
	}
	asked := func(node string) *prewarmv1alpha1.NodeCache {
		return &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{*request(1)}}}
	}
	s := &state{
		fleet: &fleet{uid: uid, named: []*prewarmv1alpha1.NodeCache{asked("written"), asked("target"),
			{ObjectMeta: metav1.ObjectMeta{Name: "reports-only"}}}},
		decision: decision{targets: []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "target"}}},
			retained: map[string]retention{"kept": {}}},
	}
	var got []string
	for _, ch := range withdrawals(s, pending) {
		if ch.uid != uid || ch.entry != nil {
			t.Errorf("withdrawal %+v; want cache %s, no entry", ch, uid)
		}
		got = append(got, ch.node)
	}
	if want := []string{"written", "pending"}; !slices.Equal(got, want) {
		t.Errorf("withdrawn from %v; want %v", got, want)
	}
}

// requestIn is test cache i's request, of namespace ns.
func requestIn(i int, ns string) *prewarmv1alpha1.CacheRequest {
	e := request(i)
	e.Namespace = ns
	return e
}

// refusePolicy makes the API server refuse, with a ValidatingAdmissionPolicy, every NodeCache
// whose list asks for a cache named name: a refusal the writer knows nothing of beforehand, and
// that names no entry.
func refusePolicy(t *testing.T, ctx context.Context, c client.Client, name string) {
	t.Helper()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refuse-" + name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{prewarmv1alpha1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"nodecaches"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("!has(object.spec.caches) || object.spec.caches.all(c, c.name != %q)", name),
				Message:    "the policy refuses caches named " + name,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The policy holds once the API server refuses a NodeCache with such a cache.
	probe := requestIn(999, "probe")
	probe.Name = name
	eventually(t, ctx, "the policy in force", func() (bool, string) {
		nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"},
			Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{*probe}}}
		err := c.Create(ctx, nc)
		if err == nil {
			_ = c.Delete(ctx, nc)
		}
		return err != nil && strings.Contains(err.Error(), "refuses caches named"), fmt.Sprint(err)
	})
}

// One cache's request never keeps a node's other requests from being written. A request the
// NodeCache schema would refuse (a repository id past its cap, sealed credentials past theirs),
// one past its namespace's share of the node's slots, and one an admission policy refuses (the
// writer finds it by splitting the node's changes) are each left out and reported on their own
// cache; every other namespace's request in the same write is written.
func TestOneRequestNeverHoldsUpTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, nodeUIDs := startAPI(t, ctx, "n1")
	refusePolicy(t, ctx, api.Client, "refused-by-policy")

	left := make(chan event.GenericEvent, 16)
	q := &Requests{Client: api.Client, Window: time.Millisecond, LeftOut: left,
		Slots: func(ns string) (int, string) { return 3, "the test's share" }}
	go func() { _ = q.Start(ctx) }()

	longID := requestIn(1, "careless")
	longID.Source = prewarmv1alpha1.CacheSource{Type: "huggingface", RepoID: strings.Repeat("x", 300)}
	bigCredentials := requestIn(2, "careless")
	bigCredentials.Credentials = &prewarmv1alpha1.SealedCredentials{KeyID: "k", Digest: "d", Sealed: strings.Repeat("A", prewarmv1alpha1.MaxSealedLength+1)}
	policy := requestIn(3, "hostile")
	policy.Name = "refused-by-policy"
	var changes []change
	for _, e := range []*prewarmv1alpha1.CacheRequest{longID, bigCredentials, policy,
		requestIn(10, "many"), requestIn(11, "many"), requestIn(12, "many"), requestIn(13, "many"), requestIn(14, "many"),
		requestIn(20, "team-a"), requestIn(21, "team-b")} {
		changes = append(changes, change{node: "n1", nodeUID: nodeUIDs["n1"], uid: e.UID, entry: e})
	}
	if _, err := q.Put(ctx, nil, changes); err != nil {
		t.Fatal(err)
	}
	want := []string{cacheUID(10), cacheUID(11), cacheUID(12), cacheUID(20), cacheUID(21)}
	eventually(t, ctx, "n1 asked for the caches that fit", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Equal(got, want), fmt.Sprintf("%v (%v)", got, err)
	})
	told := map[string]bool{}
	for len(told) < 5 {
		select {
		case e := <-left:
			told[e.Object.GetNamespace()+"/"+e.Object.GetName()] = true
		case <-ctx.Done():
			t.Fatalf("told of %v only", told)
		}
	}
	for _, tc := range []struct {
		entry          *prewarmv1alpha1.CacheRequest
		reason, saying string
	}{
		{longID, prewarmv1alpha1.ReasonRequestInvalid, "spec.caches[" + cacheUID(1) + "].source.repoID: Too long: may not be more than 256"},
		{bigCredentials, prewarmv1alpha1.ReasonRequestInvalid, "credentials.sealed: Too long"},
		{policy, prewarmv1alpha1.ReasonRequestInvalid, "the policy refuses caches named refused-by-policy"},
		{requestIn(13, "many"), prewarmv1alpha1.ReasonNodeCacheFull, "3 caches of namespace many, its share of the node's 256 cache slots (the test's share)"},
		{requestIn(14, "many"), prewarmv1alpha1.ReasonNodeCacheFull, "its share"},
	} {
		why, ok := q.leftOutOf("n1", *tc.entry, time.Now())
		if !ok || why.reason != tc.reason || !strings.Contains(why.message, tc.saying) {
			t.Errorf("cache %s/%s left out %v: %+v; want %s saying %q", tc.entry.Namespace, tc.entry.Name, ok, why, tc.reason, tc.saying)
		}
		if !told[tc.entry.Namespace+"/"+tc.entry.Name] {
			t.Errorf("cache %s/%s was not told; told %v", tc.entry.Namespace, tc.entry.Name, told)
		}
	}
	// A request changed since (a shorter id) is asked again, and written.
	fixed := *longID
	fixed.Source.RepoID = "org/model"
	if _, ok := q.leftOutOf("n1", fixed, time.Now()); ok {
		t.Error("a changed request is still reported left out")
	}
	if _, err := q.Put(ctx, nil, []change{{node: "n1", uid: fixed.UID, entry: &fixed}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n1 asked for the fixed cache", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Contains(got, cacheUID(1)), fmt.Sprintf("%v (%v)", got, err)
	})
}

// One namespace's many caches leave other namespaces their slots: 300 caches of one namespace
// and one of another asked of a node together, the other namespace's cache is written, the
// first namespace's take its default share, and the rest are left out as NodeCacheFull. A list
// that would take more bytes than a NodeCache holds leaves its last requests out the same way.
func TestANamespacesCachesLeaveOthersTheirSlots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, nodeUIDs := startAPI(t, ctx, "n1", "n2")
	q := &Requests{Client: api.Client, Window: time.Millisecond, Slots: config.Default().CacheSlots}
	go func() { _ = q.Start(ctx) }()

	var changes []change
	for i := range 300 {
		changes = append(changes, change{node: "n1", nodeUID: nodeUIDs["n1"], uid: cacheUID(i), entry: requestIn(i, "greedy")})
	}
	other := requestIn(5000, "other") // after every greedy cache in UID order
	changes = append(changes, change{node: "n1", nodeUID: nodeUIDs["n1"], uid: other.UID, entry: other})
	if _, err := q.Put(ctx, nil, changes); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n1 asked for the other namespace's cache", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n1")
		return err == nil && slices.Contains(got, other.UID) && len(got) == config.DefaultCachesPerNode+1, fmt.Sprintf("%d caches (%v)", len(got), err)
	})
	// What a write left out is remembered after the write (Requests.tell): wait for it too.
	eventually(t, ctx, "the greedy namespace's last cache left out as NodeCacheFull, naming the setting", func() (bool, string) {
		why, ok := q.leftOutOf("n1", *requestIn(299, "greedy"), time.Now())
		return ok && why.reason == prewarmv1alpha1.ReasonNodeCacheFull && strings.Contains(why.message, "maxCachesPerNode"), fmt.Sprintf("%v %+v", ok, why)
	})

	// Requests of 7 KiB each (sealed credentials near their cap): MaxRequestBytes holds about 70,
	// the first ones in UID order.
	changes = nil
	for i := range 100 {
		e := requestIn(i, fmt.Sprintf("ns-%d", i))
		e.Credentials = &prewarmv1alpha1.SealedCredentials{KeyID: "k", Digest: "d", Sealed: strings.Repeat("A", 7<<10)}
		changes = append(changes, change{node: "n2", nodeUID: nodeUIDs["n2"], uid: e.UID, entry: e})
	}
	if _, err := q.Put(ctx, nil, changes); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "n2 asked for the caches that fit its bytes", func() (bool, string) {
		got, err := uidsOf(ctx, api.Client, "n2")
		return err == nil && len(got) > 60 && len(got) < 100 && got[len(got)-1] == cacheUID(len(got)-1), fmt.Sprintf("%d caches (%v)", len(got), err)
	})
	nc, err := readNodeCache(ctx, api.Client, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(nc.Spec.Caches); len(b) > MaxRequestBytes {
		t.Errorf("n2's list takes %d bytes; want at most %d", len(b), MaxRequestBytes)
	}
	last := changes[99].entry
	if why, ok := q.leftOutOf("n2", *last, time.Now()); !ok || why.reason != prewarmv1alpha1.ReasonNodeCacheFull || !strings.Contains(why.message, "512 KiB") {
		t.Errorf("the last cache on n2: %v %+v; want NodeCacheFull naming the byte limit", ok, why)
	}
}

// The index of the entry a schema refusal names is read from the refusal's field.
func TestRefusedEntry(t *testing.T) {
	written := &prewarmv1alpha1.NodeCache{Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{*request(1), *request(2)}}}
	err := apierrors.NewInvalid(schema.GroupKind{Group: "prewarm.io", Kind: "NodeCache"}, "n1", field.ErrorList{
		field.TooLong(field.NewPath("spec", "caches").Index(1).Child("source", "repoID"), "", 256)})
	if got := refusedEntry(err, written); got != cacheUID(2) {
		t.Errorf("refusedEntry = %q; want cache 2's", got)
	}
	if !refusedForContent(err) {
		t.Error("a schema refusal is not taken for one")
	}
	race := apierrors.NewGenericServerResponse(422, "", schema.GroupResource{}, "", "testing value /metadata/generation failed: test failed", 0, false)
	if refusedForContent(race) {
		t.Error("a failed generation test is taken for a refusal of the list's content")
	}
}
