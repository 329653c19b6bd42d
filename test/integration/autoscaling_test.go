package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/keda"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// withAutoscaling is the configuration the docs tell a cluster with KEDA to set: a Prometheus
// server for triggers that name none, and the region of CloudWatch.
func withAutoscaling(c *controller.Config) {
	c.Autoscaling = config.Autoscaling{
		Prometheus: config.PrometheusServer{ServerAddress: "http://prometheus-operated.monitoring:9090"},
		AWS:        config.AWSMetrics{Region: "us-east-2"},
	}
}

func scaledObject(t *testing.T, ctx context.Context, ns, parent string) *keda.ScaledObject {
	t.Helper()
	so := &keda.ScaledObject{}
	err := server.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: parent + "-scaled-object"}, so)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return so
}

func deploymentReplicas(t *testing.T, ctx context.Context, key client.ObjectKey) int32 {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := server.Client.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	return ptr.Deref(dep.Spec.Replicas, 1)
}

// An autoScalingSpec becomes a ScaledObject on KEDA's real schema that targets the parent's
// Deployment; KEDA's report shows on the parent; the HPA's replica changes are never reverted,
// through template changes too; a spec the HPA would refuse is refused on the parent and leaves
// the last ScaledObject scaling; removing autoScalingSpec deletes the ScaledObject and
// spec.replicas governs again.
func TestAutoScalingSpecDrivesAScaledObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "scale-operator", "scale").with(withAutoscaling)
	parent := builders.MakeInferenceEndpointConfig("scale", "llama").Obj()
	parent.Spec.InstanceType = "ml.scale-suite.xlarge" // no node: the gate opens at once
	parent.Spec.ModelCacheConfig = nil
	parent.Spec.Replicas = ptr.To[int32](2)
	parent.Spec.AutoScalingSpec = &inferencev1.AutoScalingSpec{
		MinReplicaCount: ptr.To[int32](1), MaxReplicaCount: ptr.To[int32](6),
		PrometheusTrigger: &inferencev1.PrometheusTrigger{Name: ptr.To("running"), Query: ptr.To(`sum(vllm:num_requests_running)`), TargetValue: ptr.To(4.0)},
	}
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(parent)
	got := rc.endpoint(t, ctx, key)
	so := scaledObject(t, ctx, "scale", "llama")
	if so == nil {
		t.Fatal("no ScaledObject llama-scaled-object")
	}
	if !metav1.IsControlledBy(so, got) {
		t.Errorf("ScaledObject owners %+v; want the parent as controller", so.OwnerReferences)
	}
	if diff := cmp.Diff(keda.ScaleTarget{APIVersion: "apps/v1", Kind: "Deployment", Name: "llama"}, so.Spec.ScaleTargetRef); diff != "" {
		t.Errorf("scaleTargetRef (-want +got):\n%s", diff)
	}
	if *so.Spec.MinReplicaCount != 1 || *so.Spec.MaxReplicaCount != 6 || *so.Spec.InitialCooldownPeriod != 300 || len(so.Spec.Triggers) != 1 ||
		so.Spec.Triggers[0].Metadata["serverAddress"] != "http://prometheus-operated.monitoring:9090" ||
		so.Spec.Triggers[0].MetricType != autoscalingv2.AverageValueMetricType {
		t.Errorf("ScaledObject spec %+v; want 1..6, HyperPod's 300 s initial cooldown, one prometheus trigger on the configured server, AverageValue", so.Spec)
	}
	if n := deploymentReplicas(t, ctx, key); n != 2 {
		t.Errorf("Deployment created with %d replicas; want spec.replicas, 2", n)
	}
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond == nil ||
		cond.Reason != inferencev1.ReasonScaledObjectNotReady || !strings.Contains(cond.Message, "KEDA has not reported on it yet") {
		t.Errorf("Autoscaling %+v; want ScaledObjectNotReady until KEDA reports", cond)
	}

	// KEDA reports it ready, and its HPA scales the Deployment to 5.
	so.Status = keda.ScaledObjectStatus{HpaName: "keda-hpa-llama-scaled-object", Conditions: []keda.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "ScaledObjectReady"}}}
	if err := c.Status().Update(ctx, so); err != nil {
		t.Fatal(err)
	}
	scaleTo(t, ctx, key, 5)
	got = rc.endpoint(t, ctx, key)
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond == nil || cond.Status != metav1.ConditionTrue ||
		!strings.Contains(cond.Message, "between 1 and 6 replicas") || !strings.Contains(cond.Message, "HPA keda-hpa-llama-scaled-object") {
		t.Errorf("Autoscaling %+v; want True with the range and the HPA", cond)
	}
	if n := deploymentReplicas(t, ctx, key); n != 5 {
		t.Errorf("Deployment replicas %d after the HPA set 5; prewarm reverted them", n)
	}
	// A template change rolls the Deployment and keeps the HPA's count.
	got.Spec.Worker.EnvironmentVariables = append(got.Spec.Worker.EnvironmentVariables, corev1.EnvVar{Name: "MAX_BATCH", Value: "8"})
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	rc.endpoint(t, ctx, key)
	if n := deploymentReplicas(t, ctx, key); n != 5 {
		t.Errorf("Deployment replicas %d after a template change; want the HPA's 5", n)
	}

	// A stabilization window the HPA refuses: named on the parent; the ScaledObject keeps its spec.
	got = rc.endpoint(t, ctx, key)
	got.Spec.AutoScalingSpec.ScaleDownStabilizationTime = ptr.To[int32](7200)
	if err := c.Update(ctx, got); err != nil {
		t.Fatalf("HyperPod's schema accepts a 7200 s window, and so must prewarm's: %v", err)
	}
	got = rc.endpoint(t, ctx, key)
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond == nil || cond.Reason != inferencev1.ReasonInvalidAutoScaling ||
		!strings.Contains(cond.Message, "spec.autoScalingSpec.scaleDownStabilizationTime: Invalid value: 7200") || !strings.Contains(cond.Message, "keeps scaling as it was") {
		t.Errorf("Autoscaling %+v; want InvalidAutoScaling naming scaleDownStabilizationTime", cond)
	}
	if w := scaledObject(t, ctx, "scale", "llama").Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.StabilizationWindowSeconds; *w != 300 {
		t.Errorf("ScaledObject's scale-down window %d; want the last accepted, 300", *w)
	}
	if n := deploymentReplicas(t, ctx, key); n != 5 {
		t.Errorf("Deployment replicas %d while the spec is refused; want the HPA's 5", n)
	}

	// Autoscaling removed: the ScaledObject goes, spec.replicas is the count again.
	got.Spec.AutoScalingSpec = nil
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	got = rc.endpoint(t, ctx, key)
	if so := scaledObject(t, ctx, "scale", "llama"); so != nil && so.DeletionTimestamp.IsZero() {
		t.Errorf("ScaledObject still there after autoScalingSpec was removed")
	}
	if n := deploymentReplicas(t, ctx, key); n != 2 {
		t.Errorf("Deployment replicas %d after autoscaling ended; want spec.replicas, 2", n)
	}
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond != nil {
		t.Errorf("Autoscaling condition %+v after autoscaling ended; want none", cond)
	}
}

