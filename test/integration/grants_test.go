package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

// grantNodes are three nodes, named after prefix, that a standalone cache that selects
// grants-suite=<prefix> and tolerates everything would reach: an ordinary worker, a
// control-plane node, and another tenant's dedicated pool (tainted for team-b).
func grantNodes(prefix string) []string {
	return []string{prefix + "-worker", prefix + "-cp", prefix + "-pool"}
}

// upGrantNodes creates grantNodes(prefix) and returns rc with an operator configuration that
// grants namespace entitled team-b's pool (its toleration) and every other namespace the
// default: every node but the control plane's, no tolerations.
func upGrantNodes(t *testing.T, ctx context.Context, rc *reconcilers, prefix, entitled string) *reconcilers {
	t.Helper()
	nodes := grantNodes(prefix)
	for _, n := range nodes {
		upNode(t, ctx, n, "m5.grants-suite")
		labelNode(t, ctx, n, "grants-suite", prefix)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = server.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	labelNode(t, ctx, nodes[1], config.ControlPlaneLabel, "")
	taint(t, ctx, nodes[1], corev1.Taint{Key: config.ControlPlaneLabel, Effect: corev1.TaintEffectNoSchedule})
	labelNode(t, ctx, nodes[2], "pool", "team-b")
	taint(t, ctx, nodes[2], corev1.Taint{Key: "dedicated", Value: "team-b", Effect: corev1.TaintEffectNoSchedule})
	return rc.with(func(cfg *controller.Config) {
		cfg.StandaloneCacheNodes = append([]config.NodeGrant{{
			Namespaces:       []string{entitled},
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: config.ControlPlaneLabel, Operator: corev1.NodeSelectorOpDoesNotExist}},
			Tolerations:      []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "team-b", Effect: corev1.TaintEffectNoSchedule}},
		}}, config.DefaultStandaloneCacheNodes()...)
	})
}

// notGrantedNotes are what a standalone cache of namespace ns that tolerates everything says
// of grantNodes(prefix) it is not granted: the control-plane node, and (entitled false) the
// pool and its toleration.
func notGrantedNotes(prefix, ns string, entitled bool) []string {
	at := "standaloneCacheNodes[1]"
	if entitled {
		at = "standaloneCacheNodes[0]"
	}
	notes := []string{fmt.Sprintf("%s grants namespace %s's standalone caches only nodes with node-role.kubernetes.io/control-plane DoesNotExist (%s-cp)", at, ns, prefix)}
	if !entitled {
		notes = append(notes,
			fmt.Sprintf("taint dedicated=team-b:NoSchedule is tolerated only by a toleration %s does not grant namespace %s (%s-pool)", at, ns, prefix),
			"{operator: Exists} is not honoured: namespace "+ns+"'s standalone caches may use only placement.tolerations")
	}
	return notes
}

// askedAmong lists the nodes, of nodes, whose NodeCache asks for cache uid.
func askedAmong(t *testing.T, ctx context.Context, uid string, nodes []string) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		nc := &prewarmv1alpha1.NodeCache{}
		switch err := server.Client.Get(ctx, types.NamespacedName{Name: n}, nc); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			t.Fatal(err)
		}
		if slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uid && r.Refused == nil }) {
			out = append(out, n)
		}
	}
	return out
}

