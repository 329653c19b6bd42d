package integration

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// tokenSecretRef.optional, as HyperPod has it: a token Secret that is missing is no problem when
// it is optional (the cache and the pods go without it, and the pods' HF_TOKEN is optional too),
// and is reported on the cache when it is not.
func TestOptionalHuggingFaceToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "hftoken-operator", "hftoken")
	for _, optional := range []bool{true, false} {
		name := map[bool]string{true: "optional", false: "required"}[optional]
		iec := builders.MakeInferenceEndpointConfig("hftoken", name).HuggingFace("org/model", "0e9e39f249a16976918f6564b8830bc894c89659").Obj()
		iec.Spec.InstanceType = "ml.hftoken-suite.xlarge" // no node: the gate opens at once
		iec.Spec.ModelSourceConfig.HuggingFaceModel.TokenSecretRef = &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "token", Optional: ptr.To(optional)}
		if err := c.Create(ctx, iec); err != nil {
			t.Fatal(err)
		}
		got := rc.endpoint(t, ctx, client.ObjectKeyFromObject(iec))
		ready := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
		if !optional {
			if ready == nil || ready.Reason != inferencev1.ReasonTokenSecretProblem {
				t.Errorf("a required token Secret that is missing: Ready %+v; want TokenSecretProblem", ready)
			}
			continue
		}
		if ready != nil && ready.Reason == inferencev1.ReasonTokenSecretProblem {
			t.Errorf("an optional token Secret that is missing is reported: %+v", ready)
		}
		caches := &inferencev1.ModelDataCacheConfigList{}
		if err := c.List(ctx, caches, client.InNamespace("hftoken"), client.MatchingLabels{controller.ParentUIDLabel: string(iec.UID)}); err != nil {
			t.Fatal(err)
		}
		if len(caches.Items) != 1 {
			t.Fatalf("%d caches; want 1", len(caches.Items))
		}
		if cond := meta.FindStatusCondition(caches.Items[0].Status.Conditions, inferencev1.ConditionReady); cond != nil && cond.Reason == inferencev1.ReasonTokenSecretProblem {
			t.Errorf("the cache reports the optional token: %+v", cond)
		}
		dep := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(iec), dep); err != nil {
			t.Fatalf("no Deployment: %v (status %+v)", err, got.Status.Conditions)
		}
		// The pods get the model from the node's agent (their CSI volume): the token reaches
		// the agent, sealed, and never the pods.
		spec := dep.Spec.Template.Spec
		if len(spec.InitContainers) != 0 {
			t.Errorf("init containers %+v; want none", spec.InitContainers)
		}
		for _, ctr := range spec.Containers {
			for _, v := range ctr.Env {
				if v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil {
					t.Errorf("container %s reads Secret %s: the token reaches the pod", ctr.Name, v.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
}
