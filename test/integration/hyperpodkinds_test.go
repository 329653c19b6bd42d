package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/catalog"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/controller/registration"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

// createYAML creates the object a manifest describes, as `kubectl create -f` would, into obj.
func createYAML(t *testing.T, ctx context.Context, manifest string, obj client.Object) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(manifest), obj); err != nil {
		t.Fatal(err)
	}
	if err := server.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
}

// A ModelWeightsCacheConfig written as HyperPod's docs write one, with no endpoint: it gets a
// ModelDataCacheConfig of its namespace that is asked of exactly the nodes it selects (a tainted
// GPU pool, reached through its toleration), its status follows that cache's under HyperPod's
// field names, and its deletion takes the cache off every node before it goes.
func TestStandaloneModelWeightsCacheConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "mwcc-operator", "mwcc")
	r := &serving.ModelWeightsCacheConfigReconciler{Reconciler: rc.ep}
	upNode(t, ctx, "mwcc-gpu", "g5.mwcc-suite")
	upNode(t, ctx, "mwcc-cpu", "m5.mwcc-suite")
	labelNode(t, ctx, "mwcc-gpu", "pool", "mwcc-gpu")
	labelNode(t, ctx, "mwcc-cpu", "pool", "mwcc-cpu")
	taint(t, ctx, "mwcc-gpu", corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	t.Cleanup(func() {
		for _, n := range []string{"mwcc-gpu", "mwcc-cpu"} {
			_ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})

	mw := &inferencev1.ModelWeightsCacheConfig{}
	createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata:
  name: llama-warm
  namespace: mwcc
spec:
  modelSourceConfig:
    modelSourceType: s3
    s3Storage:
      bucketName: example-bucket
      region: us-west-2
    modelLocation: models/llama
  nodeSelector:
    pool: mwcc-gpu
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
`, mw)
	if !ptr.Deref(mw.Spec.Enabled, false) || mw.Spec.HostPath != "/opt/dlami/nvme" {
		t.Errorf("defaults: enabled %v, hostPath %q; want true and HyperPod's /opt/dlami/nvme", mw.Spec.Enabled, mw.Spec.HostPath)
	}
	key := client.ObjectKeyFromObject(mw)
	reconcile := func() *inferencev1.ModelWeightsCacheConfig {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		got := &inferencev1.ModelWeightsCacheConfig{}
		if err := c.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := reconcile(); !slices.Contains(got.Finalizers, inferencev1.ParentFinalizer) {
		t.Errorf("finalizers %v: the object must outlive its cache on the nodes", got.Finalizers)
	}

	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "mwcc", Name: "llama-warm-cache"}, cache); err != nil {
		t.Fatalf("no ModelDataCacheConfig llama-warm-cache: %v", err)
	}
	if diff := cmp.Diff(inferencev1.ParentReference{Kind: "ModelWeightsCacheConfig", Namespace: "mwcc", Name: "llama-warm", UID: string(mw.UID)},
		cache.Spec.ParentReference); diff != "" {
		t.Errorf("cache's parent (-want +got):\n%s", diff)
	}
	if owner := metav1.GetControllerOf(cache); owner == nil || owner.UID != mw.UID {
		t.Errorf("cache's controller = %v, want the ModelWeightsCacheConfig", owner)
	}
	if cache.Spec.HostPath != "/opt/dlami/nvme" || cache.Spec.ModelSourceConfig.S3Storage == nil || cache.Spec.ModelSourceConfig.ModelLocation != "models/llama" {
		t.Errorf("cache spec = %+v", cache.Spec)
	}

	// The cache is asked of the selected (tainted, tolerated) node only.
	rc.cache(t, ctx, cache)
	if diff := cmp.Diff([]string{"mwcc-gpu"}, askedOf(t, ctx, string(cache.UID), []string{"mwcc-gpu"})); diff != "" {
		t.Errorf("nodes asked (-want +got):\n%s", diff)
	}
	cpu := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(ctx, types.NamespacedName{Name: "mwcc-cpu"}, cpu); client.IgnoreNotFound(err) != nil || len(cpu.Spec.Caches) > 0 {
		t.Errorf("the node the selector leaves out was asked: %v %+v", err, cpu.Spec.Caches)
	}
	got := reconcile()
	if got.Status.State != "Pending" || got.Status.TargetNodes != 1 || got.Status.ReadyNodes != 0 || got.Status.CacheName != "llama-warm-cache" {
		t.Errorf("status before any node holds it = %+v", got.Status)
	}

	// The node's agent reports the cache Ready: so is the ModelWeightsCacheConfig.
	stamp := &metav1.Time{Time: time.Now()}
	reportCaches(t, ctx, "mwcc-gpu", stamp, prewarmv1alpha1.CacheStatus{UID: string(cache.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 10, BytesTotal: 10}})
	rc.cache(t, ctx, cache)
	got = reconcile()
	want := inferencev1.ModelWeightsCacheConfigStatus{State: "Ready", TargetNodes: 1, ReadyNodes: 1, ObservedGeneration: got.Generation,
		CacheName: "llama-warm-cache", Message: "all 1 target nodes hold the cache (10 B), verified"}
	if diff := cmp.Diff(want, got.Status, cmpopts.IgnoreFields(inferencev1.ModelWeightsCacheConfigStatus{}, "Conditions")); diff != "" {
		t.Errorf("status once the node holds it (-want +got):\n%s", diff)
	}
	ready := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != got.Generation {
		t.Errorf("Ready condition = %+v, want True observed at generation %d (kubectl wait --for=condition=Ready reads it)", ready, got.Generation)
	}

	// Deleted: the cache goes first (its nodes let it go), then the object.
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	if got.Status.State != "Deleting" {
		t.Errorf("state while the cache goes = %q, want Deleting", got.Status.State)
	}
	rc.cache(t, ctx, cache) // the cache's finalization (no node holds it any more once asked)
	for range 10 {
		reportCaches(t, ctx, "mwcc-gpu", stamp)
		if _, err := rc.wc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cache)}); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(cache), cache); apierrors.IsNotFound(err) {
			break
		}
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, got); !apierrors.IsNotFound(err) {
		t.Errorf("the ModelWeightsCacheConfig is still there once its cache is gone: %v (finalizers %v)", err, got.Finalizers)
	}
}

// A standalone ModelWeightsCacheConfig that cannot work says why in its status: a gated JumpStart
// model without acceptEula, a node directory the cluster admin does not allow.
func TestStandaloneModelWeightsCacheConfigProblems(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "mwccp-operator", "mwccp")
	rec := events.NewFakeRecorder(100)
	rc.ep.Recorder = rec
	r := &serving.ModelWeightsCacheConfigReconciler{Reconciler: rc.ep}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "mwccp-operator", Name: catalog.DefaultConfigMap}, Data: map[string]string{catalog.Key: `
models:
  - modelId: gated-model
    version: 1.0.0
    gated: true
    image: vllm/vllm-openai:v0.6.3
    source: {modelSourceType: s3, s3Storage: {bucketName: example-bucket, region: us-west-2}, modelLocation: models/gated}
`}}
	if err := server.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, spec, reason, says string }{
		{"not-allowed", `
  hostPath: /etc
  modelSourceConfig:
    modelSourceType: s3
    s3Storage: {bucketName: example-bucket, region: us-west-2}`, inferencev1.ReasonHostPathNotAllowed, "/etc"},
		{"not-in-catalog", `
  modelSourceConfig:
    modelSourceType: s3
  jumpStartModel:
    modelId: no-such-model
    acceptEula: true`, inferencev1.ReasonModelNotInCatalog, "no-such-model"},
		{"gated", `
  modelSourceConfig:
    modelSourceType: s3
  jumpStartModel:
    modelId: gated-model`, inferencev1.ReasonEULANotAccepted, "spec.jumpStartModel.acceptEula: true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := &inferencev1.ModelWeightsCacheConfig{}
			createYAML(t, ctx, "apiVersion: inference.sagemaker.aws.amazon.com/v1\nkind: ModelWeightsCacheConfig\nmetadata: {name: "+tc.name+", namespace: mwccp}\nspec:"+tc.spec, mw)
			// The problem is told once, as a parent's is: a Warning event, not again while it
			// stays.
			var told []string
			for range 2 {
				if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mw)}); err != nil {
					t.Fatal(err)
				}
				for len(rec.Events) > 0 {
					told = append(told, <-rec.Events)
				}
			}
			if len(told) != 1 || !strings.HasPrefix(told[0], "Warning "+tc.reason+" ") {
				t.Errorf("events %q; want one Warning %s", told, tc.reason)
			}
			if err := server.Client.Get(ctx, client.ObjectKeyFromObject(mw), mw); err != nil {
				t.Fatal(err)
			}
			ready := apimeta.FindStatusCondition(mw.Status.Conditions, inferencev1.ConditionReady)
			if mw.Status.State != "Failed" || ready == nil || ready.Reason != tc.reason || !strings.Contains(mw.Status.Message, tc.says) {
				t.Errorf("status = %+v; want Failed, reason %s, a message naming %q", mw.Status, tc.reason, tc.says)
			}
			caches := &inferencev1.ModelDataCacheConfigList{}
			if err := server.Client.List(ctx, caches, client.InNamespace("mwccp")); err != nil || len(caches.Items) != 0 {
				t.Errorf("%d caches made (%v), want none", len(caches.Items), err)
			}
		})
	}
}

// A parent's weights cache and image cache are visible under HyperPod's kind names: a view of
// the same name, owned by the cache, whose spec says what the cache holds (an edit is put back)
// and whose status is the cache's.
func TestParentsCachesHaveHyperPodViews(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "views-operator", "views")
	weights := &serving.ModelWeightsCacheConfigReconciler{Reconciler: rc.ep}
	images := &serving.ModelImageCacheReconciler{Reconciler: rc.ep}
	parent := builders.MakeInferenceEndpointConfig("views", "served").Obj()
	parent.Spec.InstanceType = "ml.views-suite.xlarge"
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	rc.endpoint(t, ctx, client.ObjectKeyFromObject(parent))
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "views", Name: "served-cache"}, cache); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(cache)
	for range 2 {
		if _, err := weights.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
	}
	view := &inferencev1.ModelWeightsCacheConfig{}
	if err := c.Get(ctx, key, view); err != nil {
		t.Fatalf("no ModelWeightsCacheConfig view of %s: %v", key, err)
	}
	if owner := metav1.GetControllerOf(view); owner == nil || owner.UID != cache.UID {
		t.Errorf("view's controller = %v, want the ModelDataCacheConfig", owner)
	}
	if diff := cmp.Diff(map[string]string{"node.kubernetes.io/instance-type": "ml.views-suite.xlarge"}, view.Spec.NodeSelector); diff != "" {
		t.Errorf("view's nodeSelector (-want +got):\n%s", diff)
	}
	if view.Spec.HostPath != cache.Spec.HostPath || view.Spec.ModelSourceConfig.ModelLocation != "models/served" {
		t.Errorf("view spec = %+v", view.Spec)
	}
	if view.Status.State != string(cache.Status.State) || view.Status.TargetNodes != cache.Status.TargetNodes || view.Status.CacheName != "served-cache" {
		t.Errorf("view status = %+v, want the cache's (%+v)", view.Status, cache.Status)
	}
	view.Spec.HostPath = "/mnt/elsewhere"
	if err := c.Update(ctx, view); err != nil {
		t.Fatal(err)
	}
	if _, err := weights.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, view); err != nil {
		t.Fatal(err)
	}
	if view.Spec.HostPath != cache.Spec.HostPath {
		t.Errorf("an edited view keeps hostPath %q; want it put back to the cache's %q", view.Spec.HostPath, cache.Spec.HostPath)
	}

	// The image cache's view, in the operator namespace.
	ics := &inferencev1.InferenceImageCacheList{}
	if err := c.List(ctx, ics, client.InNamespace("views-operator")); err != nil || len(ics.Items) != 1 {
		t.Fatalf("%d image caches (%v), want 1", len(ics.Items), err)
	}
	ic := &ics.Items[0]
	if _, err := images.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ic)}); err != nil {
		t.Fatal(err)
	}
	mic := &inferencev1.ModelImageCache{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ic), mic); err != nil {
		t.Fatalf("no ModelImageCache view of %s: %v", ic.Name, err)
	}
	if diff := cmp.Diff([]inferencev1.ImageCacheParentReference{{Kind: "InferenceEndpointConfig", Namespace: "views", Name: "served", UID: string(parent.UID)}},
		mic.Spec.ParentReferences); diff != "" {
		t.Errorf("view's parentReferences (-want +got):\n%s", diff)
	}
	if mic.Spec.Image != parent.Spec.Worker.Image || mic.Status.CacheName != ic.Name {
		t.Errorf("image view = %+v", mic)
	}
}

// A ModelImageCache written as HyperPod's docs write one becomes a parent of the shared image
// cache of its image on its nodes, reports that cache's state under HyperPod's names, and lets
// it go when deleted.
func TestStandaloneModelImageCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "mic-operator", "mic")
	r := &serving.ModelImageCacheReconciler{Reconciler: rc.ep}
	ir := &imagecache.Reconciler{Client: harness.IndexedClient(c, controller.NodeIndexes...), Config: rc.cfg, Now: time.Now}
	upNode(t, ctx, "mic-node", "ml.mic-suite.xlarge")
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mic-node"}})
	})

	mic := &inferencev1.ModelImageCache{}
	createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelImageCache
metadata:
  name: vllm-image
  namespace: mic
spec:
  image: vllm/vllm-openai:v0.6.3
  nodeSelector:
    node.kubernetes.io/instance-type: ml.mic-suite.xlarge
`, mic)
	key := client.ObjectKeyFromObject(mic)
	for range 2 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
	}
	// The cache's placement is the ModelImageCache's within what the operator configuration
	// grants the namespace's standalone caches (by default, every node but the control plane's).
	bounded := rc.cfg.Grant("mic").Bound(inferencev1.Placement{InstanceTypes: []string{"ml.mic-suite.xlarge"}})
	name := serving.ImageCacheName("vllm/vllm-openai:v0.6.3", bounded.Placement, "")
	ic := &inferencev1.InferenceImageCache{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "mic-operator", Name: name}, ic); err != nil {
		t.Fatalf("no image cache %s: %v", name, err)
	}
	if diff := cmp.Diff([]inferencev1.ParentReference{{Kind: "ModelImageCache", Namespace: "mic", Name: "vllm-image", UID: string(mic.UID)}}, ic.Spec.ParentReferences); diff != "" {
		t.Errorf("image cache's parents (-want +got):\n%s", diff)
	}
	if _, err := ir.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ic)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ic), ic); err != nil || len(ic.Spec.ParentReferences) != 1 {
		t.Fatalf("the image cache let its live ModelImageCache parent go: %v %+v", err, ic.Spec.ParentReferences)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, mic); err != nil {
		t.Fatal(err)
	}
	if mic.Status.State != inferencev1.ModelImagePending || mic.Status.TargetNodes != 1 || mic.Status.CacheName != name || mic.Status.LastTransitionTime == nil {
		t.Errorf("status = %+v; want Pending on 1 target node, naming %s", mic.Status, name)
	}
	// No view of a cache only ModelImageCaches use: they are their own view.
	if err := c.Get(ctx, types.NamespacedName{Namespace: "mic-operator", Name: name}, &inferencev1.ModelImageCache{}); !apierrors.IsNotFound(err) {
		t.Errorf("a view was written of a cache only a ModelImageCache uses: %v", err)
	}

	if err := c.Delete(ctx, mic); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, mic); !apierrors.IsNotFound(err) {
		t.Errorf("the ModelImageCache is still there: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ic), ic); client.IgnoreNotFound(err) != nil || len(ic.Spec.ParentReferences) != 0 {
		t.Errorf("the image cache still names the deleted ModelImageCache: %v %+v", err, ic.Spec.ParentReferences)
	}
}