// scaleTo sets the Deployment's replicas as KEDA's HPA does, through its scale subresource.
func scaleTo(t *testing.T, ctx context.Context, key client.ObjectKey, n int32) {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := server.Client.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: n}}
	if err := server.Client.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(scale)); err != nil {
		t.Fatal(err)
	}
}

// HyperPod's published autoscaling manifests (the AWS docs' autoscaling page, aws-samples'
// aws-do-hyperpod) apply unchanged but for their placeholders, and each gets a ScaledObject
// that KEDA's schema accepts. Their only trigger, SageMaker's Invocations, never has a value
// off SageMaker: the parent says so and what to use instead, and never scales to zero. The
// CLI's template with no metric asks for nothing: no ScaledObject, no condition, nothing
// Unsupported.
func TestHyperPodAutoscalingManifestsGetScaledObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := server.Client
	namespaces := []string{"default-scale", "ns-team-a", "hyperpod-ns-inference-team"}
	rc := newReconcilers(t, ctx, "manifests-scale-operator", namespaces...).with(withAutoscaling)
	if err := c.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: rc.cfg.OperatorNamespace, Name: "prewarm-jumpstart-catalog"},
		Data: map[string]string{"catalog.yaml": `models:
- modelId: deepseek-llm-r1-distill-qwen-1-5b
  version: 2.0.4
  source: {modelSourceType: s3, s3Storage: {bucketName: example-bucket, region: us-east-2}, modelLocation: deepseek/}
  image: vllm/vllm-openai:v0.6.3
  port: 8080
- modelId: huggingface-llm-mistral-7b-instruct-v3
  version: 1.0.0
  source: {modelSourceType: s3, s3Storage: {bucketName: example-bucket, region: us-east-2}, modelLocation: mistral/}
  image: vllm/vllm-openai:v0.6.3
  port: 8080
`},
	}); err != nil {
		t.Fatal(err)
	}
	jr := &serving.JumpStartReconciler{Reconciler: rc.ep, CatalogName: "prewarm-jumpstart-catalog"}
	// The samples' shell variables as their scripts fill them in; the docs' serverAddress
	// placeholder is not one HyperPod's own schema accepts (only Amazon Managed Prometheus
	// URLs or ""), so it is left empty: the configured server.
	fill := strings.NewReplacer("$SAGEMAKER_ENDPOINT_NAME", "deepseek15b", "$ACCEL_INSTANCE_TYPE", "ml.scale-manifests.xlarge",
		"$S3_BUCKET_NAME", "example-bucket", "$AWS_REGION", "us-east-2", "${S3_BUCKET_NAME}", "example-bucket",
		"http://<prometheus-host>:9090", `""`)
	for _, tc := range []struct {
		file, ns, name string
		triggers       []string
		min            int32
	}{
		{"aws-do-hyperpod-s3.yaml", "default-scale", "deepseek15b-autoscale", []string{"aws-cloudwatch"}, 1},
		{"aws-do-hyperpod-jumpstart.yaml", "hyperpod-ns-inference-team", "mistral-jumpstart-autoscale", []string{"aws-cloudwatch"}, 1},
		// minReplicaCount 0 with a Prometheus trigger beside SageMaker's: it can wake the endpoint.
		{"awsdocs-jumpstart.yaml", "ns-team-a", "deepseek-sample624", []string{"aws-cloudwatch", "prometheus"}, 0},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "autoscaling", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(fill.Replace(string(data))), &u.Object); err != nil {
				t.Fatal(err)
			}
			if u.GetNamespace() == "" {
				u.SetNamespace(tc.ns)
			}
			if err := c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Fatalf("applying %s: %v", tc.file, err)
			}
			key := client.ObjectKey{Namespace: tc.ns, Name: tc.name}
			var conds []metav1.Condition
			if u.GetKind() == "JumpStartModel" {
				rc.settle(t, ctx, tc.ns, func() error { _, err := jr.Reconcile(ctx, ctrl.Request{NamespacedName: key}); return err })
				j := &inferencev1.JumpStartModel{}
				if err := c.Get(ctx, key, j); err != nil {
					t.Fatal(err)
				}
				conds = j.Status.Conditions
			} else {
				conds = rc.endpoint(t, ctx, key).Status.Conditions
			}
			so := scaledObject(t, ctx, tc.ns, tc.name)
			if so == nil {
				t.Fatalf("no ScaledObject; conditions %+v", conds)
			}
			var types []string
			for _, tr := range so.Spec.Triggers {
				types = append(types, tr.Type)
			}
			if diff := cmp.Diff(tc.triggers, types); diff != "" || *so.Spec.MinReplicaCount != tc.min {
				t.Errorf("triggers (-want +got):\n%s minReplicaCount %d; want %d", diff, *so.Spec.MinReplicaCount, tc.min)
			}
			cond := apimeta.FindStatusCondition(conds, inferencev1.ConditionAutoscaling)
			if cond == nil || cond.Reason != inferencev1.ReasonMetricUnavailable || !strings.Contains(cond.Message, "prometheusTrigger") {
				t.Errorf("Autoscaling %+v; want MetricUnavailable saying to use a prometheusTrigger", cond)
			}
			if un := apimeta.FindStatusCondition(conds, inferencev1.ConditionUnsupported); un != nil && strings.Contains(un.Message, "autoScalingSpec") {
				t.Errorf("Unsupported %q names autoScalingSpec", un.Message)
			}
		})
	}

	t.Run("the CLI's template with no metric", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join("testdata", "autoscaling", "hyperpod-cli-v1_2-empty.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetNamespace("default-scale")
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
		got := rc.endpoint(t, ctx, client.ObjectKeyFromObject(u))
		if so := scaledObject(t, ctx, "default-scale", "my-endpoint"); so != nil {
			t.Errorf("a ScaledObject for a spec that asks for nothing: %+v", so.Spec)
		}
		if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond != nil {
			t.Errorf("Autoscaling %+v; want none", cond)
		}
		if un := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionUnsupported); un == nil || strings.Contains(un.Message, "autoScalingSpec") {
			t.Errorf("Unsupported %+v; want one that does not name autoScalingSpec", un)
		}
	})
}

