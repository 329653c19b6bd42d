package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// createFromFile creates the object in a YAML file exactly as written, as `kubectl create -f`
// would: no typed round trip that could drop or add fields on the way.
func createFromFile(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := server.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("creating %s unchanged: %v", path, err)
	}
	t.Cleanup(func() { _ = server.Client.Delete(context.Background(), u) })
}

// The samples in config/samples are the seed's manifests, byte for byte.
func TestSamplesAreTheSeedManifests(t *testing.T) {
	seedDir := filepath.Join(server.Root, "..", "shared", "seed")
	if _, err := os.Stat(seedDir); err != nil {
		t.Skipf("no seed folder beside the repository (%v); the samples are the committed copies", err)
	}
	for _, name := range []string{"inference-endpoint-config.yaml", "jumpstart-model.yaml"} {
		seed, err := os.ReadFile(filepath.Join(seedDir, name))
		if err != nil {
			t.Fatal(err)
		}
		sample, err := os.ReadFile(filepath.Join(server.Root, "config", "samples", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(seed, sample) {
			t.Errorf("config/samples/%s differs from the seed's", name)
		}
	}
}

func TestSeedInferenceEndpointConfigAcceptedWithDefaults(t *testing.T) {
	createFromFile(t, filepath.Join(server.Root, "config", "samples", "inference-endpoint-config.yaml"))

	got := &inferencev1.InferenceEndpointConfig{}
	if err := server.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "example-model"}, got); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		field string
		got   any
		want  any
	}{
		{"modelName", got.Spec.ModelName, "example-model"},
		{"modelSourceType", got.Spec.ModelSourceConfig.ModelSourceType, inferencev1.ModelSourceS3},
		{"s3Storage", *got.Spec.ModelSourceConfig.S3Storage, inferencev1.S3Storage{BucketName: "example-bucket", Region: "us-west-2"}},
		{"modelLocation", got.Spec.ModelSourceConfig.ModelLocation, "models/example-model"},
		{"weightsCache", *got.Spec.ModelCacheConfig.WeightsCache, inferencev1.WeightsCacheConfig{Enabled: true, HostPath: "/opt/dlami/nvme"}},
		{"imageCache", *got.Spec.ModelCacheConfig.ImageCache, inferencev1.ImageCacheConfig{Enabled: true}},
		{"instanceType", got.Spec.InstanceType, "ml.g5.24xlarge"},
		{"replicas (default)", got.Spec.Replicas, ptr.To[int32](1)},
		{"modelInvocationPort", got.Spec.Worker.ModelInvocationPort, inferencev1.ModelInvocationPort{ContainerPort: 8000, Name: "http"}},
		{"modelVolumeMount", got.Spec.Worker.ModelVolumeMount, inferencev1.ModelVolumeMount{Name: "model-weights", MountPath: "/opt/ml/model"}},
		{"gpu limit", got.Spec.Worker.Resources.Limits.Name("nvidia.com/gpu", "").String(), "4"},
		{"invocationEndpoint (default)", got.Spec.InvocationEndpoint, "invocations"},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.field, diff)
		}
	}
}

func TestSeedJumpStartModelAcceptedWithDefaults(t *testing.T) {
	createFromFile(t, filepath.Join(server.Root, "config", "samples", "jumpstart-model.yaml"))

	got := &inferencev1.JumpStartModel{}
	if err := server.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "example-jumpstart-model"}, got); err != nil {
		t.Fatal(err)
	}
	want := inferencev1.JumpStartModelSpec{
		Model: inferencev1.JumpStartModelRef{
			ModelID:      "meta-textgeneration-llama-3-1-8b-instruct",
			AcceptEula:   true,
			ModelHubName: "SageMakerPublicHub",
		},
		Server: inferencev1.JumpStartServer{InstanceType: "ml.g5.24xlarge"},
		ModelCacheConfig: &inferencev1.ModelCacheConfig{
			WeightsCache: &inferencev1.WeightsCacheConfig{Enabled: true, HostPath: "/opt/dlami/nvme"},
			ImageCache:   &inferencev1.ImageCacheConfig{Enabled: true},
		},
		Replicas:               ptr.To[int32](1),
		MaxDeployTimeInSeconds: ptr.To[int32](3600), // HyperPod's default
	}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("spec read back (-want +got):\n%s", diff)
	}
}

// A manifest with only weightsCache.enabled and no hostPath gets the default root, and one
// with weightsCache.enabled=false keeps it off: the defaults a user relies on.
func TestWeightsCacheDefaults(t *testing.T) {
	ctx := context.Background()
	u := &unstructured.Unstructured{}
	manifest := `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: InferenceEndpointConfig
metadata: {name: defaults-only, namespace: default}
spec:
  modelName: defaults-only
  modelSourceConfig:
    modelSourceType: s3
    s3Storage: {bucketName: example-bucket, region: us-west-2}
  modelCacheConfig:
    weightsCache: {}
  instanceType: ml.g5.24xlarge
  worker:
    image: vllm/vllm-openai:latest
    modelInvocationPort: {containerPort: 8000}
    modelVolumeMount: {name: model-weights}
    resources: {}
`
	if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := server.Client.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Client.Delete(ctx, u) })
	got := &inferencev1.InferenceEndpointConfig{}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inferencev1.WeightsCacheConfig{Enabled: false, HostPath: "/opt/dlami/nvme"}, *got.Spec.ModelCacheConfig.WeightsCache); diff != "" {
		t.Errorf("weightsCache (-want +got):\n%s", diff)
	}
	if got.Spec.Worker.ModelVolumeMount.MountPath != "/opt/ml/model" {
		t.Errorf("mountPath = %q, want the default /opt/ml/model", got.Spec.Worker.ModelVolumeMount.MountPath)
	}
	if got.Spec.Worker.ModelInvocationPort.Name != "http" {
		t.Errorf("port name = %q, want the default http", got.Spec.Worker.ModelInvocationPort.Name)
	}
}
