package integration

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// The InferenceEndpointConfig reconciler, called directly against the real API server (with the
// weights cache reconciler), through one parent's life on one node: its finalizer, weights and
// image caches; the gate holding the Deployment back while the node downloads, then opening; a
// change of the model's location rolling the Deployment to a new cache only once that cache is
// held, and the old cache removed only once every pod runs the new template; and on deletion
// the image cache's reference released and the finalizer lifted. Whole statuses are compared at
// each step.
func TestInferenceEndpointConfigReconcile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "iec-operator", "iec")
	const itype, node = "ml.iec-suite.xlarge", "iec-node"
	upNode(t, ctx, node, itype)
	parent := builders.MakeInferenceEndpointConfig("iec", "llama").Obj()
	parent.Spec.InstanceType = itype
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(parent)
	reconcile := func() *inferencev1.InferenceEndpointConfig { t.Helper(); return rc.endpoint(t, ctx, key) }
	// The gate's message counts down to its timeout; the count is not compared.
	countdown := regexp.MustCompile(`opens at the latest in [0-9hms.]+`)
	compare := cmp.Options{
		cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime"),
		cmpopts.IgnoreFields(inferencev1.DeploymentStatus{}, "LastUpdated"),
		cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Message" },
			cmp.Transformer("countdown", func(s string) string { return countdown.ReplaceAllString(s, "opens at the latest in …") })),
	}
	wantStatus := func(step string, got *inferencev1.InferenceEndpointConfig, want inferencev1.ParentStatus) {
		t.Helper()
		if diff := cmp.Diff(want, got.Status, compare); diff != "" {
			t.Errorf("%s: status (-want +got):\n%s", step, diff)
		}
	}
	cond := func(gen int64, typ string, st metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen}
	}
	caches := func() map[string]*inferencev1.ModelDataCacheConfig {
		t.Helper()
		list := &inferencev1.ModelDataCacheConfigList{}
		if err := c.List(ctx, list, client.InNamespace("iec"), client.MatchingLabels{controller.ParentUIDLabel: string(parent.UID)}); err != nil {
			t.Fatal(err)
		}
		out := map[string]*inferencev1.ModelDataCacheConfig{}
		for i := range list.Items {
			out[list.Items[i].Spec.ModelSourceConfig.ModelLocation] = &list.Items[i]
		}
		return out
	}
	deployment := func() *appsv1.Deployment {
		t.Helper()
		dep := &appsv1.Deployment{}
		if err := c.Get(ctx, key, dep); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			t.Fatal(err)
		}
		return dep
	}
	stamp := &metav1.Time{Time: time.Now()}
	holds := func(m *inferencev1.ModelDataCacheConfig) prewarmv1alpha1.CacheStatus {
		return prewarmv1alpha1.CacheStatus{UID: string(m.UID), CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 2e9, BytesTotal: 2e9}, Revision: "v1"}
	}
	downloading := func(m *inferencev1.ModelDataCacheConfig) prewarmv1alpha1.CacheStatus {
		return prewarmv1alpha1.CacheStatus{
			UID:        string(m.UID),
			CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, Reason: prewarmv1alpha1.ReasonDownloading, BytesDone: 1e9, BytesTotal: 2e9, Message: "downloading"},
		}
	}

	// The node downloads: the gate holds the Deployment back.
	got := reconcile()
	if diff := cmp.Diff([]string{inferencev1.ParentFinalizer}, got.Finalizers); diff != "" {
		t.Errorf("finalizers (-want +got):\n%s", diff)
	}
	first := caches()["models/llama"]
	if first == nil || !metav1.IsControlledBy(first, got) {
		t.Fatalf("the parent has no weights cache of its own: %v", caches())
	}
	images := &inferencev1.InferenceImageCacheList{}
	if err := c.List(ctx, images, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil {
		t.Fatal(err)
	}
	if len(images.Items) != 1 || len(images.Items[0].Spec.ParentReferences) != 1 || images.Items[0].Spec.ParentReferences[0].UID != string(parent.UID) {
		t.Fatalf("image caches %+v; want one, referencing the parent", images.Items)
	}
	image := &images.Items[0]
	imageNamed := "image cache " + image.Namespace + "/" + image.Name + " Pending: "
	selector := controller.EndpointLabel + "=" + string(parent.UID)
	unsupported := cond(1, inferencev1.ConditionUnsupported, metav1.ConditionFalse, "FieldsWithoutEffect", "every field set has its effect")
	imagePulling := cond(1, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, "Pulling", imageNamed+"it has not reported yet")
	reportCaches(t, ctx, node, stamp, downloading(first))
	got = reconcile()
	if dep := deployment(); dep != nil {
		t.Fatalf("a Deployment while the only target node downloads: %+v", dep.Spec.Template.Annotations)
	}
	wantStatus("the node downloads", got, inferencev1.ParentStatus{
		ObservedGeneration: 1, State: inferencev1.DeploymentPending, Selector: selector,
		Conditions: []metav1.Condition{unsupported, imagePulling,
			cond(1, inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonDownloading, "weights cache llama-cache Downloading: 0 of 1 target nodes hold the cache; 1 downloading, 0 waiting, 0 failed"),
			cond(1, inferencev1.ConditionGated, metav1.ConditionTrue, inferencev1.ReasonWaitingForCache,
				"waiting for the weights cache on 1 of 1 target nodes: iec-node Downloading 50% (opens at the latest in …)"),
			cond(1, inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache, "the Deployment is created once the weights cache settles"),
			cond(1, inferencev1.ConditionCapacityAvailable, metav1.ConditionUnknown, inferencev1.ReasonDisksNotReported, "none of the 1 target nodes has reported its disk yet; the model is 2.0 GB (as the nodes listed it)"),
		},
	})

	// The node holds it: the gate opens, and the Deployment's pods read that cache.
	reportCaches(t, ctx, node, stamp, holds(first))
	got = reconcile()
	dep := deployment()
	if dep == nil {
		t.Fatalf("no Deployment once the node holds the cache; status %+v", got.Status.Conditions)
	}
	if name := dep.Spec.Template.Annotations[controller.WeightsCacheAnnotation]; name != "llama-cache" {
		t.Errorf("the pods read weights cache %q; want llama-cache", name)
	}
	weightsReady := cond(1, inferencev1.ConditionWeightsCacheReady, metav1.ConditionTrue, inferencev1.ReasonAllNodesReady, "weights cache llama-cache Ready: all 1 target nodes hold the cache (2.0 GB), verified")
	wantStatus("the node holds the cache", got, inferencev1.ParentStatus{
		ObservedGeneration: 1, State: inferencev1.DeploymentInProgress, Selector: selector,
		DeploymentStatus: &inferencev1.DeploymentStatus{Name: "llama", Status: &inferencev1.DeploymentObjectStatus{},
			DeploymentObjectOverallState: string(inferencev1.DeploymentInProgress)},
		Conditions: []metav1.Condition{unsupported, imagePulling, weightsReady,
			cond(1, inferencev1.ConditionGated, metav1.ConditionFalse, inferencev1.ReasonGateOpen, "all 1 target nodes hold the weights cache"),
			cond(1, inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonDeploymentCreated, "Deployment llama is rolling out: 0 of 1 pods updated, 0 available"),
			cond(1, inferencev1.ConditionCapacityAvailable, metav1.ConditionTrue, inferencev1.ReasonFits, "the 1 target nodes that reported their disks can hold the model (2.0 GB, as the nodes listed it)"),
		},
	})

	// The model moves: a new cache is made, and the pods stay on the old one until the node
	// holds the new one.
	got.Spec.ModelSourceConfig.ModelLocation = "models/llama-v2"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	reconcile()
	second := caches()["models/llama-v2"]
	if second == nil {
		t.Fatalf("no cache for the new location; caches %v", caches())
	}
	reportCaches(t, ctx, node, stamp, holds(first), downloading(second))
	got = reconcile()
	if name := deployment().Spec.Template.Annotations[controller.WeightsCacheAnnotation]; name != "llama-cache" {
		t.Errorf("the pods moved to %q before the node holds it; want them on llama-cache", name)
	}
	wantStatus("the new cache downloads", got, inferencev1.ParentStatus{
		ObservedGeneration: 2, State: inferencev1.DeploymentInProgress, Selector: selector,
		DeploymentStatus: &inferencev1.DeploymentStatus{Name: "llama", Status: &inferencev1.DeploymentObjectStatus{},
			DeploymentObjectOverallState: string(inferencev1.DeploymentInProgress)},
		Conditions: []metav1.Condition{
			cond(2, inferencev1.ConditionUnsupported, metav1.ConditionFalse, "FieldsWithoutEffect", "every field set has its effect"),
			cond(2, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, "Pulling", imageNamed+"it has not reported yet"),
			cond(2, inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonDownloading, "weights cache "+second.Name+" Downloading: 0 of 1 target nodes hold the cache; 1 downloading, 0 waiting, 0 failed"),
			cond(2, inferencev1.ConditionGated, metav1.ConditionTrue, inferencev1.ReasonWaitingForCache,
				"the pods stay on cache llama-cache until "+second.Name+" settles: waiting for the weights cache on 1 of 1 target nodes: iec-node Downloading 50% (opens at the latest in …)"),
			cond(2, inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonDeploymentCreated, "Deployment llama is rolling out: 0 of 1 pods updated, 0 available"),
			cond(2, inferencev1.ConditionCapacityAvailable, metav1.ConditionUnknown, inferencev1.ReasonDisksNotReported, "none of the 1 target nodes has reported its disk yet; the model is 2.0 GB (as the nodes listed it)"),
		},
	})

	// The node holds the new cache: the Deployment rolls to it; the old cache stays while any
	// pod may still read it, and goes once every pod runs the new template.
	reportCaches(t, ctx, node, stamp, holds(first), holds(second))
	reconcile()
	dep = deployment()
	if name := dep.Spec.Template.Annotations[controller.WeightsCacheAnnotation]; name != second.Name {
		t.Errorf("the pods read %q once the node holds the new cache; want %s", name, second.Name)
	}
	if old := caches()["models/llama"]; old == nil || !old.DeletionTimestamp.IsZero() {
		t.Error("the old cache was deleted before every pod ran the new template")
	}
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := c.Status().Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	if old := caches()["models/llama"]; old != nil && old.DeletionTimestamp.IsZero() {
		t.Errorf("the old cache remains once every pod runs the new template")
	}
	wantStatus("rolled to the new cache", got, inferencev1.ParentStatus{
		ObservedGeneration: 2, State: inferencev1.DeploymentComplete, Replicas: 1, Selector: selector,
		DeploymentStatus: &inferencev1.DeploymentStatus{Name: "llama", DeploymentObjectOverallState: string(inferencev1.DeploymentComplete),
			Status: &inferencev1.DeploymentObjectStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}},
		Conditions: []metav1.Condition{
			cond(2, inferencev1.ConditionUnsupported, metav1.ConditionFalse, "FieldsWithoutEffect", "every field set has its effect"),
			cond(2, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, "Pulling", imageNamed+"it has not reported yet"),
			cond(2, inferencev1.ConditionWeightsCacheReady, metav1.ConditionTrue, inferencev1.ReasonAllNodesReady, "weights cache "+second.Name+" Ready: all 1 target nodes hold the cache (2.0 GB), verified"),
			cond(2, inferencev1.ConditionGated, metav1.ConditionFalse, inferencev1.ReasonGateOpen, "all 1 target nodes hold the weights cache"),
			cond(2, inferencev1.ConditionReady, metav1.ConditionTrue, inferencev1.ReasonDeploymentCreated, "Deployment llama has 1 of 1 pods available"),
			cond(2, inferencev1.ConditionCapacityAvailable, metav1.ConditionTrue, inferencev1.ReasonFits, "the 1 target nodes that reported their disks can hold the model (2.0 GB, as the nodes listed it)"),
		},
	})

	// Nothing changed: reconciling again, a minute later, writes nothing (lastUpdated moves only
	// with the rest).
	before := got.ResourceVersion
	rc.ep.Now = func() time.Time { return time.Now().Add(time.Minute) }
	if got = reconcile(); got.ResourceVersion != before {
		t.Errorf("a reconcile with nothing changed wrote the parent (resourceVersion %s, then %s)", before, got.ResourceVersion)
	}

	// Deleted: the image cache is let go of, and the parent goes (its Deployment and caches are
	// the garbage collector's, through their owner references).
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.ep.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, got); !apierrors.IsNotFound(err) {
		t.Errorf("the deleted parent remains: finalizers %v, %v", got.Finalizers, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(image), image); err != nil {
		t.Fatal(err)
	}
	if len(image.Spec.ParentReferences) != 0 {
		t.Errorf("the image cache still references %+v", image.Spec.ParentReferences)
	}
}

