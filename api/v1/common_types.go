package v1

import (
	corev1 "k8s.io/api/core/v1"
)

// ModelSourceType names where a model's files come from.
// +kubebuilder:validation:Enum=s3;fsx;huggingface;kubernetesVolume
type ModelSourceType string

const (
	// ModelSourceS3 reads the model from an S3 bucket under modelLocation.
	ModelSourceS3 ModelSourceType = "s3"
	// ModelSourceFSx reads the model from an FSx for Lustre file system mounted on the nodes.
	ModelSourceFSx ModelSourceType = "fsx"
	// ModelSourceHuggingFace reads the model from a Hugging Face Hub repository.
	ModelSourceHuggingFace ModelSourceType = "huggingface"
	// ModelSourceKubernetesVolume reads the model from a PersistentVolumeClaim; it cannot be
	// cached on node-local disk.
	ModelSourceKubernetesVolume ModelSourceType = "kubernetesVolume"
)

// ModelSourceConfig says where the model's files are. The fields that hold one check that its
// storage block is there.
type ModelSourceConfig struct {
	// modelSourceType is where the model comes from: s3, fsx, huggingface or kubernetesVolume.
	// The storage block of the same name must be set, and no other.
	// +required
	ModelSourceType ModelSourceType `json:"modelSourceType"`

	// s3Storage is the bucket that holds the model, for modelSourceType s3.
	// +optional
	S3Storage *S3Storage `json:"s3Storage,omitempty"`

	// fsxStorage is the FSx for Lustre file system that holds the model, for modelSourceType fsx.
	// +optional
	FSxStorage *FSxStorage `json:"fsxStorage,omitempty"`

	// huggingFaceModel is the Hugging Face Hub repository that holds the model, for
	// modelSourceType huggingface.
	// +optional
	HuggingFaceModel *HuggingFaceModel `json:"huggingFaceModel,omitempty"`

	// modelLocation is the model's place inside the source: the key prefix in the bucket for
	// s3 (taken byte for byte), the directory under the mount for fsx, the sub-path of the
	// volume for kubernetesVolume.
	// +optional
	ModelLocation string `json:"modelLocation,omitempty"`

	// prefetchEnabled makes the inference server read the model from memory: an init container
	// copies it from the model volume (the node's cache) into a memory-backed volume,
	// model-weights-copy, sized from the model, before the worker starts. The model must fit
	// the worker's memory limit.
	// +optional
	// +kubebuilder:default=false
	PrefetchEnabled *bool `json:"prefetchEnabled,omitempty"`
}

// S3Storage names an S3 bucket.
type S3Storage struct {
	// bucketName is the bucket's name.
	// +required
	BucketName string `json:"bucketName"`

	// region is the AWS region of the bucket, e.g. us-west-2.
	// +required
	Region string `json:"region"`
}

// FSxStorage names an FSx for Lustre file system.
type FSxStorage struct {
	// fileSystemId is the file system's ID, e.g. fs-0123456789abcdef0. The operator
	// configuration says where it is mounted on the nodes.
	// +required
	FileSystemID string `json:"fileSystemId"`

	// dnsName is the file system's DNS name.
	// +optional
	DNSName string `json:"dnsName,omitempty"`

	// mountName is the file system's mount name.
	// +optional
	MountName string `json:"mountName,omitempty"`
}

// HuggingFaceModel names a repository on the Hugging Face Hub.
type HuggingFaceModel struct {
	// modelId is the repository, as org/name (e.g. meta-llama/Llama-3.1-8B-Instruct).
	// +required
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$')`,message="modelId must be a Hugging Face repository as org/name (letters, digits, '_', '.' and '-'), e.g. meta-llama/Llama-3.1-8B-Instruct"
	// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="modelId must not contain '..': no Hub repository is named so"
	ModelID string `json:"modelId"`

	// commitSHA pins the repository to one commit (40 hex digits). When empty, the default
	// branch is resolved once to a commit and that commit is used on every node.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{40}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[0-9a-f]{40}$')`,message="commitSHA must be a full commit id, 40 lower-case hex digits; leave it empty to pin the default branch's commit"
	CommitSHA string `json:"commitSHA,omitempty"`

	// tokenSecretRef names a key of a Secret, in the parent's namespace, that holds a Hub access
	// token for gated or private repositories. With optional set, a missing Secret or key means
	// no token.
	// +optional
	TokenSecretRef *corev1.SecretKeySelector `json:"tokenSecretRef,omitempty"`
}

// ModelCacheConfig turns node-local caching of the weights and of the image on or off.
// The two are independent.
type ModelCacheConfig struct {
	// weightsCache keeps a copy of the model's files on the local disk of every target node.
	// +optional
	WeightsCache *WeightsCacheConfig `json:"weightsCache,omitempty"`

	// imageCache keeps the inference image pulled and pinned on every target node.
	// +optional
	ImageCache *ImageCacheConfig `json:"imageCache,omitempty"`
}

