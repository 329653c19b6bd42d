package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	inferencev1alpha1 "github.com/prewarm/prewarm/api/v1alpha1"
	"github.com/prewarm/prewarm/internal/controller/gateway"
)

// The HyperPod add-on's InferenceGatewayConfig manifests (AWS's docs, awslabs'
// ai-on-sagemaker-hyperpod) apply as written, keep every field, and report that routing is left
// to a Gateway API inference extension, naming the Services and labels to point one at.
func TestInferenceGatewayConfigsApplyAndSayRoutingIsLeftToTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	for _, ns := range []string{"inference-gateway", "gateway-models"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	r := &gateway.Reconciler{Client: c}
	fill := strings.NewReplacer("${GATEWAY_NAME}", "my-gateway", "${MODEL_NS}", "gateway-models")
	for _, f := range []string{"awsdocs-minimal.yaml", "ai-on-sagemaker-hyperpod-single.yaml", "ai-on-sagemaker-hyperpod-bbr.yaml"} {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "gateway", f))
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(fill.Replace(string(data))), &u.Object); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(f, "bbr") {
				u.SetName("my-gateway-bbr")
			}
			if err := c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Fatalf("applying %s: %v", f, err)
			}
			key := client.ObjectKeyFromObject(u)
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			gw := &inferencev1alpha1.InferenceGatewayConfig{}
			if err := c.Get(ctx, key, gw); err != nil {
				t.Fatal(err)
			}
			var spec map[string]any
			if err := yaml.Unmarshal(gw.Spec.Raw, &spec); err != nil {
				t.Fatal(err)
			}
			if want, _, _ := unstructured.NestedMap(u.Object, "spec"); !strings.Contains(string(gw.Spec.Raw), `"schedulers"`) || len(spec) != len(want) {
				t.Errorf("spec read back %s; want every field of %v", gw.Spec.Raw, want)
			}
			accepted := apimeta.FindStatusCondition(gw.Status.Conditions, gateway.ConditionAccepted)
			ready := apimeta.FindStatusCondition(gw.Status.Conditions, inferencev1.ConditionReady)
			if accepted == nil || accepted.Status != metav1.ConditionTrue || ready == nil || ready.Status != metav1.ConditionFalse ||
				ready.Reason != gateway.ReasonRoutingNotProvided || !strings.Contains(ready.Message, "InferencePool") ||
				gw.Status.ObservedGeneration != gw.Generation {
				t.Errorf("status %+v; want Accepted, and Ready False RoutingNotProvided naming the InferencePool", gw.Status)
			}
		})
	}
}
