package integration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

type iecMutation func(*inferencev1.InferenceEndpointConfig)

func iec(name string, mutate iecMutation) client.Object {
	o := testutil.MakeInferenceEndpointConfig("default", name).Obj()
	mutate(o)
	return o
}

func jsm(name string, mutate func(*inferencev1.JumpStartModel)) client.Object {
	o := testutil.MakeJumpStartModel("default", name).Obj()
	mutate(o)
	return o
}

// Each object is rejected by the API server, and the message tells the user what is wrong.
func TestInvalidObjectsRejectedWithClearMessages(t *testing.T) {
	cases := []struct {
		name    string
		obj     client.Object
		wantMsg string
	}{
		{"relative hostPath", iec("v1", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "opt/dlami/nvme"
		}), "hostPath must be an absolute path"},
		{"hostPath with ..", iec("v2", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/opt/dlami/nvme/../../../etc"
		}), "hostPath must not contain '..'"},
		{"hostPath is /", iec("v3", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/"
		}), "hostPath must not be the filesystem root"},
		{"hostPath over 255", iec("v4", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/" + strings.Repeat("a", 255)
		}), "may not be more than 255"},
		{"hostPath with a newline", iec("v5", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/opt/dlami/nvme\n/etc"
		}), "hostPath must not contain control characters"},
		{"s3 without s3Storage", iec("v6", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage = nil
		}), "modelSourceType s3 needs s3Storage"},
		{"s3 with fsxStorage too", iec("v7", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.FSxStorage = &inferencev1.FSxStorage{FileSystemID: "fs-0123456789abcdef0"}
		}), "fsxStorage is set but modelSourceType is not fsx"},
		{"fsx without fsxStorage", iec("v8", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = inferencev1.ModelSourceFSx
			o.Spec.ModelSourceConfig.S3Storage = nil
		}), "modelSourceType fsx needs fsxStorage"},
		{"huggingface with s3Storage", iec("v9", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = inferencev1.ModelSourceHuggingFace
		}), "modelSourceType huggingface needs huggingFaceModel"},
		{"unknown source type", iec("v10", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = "gcs"
		}), `Unsupported value: "gcs"`},
		{"instanceType and instanceTypes", iec("v11", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceTypes = []string{"ml.g5.48xlarge"}
		}), "instanceType, instanceTypes and nodeAffinity are mutually exclusive"},
		{"instanceType and nodeAffinity", iec("v12", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}}
		}), "mutually exclusive"},
		{"no placement", iec("v13", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = ""
		}), "one of instanceType, instanceTypes or nodeAffinity is required"},
		{"instanceType without ml. prefix", iec("v14", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = "g5.24xlarge"
		}), "instanceType must look like ml.g5.24xlarge"},
		{"bad instanceTypes entry", iec("v15", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = ""
			o.Spec.InstanceTypes = []string{"ml.g5.24xlarge", "p4d.24xlarge"}
		}), "every instanceTypes entry must look like ml.g5.24xlarge"},
		{"HF modelId without org", testutil.MakeInferenceEndpointConfig("default", "v16").HuggingFace("llama", "").Obj(),
			"modelId must be org/name"},
		{"HF commitSHA a branch", testutil.MakeInferenceEndpointConfig("default", "v17").HuggingFace("meta-llama/Llama-3.1-8B", "main").Obj(),
			"commitSHA must be a full 40-character lowercase hex commit id"},
		{"bucket with uppercase and _", iec("v18", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage.BucketName = "Example_Bucket"
		}), "bucketName must use only lowercase letters, digits, dots and hyphens"},
		{"bucket too short", iec("v19", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage.BucketName = "ab"
		}), "at least 3 chars long"},
		{"bucket with ..", iec("v20", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage.BucketName = "my..bucket"
		}), "bucketName must not contain two adjacent dots"},
		{"bucket an IP address", iec("v21", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage.BucketName = "192.168.10.1"
		}), "bucketName must not look like an IP address"},
		{"region a name", iec("v22", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage.Region = "oregon"
		}), "region must look like us-west-2"},
		{"modelLocation a URL", iec("v23", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelLocation = "s3://example-bucket/models/example-model"
		}), "modelLocation is a path inside the source, not a URL"},
		{"modelLocation with ..", iec("v24", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelLocation = "models/../secrets"
		}), "modelLocation must not contain '..'"},
		{"s3 modelLocation absolute", iec("v25", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelLocation = "/models/example-model"
		}), "modelLocation for s3 is a key prefix and must not start with '/'"},
		{"containerPort 0", iec("v26", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.ContainerPort = 0
		}), "should be greater than or equal to 1"},
		{"containerPort 70000", iec("v27", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.ContainerPort = 70000
		}), "should be less than or equal to 65535"},
		{"port name not IANA", iec("v28", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.Name = "HTTP_port"
		}), "port name must be lowercase letters, digits and single hyphens"},
		{"modelName with uppercase", iec("v29", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelName = "Example_Model"
		}), "modelName must be lowercase letters, digits and '-'"},
		{"modelName over 63", iec("v30", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelName = strings.Repeat("m", 64)
		}), "may not be more than 63"},
		{"weightsCache with kubernetesVolume", iec("v31", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceKubernetesVolume,
				KubernetesVolume: &inferencev1.KubernetesVolume{ClaimName: "models"}}
		}), "weightsCache cannot be enabled for modelSourceType kubernetesVolume"},
		{"negative replicas", iec("v32", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Replicas = ptr.To[int32](-1)
		}), "should be greater than or equal to 0"},
		{"env var name starting with a digit", iec("v33", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.EnvironmentVariables = []inferencev1.EnvironmentVariable{{Name: "1BAD", Value: "x"}}
		}), "environment variable names must consist of letters"},
		{"relative mountPath", iec("v34", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelVolumeMount.MountPath = "opt/ml/model"
		}), "mountPath must be an absolute path other than /"},
		{"image with a space", iec("v35", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.Image = "vllm/vllm-openai latest"
		}), "image must not contain whitespace"},
		{"fsx id malformed", iec("v36", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceFSx,
				FSxStorage: &inferencev1.FSxStorage{FileSystemID: "lustre-1"}}
		}), "fileSystemId must look like fs-0123456789abcdef0"},
		{"volume name not a DNS label", iec("v37", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelVolumeMount.Name = "Model_Weights"
		}), "modelVolumeMount.name must be a DNS label"},
		{"JumpStart modelId with spaces", jsm("v38", func(o *inferencev1.JumpStartModel) {
			o.Spec.Model.ModelID = "Meta Llama 3.1 8B"
		}), "modelId must be lowercase letters, digits, '.' and '-'"},
		{"JumpStart instanceType without ml.", jsm("v39", func(o *inferencev1.JumpStartModel) {
			o.Spec.Server.InstanceType = "p4d.24xlarge"
		}), "instanceType must look like ml.g5.24xlarge"},
		{"JumpStart modelVersion not semantic", jsm("v40", func(o *inferencev1.JumpStartModel) {
			o.Spec.Model.ModelVersion = "latest"
		}), "modelVersion must be a version like 2.1.0"},
		{"JumpStart hostPath relative", jsm("v41", func(o *inferencev1.JumpStartModel) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "nvme"
		}), "hostPath must be an absolute path"},
		{"ModelDataCacheConfig hostPath with ..", func() client.Object {
			o := testutil.MakeModelDataCacheConfig("default", "v42")
			o.Spec.HostPath = "/opt/dlami/nvme/.."
			return o
		}(), "hostPath must not contain '..'"},
		{"InferenceImageCache parent of unknown kind", func() client.Object {
			o := testutil.MakeInferenceImageCache("default", "v43")
			o.Spec.ParentReferences = []inferencev1.ParentReference{{Kind: "Deployment", Namespace: "default", Name: "x", UID: "u1"}}
			return o
		}(), `Unsupported value: "Deployment"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := server.Client.Create(context.Background(), tc.obj)
			if err == nil {
				_ = server.Client.Delete(context.Background(), tc.obj)
				t.Fatalf("created; want rejection with %q", tc.wantMsg)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("error is not Invalid: %v", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error does not say %q:\n%v", tc.wantMsg, err)
			}
		})
	}
}

// The shapes users write that must stay accepted: every source type, every placement.
func TestValidVariantsAccepted(t *testing.T) {
	cases := []struct {
		name string
		obj  client.Object
	}{
		{"huggingface pinned", iec("ok-hf", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceHuggingFace,
				HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: "meta-llama/Llama-3.1-8B-Instruct",
					CommitSHA: "0e9e39f249a16976918f6564b8830bc894c89659", TokenSecretRef: &inferencev1.SecretKeyRef{Name: "hf-token"}}}
		})},
		{"fsx with instanceTypes", iec("ok-fsx", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceFSx,
				FSxStorage:    &inferencev1.FSxStorage{FileSystemID: "fs-0123456789abcdef0", MountName: "abcdef"},
				ModelLocation: "/models/llama"}
			o.Spec.InstanceType = ""
			o.Spec.InstanceTypes = []string{"ml.g5.24xlarge", "ml.p4d.24xlarge"}
		})},
		{"nodeAffinity and tolerations", iec("ok-affinity", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = ""
			o.Spec.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "node.kubernetes.io/instance-type", Operator: corev1.NodeSelectorOpIn, Values: []string{"ml.g5.24xlarge"}}}}}}}
			o.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		})},
		{"kubernetesVolume without weights cache", iec("ok-pvc", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceKubernetesVolume,
				KubernetesVolume: &inferencev1.KubernetesVolume{ClaimName: "models"}}
			o.Spec.ModelCacheConfig.WeightsCache.Enabled = false
		})},
		{"custom hostPath, env, args, probes", iec("ok-worker", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/mnt/k8s-disks/0"
			o.Spec.Worker.EnvironmentVariables = []inferencev1.EnvironmentVariable{{Name: "OPTION_ROLLING_BATCH", Value: "vllm"}}
			o.Spec.Worker.Args = []string{"--model", "/opt/ml/model"}
			o.Spec.Worker.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health"}}}
		})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := server.Client.Create(context.Background(), tc.obj); err != nil {
				t.Fatalf("rejected: %v", err)
			}
			_ = server.Client.Delete(context.Background(), tc.obj)
		})
	}
}
