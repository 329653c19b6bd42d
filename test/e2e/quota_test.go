package e2e

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/pkg/engine"
)

// A namespace whose quota lets it hold one and a half models per node gets its first cache on
// every node, and its second on none: each node's agent keeps it off (BudgetExceeded), which
// the second cache and its parent say with the figures, and no node holds more of the
// namespace's caches than its limit at any moment. Another namespace's cache on the same nodes
// is Ready everywhere. The controller and the agents are the real binaries; S3 is real.
func TestNamespaceOverItsQuotaFillsNoNode(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	limit := resource.MustParse(fmt.Sprint(total * 3 / 2))
	e.configure = func(op *config.OperatorConfiguration) {
		op.NamespaceQuotas = []config.NamespaceQuota{{Namespaces: []string{"team-a"}, MaxBytesPerNode: &limit}}
	}
	nodes := []string{"quota-1", "quota-2"}
	for _, n := range nodes {
		e.addNode(n, "ml.g6e.12xlarge", s3srv.Endpoint)
	}
	e.startController("--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false", "--metrics-bind-address=0",
		"--health-probe-bind-address=0", "--config="+e.config(s3srv.Endpoint), "--gate-timeout=3m", "--agent-image=prewarm/agent:e2e")
	for _, ns := range []string{"team-a", "team-b"} {
		if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// What team-a's caches take on each node's disk, sampled throughout.
	var over atomic.Value
	stop := make(chan struct{})
	sampled := make(chan struct{})
	var uids atomic.Value // team-a's cache UIDs
	uids.Store([]string{})
	go func() {
		defer close(sampled)
		for {
			for _, n := range nodes {
				var held int64
				for _, uid := range uids.Load().([]string) {
					held += treeBytes(filepath.Join(e.nodeRoot(n), prewarmv1alpha1.Directory, uid))
				}
				if held > limit.Value() && over.Load() == nil {
					over.Store(fmt.Sprintf("node %s held %d bytes of team-a's caches, past its %d", n, held, limit.Value()))
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	parent := func(ns, name string) {
		t.Helper()
		p := builders.MakeInferenceEndpointConfig(ns, name).Location(prefix).InstanceType("ml.g6e.12xlarge").Obj()
		p.Spec.ModelCacheConfig.ImageCache = nil
		if err := e.c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	addUID := func(m *inferencev1.ModelDataCacheConfig) {
		uids.Store(append(uids.Load().([]string), string(m.UID)))
	}
	parent("team-a", "first")
	first := &inferencev1.ModelDataCacheConfig{}
	e.eventually(time.Minute, "team-a's first cache made", func() (bool, string) {
		err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "first-cache"}, first)
		return err == nil, fmt.Sprint(err)
	})
	addUID(first)
	first = e.waitCacheIn("team-a", "first-cache", 2)

	parent("team-a", "second")
	second := &inferencev1.ModelDataCacheConfig{}
	e.eventually(time.Minute, "team-a's second cache made", func() (bool, string) {
		err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "second-cache"}, second)
		return err == nil, fmt.Sprint(err)
	})
	addUID(second)
	parent("team-b", "first")
	e.eventually(2*time.Minute, "team-a's second cache BudgetExceeded on both nodes", func() (bool, string) {
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "second-cache"}, second); err != nil {
			return false, err.Error()
		}
		c := condition(second.Status.Conditions, inferencev1.ConditionWithinBudget)
		return second.Status.State == inferencev1.CacheFailed && c.Reason == inferencev1.ReasonBudgetExceeded &&
			strings.Contains(c.Message, "2 node(s) keep this cache off for it"), fmt.Sprintf("%s %+v", second.Status.State, second.Status.Conditions)
	})
	within := condition(second.Status.Conditions, inferencev1.ConditionWithinBudget)
	if want := fmt.Sprintf("namespace team-a may hold %s of caches on a node (namespaceQuotas[0].maxBytesPerNode)", engine.HumanBytes(limit.Value())); !strings.Contains(within.Message, want) {
		t.Errorf("WithinBudget says %q; want %q in it", within.Message, want)
	}
	for _, ns := range second.Status.Nodes {
		if ns.Reason != prewarmv1alpha1.ReasonBudgetExceeded || !strings.Contains(ns.Message, "its other caches and copies here hold") {
			t.Errorf("node %s: %s %s; want BudgetExceeded from its agent, with the figures", ns.Name, ns.Reason, ns.Message)
		}
	}
	e.eventually(time.Minute, "team-a/second's parent says BudgetExceeded", func() (bool, string) {
		p := &inferencev1.InferenceEndpointConfig{}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "second"}, p); err != nil {
			return false, err.Error()
		}
		c := condition(p.Status.Conditions, inferencev1.ConditionWithinBudget)
		return c.Reason == inferencev1.ReasonBudgetExceeded, fmt.Sprintf("%+v", p.Status.Conditions)
	})
	other := e.waitCacheIn("team-b", "first-cache", 2)
	for _, n := range nodes {
		assertTree(t, e.cacheDir(n, string(first.UID)), model)
		assertTree(t, e.cacheDir(n, string(other.UID)), model)
		if b := treeBytes(filepath.Join(e.nodeRoot(n), prewarmv1alpha1.Directory, string(second.UID))); b > 0 {
			t.Errorf("node %s holds %d bytes of the cache its namespace's quota keeps off", n, b)
		}
	}
	if c := condition(other.Status.Conditions, inferencev1.ConditionWithinBudget); c.Type != "" {
		t.Errorf("team-b has no quota, yet its cache says %+v", c)
	}
	close(stop)
	<-sampled
	if v := over.Load(); v != nil {
		t.Error(v)
	}
}

// treeBytes is the size of the files under dir (0 when it is not there).
func treeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
