package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JumpStartModelSpec is a catalog model to serve.
type JumpStartModelSpec struct {
	// model names the catalog model.
	// +required
	Model JumpStartModelRef `json:"model"`

	// server says where the model runs.
	// +required
	Server JumpStartServer `json:"server"`

	// modelCacheConfig turns node-local caching of the weights and the image on or off.
	// +optional
	ModelCacheConfig *ModelCacheConfig `json:"modelCacheConfig,omitempty"`

	// replicas is the number of inference pods; default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	Replicas *int32 `json:"replicas,omitempty"`

	// tolerations let the model's pods, and the cache workers, run on tainted nodes.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// environmentVariables are added to the catalog's for the inference container.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	EnvironmentVariables []EnvironmentVariable `json:"environmentVariables,omitempty"`

	// sageMakerEndpoint is accepted for compatibility; no SageMaker endpoint is registered here.
	// +optional
	SageMakerEndpoint *Opaque `json:"sageMakerEndpoint,omitempty"`

	// tlsConfig is accepted for compatibility; TLS via ACM has no effect here.
	// +optional
	TLSConfig *Opaque `json:"tlsConfig,omitempty"`

	// autoScalingSpec is accepted for compatibility; scale through replicas instead.
	// +optional
	AutoScalingSpec *Opaque `json:"autoScalingSpec,omitempty"`

	// metrics is accepted for compatibility; it has no effect here.
	// +optional
	Metrics *Opaque `json:"metrics,omitempty"`

	// intelligentRoutingSpec is accepted for compatibility; it has no effect here.
	// +optional
	IntelligentRoutingSpec *Opaque `json:"intelligentRoutingSpec,omitempty"`

	// kvCacheSpec is accepted for compatibility; KV-cache tiers have no effect here.
	// +optional
	KVCacheSpec *Opaque `json:"kvCacheSpec,omitempty"`
}

// JumpStartModelRef names a model in the catalog.
type JumpStartModelRef struct {
	// modelId is the catalog id, e.g. meta-textgeneration-llama-3-1-8b-instruct.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$')",message="modelId must be lowercase letters, digits, '.' and '-', e.g. meta-textgeneration-llama-3-1-8b-instruct"
	ModelID string `json:"modelId"`

	// acceptEula accepts the model's end-user licence; gated models need it to be true.
	// +optional
	// +kubebuilder:default=false
	AcceptEula bool `json:"acceptEula"`

	// modelHubName is the hub the model comes from; default SageMakerPublicHub.
	// +optional
	// +kubebuilder:default=SageMakerPublicHub
	// +kubebuilder:validation:MaxLength=256
	ModelHubName string `json:"modelHubName,omitempty"`

	// modelVersion is the catalog version (semantic, e.g. 2.1.0); default the newest.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]+([.][0-9]+){0,2}$|^[*]$')",message="modelVersion must be a version like 2.1.0 (or *)"
	ModelVersion string `json:"modelVersion,omitempty"`

	// gatedModelDownloadRole is accepted for compatibility; it has no effect here.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	GatedModelDownloadRole string `json:"gatedModelDownloadRole,omitempty"`
}

// JumpStartServer says where a JumpStart model runs.
type JumpStartServer struct {
	// instanceType places the model on nodes of this instance type, e.g. ml.g5.24xlarge.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^ml[.][a-z0-9-]+[.][a-z0-9]+$')",message="instanceType must look like ml.g5.24xlarge"
	InstanceType string `json:"instanceType"`

	// executionRole is accepted for compatibility; it has no effect here.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	ExecutionRole string `json:"executionRole,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model.modelId`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// JumpStartModel deploys a model from the JumpStart catalog, with optional node-local caching of
// its weights and image.
type JumpStartModel struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired deployment.
	// +required
	Spec JumpStartModelSpec `json:"spec"`
	// status is the observed deployment.
	// +optional
	Status ParentStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// JumpStartModelList is a list of JumpStartModel.
type JumpStartModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []JumpStartModel `json:"items"`
}
