package integration

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

// The image cache reconciler, called directly against the real API server: it holds its
// finalizer and a DaemonSet pinning the image while a live parent references it; a reference to
// a parent that is gone (or recreated with another UID) does not keep it; the whole status before
// the DaemonSet's pod and once it runs, and the node's label; with no reference left it deletes
// itself, and its finalization removes the DaemonSet, the node label and the finalizer.
func TestImageCacheLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "images-operator", "images")
	r := &imagecache.Reconciler{Client: harness.IndexedClient(c, controller.NodeIndexes...), Config: rc.cfg, Now: time.Now}
	upNode(t, ctx, "images-node", "ml.ic-suite.xlarge")

	parent := builders.MakeInferenceEndpointConfig("images", "served").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	ic := builders.MakeInferenceImageCache(rc.cfg.OperatorNamespace, "iic-images")
	ic.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.ic-suite.xlarge"}}
	ic.Spec.ParentReferences = []inferencev1.ParentReference{
		{Kind: "InferenceEndpointConfig", Namespace: "images", Name: "served", UID: string(parent.UID)},
		{Kind: "InferenceEndpointConfig", Namespace: "images", Name: "gone", UID: "00000000-0000-4000-8000-00000000000a"},
	}
	if err := c.Create(ctx, ic); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(ic)
	reconcile := func() {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	reconcile()
	if err := c.Get(ctx, key, ic); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{inferencev1.CacheFinalizer}, ic.Finalizers); diff != "" {
		t.Errorf("finalizers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]inferencev1.ParentReference{{Kind: "InferenceEndpointConfig", Namespace: "images", Name: "served", UID: string(parent.UID)}},
		ic.Spec.ParentReferences); diff != "" {
		t.Errorf("references: only the live parent's stay (-want +got):\n%s", diff)
	}
	ignoreConditionTime := cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")
	// (The released reference was a change of the spec: generation 2.)
	if diff := cmp.Diff(inferencev1.InferenceImageCacheStatus{
		ObservedGeneration: 2, Phase: inferencev1.ImagePending, TargetNodes: 1,
		Nodes: []inferencev1.NodeImageStatus{{Name: "images-node", Phase: inferencev1.ImagePending, Reason: "NoPod", Message: "the DaemonSet has not placed a pod on this node yet"}},
		Conditions: []metav1.Condition{{Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: 2,
			Reason: inferencev1.ReasonPulling, Message: "waiting for the DaemonSet's pods"}},
	}, ic.Status, ignoreConditionTime); diff != "" {
		t.Errorf("status before any pod (-want +got):\n%s", diff)
	}
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, key, ds); err != nil {
		t.Fatalf("no DaemonSet pinning the image: %v", err)
	}
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != ic.Spec.Image {
		t.Errorf("the DaemonSet pulls %s, want %s", got, ic.Spec.Image)
	}

	// The DaemonSet's pod runs on the node (as the DaemonSet controller and the kubelet would
	// have it): the image is there, and the node is labelled.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ds.Namespace, Name: ds.Name + "-x7k2p", Labels: ds.Spec.Template.Labels},
		Spec: *ds.Spec.Template.Spec.DeepCopy()}
	pod.Spec.NodeName = "images-node"
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:6f1c63ba2ab1e5e34ab7b2e1e4d9c7a0e6d1e0b7f7c1f5f4e3d2c1b0a9f8e7d6"
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: imagecache.ImageContainerName, Image: ic.Spec.Image,
		ImageID: "docker.io/vllm/vllm-openai@" + digest, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	reconcile()
	if err := c.Get(ctx, key, ic); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inferencev1.InferenceImageCacheStatus{
		ObservedGeneration: 2, Phase: inferencev1.ImageComplete, TargetNodes: 1, CachedNodes: 1, ImageDigest: digest,
		Nodes: []inferencev1.NodeImageStatus{{Name: "images-node", Phase: inferencev1.ImageComplete, Reason: "Pulled", Message: "the image is on the node and pinned by a running container"}},
		Conditions: []metav1.Condition{{Type: inferencev1.ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: 2,
			Reason: inferencev1.ReasonAllNodesReady, Message: "all 1 target nodes hold " + ic.Spec.Image}},
	}, ic.Status, ignoreConditionTime); diff != "" {
		t.Errorf("status once the pod runs (-want +got):\n%s", diff)
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: "images-node"}, node); err != nil {
		t.Fatal(err)
	}
	if node.Labels[inferencev1.ImageCacheReadyLabel(string(ic.UID))] != inferencev1.LabelTrue {
		t.Errorf("the node holding the image is not labelled: %v", node.Labels)
	}

	// The parent goes.
	if err := c.Delete(ctx, parent); err != nil {
		t.Fatal(err)
	}
	reconcile() // no reference left: the cache deletes itself
	reconcile() // finalization
	if err := c.Get(ctx, key, ic); !apierrors.IsNotFound(err) {
		t.Errorf("the image cache of no parent remains: %+v, %v", ic.ObjectMeta, err)
	}
	if err := c.Get(ctx, key, ds); err == nil && ds.DeletionTimestamp.IsZero() {
		t.Error("its DaemonSet remains")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "images-node"}, node); err != nil {
		t.Fatal(err)
	}
	for k := range node.Labels {
		if k == inferencev1.ImageCacheReadyLabel(string(ic.UID)) {
			t.Errorf("the node keeps the image cache's label %s", k)
		}
	}
}

