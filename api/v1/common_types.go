package v1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// ModelSourceConfig says where the model's files are.
// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 's3' || has(self.s3Storage)",message="modelSourceType s3 needs s3Storage with bucketName and region"
// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'fsx' || has(self.fsxStorage)",message="modelSourceType fsx needs fsxStorage with fileSystemId"
// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'huggingface' || has(self.huggingFaceModel)",message="modelSourceType huggingface needs huggingFaceModel with modelId"
// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'kubernetesVolume' || has(self.kubernetesVolume)",message="modelSourceType kubernetesVolume needs kubernetesVolume with claimName"
// +kubebuilder:validation:XValidation:rule="!has(self.s3Storage) || self.modelSourceType == 's3'",message="s3Storage is set but modelSourceType is not s3"
// +kubebuilder:validation:XValidation:rule="!has(self.fsxStorage) || self.modelSourceType == 'fsx'",message="fsxStorage is set but modelSourceType is not fsx"
// +kubebuilder:validation:XValidation:rule="!has(self.huggingFaceModel) || self.modelSourceType == 'huggingface'",message="huggingFaceModel is set but modelSourceType is not huggingface"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetesVolume) || self.modelSourceType == 'kubernetesVolume'",message="kubernetesVolume is set but modelSourceType is not kubernetesVolume"
// +kubebuilder:validation:XValidation:rule="!has(self.modelLocation) || !self.modelLocation.contains('://')",message="modelLocation is a path inside the source, not a URL: put the bucket in s3Storage.bucketName and only the key prefix here"
// +kubebuilder:validation:XValidation:rule="!has(self.modelLocation) || !self.modelLocation.matches('(^|/)[.][.](/|$)')",message="modelLocation must not contain '..'"
// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 's3' || !has(self.modelLocation) || !self.modelLocation.startsWith('/')",message="modelLocation for s3 is a key prefix and must not start with '/'"
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

	// kubernetesVolume is the PersistentVolumeClaim that holds the model, for modelSourceType
	// kubernetesVolume.
	// +optional
	KubernetesVolume *KubernetesVolume `json:"kubernetesVolume,omitempty"`

	// modelLocation is the model's place inside the source: the key prefix in the bucket for
	// s3, the directory under the mount for fsx and kubernetesVolume.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ModelLocation string `json:"modelLocation,omitempty"`

	// prefetchEnabled is accepted for compatibility; it has no effect here.
	// +optional
	PrefetchEnabled *bool `json:"prefetchEnabled,omitempty"`
}

// S3Storage names an S3 bucket.
type S3Storage struct {
	// bucketName is the bucket's name (3-63 lowercase letters, digits, dots and hyphens).
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9][a-z0-9.-]*[a-z0-9]$')",message="bucketName must use only lowercase letters, digits, dots and hyphens, and begin and end with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="bucketName must not contain two adjacent dots"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$')",message="bucketName must not look like an IP address"
	BucketName string `json:"bucketName"`

	// region is the AWS region of the bucket, e.g. us-west-2.
	// +required
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z]{2}(-[a-z]+)+-[0-9]+$')",message="region must look like us-west-2"
	Region string `json:"region"`
}

// FSxStorage names an FSx for Lustre file system.
type FSxStorage struct {
	// fileSystemId is the file system's ID, e.g. fs-0123456789abcdef0.
	// +required
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^fs-[0-9a-f]{8,21}$')",message="fileSystemId must look like fs-0123456789abcdef0"
	FileSystemID string `json:"fileSystemId"`

	// dnsName is the file system's DNS name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	DNSName string `json:"dnsName,omitempty"`

	// mountName is the file system's mount name.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	MountName string `json:"mountName,omitempty"`
}

// HuggingFaceModel names a repository on the Hugging Face Hub.
type HuggingFaceModel struct {
	// modelId is the repository, as org/name (e.g. meta-llama/Llama-3.1-8B-Instruct).
	// +required
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$')",message="modelId must be org/name, e.g. meta-llama/Llama-3.1-8B-Instruct"
	// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="modelId must not contain '..'"
	ModelID string `json:"modelId"`

	// commitSHA pins the repository to one commit (40 hex digits). When empty, the default
	// branch is resolved once to a commit and that commit is used on every node.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{40}$')",message="commitSHA must be a full 40-character lowercase hex commit id"
	CommitSHA string `json:"commitSHA,omitempty"`

	// tokenSecretRef names a Secret, in the parent's namespace, that holds a Hub access token
	// for gated or private repositories.
	// +optional
	TokenSecretRef *SecretKeyRef `json:"tokenSecretRef,omitempty"`
}