// A Deployment that has not rolled out within maxDeployTimeInSeconds is reported failed, as
// HyperPod reports it; until then the parent is requeued for the deadline.
func TestDeploymentDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "deadline-operator", "deadline")
	parent := builders.MakeInferenceEndpointConfig("deadline", "slow").Obj()
	parent.Spec.InstanceType = "ml.deadline-suite.xlarge" // no node: the gate opens at once
	parent.Spec.MaxDeployTimeInSeconds = ptr.To[int32](600)
	parent.Spec.ModelCacheConfig = nil
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(parent)
	start := time.Now()
	rc.ep.Now = func() time.Time { return start }
	got := rc.endpoint(t, ctx, key)
	if got.Status.State != inferencev1.DeploymentInProgress {
		t.Fatalf("state %s; want DeploymentInProgress while the Deployment rolls out", got.Status.State)
	}
	res, err := rc.ep.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > 10*time.Minute {
		t.Errorf("requeued after %s; want at most the 10m left before the deadline", res.RequeueAfter)
	}
	rc.ep.Now = func() time.Time { return start.Add(11 * time.Minute) }
	got = rc.endpoint(t, ctx, key)
	ready := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
	if got.Status.State != inferencev1.DeploymentFailed || ready == nil || ready.Reason != inferencev1.ReasonDeploymentTimeout ||
		!strings.Contains(ready.Message, "has not rolled out within maxDeployTimeInSeconds (10m0s") {
		t.Errorf("past the deadline: state %s, Ready %+v; want DeploymentFailed, DeploymentTimeout", got.Status.State, ready)
	}
	if d := got.Status.DeploymentStatus; d == nil || d.DeploymentObjectOverallState != string(inferencev1.DeploymentFailed) {
		t.Errorf("deploymentStatus %+v; want the overall state DeploymentFailed", d)
	}
}
