package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InferenceEndpointConfigSpec is a model to serve: where its files are, which image serves it,
// on which nodes, and what to cache there.
// +kubebuilder:validation:XValidation:rule="(has(self.instanceType) ? 1 : 0) + (has(self.instanceTypes) ? 1 : 0) + (has(self.nodeAffinity) ? 1 : 0) <= 1",message="instanceType, instanceTypes and nodeAffinity are mutually exclusive: set only one"
// +kubebuilder:validation:XValidation:rule="has(self.instanceType) || has(self.instanceTypes) || has(self.nodeAffinity)",message="one of instanceType, instanceTypes or nodeAffinity is required to say which nodes serve the model"
// +kubebuilder:validation:XValidation:rule="!(has(self.modelCacheConfig) && has(self.modelCacheConfig.weightsCache) && self.modelCacheConfig.weightsCache.enabled && self.modelSourceConfig.modelSourceType == 'kubernetesVolume')",message="weightsCache cannot be enabled for modelSourceType kubernetesVolume: the volume is mounted as it is; use s3, fsx or huggingface to cache on node disks"
type InferenceEndpointConfigSpec struct {
	// modelName is the model's name (lowercase letters, digits and '-', at most 63).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="modelName must be lowercase letters, digits and '-', starting and ending with a letter or digit"
	ModelName string `json:"modelName"`

	// modelVersion is the model's version, accepted for compatibility.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ModelVersion string `json:"modelVersion,omitempty"`

	// modelSourceConfig says where the model's files are.
	// +required
	ModelSourceConfig ModelSourceConfig `json:"modelSourceConfig"`

	// modelCacheConfig turns node-local caching of the weights and the image on or off.
	// +optional
	ModelCacheConfig *ModelCacheConfig `json:"modelCacheConfig,omitempty"`

	// instanceType places the model on nodes whose node.kubernetes.io/instance-type label has
	// this value, e.g. ml.g5.24xlarge.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^ml[.][a-z0-9-]+[.][a-z0-9]+$')",message="instanceType must look like ml.g5.24xlarge"
	InstanceType string `json:"instanceType,omitempty"`

	// instanceTypes places the model on nodes of any of these instance types.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.all(t, t.matches('^ml[.][a-z0-9-]+[.][a-z0-9]+$'))",message="every instanceTypes entry must look like ml.g5.24xlarge"
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
	// +kubebuilder:validation:Maximum=10000
	Replicas *int32 `json:"replicas,omitempty"`

	// worker is the inference server container.
	// +required
	Worker Worker `json:"worker"`

	// endpointName is accepted for compatibility; no SageMaker endpoint is registered here.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	EndpointName string `json:"endpointName,omitempty"`

	// invocationEndpoint is the request path of the model server; default "invocations".
	// +optional
	// +kubebuilder:default=invocations
	// +kubebuilder:validation:MaxLength=255
	InvocationEndpoint string `json:"invocationEndpoint,omitempty"`

	// tags are accepted for compatibility; they have no effect here.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	Tags []Tag `json:"tags,omitempty"`

	// tlsConfig is accepted for compatibility; TLS via ACM has no effect here.
	// +optional
	TLSConfig *Opaque `json:"tlsConfig,omitempty"`

	// autoScalingSpec is accepted for compatibility; scale through the scale subresource
	// (e.g. with a HorizontalPodAutoscaler) instead.
	// +optional
	AutoScalingSpec *Opaque `json:"autoScalingSpec,omitempty"`

	// metrics is accepted for compatibility; it has no effect here.
	// +optional
	Metrics *Opaque `json:"metrics,omitempty"`

	// loadBalancer is accepted for compatibility; no ALB is created here.
	// +optional
	LoadBalancer *Opaque `json:"loadBalancer,omitempty"`

	// intelligentRoutingSpec is accepted for compatibility; it has no effect here.
	// +optional
	IntelligentRoutingSpec *Opaque `json:"intelligentRoutingSpec,omitempty"`

	// kvCacheSpec is accepted for compatibility; KV-cache tiers have no effect here.
	// +optional
	KVCacheSpec *Opaque `json:"kvCacheSpec,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
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