// A SageMakerEndpointRegistration is accepted with HyperPod's schema and says that registering
// with SageMaker is not available here.
func TestSageMakerEndpointRegistrationSaysItIsNotAvailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reg := &inferencev1.SageMakerEndpointRegistration{}
	createYAML(t, ctx, `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: SageMakerEndpointRegistration
metadata: {name: llama-endpoint, namespace: default}
spec:
  name: llama-endpoint
  executionRole: arn:aws:iam::123456789012:role/HyperPodInference
  imageUri: 123456789012.dkr.ecr.us-west-2.amazonaws.com/sagemaker-hyperpod-inference:latest
  instanceType: ml.g5.24xlarge
  loadBalancerHostName: internal-k8s-llama.us-west-2.elb.amazonaws.com
  restApiId: a1b2c3d4e5
  eksClusterDetails: {arn: "arn:aws:eks:us-west-2:123456789012:cluster/hp", name: hp, clusterSecurityGroupId: sg-1, securityGroupIds: [sg-2], subnetIds: [subnet-1], vpcId: vpc-1}
  tlsConfig: {tlsCertificateOutputS3Bucket: b, tlsCertificateS3Keys: [k]}
`, reg)
	t.Cleanup(func() { _ = server.Client.Delete(context.Background(), reg) })
	r := &registration.Reconciler{Client: server.Client}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(reg)}); err != nil {
		t.Fatal(err)
	}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(reg), reg); err != nil {
		t.Fatal(err)
	}
	cond := apimeta.FindStatusCondition(reg.Status.Conditions, inferencev1.ConditionRegistered)
	if reg.Status.State != inferencev1.RegistrationCreationFailed || cond == nil || cond.Status != metav1.ConditionFalse ||
		cond.Reason != inferencev1.ReasonNotAvailableOffSageMaker || reg.Spec.InvocationEndpoint != "invocations" {
		t.Errorf("registration = spec %+v status %+v", reg.Spec, reg.Status)
	}
}