// WeightsCacheConfig configures the weights cache.
type WeightsCacheConfig struct {
	// enabled turns the weights cache on; default false.
	// +optional
	// +kubebuilder:default=false
	Enabled bool `json:"enabled"`

	// hostPath is the node directory that holds the cache; default /opt/dlami/nvme. It must be
	// one of the roots the cluster admin allows.
	// +optional
	// +kubebuilder:default="/opt/dlami/nvme"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="hostPath must be an absolute path, e.g. /opt/dlami/nvme"
	// +kubebuilder:validation:XValidation:rule="self != '/'",message="hostPath must not be the filesystem root"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="hostPath must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:cntrl:]]')",message="hostPath must not contain control characters"
	HostPath string `json:"hostPath,omitempty"`
}

// ImageCacheConfig configures the image cache.
type ImageCacheConfig struct {
	// enabled turns the image cache on.
	// +required
	Enabled bool `json:"enabled"`
}

// Worker describes the inference server container.
type Worker struct {
	// image is the inference server image.
	// +required
	Image string `json:"image"`

	// modelInvocationPort is the port the server listens on for requests.
	// +required
	ModelInvocationPort ModelInvocationPort `json:"modelInvocationPort"`

	// modelVolumeMount is where the server finds the model's files. For modelSourceType
	// kubernetesVolume, its name names the volume in spec.kubernetes.volumes.
	// +required
	ModelVolumeMount ModelVolumeMount `json:"modelVolumeMount"`

	// resources are the container's requests and limits (CPU, memory, GPUs).
	// +required
	Resources corev1.ResourceRequirements `json:"resources"`

	// environmentVariables are set in the container.
	// +optional
	// +listType=map
	// +listMapKey=name
	EnvironmentVariables []corev1.EnvVar `json:"environmentVariables,omitempty"`

	// args are the arguments to the container's entrypoint.
	// +optional
	Args []string `json:"args,omitempty"`

	// command replaces the container's entrypoint.
	// +optional
	Command []string `json:"command,omitempty"`

	// workingDir is the container's working directory.
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`

	// probes tell when the server has started, can take requests, and must be restarted.
	// +optional
	Probes *Probes `json:"probes,omitempty"`

	// requestLimits are HyperPod's limits on concurrent and queued requests, enforced by its
	// load balancer sidecar; prewarm does not act on them.
	// +optional
	RequestLimits *RequestLimits `json:"requestLimits,omitempty"`
}

// Probes are the inference container's probes.
type Probes struct {
	// livenessProbe tells when the server must be restarted.
	// +optional
	LivenessProbe *corev1.Probe `json:"livenessProbe,omitempty"`

	// readinessProbe tells when the server can take requests.
	// +optional
	ReadinessProbe *corev1.Probe `json:"readinessProbe,omitempty"`

	// startupProbe holds the other probes back while a large model loads.
	// +optional
	StartupProbe *corev1.Probe `json:"startupProbe,omitempty"`
}

// RequestLimits bound the requests one pod takes.
type RequestLimits struct {
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConcurrentRequests *int32 `json:"maxConcurrentRequests,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxQueueSize *int32 `json:"maxQueueSize,omitempty"`
	// +kubebuilder:default=429
	// +kubebuilder:validation:Minimum=400
	// +kubebuilder:validation:Maximum=599
	// +optional
	OverflowStatusCode *int32 `json:"overflowStatusCode,omitempty"`
}

// ModelInvocationPort is the port the inference server listens on.
type ModelInvocationPort struct {
	// containerPort is the port number, 1-65535.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ContainerPort int32 `json:"containerPort"`

	// name is the port's protocol: http (the default) or grpc.
	// +optional
	// +kubebuilder:default=http
	// +kubebuilder:validation:Pattern=`^http$|^grpc$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^http$|^grpc$')`,message="modelInvocationPort.name must be http or grpc"
	Name string `json:"name,omitempty"`
}

// ModelVolumeMount is where the model's files appear inside the inference container.
type ModelVolumeMount struct {
	// name is the volume's name.
	// +required
	Name string `json:"name"`

	// mountPath is the directory inside the container; default /opt/ml/model.
	// +optional
	// +kubebuilder:default="/opt/ml/model"
	MountPath string `json:"mountPath,omitempty"`
}

// Tag is a name/value pair, accepted for compatibility.
type Tag struct {
	// name is the tag's name.
	// +required
	Name string `json:"name"`
	// value is the tag's value.
	// +required
	Value string `json:"value"`
}

// NameValue is a name and a value.
type NameValue struct {
	// +required
	Name string `json:"name"`
	// +required
	Value string `json:"value"`
}

// KubernetesSpec is what the inference pods take from the parent beyond the worker: init
// containers that run before prewarm's own, extra volumes (the model's volume for
// modelSourceType kubernetesVolume), the service account and the scheduler.
type KubernetesSpec struct {
	// initContainers run, in order, before prewarm's init container and the worker.
	// +optional
	InitContainers []corev1.Container `json:"initContainers,omitempty"`

	// volumes are added to the pods; the worker mounts the one named by
	// worker.modelVolumeMount.name when modelSourceType is kubernetesVolume.
	// +optional
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// serviceAccountName is the pods' service account.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')`,message="serviceAccountName must be a ServiceAccount's name: lower-case letters, digits, '-' and '.', e.g. model-server"
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// schedulerName is the scheduler that places the pods.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')`,message="schedulerName must be a scheduler's name: lower-case letters, digits, '-' and '.', e.g. default-scheduler"
	SchedulerName string `json:"schedulerName,omitempty"`
}
