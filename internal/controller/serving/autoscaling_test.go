package serving

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/keda"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

func autoScalingSpec(t *testing.T, doc string) *inferencev1.AutoScalingSpec {
	t.Helper()
	s := &inferencev1.AutoScalingSpec{}
	if err := yaml.UnmarshalStrict([]byte(doc), s); err != nil {
		t.Fatal(err)
	}
	return s
}

func scalingConfig() config.OperatorConfiguration {
	return config.OperatorConfiguration{Autoscaling: config.Autoscaling{
		Prometheus: config.PrometheusServer{ServerAddress: "http://prometheus.monitoring:9090"},
		AWS:        config.AWSMetrics{Region: "us-east-2"},
	}}
}

// Every field of autoScalingSpec lands where KEDA reads it: the counts, intervals and cooldowns
// on the ScaledObject, the stabilization windows in the HPA's behaviour, each trigger's fields
// in its scaler's metadata, HyperPod's "Average" as the HPA's AverageValue.
func TestAutoScalingSpecMapsOntoAScaledObject(t *testing.T) {
	spec := autoScalingSpec(t, `
minReplicaCount: 0
maxReplicaCount: 8
pollingInterval: 15
cooldownPeriod: 120
initialCooldownPeriod: 60
scaleUpStabilizationTime: 30
scaleDownStabilizationTime: 600
cloudWatchTrigger:
  name: sqs-backlog
  namespace: AWS/SQS
  metricName: ApproximateNumberOfMessagesVisible
  dimensions: [{name: QueueName, value: requests}, {name: Tier, value: gold}]
  targetValue: 5.5
  activationTargetValue: 1
  minValue: 0
  metricStat: Sum
  metricCollectionPeriod: 60
  metricCollectionStartTime: 180
  metricType: Value
  useCachedMetrics: false
prometheusTriggerList:
- name: running
  query: sum(vllm:num_requests_running{model_name="llama"})
  targetValue: 4
  activationTargetValue: 0.5
  customHeaders: X-Scope-OrgID=team-a
- name: amp
  serverAddress: https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1234abcd-56ef
  query: avg(queue_depth)
  targetValue: 10
  namespace: tenant-a
`)
	plan, err := planScaling(spec, "llama", scalingConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := &keda.ScaledObjectSpec{
		ScaleTargetRef:  keda.ScaleTarget{APIVersion: "apps/v1", Kind: "Deployment", Name: "llama"},
		MinReplicaCount: ptr.To[int32](0), MaxReplicaCount: ptr.To[int32](8), PollingInterval: ptr.To[int32](15),
		CooldownPeriod: ptr.To[int32](120), InitialCooldownPeriod: ptr.To[int32](60),
		Advanced: &keda.AdvancedConfig{HorizontalPodAutoscalerConfig: &keda.HorizontalPodAutoscalerConfig{
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleUp:   &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](30)},
				ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](600)},
			},
		}},
		Triggers: []keda.ScaleTriggers{{
			Type: "aws-cloudwatch", Name: "sqs-backlog", MetricType: autoscalingv2.ValueMetricType,
			Metadata: map[string]string{
				"namespace": "AWS/SQS", "metricName": "ApproximateNumberOfMessagesVisible",
				"dimensionName": "QueueName;Tier", "dimensionValue": "requests;gold",
				"targetMetricValue": "5.5", "activationTargetMetricValue": "1", "minMetricValue": "0",
				"metricStat": "Sum", "metricStatPeriod": "60", "metricCollectionTime": "180",
				"awsRegion": "us-east-2", "identityOwner": "operator",
			},
		}, {
			Type: "prometheus", Name: "running", UseCachedMetrics: true, MetricType: autoscalingv2.AverageValueMetricType,
			Metadata: map[string]string{
				"serverAddress": "http://prometheus.monitoring:9090", "query": `sum(vllm:num_requests_running{model_name="llama"})`,
				"threshold": "4", "activationThreshold": "0.5", "customHeaders": "X-Scope-OrgID=team-a",
			},
		}, {
			Type: "prometheus", Name: "amp", UseCachedMetrics: true, MetricType: autoscalingv2.AverageValueMetricType,
			Metadata: map[string]string{
				"serverAddress": "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1234abcd-56ef", "query": "avg(queue_depth)",
				"threshold": "10", "activationThreshold": "0", "namespace": "tenant-a",
				"awsRegion": "eu-west-1", "identityOwner": "operator",
			},
		}},
	}
	if diff := cmp.Diff(want, plan.spec); diff != "" {
		t.Errorf("ScaledObject spec (-want +got):\n%s", diff)
	}
	if len(plan.left) != 0 {
		t.Errorf("triggers left out: %v; want none", plan.left)
	}
}

