package integration

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

type iecMutation func(*inferencev1.InferenceEndpointConfig)

func iec(name string, mutate iecMutation) client.Object {
	o := builders.MakeInferenceEndpointConfig("default", name).Obj()
	mutate(o)
	return o
}

func jsm(name string, mutate func(*inferencev1.JumpStartModel)) client.Object {
	o := builders.MakeJumpStartModel("default", name).Obj()
	mutate(o)
	return o
}

// Each object is rejected by the API server, and the message tells the user what is wrong:
// HyperPod's own validation, and the few deliberate checks of values that could never work
// (docs/hyperpod-compatibility.md).
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
		{"hostPath over 255 (HyperPod's limit)", iec("v4", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/" + strings.Repeat("a", 255)
		}), "may not be more than 255"},
		{"hostPath with a newline", iec("v5", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/opt/dlami/nvme\n/etc"
		}), "hostPath must not contain control characters"},
		{"s3 without s3Storage", iec("v6", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage = nil
		}), "modelSourceType s3 needs s3Storage"},
		{"fsx without fsxStorage", iec("v8", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = inferencev1.ModelSourceFSx
			o.Spec.ModelSourceConfig.S3Storage = nil
		}), "modelSourceType fsx needs fsxStorage"},
		{"huggingface with s3Storage only", iec("v9", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = inferencev1.ModelSourceHuggingFace
		}), "modelSourceType huggingface needs huggingFaceModel"},
		{"unknown source type", iec("v10", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.ModelSourceType = "gcs"
		}), `Unsupported value: "gcs"`},
		{"no placement", iec("v13", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = ""
		}), "one of instanceType, instanceTypes or nodeAffinity is required"},
		{"instanceType without ml. prefix (HyperPod's pattern)", iec("v14", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = "g5.24xlarge"
		}), "instanceType must look like ml.g5.24xlarge"},
		{"instanceType: the pattern is kept beside its message", iec("v14b", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceType = "g5.24xlarge"
		}), `should match '^ml\..*'`},
		{"HF modelId without org (HyperPod's pattern)", builders.MakeInferenceEndpointConfig("default", "v16").HuggingFace("llama", "").Obj(),
			"modelId must be a Hugging Face repository as org/name"},
		{"HF modelId with ..", builders.MakeInferenceEndpointConfig("default", "v16b").HuggingFace("meta-llama/..", "").Obj(),
			"modelId must not contain '..'"},
		{"HF commitSHA a branch (HyperPod's pattern)", builders.MakeInferenceEndpointConfig("default", "v17").HuggingFace("meta-llama/Llama-3.1-8B", "main").Obj(),
			"commitSHA must be a full commit id, 40 lower-case hex digits"},
		{"fsx modelLocation with ..", iec("v24", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceFSx,
				FSxStorage: &inferencev1.FSxStorage{FileSystemID: "fs-0123456789abcdef0"}, ModelLocation: "models/../../etc"}
		}), "modelLocation of an fsx source must not contain '..'"},
		{"containerPort 0", iec("v26", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.ContainerPort = 0
		}), "should be greater than or equal to 1"},
		{"containerPort 70000", iec("v27", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.ContainerPort = 70000
		}), "should be less than or equal to 65535"},
		{"port name neither http nor grpc (HyperPod's pattern)", iec("v28", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.ModelInvocationPort.Name = "metrics"
		}), "modelInvocationPort.name must be http or grpc"},
		{"modelName with an underscore (HyperPod's pattern)", iec("v29", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelName = "_model"
		}), "modelName must start with a letter or digit"},
		{"endpointName with an underscore (HyperPod's pattern)", iec("v29b", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.EndpointName = "my_endpoint"
		}), "endpointName must be letters, digits and hyphens"},
		{"loadBalancer health check path without / (HyperPod's pattern)", iec("v29c", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.LoadBalancer = &inferencev1.LoadBalancer{HealthCheckPath: ptr.To("ping")}
		}), "healthCheckPath must be a path starting with /, e.g. /ping"},
		{"an ACM ARN of another service (HyperPod's pattern)", iec("v29d", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.TLSConfig = &inferencev1.TLSConfig{CustomCertificateConfig: &inferencev1.CustomCertificateConfig{
				ACMArn: "arn:aws:iam::111122223333:certificate/x", DomainName: "model.example.com"}}
		}), "acmArn must be an ACM certificate ARN"},
		{"modelName over 63", iec("v30", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelName = strings.Repeat("m", 64)
		}), "may not be more than 63"},
		{"negative replicas", iec("v32", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Replicas = ptr.To[int32](-1)
		}), "should be greater than or equal to 0"},
		{"worker without resources (HyperPod requires them)", func() client.Object {
			u := unstructuredIEC("v33")
			unstructured.RemoveNestedField(u.Object, "spec", "worker", "resources")
			return u
		}(), "spec.worker.resources: Required value"},
		{"a typo inside a HyperPod block", func() client.Object {
			u := unstructuredIEC("v34")
			_ = unstructured.SetNestedField(u.Object, "round_robbin", "spec", "loadBalancer", "routingAlgorithm")
			return u
		}(), `spec.loadBalancer.routingAlgorithm: Unsupported value: "round_robbin"`},
		{"autoscaling below zero", iec("v35", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.AutoScalingSpec = &inferencev1.AutoScalingSpec{MinReplicaCount: ptr.To[int32](-1)}
		}), "spec.autoScalingSpec.minReplicaCount"},
		{"JumpStart modelId with spaces (HyperPod's pattern)", jsm("v38", func(o *inferencev1.JumpStartModel) {
			o.Spec.Model.ModelID = "Meta Llama 3.1 8B"
		}), "modelId must be a JumpStart model id"},
		{"JumpStart instanceType without ml. (HyperPod's pattern)", jsm("v39", func(o *inferencev1.JumpStartModel) {
			o.Spec.Server.InstanceType = "p4d.24xlarge"
		}), "instanceType must look like ml.g5.24xlarge"},
		{"JumpStart modelVersion not semantic (HyperPod's pattern)", jsm("v40", func(o *inferencev1.JumpStartModel) {
			o.Spec.Model.ModelVersion = "latest"
		}), "modelVersion must be three numbers, e.g. 2.1.0"},
		{"JumpStart accelerator partition not MIG", jsm("v40b", func(o *inferencev1.JumpStartModel) {
			o.Spec.Server.AcceleratorPartitionType = "1g.10gb"
		}), "acceleratorPartitionType must be a MIG profile, e.g. mig-1g.10gb"},
		{"JumpStart hostPath relative", jsm("v41", func(o *inferencev1.JumpStartModel) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "nvme"
		}), "hostPath must be an absolute path"},
		{"ModelDataCacheConfig hostPath with ..", func() client.Object {
			o := builders.MakeModelDataCacheConfig("default", "v42")
			o.Spec.HostPath = "/opt/dlami/nvme/.."
			return o
		}(), "hostPath must not contain '..'"},
		{"InferenceImageCache parent of unknown kind", func() client.Object {
			o := builders.MakeInferenceImageCache("default", "v43")
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
			// Older API servers (1.31) word a length limit "may not be longer than".
			if !strings.Contains(strings.ReplaceAll(err.Error(), "may not be longer than", "may not be more than"), tc.wantMsg) {
				t.Errorf("error does not say %q:\n%v", tc.wantMsg, err)
			}
		})
	}
}