// A ScaledObject of the parent's name that is someone else's is never overwritten (the parent
// says whose and keeps its replicas); autoscaling.disabled leaves autoScalingSpec without
// effect, named in Unsupported, and writes no ScaledObject.
func TestAutoscalingNeverTakesAnotherScaledObjectAndCanBeTurnedOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "scale-conflict-operator", "scale-conflict").with(withAutoscaling)
	theirs := &keda.ScaledObject{
		ObjectMeta: metav1.ObjectMeta{Namespace: "scale-conflict", Name: "llama-scaled-object"},
		Spec: keda.ScaledObjectSpec{ScaleTargetRef: keda.ScaleTarget{Name: "something-else"},
			Triggers: []keda.ScaleTriggers{{Type: "cpu", Metadata: map[string]string{"value": "50"}, MetricType: autoscalingv2.UtilizationMetricType}}},
	}
	if err := c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	parent := builders.MakeInferenceEndpointConfig("scale-conflict", "llama").Obj()
	parent.Spec.InstanceType = "ml.scale-conflict.xlarge"
	parent.Spec.ModelCacheConfig = nil
	parent.Spec.Replicas = ptr.To[int32](2)
	parent.Spec.AutoScalingSpec = &inferencev1.AutoScalingSpec{PrometheusTrigger: &inferencev1.PrometheusTrigger{Query: ptr.To("up"), TargetValue: ptr.To(1.0)}}
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(parent)
	got := rc.endpoint(t, ctx, key)
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond == nil || cond.Reason != inferencev1.ReasonNameConflict ||
		!strings.Contains(cond.Message, "spec.replicas (2) is the count") {
		t.Errorf("Autoscaling %+v; want NameConflict keeping spec.replicas", cond)
	}
	if so := scaledObject(t, ctx, "scale-conflict", "llama"); so == nil || so.Spec.ScaleTargetRef.Name != "something-else" || len(so.OwnerReferences) != 0 {
		t.Errorf("their ScaledObject was changed: %+v", so)
	}
	scaleTo(t, ctx, key, 4)
	rc.endpoint(t, ctx, key)
	if n := deploymentReplicas(t, ctx, key); n != 2 {
		t.Errorf("Deployment replicas %d; want spec.replicas (2): no ScaledObject of the parent's scales it", n)
	}

	off := rc.with(func(c *controller.Config) { c.Autoscaling.Disabled = true })
	if err := c.Delete(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	got = off.endpoint(t, ctx, key)
	if so := scaledObject(t, ctx, "scale-conflict", "llama"); so != nil {
		t.Errorf("a ScaledObject with autoscaling disabled: %+v", so.Spec)
	}
	if un := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionUnsupported); un == nil || un.Status != metav1.ConditionTrue ||
		!strings.Contains(un.Message, "autoScalingSpec (autoscaling.disabled in prewarm's configuration)") {
		t.Errorf("Unsupported %+v; want autoScalingSpec named", un)
	}
	if cond := apimeta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionAutoscaling); cond != nil {
		t.Errorf("Autoscaling %+v with autoscaling disabled; want none", cond)
	}
}
