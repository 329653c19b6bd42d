package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// askedNode is node's NodeCache asking for uids, as the controller writes it.
func askedNode(node string, uids ...string) *prewarmv1alpha1.NodeCache {
	nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}
	for _, uid := range uids {
		nc.Spec.Caches = append(nc.Spec.Caches, prewarmv1alpha1.CacheRequest{UID: uid})
	}
	return nc
}

// countedNodeCaches is a fake API server holding objs, and how many reads it was asked; a read
// waits for release, when set.
func countedNodeCaches(release <-chan struct{}, objs ...client.Object) (client.WithWatch, *atomic.Int64) {
	var gets atomic.Int64
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets.Add(1)
			if release != nil {
				<-release
			}
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	return c, &gets
}

func TestTargetCheckAdmitsOnlyTheCachesNodes(t *testing.T) {
	c, gets := countedNodeCaches(nil, askedNode("node-a", "cache-1"), askedNode("node-b", "cache-2"))
	tc := &TargetCheck{Reader: c}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for _, x := range []struct {
		who, uid string
		ok       bool
	}{
		{"node-a", "cache-1", true},
		{"node-b", "cache-1", false}, // an agent of another cache's node
		{"node-c", "cache-1", false}, // a node with no NodeCache
		{"system:serviceaccount:hyperpod-inference-system:prewarm-agent", "cache-1", false}, // bound to no node
		{"pod/prewarm-agent-x", "cache-1", false},
	} {
		if err := tc.Admit(r, x.who, x.uid); (err == nil) != x.ok {
			t.Errorf("Admit(%s, %s) = %v; want admitted %v", x.who, x.uid, err, x.ok)
		}
	}
	before := gets.Load()
	for range 20 {
		_ = tc.Admit(r, "node-a", "cache-1")
		_ = tc.Admit(r, "node-b", "cache-1")
	}
	if n := gets.Load() - before; n != 0 {
		t.Errorf("%d more reads for answers already known; want 0", n)
	}
}

// One read of a node's NodeCache answers every key for that node: the caches it is asked for
// for askedTTL, any other key until the set is recheckAfter old.
func TestTargetCheckReadsANodeOncePerTTL(t *testing.T) {
	var asked []string
	for i := range 50 {
		asked = append(asked, fmt.Sprintf("cache-%d", i))
	}
	c, gets := countedNodeCaches(nil, askedNode("node-a", asked...))
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tc := &TargetCheck{Reader: c, Clock: clk}
	r := httptest.NewRequest(http.MethodGet, "/", nil)

	for _, uid := range asked {
		if err := tc.Admit(r, "node-a", uid); err != nil {
			t.Fatalf("Admit(node-a, %s) = %v; want admitted", uid, err)
		}
	}
	for range 1000 {
		if err := tc.Admit(r, "node-a", string(uuid.NewUUID())); err == nil {
			t.Fatal("a key node-a is not asked for was admitted")
		}
	}
	if n := gets.Load(); n != 1 {
		t.Errorf("50 caches of node-a and 1,000 random keys: %d reads of its NodeCache; want 1", n)
	}

	// A key the set lacks is looked up again once the set is recheckAfter old, once.
	clk.SetTime(clk.Now().Add(recheckAfter))
	for range 100 {
		_ = tc.Admit(r, "node-a", string(uuid.NewUUID()))
		_ = tc.Admit(r, "node-a", asked[0])
	}
	if n := gets.Load(); n != 2 {
		t.Errorf("after %v: %d reads in all; want 2", recheckAfter, n)
	}
	// The set's keys are kept until askedTTL after its read; then one read again.
	clk.SetTime(clk.Now().Add(askedTTL - time.Second))
	_ = tc.Admit(r, "node-a", asked[1])
	if n := gets.Load(); n != 2 {
		t.Errorf("within %v of the last read: %d reads in all; want 2", askedTTL, n)
	}
	clk.SetTime(clk.Now().Add(2 * time.Second))
	for _, uid := range asked {
		_ = tc.Admit(r, "node-a", uid)
	}
	if n := gets.Load(); n != 3 {
		t.Errorf("after %v: %d reads in all; want 3", askedTTL, n)
	}
}

// A node withdrawn from a cache is refused once askedTTL has passed since its set was read.
func TestTargetCheckRefusesAWithdrawnNodeAfterTheTTL(t *testing.T) {
	c, _ := countedNodeCaches(nil, askedNode("node-a", "cache-1"))
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tc := &TargetCheck{Reader: c, Clock: clk}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if err := tc.Admit(r, "node-a", "cache-1"); err != nil {
		t.Fatalf("Admit(node-a, cache-1) = %v; want admitted", err)
	}
	setRequests(t, c, "node-a") // the controller withdraws node-a from cache-1
	clk.SetTime(clk.Now().Add(askedTTL + time.Second))
	if err := tc.Admit(r, "node-a", "cache-1"); err == nil {
		t.Errorf("%v after node-a's request for cache-1 was withdrawn: admitted; want refused", askedTTL+time.Second)
	}
}