// An InferenceImageCache written outside the operator namespace (where prewarm's Role lets it
// keep DaemonSets) gets no DaemonSet and no finalizer, even with a live parent: its status says
// Failed, naming the operator namespace and what to write instead, and stays as it is.
func TestImageCacheOutsideTheOperatorNamespaceIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "refused-operator", "refused-team")
	r := &imagecache.Reconciler{Client: harness.IndexedClient(c, controller.NodeIndexes...), Config: rc.cfg, Now: time.Now}
	upNode(t, ctx, "refused-node", "ml.ic-refused.xlarge")

	parent := builders.MakeInferenceEndpointConfig("refused-team", "served").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	ic := builders.MakeInferenceImageCache("refused-team", "iic-own")
	ic.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.ic-refused.xlarge"}}
	ic.Spec.ParentReferences = []inferencev1.ParentReference{{Kind: "InferenceEndpointConfig", Namespace: "refused-team", Name: "served", UID: string(parent.UID)}}
	if err := c.Create(ctx, ic); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(ic)
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if err := c.Get(ctx, key, ic); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inferencev1.InferenceImageCacheStatus{
		ObservedGeneration: 1, Phase: inferencev1.ImageFailed,
		Conditions: []metav1.Condition{{Type: inferencev1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: 1,
			Reason: imagecache.ReasonNotInOperatorNamespace,
			Message: "prewarm keeps InferenceImageCaches in its operator namespace refused-operator only, and pulls nothing for one in refused-team: " +
				"to pin an image for this namespace's pods, write a ModelImageCache here instead"}},
	}, ic.Status, cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	if len(ic.Finalizers) > 0 {
		t.Errorf("finalizers %v; want none", ic.Finalizers)
	}
	dss := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dss, client.InNamespace("refused-team")); err != nil {
		t.Fatal(err)
	}
	if len(dss.Items) > 0 {
		t.Errorf("DaemonSet %s/%s made for an image cache outside the operator namespace", dss.Items[0].Namespace, dss.Items[0].Name)
	}
	// Reconciled again, a second later, it is not written again (its condition keeps its time).
	rv := ic.ResourceVersion
	written := ic.Status.Conditions[0].LastTransitionTime.Time
	if err := testutil.Eventually(ctx, 5*time.Second, func() (bool, error) { return time.Now().Truncate(time.Second).After(written), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if err := c.Get(ctx, key, ic); err != nil {
		t.Fatal(err)
	}
	if ic.ResourceVersion != rv {
		t.Errorf("a second reconcile wrote the refused image cache again (resourceVersion %s, then %s)", rv, ic.ResourceVersion)
	}
}