// A standalone ModelWeightsCacheConfig that tolerates everything is asked only of the nodes its
// namespace's grant covers: not another tenant's tainted pool, not the control plane; and it
// says which nodes are left out and which toleration is not honoured. A namespace granted the
// pool gets it.
func TestStandaloneWeightsCacheReachesOnlyGrantedNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const prefix = "grants-w"
	nodes := grantNodes(prefix)
	rc := upGrantNodes(t, ctx, newReconcilers(t, ctx, "grants-w-operator", "grants-wa", "grants-wb"), prefix, "grants-wb")
	r := &serving.ModelWeightsCacheConfigReconciler{Reconciler: rc.ep}
	for _, tc := range []struct {
		ns       string
		entitled bool
		asked    []string
	}{
		{"grants-wa", false, []string{nodes[0]}},
		{"grants-wb", true, []string{nodes[0], nodes[2]}},
	} {
		t.Run(tc.ns, func(t *testing.T) {
			mw := &inferencev1.ModelWeightsCacheConfig{}
			createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata: {name: everywhere, namespace: `+tc.ns+`}
spec:
  modelSourceConfig:
    modelSourceType: s3
    s3Storage: {bucketName: example-bucket, region: us-west-2}
    modelLocation: models/everywhere
  nodeSelector: {grants-suite: `+prefix+`}
  tolerations: [{operator: Exists}]
`, mw)
			key := client.ObjectKeyFromObject(mw)
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			cache := &inferencev1.ModelDataCacheConfig{}
			if err := server.Client.Get(ctx, types.NamespacedName{Namespace: tc.ns, Name: "everywhere-cache"}, cache); err != nil {
				t.Fatal(err)
			}
			cache = rc.cache(t, ctx, cache)
			if diff := cmp.Diff(tc.asked, askedAmong(t, ctx, string(cache.UID), nodes)); diff != "" {
				t.Errorf("nodes asked (-want +got):\n%s", diff)
			}
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			if err := server.Client.Get(ctx, key, mw); err != nil {
				t.Fatal(err)
			}
			if mw.Status.TargetNodes != int32(len(tc.asked)) {
				t.Errorf("targetNodes = %d, want %d", mw.Status.TargetNodes, len(tc.asked))
			}
			for _, want := range notGrantedNotes(prefix, tc.ns, tc.entitled) {
				if !strings.Contains(mw.Status.Message, want) {
					t.Errorf("status message %q\nwant it to say %q", mw.Status.Message, want)
				}
			}
			if tc.entitled {
				return
			}
			// A pod of the namespace itself on the pool (its own admission let it there), with
			// the cache in its volume: the node holds the cache for it, as for any cache.
			pool := nodes[2]
			if err := agent.EnsureNodeCache(ctx, server.Client, pool); err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: "on-the-pool"}, Spec: corev1.PodSpec{
				NodeName: pool, Containers: []corev1.Container{{Name: "w", Image: "x"}},
				Volumes: []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
					Driver: prewarmv1alpha1.CSIDriverName, VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: string(cache.UID)},
				}}}},
			}}
			if err := server.Client.Create(ctx, pod); err != nil {
				t.Fatal(err)
			}
			demandOn(t, ctx, pool, string(cache.UID), tc.ns)
			rc.cache(t, ctx, cache)
			if diff := cmp.Diff([]string{nodes[0], pool}, askedAmong(t, ctx, string(cache.UID), nodes)); diff != "" {
				t.Errorf("nodes asked once a pod of the namespace on the pool asks for the cache (-want +got):\n%s", diff)
			}
		})
	}
}

// A standalone ModelImageCache that tolerates everything gets an image cache whose DaemonSet
// tolerates and selects only what its namespace's grant covers, so its pods land on neither
// another tenant's tainted pool nor the control plane; it says which nodes are left out and
// which toleration is not honoured. A namespace granted the pool gets it.
func TestStandaloneImageCacheReachesOnlyGrantedNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const prefix = "grants-i"
	names := grantNodes(prefix)
	rc := upGrantNodes(t, ctx, newReconcilers(t, ctx, "grants-i-operator", "grants-ia", "grants-ib"), prefix, "grants-ib")
	r := &serving.ModelImageCacheReconciler{Reconciler: rc.ep}
	ir := &imagecache.Reconciler{Client: harness.IndexedClient(server.Client, controller.NodeIndexes...), Config: rc.cfg, Now: time.Now}
	nodes := map[string]*corev1.Node{}
	for _, name := range names {
		n := &corev1.Node{}
		if err := server.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		nodes[name] = n
	}
	for _, tc := range []struct {
		ns       string
		entitled bool
		reached  []string
	}{
		{"grants-ia", false, []string{names[0]}},
		{"grants-ib", true, []string{names[0], names[2]}},
	} {
		t.Run(tc.ns, func(t *testing.T) {
			mic := &inferencev1.ModelImageCache{}
			createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelImageCache
metadata: {name: everywhere, namespace: `+tc.ns+`}
spec:
  image: vllm/vllm-openai:v0.6.3
  nodeSelector: {grants-suite: `+prefix+`}
  tolerations: [{operator: Exists}]
`, mic)
			key := client.ObjectKeyFromObject(mic)
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			if err := server.Client.Get(ctx, key, mic); err != nil {
				t.Fatal(err)
			}
			ic := &inferencev1.InferenceImageCache{}
			if err := server.Client.Get(ctx, types.NamespacedName{Namespace: rc.cfg.OperatorNamespace, Name: mic.Status.CacheName}, ic); err != nil {
				t.Fatalf("image cache %q: %v", mic.Status.CacheName, err)
			}
			if _, err := ir.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ic)}); err != nil {
				t.Fatal(err)
			}
			ds := &appsv1.DaemonSet{}
			if err := server.Client.Get(ctx, client.ObjectKeyFromObject(ic), ds); err != nil {
				t.Fatalf("no DaemonSet: %v", err)
			}
			// Where the scheduler would put the DaemonSet's pods: the nodes its affinity selects
			// and whose taints its tolerations tolerate.
			pod := inferencev1.Placement{Tolerations: ds.Spec.Template.Spec.Tolerations}
			if a := ds.Spec.Template.Spec.Affinity; a != nil {
				pod.NodeAffinity = a.NodeAffinity
			}
			var reached []string
			for _, name := range names {
				if ok, _ := rc.cfg.Rules().Match(pod, nodes[name]); ok {
					reached = append(reached, name)
				}
			}
			if diff := cmp.Diff(tc.reached, reached); diff != "" {
				b, _ := yaml.Marshal(ds.Spec.Template.Spec.Affinity)
				t.Errorf("nodes the DaemonSet's pods may run on (-want +got):\n%s\ntolerations %+v\naffinity:\n%s", diff, ds.Spec.Template.Spec.Tolerations, b)
			}
			if err := server.Client.Get(ctx, client.ObjectKeyFromObject(ic), ic); err != nil {
				t.Fatal(err)
			}
			if ic.Status.TargetNodes != int32(len(tc.reached)) {
				t.Errorf("image cache targetNodes = %d, want %d", ic.Status.TargetNodes, len(tc.reached))
			}
			for _, want := range notGrantedNotes(prefix, tc.ns, tc.entitled) {
				if !strings.Contains(mic.Status.Message, want) {
					t.Errorf("status message %q\nwant it to say %q", mic.Status.Message, want)
				}
			}
		})
	}
}