// A spec stored before HyperPod's defaults applied (fields nil) scales with HyperPod's
// defaults, never KEDA's (no initial cooldown, 100 replicas); the configured authentication
// replaces KEDA's own identity.
func TestAutoScalingDefaultsAreHyperPods(t *testing.T) {
	cfg := scalingConfig()
	cfg.Autoscaling.AWS.AuthenticationRef = &config.TriggerAuthenticationRef{Name: "aws", Kind: "ClusterTriggerAuthentication"}
	cfg.Autoscaling.Prometheus.AuthenticationRef = &config.TriggerAuthenticationRef{Name: "prom"}
	plan, err := planScaling(autoScalingSpec(t, `
cloudWatchTrigger: {metricName: Backlog, namespace: Custom, dimensions: [{name: Queue, value: q}], targetValue: 3}
prometheusTrigger: {query: up, targetValue: 1}
`), "m", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := plan.spec
	got := []int32{*s.MinReplicaCount, *s.MaxReplicaCount, *s.PollingInterval, *s.CooldownPeriod, *s.InitialCooldownPeriod,
		*s.Advanced.HorizontalPodAutoscalerConfig.Behavior.ScaleUp.StabilizationWindowSeconds,
		*s.Advanced.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.StabilizationWindowSeconds}
	if diff := cmp.Diff([]int32{1, 5, 30, 300, 300, 0, 300}, got); diff != "" {
		t.Errorf("min, max, polling, cooldown, initial cooldown, up, down (-want +got):\n%s", diff)
	}
	cw, prom := s.Triggers[0], s.Triggers[1]
	if cw.Metadata["metricStat"] != "Average" || cw.Metadata["metricStatPeriod"] != "300" || cw.Metadata["metricCollectionTime"] != "300" ||
		!cw.UseCachedMetrics || cw.MetricType != autoscalingv2.AverageValueMetricType {
		t.Errorf("CloudWatch trigger %+v: want HyperPod's defaults (Average, 300, 300, cached, AverageValue)", cw)
	}
	if diff := cmp.Diff(&keda.AuthenticationRef{Name: "aws", Kind: "ClusterTriggerAuthentication"}, cw.AuthenticationRef); diff != "" || cw.Metadata["identityOwner"] != "" {
		t.Errorf("CloudWatch authentication (-want +got):\n%s identityOwner %q", diff, cw.Metadata["identityOwner"])
	}
	if diff := cmp.Diff(&keda.AuthenticationRef{Name: "prom"}, prom.AuthenticationRef); diff != "" {
		t.Errorf("Prometheus authentication (-want +got):\n%s", diff)
	}
}

// Values HyperPod's schema accepts and KEDA or the HPA would refuse are refused here, each
// naming its field and what KEDA needs.
func TestAutoScalingValuesKEDARefusesAreNamed(t *testing.T) {
	const cw = "cloudWatchTrigger: {metricName: M, namespace: N, dimensions: [{name: a, value: b}], targetValue: 1"
	for _, tc := range []struct{ name, spec, want string }{
		{"no replicas at most", "maxReplicaCount: 0\nprometheusTrigger: {query: up, targetValue: 1}", "spec.autoScalingSpec.maxReplicaCount: Invalid value: 0: must be at least 1"},
		{"min above max", "minReplicaCount: 6\nmaxReplicaCount: 5\nprometheusTrigger: {query: up, targetValue: 1}", "spec.autoScalingSpec.minReplicaCount: Invalid value: 6: must not exceed maxReplicaCount (5)"},
		{"polling never", "pollingInterval: 0\nprometheusTrigger: {query: up, targetValue: 1}", "spec.autoScalingSpec.pollingInterval"},
		{"scale-down window over an hour", "scaleDownStabilizationTime: 7200\nprometheusTrigger: {query: up, targetValue: 1}", "spec.autoScalingSpec.scaleDownStabilizationTime: Invalid value: 7200: must be at most 3600 seconds"},
		{"scale-up window over an hour", "scaleUpStabilizationTime: 3601\nprometheusTrigger: {query: up, targetValue: 1}", "spec.autoScalingSpec.scaleUpStabilizationTime"},
		{"Prometheus without a target", "prometheusTrigger: {query: up}", "spec.autoScalingSpec.prometheusTrigger.targetValue: Required value"},
		{"CloudWatch without dimensions", "cloudWatchTrigger: {metricName: M, namespace: N, targetValue: 1}", "spec.autoScalingSpec.cloudWatchTrigger.dimensions: Required value"},
		{"CloudWatch without a namespace", "cloudWatchTrigger: {metricName: M, dimensions: [{name: a, value: b}], targetValue: 1}", "spec.autoScalingSpec.cloudWatchTrigger.namespace: Required value"},
		{"CloudWatch without a target", "cloudWatchTrigger: {metricName: M, namespace: N, dimensions: [{name: a, value: b}]}", "spec.autoScalingSpec.cloudWatchTrigger.targetValue: Required value"},
		{"a period CloudWatch has not", cw + ", metricCollectionPeriod: 90}", "spec.autoScalingSpec.cloudWatchTrigger.metricCollectionPeriod: Invalid value: 90"},
		{"a start not a multiple of the period", cw + ", metricCollectionPeriod: 60, metricCollectionStartTime: 90}", "metricCollectionStartTime: Invalid value: 90: must be a multiple of metricCollectionPeriod (60)"},
		{"a dimension with ;", "cloudWatchTrigger: {metricName: M, namespace: N, dimensions: [{name: a, value: 'b;c'}], targetValue: 1}", "cloudWatchTrigger.dimensions[0]"},
		{"two triggers of one name", "prometheusTriggerList: [{name: x, query: up, targetValue: 1}, {name: x, query: down, targetValue: 1}]", `spec.autoScalingSpec.triggers.name: Duplicate value: "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planScaling(autoScalingSpec(t, tc.spec), "m", scalingConfig())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("planScaling(%s) = %v; want an error with %q", tc.spec, err, tc.want)
			}
		})
	}
	// At the bounds, nothing is refused.
	if _, err := planScaling(autoScalingSpec(t, "minReplicaCount: 5\nmaxReplicaCount: 5\nscaleDownStabilizationTime: 3600\n"+cw+", metricCollectionPeriod: 120, metricCollectionStartTime: 0}"), "m", scalingConfig()); err != nil {
		t.Errorf("values at KEDA's bounds refused: %v", err)
	}
}

// A trigger that cannot work here is left out with why and what to use instead (with none
// left there is nothing to scale on, and no ScaledObject); one that reads a metric this cluster
// never has (SageMaker's) is written with a warning, and an endpoint only such triggers scale is
// never scaled to zero, where nothing could wake it.
func TestTriggersThatCannotWorkHereAreLeftOut(t *testing.T) {
	sageMaker := `cloudWatchTrigger: {name: invocations, metricName: Invocations, namespace: AWS/SageMaker,
  dimensions: [{name: EndpointName, value: llama}, {name: VariantName, value: AllTraffic}], targetValue: 10}`
	for _, tc := range []struct {
		name, spec string
		cfg        func(*config.OperatorConfiguration)
		left, dead []string
		triggers   int
		min        int32
	}{
		{"SageMaker's Invocations, from zero", "minReplicaCount: 0\n" + sageMaker, nil, nil,
			[]string{"spec.autoScalingSpec.cloudWatchTrigger: the AWS/SageMaker metrics (Invocations) exist only for endpoints registered with SageMaker",
				"minReplicaCount 0 is kept at 1"}, 1, 1},
		{"SageMaker's beside a Prometheus query, from zero", "minReplicaCount: 0\n" + sageMaker + "\nprometheusTrigger: {query: up, targetValue: 1}", nil, nil,
			[]string{"spec.autoScalingSpec.cloudWatchTrigger: the AWS/SageMaker metrics"}, 2, 0},
		{"CloudWatch with no region", "cloudWatchTrigger: {metricName: M, namespace: N, dimensions: [{name: a, value: b}], targetValue: 1}",
			func(c *config.OperatorConfiguration) { c.Autoscaling.AWS.Region = "" },
			[]string{"spec.autoScalingSpec.cloudWatchTrigger: no AWS region to read CloudWatch in: set autoscaling.aws.region"}, nil, 0, 0},
		{"CloudWatch's region from jumpStart", "cloudWatchTrigger: {metricName: M, namespace: N, dimensions: [{name: a, value: b}], targetValue: 1}",
			func(c *config.OperatorConfiguration) { c.Autoscaling.AWS.Region, c.JumpStart.Region = "", "us-west-2" }, nil, nil, 1, 1},
		{"Prometheus with no server", "prometheusTriggerList: [{query: up, targetValue: 1}]",
			func(c *config.OperatorConfiguration) { c.Autoscaling.Prometheus.ServerAddress = "" },
			[]string{"spec.autoScalingSpec.prometheusTriggerList[0]: no serverAddress, and no Prometheus server to default to: set autoscaling.prometheus.serverAddress"}, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := scalingConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			plan, err := planScaling(autoScalingSpec(t, tc.spec), "m", cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, got := range []struct {
				what      string
				got, want []string
			}{{"left out", plan.left, tc.left}, {"without a metric here", plan.dead, tc.dead}} {
				if len(got.got) != len(got.want) {
					t.Fatalf("%s %q; want %d", got.what, got.got, len(got.want))
				}
				for i, w := range got.want {
					if !strings.HasPrefix(got.got[i], w) {
						t.Errorf("%s %q; want it to begin %q", got.what, got.got[i], w)
					}
				}
			}
			if tc.triggers > 0 && *plan.spec.MinReplicaCount != tc.min {
				t.Errorf("minReplicaCount %d; want %d", *plan.spec.MinReplicaCount, tc.min)
			}
			switch {
			case tc.triggers == 0 && plan.spec != nil:
				t.Errorf("a ScaledObject with %d triggers; want none", len(plan.spec.Triggers))
			case tc.triggers > 0 && (plan.spec == nil || len(plan.spec.Triggers) != tc.triggers):
				t.Errorf("ScaledObject %+v; want %d triggers", plan.spec, tc.triggers)
			}
			if tc.triggers > 0 && strings.Contains(tc.name, "jumpStart") && plan.spec.Triggers[0].Metadata["awsRegion"] != "us-west-2" {
				t.Errorf("awsRegion %q; want jumpStart.region's", plan.spec.Triggers[0].Metadata["awsRegion"])
			}
		})
	}
}

// With no KEDA in the cluster, a parent that asks for autoscaling says what to install, keeps
// its replicas (spec.replicas is the count) and is looked at again; asking for nothing says
// nothing.
func TestAutoscalingWithoutKEDASaysWhatToInstall(t *testing.T) {
	s := scheme.New()
	mapper := apimeta.NewDefaultRESTMapper(nil)
	for _, gvk := range []schema.GroupVersionKind{inferencev1.GroupVersion.WithKind("InferenceEndpointConfig"), appsv1.SchemeGroupVersion.WithKind("Deployment")} {
		mapper.Add(gvk, apimeta.RESTScopeNamespace)
	}
	r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(s).WithRESTMapper(mapper).Build(), Now: time.Now}
	r.Config.OperatorConfiguration = scalingConfig()
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	iec.Spec.Replicas = ptr.To[int32](3)
	iec.Spec.AutoScalingSpec = autoScalingSpec(t, "prometheusTrigger: {query: up, targetValue: 1}")
	st := &state{m: fromEndpoint(iec), status: &inferencev1.ParentStatus{}}
	ctx := context.Background()
	if err := r.scalingPhase(ctx, st); err != nil {
		t.Fatal(err)
	}
	if st.scaling.owns(iec) {
		t.Error("a ScaledObject owns the replicas with no KEDA installed")
	}
	if err := r.scaledObjectPhase(ctx, st); err != nil {
		t.Fatal(err)
	}
	cond := apimeta.FindStatusCondition(st.status.Conditions, inferencev1.ConditionAutoscaling)
	if cond == nil || cond.Reason != inferencev1.ReasonKEDANotInstalled || !strings.Contains(cond.Message, "helm install keda kedacore/keda") ||
		!strings.Contains(cond.Message, "spec.replicas (3) is the count") {
		t.Errorf("Autoscaling %+v; want KEDANotInstalled naming what to install", cond)
	}
	if st.result.RequeueAfter <= 0 {
		t.Error("not looked at again: KEDA installed later would go unnoticed")
	}

	iec.Spec.AutoScalingSpec = autoScalingSpec(t, "cloudWatchTrigger: {metricStat: Average, metricType: Average}") // the CLI's
	st = &state{m: fromEndpoint(iec), status: &inferencev1.ParentStatus{}}
	if err := r.scalingPhase(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := r.scaledObjectPhase(ctx, st); err != nil {
		t.Fatal(err)
	}
	if len(st.status.Conditions) != 0 {
		t.Errorf("conditions %+v for a spec that asks for nothing; want none", st.status.Conditions)
	}
}

// KEDA writes a ScaledObject's activity at every poll: only its spec, its Ready condition and
// its HPA bring the parent back.
func TestOnlyScaledObjectChangesTheParentReportsWakeIt(t *testing.T) {
	base := &keda.ScaledObject{Status: keda.ScaledObjectStatus{HpaName: "keda-hpa-x",
		Conditions: []keda.Condition{{Type: "Ready", Status: "True"}, {Type: "Active", Status: "True"}}}}
	for _, tc := range []struct {
		name   string
		change func(*keda.ScaledObject)
		want   bool
	}{
		{"Active flips", func(so *keda.ScaledObject) { so.Status.Conditions[1].Status = "False" }, false},
		{"Ready flips", func(so *keda.ScaledObject) { so.Status.Conditions[0].Status = "False" }, true},
		{"Ready's message", func(so *keda.ScaledObject) { so.Status.Conditions[0].Message = "scaler failed" }, true},
		{"another HPA", func(so *keda.ScaledObject) { so.Status.HpaName = "keda-hpa-y" }, true},
		{"spec", func(so *keda.ScaledObject) { so.Generation++ }, true},
	} {
		after := base.DeepCopy()
		tc.change(after)
		if got := scaledObjectChanged.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: after}); got != tc.want {
			t.Errorf("%s: reconcile %v; want %v", tc.name, got, tc.want)
		}
	}
}