// SecretKeyRef names one key of a Secret in the same namespace.
type SecretKeyRef struct {
	// name is the Secret's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key is the key inside the Secret; default "token".
	// +optional
	// +kubebuilder:default=token
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// KubernetesVolume names a PersistentVolumeClaim that holds the model.
type KubernetesVolume struct {
	// claimName is the PersistentVolumeClaim's name, in the parent's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClaimName string `json:"claimName"`
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
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="hostPath must be an absolute path, e.g. /opt/dlami/nvme"
	// +kubebuilder:validation:XValidation:rule="self != '/'",message="hostPath must not be the filesystem root"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="hostPath must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:cntrl:]]')",message="hostPath must not contain control characters"
	HostPath string `json:"hostPath,omitempty"`
}

// ImageCacheConfig configures the image cache.
type ImageCacheConfig struct {
	// enabled turns the image cache on; default false.
	// +optional
	// +kubebuilder:default=false
	Enabled bool `json:"enabled"`
}

// Worker describes the inference server container.
type Worker struct {
	// image is the inference server image.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.matches('[[:space:]]')",message="image must not contain whitespace"
	Image string `json:"image"`

	// modelInvocationPort is the port the server listens on for requests.
	// +required
	ModelInvocationPort ModelInvocationPort `json:"modelInvocationPort"`

	// modelVolumeMount is where the server finds the model's files.
	// +required
	ModelVolumeMount ModelVolumeMount `json:"modelVolumeMount"`

	// resources are the container's requests and limits (CPU, memory, GPUs).
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// environmentVariables are set in the container.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	EnvironmentVariables []EnvironmentVariable `json:"environmentVariables,omitempty"`

	// args are the arguments to the container's entrypoint.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Args []string `json:"args,omitempty"`

	// command replaces the container's entrypoint.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Command []string `json:"command,omitempty"`

	// readinessProbe tells when the server can take requests.
	// +optional
	ReadinessProbe *corev1.Probe `json:"readinessProbe,omitempty"`

	// livenessProbe tells when the server must be restarted.
	// +optional
	LivenessProbe *corev1.Probe `json:"livenessProbe,omitempty"`

	// startupProbe holds the other probes back while a large model loads.
	// +optional
	StartupProbe *corev1.Probe `json:"startupProbe,omitempty"`
}

// ModelInvocationPort is the port the inference server listens on.
type ModelInvocationPort struct {
	// containerPort is the port number, 1-65535.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ContainerPort int32 `json:"containerPort"`

	// name is the port's name (an IANA service name); default "http".
	// +optional
	// +kubebuilder:default=http
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([a-z0-9-]*[a-z0-9])?$') && self.matches('[a-z]') && !self.contains('--')",message="port name must be lowercase letters, digits and single hyphens, with at least one letter, at most 15 characters"
	Name string `json:"name,omitempty"`
}

// ModelVolumeMount is where the model's files appear inside the inference container.
type ModelVolumeMount struct {
	// name is the volume's name.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="modelVolumeMount.name must be a DNS label: lowercase letters, digits and '-'"
	Name string `json:"name"`

	// mountPath is the directory inside the container; default /opt/ml/model.
	// +optional
	// +kubebuilder:default="/opt/ml/model"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') && self != '/'",message="mountPath must be an absolute path other than /"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.](/|$)')",message="mountPath must not contain '..'"
	MountPath string `json:"mountPath,omitempty"`
}

// Tag is a name/value pair, accepted for compatibility.
type Tag struct {
	// name is the tag's name.
	// +required
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// value is the tag's value.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Value string `json:"value"`
}

// Opaque is a block accepted for compatibility with HyperPod whose content prewarm does not
// act on; a parent that sets one gets an Unsupported condition naming it.
// +kubebuilder:validation:Type=object
// +kubebuilder:pruning:PreserveUnknownFields
type Opaque struct {
	runtime.RawExtension `json:",inline"`
}

// EnvironmentVariable is a variable set in the inference container.
type EnvironmentVariable struct {
	// name is the variable's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-._a-zA-Z][-._a-zA-Z0-9]*$')",message="environment variable names must consist of letters, digits, '_', '-' or '.', and must not start with a digit"
	Name string `json:"name"`

	// value is the variable's value; variable references $(VAR) are expanded.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	Value string `json:"value,omitempty"`

	// valueFrom takes the value from a Secret, a ConfigMap or a field of the pod.
	// +optional
	ValueFrom *corev1.EnvVarSource `json:"valueFrom,omitempty"`
}