// A namespace that no entry of standaloneCacheNodes names has its standalone caches on no node,
// and each says so, naming the setting.
func TestStandaloneCachesOfANamespaceGrantedNoNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "grants-n-operator", "grants-none").with(func(cfg *controller.Config) {
		cfg.StandaloneCacheNodes = []config.NodeGrant{{Namespaces: []string{"grants-other"}}}
	})
	upNode(t, ctx, "grants-none-node", "m5.grants-none")
	t.Cleanup(func() {
		_ = server.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "grants-none-node"}})
	})
	weights := &serving.ModelWeightsCacheConfigReconciler{Reconciler: rc.ep}
	images := &serving.ModelImageCacheReconciler{Reconciler: rc.ep}
	mw := &inferencev1.ModelWeightsCacheConfig{}
	createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata: {name: nowhere, namespace: grants-none}
spec:
  modelSourceConfig:
    modelSourceType: s3
    s3Storage: {bucketName: example-bucket, region: us-west-2}
    modelLocation: models/nowhere
  nodeSelector: {node.kubernetes.io/instance-type: m5.grants-none}
`, mw)
	mic := &inferencev1.ModelImageCache{}
	createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelImageCache
metadata: {name: nowhere, namespace: grants-none}
spec:
  image: vllm/vllm-openai:v0.6.3
  nodeSelector: {node.kubernetes.io/instance-type: m5.grants-none}
`, mic)
	if _, err := weights.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mw)}); err != nil {
		t.Fatal(err)
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := server.Client.Get(ctx, types.NamespacedName{Namespace: "grants-none", Name: "nowhere-cache"}, cache); err != nil {
		t.Fatal(err)
	}
	cache = rc.cache(t, ctx, cache)
	if got := askedAmong(t, ctx, string(cache.UID), []string{"grants-none-node"}); len(got) != 0 {
		t.Errorf("asked of %v; want no node", got)
	}
	if _, err := weights.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mw)}); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mic)}); err != nil {
		t.Fatal(err)
	}
	for _, got := range []struct {
		obj   client.Object
		state func() string
		msg   func() string
	}{
		{mw, func() string { return mw.Status.State }, func() string { return mw.Status.Message }},
		{mic, func() string { return string(mic.Status.State) }, func() string { return mic.Status.Message }},
	} {
		if err := server.Client.Get(ctx, client.ObjectKeyFromObject(got.obj), got.obj); err != nil {
			t.Fatal(err)
		}
		if got.state() != "Failed" || !strings.Contains(got.msg(), "no entry of the operator configuration's standaloneCacheNodes names namespace grants-none") {
			t.Errorf("%T: state %s, message %q; want Failed, naming standaloneCacheNodes", got.obj, got.state(), got.msg())
		}
	}
	ics := &inferencev1.InferenceImageCacheList{}
	if err := server.Client.List(ctx, ics, client.InNamespace("grants-n-operator")); err != nil || len(ics.Items) != 0 {
		t.Errorf("%d image caches (%v); want none", len(ics.Items), err)
	}
}