// A node newly asked for a cache is admitted at most recheckAfter after, though its set
// without the cache is kept.
func TestTargetCheckAdmitsANewlyAskedNode(t *testing.T) {
	c, _ := countedNodeCaches(nil, askedNode("node-a", "cache-1"))
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tc := &TargetCheck{Reader: c, Clock: clk}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if err := tc.Admit(r, "node-a", "cache-2"); err == nil {
		t.Fatal("node-a admitted for cache-2, which it is not asked for")
	}
	setRequests(t, c, "node-a", "cache-1", "cache-2") // the controller asks node-a for cache-2
	clk.SetTime(clk.Now().Add(recheckAfter))
	if err := tc.Admit(r, "node-a", "cache-2"); err != nil {
		t.Errorf("%v after node-a was asked for cache-2: %v; want admitted", recheckAfter, err)
	}
}

// setRequests makes node's NodeCache ask for uids, as the controller would.
func setRequests(t *testing.T, c client.Client, node string, uids ...string) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Spec.Caches = askedNode(node, uids...).Spec.Caches
	if err := c.Update(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
}

// Many askers for one node at once share one read.
func TestTargetCheckSharesAReadAmongAskers(t *testing.T) {
	release := make(chan struct{})
	c, gets := countedNodeCaches(release, askedNode("node-a", "cache-1"))
	tc := &TargetCheck{Reader: c}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	var started, done sync.WaitGroup
	var admitted atomic.Int64
	for i := range 100 {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			uid := "cache-1"
			if i%2 == 1 {
				uid = fmt.Sprintf("cache-x%d", i)
			}
			if tc.Admit(r, "node-a", uid) == nil {
				admitted.Add(1)
			}
		}()
	}
	started.Wait()
	// Once the first read is under way, the others join it.
	for deadline := time.Now().Add(time.Minute); gets.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no read of node-a's NodeCache within a minute")
		}
		runtime.Gosched()
	}
	close(release)
	done.Wait()
	if n := gets.Load(); n != 1 {
		t.Errorf("100 askers at once: %d reads of node-a's NodeCache; want 1", n)
	}
	if n := admitted.Load(); n != 50 {
		t.Errorf("%d of the 50 asks for cache-1 admitted", n)
	}
}

// Reads are made at most readsPerSecond (burst readBurst); past that the peer is answered 429
// without a read.
func TestTargetCheckBoundsReads(t *testing.T) {
	var objs []client.Object
	for i := range 2 * readBurst {
		objs = append(objs, askedNode(fmt.Sprintf("node-%d", i), "cache-1"))
	}
	c, gets := countedNodeCaches(nil, objs...)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tc := &TargetCheck{Reader: c, Clock: clk}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	var admitted, unchecked int
	for i := range 2 * readBurst {
		switch err := tc.Admit(r, fmt.Sprintf("node-%d", i), "cache-1"); {
		case err == nil:
			admitted++
		case errors.Is(err, peer.ErrTooManyRequests):
			unchecked++
		default:
			t.Fatalf("node-%d: %v", i, err)
		}
	}
	if admitted != readBurst || unchecked != readBurst || gets.Load() != readBurst {
		t.Errorf("%d nodes asking at once: %d admitted, %d answered 429, %d reads; want %d, %d, %d",
			2*readBurst, admitted, unchecked, gets.Load(), readBurst, readBurst, readBurst)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	admitted = 0
	for i := readBurst; i < 2*readBurst; i++ {
		if tc.Admit(r, fmt.Sprintf("node-%d", i), "cache-1") == nil {
			admitted++
		}
	}
	if admitted != readsPerSecond {
		t.Errorf("a second later: %d more admitted; want %d", admitted, readsPerSecond)
	}
}

// At most maxAskingNodes nodes' sets are kept: the least recently used is read again.
func TestTargetCheckKeepsBoundedSets(t *testing.T) {
	var objs []client.Object
	for i := range maxAskingNodes + 1 {
		objs = append(objs, askedNode(fmt.Sprintf("node-%d", i), "cache-1"))
	}
	c, gets := countedNodeCaches(nil, objs...)
	tc := &TargetCheck{Reader: c}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	_ = tc.Admit(r, "node-0", "cache-1")
	tc.reads = rate.NewLimiter(rate.Inf, 0) // this test is about the sets kept, not the rate
	for i := range maxAskingNodes + 1 {
		_ = tc.Admit(r, fmt.Sprintf("node-%d", i), "cache-1")
	}
	if n := len(tc.sets.Keys()); n != maxAskingNodes {
		t.Errorf("%d nodes' sets kept; want %d", n, maxAskingNodes)
	}
	before := gets.Load()
	_ = tc.Admit(r, fmt.Sprintf("node-%d", maxAskingNodes), "cache-1")
	if gets.Load() != before {
		t.Error("the last node asking was read again")
	}
	_ = tc.Admit(r, "node-0", "cache-1")
	if gets.Load() != before+1 {
		t.Error("the least recently used node was not read again")
	}
}