// unstructuredIEC is a valid InferenceEndpointConfig as unstructured, for manifests the typed
// client cannot express (a missing required field, a value outside an enum).
func unstructuredIEC(name string) *unstructured.Unstructured {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(builders.MakeInferenceEndpointConfig("default", name).Obj())
	if err != nil {
		panic(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(inferencev1.GroupVersion.String())
	u.SetKind("InferenceEndpointConfig")
	unstructured.RemoveNestedField(u.Object, "status")
	return u
}

// The shapes users write that must stay accepted: every source type, every placement, and what
// HyperPod accepts that prewarm once refused.
func TestValidVariantsAccepted(t *testing.T) {
	cases := []struct {
		name string
		obj  client.Object
	}{
		{"huggingface pinned, optional token", iec("ok-hf", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceHuggingFace,
				HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: "meta-llama/Llama-3.1-8B-Instruct",
					CommitSHA: "0e9e39f249a16976918f6564b8830bc894c89659",
					TokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"},
						Key: "token", Optional: ptr.To(true)}}}
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
		{"instanceType and instanceTypes and nodeAffinity together", iec("ok-all-placements", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.InstanceTypes = []string{"ml.g5.24xlarge", "ml.g5.48xlarge"}
			o.Spec.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}}
		})},
		{"kubernetesVolume from spec.kubernetes.volumes", iec("ok-pvc", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceKubernetesVolume, ModelLocation: "llama"}
			o.Spec.Kubernetes = &inferencev1.KubernetesSpec{Volumes: []corev1.Volume{{Name: "model-weights",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models"}}}}}
		})},
		{"custom hostPath, env, args, probes, workingDir", iec("ok-worker", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelCacheConfig.WeightsCache.HostPath = "/mnt/k8s-disks/0"
			o.Spec.Worker.EnvironmentVariables = []corev1.EnvVar{{Name: "OPTION_ROLLING_BATCH", Value: "vllm"}}
			o.Spec.Worker.Args = []string{"--model", "/opt/ml/model"}
			o.Spec.Worker.WorkingDir = "/srv"
			o.Spec.Worker.Probes = &inferencev1.Probes{ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health"}}}}
		})},
		{"Hugging Face casing in modelName", iec("ok-casing", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelName = "Llama-3.1-8B-Instruct"
		})},
		{"a legacy bucket name and a custom region", iec("ok-bucket", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.ModelSourceConfig.S3Storage = &inferencev1.S3Storage{BucketName: "Legacy_Bucket", Region: "local"}
			o.Spec.ModelSourceConfig.ModelLocation = "/models/with a space"
		})},
		{"an environment variable name Kubernetes accepts", iec("ok-env", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.Worker.EnvironmentVariables = []corev1.EnvVar{{Name: "1ST_OPTION", Value: "x"}}
		})},
		// The rules that say what to write beside HyperPod's patterns leave a long value to the
		// pattern alone: their cost refuses nothing the pattern accepts.
		{"an ACM ARN of 800,000 characters that HyperPod's pattern accepts", iec("ok-long-arn", func(o *inferencev1.InferenceEndpointConfig) {
			o.Spec.TLSConfig = &inferencev1.TLSConfig{CustomCertificateConfig: &inferencev1.CustomCertificateConfig{
				ACMArn: "arn:aws:acm:us-west-2:111122223333:certificate/" + strings.Repeat("a", 800_000), DomainName: "model.example.com"}}
		})},
		{"JumpStart with a MIG partition and additional configs", jsm("ok-jsm", func(o *inferencev1.JumpStartModel) {
			o.Spec.Server.AcceleratorPartitionType = "mig-1g.10gb"
			o.Spec.Model.AdditionalConfigs = []inferencev1.NameValue{{Name: "MAX_MODEL_LEN", Value: "4096"}}
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
