package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// alphaManifest is an S3 model written against v1alpha1, with HyperPod's probes and workingDir.
const alphaManifest = `
apiVersion: inference.sagemaker.aws.amazon.com/v1alpha1
kind: InferenceEndpointConfig
metadata: {name: alpha-model, namespace: default}
spec:
  modelName: Mistral-7B-Instruct
  instanceType: ml.g5.8xlarge
  replicas: 2
  modelSourceConfig:
    modelSourceType: s3
    s3Storage: {bucketName: ` + bucket + `, region: us-west-2}
    modelLocation: ` + prefix + `
  worker:
    image: vllm/vllm-openai:v0.11.0
    workingDir: /opt/ml
    resources: {limits: {nvidia.com/gpu: 1}}
    modelInvocationPort: {containerPort: 8000}
    modelVolumeMount: {name: model-weights}
    probes:
      readinessProbe: {httpGet: {path: /health, port: 8000}}
`

// HyperPod manifests, as its users write them, through the real controller onto kwok nodes: a
// v1alpha1 one is read as v1; spec.kubernetes (init containers, volumes, service account,
// scheduler), probes and workingDir reach the pods; a kubernetesVolume model is mounted from the
// parent's own volume; what prewarm cannot honour is named in Unsupported with an event; and once
// the pods run, the status has HyperPod's shape.
func TestHyperPodManifestsEndToEnd(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx, c := e.ctx, e.c
	for _, n := range []string{"g5-8x-a", "g5-8x-b"} {
		if _, err := e.cluster.AddNode(ctx, n, testutil.NodeOptions{InstanceType: "ml.g5.8xlarge", GPUs: 4}); err != nil {
			t.Fatal(err)
		}
	}
	e.startController(
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "inference-runner"}}); err != nil {
		t.Fatal(err)
	}
	volumeSample, err := os.ReadFile(filepath.Join("..", "compat", "testdata", "samples", "iec-kubernetes-volume.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, manifest := range [][]byte{volumeSample, []byte(alphaManifest)} {
		u := &unstructured.Unstructured{}
		if err := yaml.UnmarshalStrict(manifest, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, u, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("applying %s %s: %v", u.GetAPIVersion(), u.GetName(), err)
		}
	}

	t.Run("kubernetesVolume with spec.kubernetes", func(t *testing.T) {
		dep := e.deployment("qwen-volume")
		spec := dep.Spec.Template.Spec
		var inits []string
		for _, ic := range spec.InitContainers {
			inits = append(inits, ic.Name)
		}
		if !slices.Equal(inits, []string{"warm-kernels"}) {
			t.Errorf("init containers %v; want the parent's warm-kernels alone (a volume needs no preparing)", inits)
		}
		if spec.ServiceAccountName != "inference-runner" || spec.SchedulerName != "default-scheduler" {
			t.Errorf("service account %q, scheduler %q", spec.ServiceAccountName, spec.SchedulerName)
		}
		if len(spec.Volumes) != 1 || spec.Volumes[0].HostPath == nil || spec.Volumes[0].HostPath.Path != "/data/models" {
			t.Errorf("volumes %+v; want the parent's model-weights hostPath", spec.Volumes)
		}
		mounts := spec.Containers[0].VolumeMounts
		if len(mounts) != 1 || !equality.Semantic.DeepEqual(mounts[0], corev1.VolumeMount{Name: "model-weights", MountPath: "/opt/ml/model", SubPath: "qwen3-0.6b", ReadOnly: true}) {
			t.Errorf("worker mounts %+v; want model-weights at /opt/ml/model, sub-path qwen3-0.6b, read-only", mounts)
		}
		iec := e.waitComplete("qwen-volume", 1)
		if u := condition(iec.Status.Conditions, inferencev1.ConditionUnsupported); u.Status != metav1.ConditionTrue || !strings.Contains(u.Message, "worker.requestLimits") {
			t.Errorf("Unsupported %+v; want it to name worker.requestLimits", u)
		}
		if w := condition(iec.Status.Conditions, inferencev1.ConditionWeightsCacheReady); !strings.Contains(w.Message, "the parent's own volume") {
			t.Errorf("WeightsCacheReady %+v; want it to say the volume is not cached", w)
		}
		e.eventually(30*time.Second, "the UnsupportedFields event", func() (bool, string) {
			got := e.events("default", "InferenceEndpointConfig", "qwen-volume")
			return slices.Contains(got, "UnsupportedFields"), fmt.Sprint(got)
		})
	})

	t.Run("v1alpha1 with probes and workingDir", func(t *testing.T) {
		dep := e.deployment("alpha-model")
		w := dep.Spec.Template.Spec.Containers[0]
		if w.WorkingDir != "/opt/ml" || w.ReadinessProbe == nil || w.ReadinessProbe.HTTPGet == nil || w.ReadinessProbe.HTTPGet.Path != "/health" {
			t.Errorf("worker workingDir %q, readiness probe %+v; want /opt/ml and /health", w.WorkingDir, w.ReadinessProbe)
		}
		if len(dep.Spec.Template.Spec.InitContainers) != 1 || dep.Spec.Template.Spec.InitContainers[0].Name != "prewarm-prepare" {
			t.Errorf("init containers %+v; want prewarm's, which downloads the model on a cold node", dep.Spec.Template.Spec.InitContainers)
		}
		iec := e.waitComplete("alpha-model", 2)
		if iec.Spec.MaxDeployTimeInSeconds == nil || *iec.Spec.MaxDeployTimeInSeconds != 3600 || iec.Spec.ModelName != "Mistral-7B-Instruct" {
			t.Errorf("read as v1: maxDeployTimeInSeconds %v, modelName %q; want HyperPod's default 3600 and the name as written",
				iec.Spec.MaxDeployTimeInSeconds, iec.Spec.ModelName)
		}
		if u := condition(iec.Status.Conditions, inferencev1.ConditionUnsupported); u.Status != metav1.ConditionFalse {
			t.Errorf("Unsupported %+v; want False: every field set has its effect", u)
		}
	})
}

// deployment waits for the parent's Deployment.
func (e *weightsEnv) deployment(name string) *appsv1.Deployment {
	e.t.Helper()
	dep := &appsv1.Deployment{}
	e.eventually(time.Minute, "Deployment "+name, func() (bool, string) {
		err := e.c.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, dep)
		return err == nil, fmt.Sprint(err)
	})
	return dep
}

// waitComplete waits until the parent reports its pods available in HyperPod's status shape:
// state DeploymentComplete, and deploymentStatus with the Deployment's own status.
func (e *weightsEnv) waitComplete(name string, replicas int32) *inferencev1.InferenceEndpointConfig {
	e.t.Helper()
	iec := &inferencev1.InferenceEndpointConfig{}
	e.eventually(2*time.Minute, name+" DeploymentComplete", func() (bool, string) {
		if err := e.c.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, iec); err != nil {
			return false, err.Error()
		}
		d := iec.Status.DeploymentStatus
		return iec.Status.State == inferencev1.DeploymentComplete && d != nil && d.Name == name && d.Status != nil &&
				d.Status.AvailableReplicas == replicas && d.DeploymentObjectOverallState == string(inferencev1.DeploymentComplete) &&
				!d.LastUpdated.IsZero(),
			fmt.Sprintf("state %s, deploymentStatus %+v", iec.Status.State, d)
	})
	return iec
}
