package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InferenceEndpointConfigSpec is a model to serve: where its files are, which image serves it,
// on which nodes, and what to cache there. Its fields are HyperPod's; tolerations are prewarm's
// own.
// +kubebuilder:validation:XValidation:rule="has(self.instanceType) || has(self.instanceTypes) || has(self.nodeAffinity)",message="one of instanceType, instanceTypes or nodeAffinity is required to say which nodes serve the model"
type InferenceEndpointConfigSpec struct {
	// modelName is the model's name.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}')`,message="modelName must start with a letter or digit, e.g. llama-3-8b"
	ModelName string `json:"modelName"`

	// modelVersion is the model's version, accepted for compatibility.
	// +optional
	ModelVersion string `json:"modelVersion,omitempty"`

	// modelSourceConfig says where the model's files are.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 's3' || has(self.s3Storage)",message="modelSourceType s3 needs s3Storage with bucketName"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'fsx' || has(self.fsxStorage)",message="modelSourceType fsx needs fsxStorage with fileSystemId"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'huggingface' || has(self.huggingFaceModel)",message="modelSourceType huggingface needs huggingFaceModel with modelId"
	// +kubebuilder:validation:XValidation:rule="self.modelSourceType != 'fsx' || !has(self.modelLocation) || !self.modelLocation.matches('(^|/)[.][.](/|$)')",message="modelLocation of an fsx source must not contain '..': it would leave the file system"
	ModelSourceConfig ModelSourceConfig `json:"modelSourceConfig"`

	// modelCacheConfig turns node-local caching of the weights and the image on or off.
	// +optional
	ModelCacheConfig *ModelCacheConfig `json:"modelCacheConfig,omitempty"`

	// instanceType places the model on nodes whose node.kubernetes.io/instance-type label has
	// this value, e.g. ml.g5.24xlarge. It and instanceTypes are mutually exclusive (a parent with
	// both is refused, InvalidSpec). With nodeAffinity too, a node must satisfy both.
	// +optional
	// +kubebuilder:validation:Pattern=`^ml\..*`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^ml\..*')`,message="instanceType must look like ml.g5.24xlarge: ml. and the instance type"
	InstanceType string `json:"instanceType,omitempty"`

	// instanceTypes places the model on nodes of any of these instance types.
	// +optional
	InstanceTypes []string `json:"instanceTypes,omitempty"`

	// nodeAffinity places the model on the nodes it selects (its required terms choose the
	// target nodes; its preferred terms are passed to the pods).
	// +optional
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity,omitempty"`

	// tolerations let the model's pods, and the cache workers, run on tainted nodes.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// replicas is the number of inference pods; default 1. The scale subresource sets it.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// InitialReplicaCount is HyperPod's replica count before autoscaling takes over; with no
	// autoscaling here, replicas is what counts.
	// +optional
	InitialReplicaCount *int32 `json:"InitialReplicaCount,omitempty"`

	// maxDeployTimeInSeconds is how long the Deployment may take to become available before the
	// parent reports it failed (DeploymentFailed, reason DeploymentTimeout); default 3600.
	// +optional
	// +kubebuilder:default=3600
	MaxDeployTimeInSeconds *int32 `json:"maxDeployTimeInSeconds,omitempty"`

	// worker is the inference server container.
	// +required
	Worker Worker `json:"worker"`

	// kubernetes adds to the inference pods: init containers, volumes, the service account and
	// the scheduler.
	// +optional
	Kubernetes *KubernetesSpec `json:"kubernetes,omitempty"`

	// endpointName is HyperPod's SageMaker endpoint name; no SageMaker endpoint is registered
	// here.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$')`,message="endpointName must be letters, digits and hyphens, starting and ending with a letter or digit, e.g. llama-endpoint"
	EndpointName string `json:"endpointName,omitempty"`

	// invocationEndpoint is the request path of the model server; default "invocations".
	// +optional
	// +kubebuilder:default=invocations
	InvocationEndpoint string `json:"invocationEndpoint,omitempty"`

	// tags are HyperPod's AWS resource tags; they have no effect here.
	// +optional
	Tags []Tag `json:"tags,omitempty"`

	// HyperPod's blocks that prewarm accepts and validates but does not act on.
	HyperPodFeatures `json:",inline"`

	// pdSpec is HyperPod's; prewarm does not act on it.
	// +optional
	PDSpec *PDSpec `json:"pdSpec,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:printcolumn:name="STATE",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="REPLICAS",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`

// InferenceEndpointConfig deploys a model from S3, FSx, the Hugging Face Hub or a volume, with
// optional node-local caching of its weights and image.
type InferenceEndpointConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired deployment.
	// +required
	Spec InferenceEndpointConfigSpec `json:"spec"`
	// status is the observed deployment.
	// +optional
	Status ParentStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// InferenceEndpointConfigList is a list of InferenceEndpointConfig.
type InferenceEndpointConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceEndpointConfig `json:"items"`
}
