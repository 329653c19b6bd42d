package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JumpStartModelSpec is a catalog model to serve. Its fields are HyperPod's; tolerations are
// prewarm's own.
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
	Replicas *int32 `json:"replicas,omitempty"`

	// maxDeployTimeInSeconds is how long the Deployment may take to become available before the
	// model reports it failed (DeploymentFailed, reason DeploymentTimeout); default 3600.
	// +optional
	// +kubebuilder:default=3600
	MaxDeployTimeInSeconds *int32 `json:"maxDeployTimeInSeconds,omitempty"`

	// tolerations let the model's pods, and the cache workers, run on tainted nodes.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// environmentVariables are added to the catalog's for the inference container.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	EnvironmentVariables []NameValue `json:"environmentVariables,omitempty"`

	// sageMakerEndpoint is HyperPod's; no SageMaker endpoint is registered here.
	// +optional
	SageMakerEndpoint *SageMakerEndpoint `json:"sageMakerEndpoint,omitempty"`

	// HyperPod's blocks that prewarm accepts and validates but does not act on.
	HyperPodFeatures `json:",inline"`
}

// JumpStartModelRef names a model in the catalog.
type JumpStartModelRef struct {
	// modelId is the catalog id, e.g. meta-textgeneration-llama-3-1-8b-instruct.
	// +required
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$')`,message="modelId must be a JumpStart model id: letters, digits and hyphens, e.g. meta-textgeneration-llama-3-1-8b-instruct"
	ModelID string `json:"modelId"`

	// acceptEula accepts the model's end-user licence; gated models need it to be true.
	// +required
	// +kubebuilder:default=false
	AcceptEula bool `json:"acceptEula"`

	// modelHubName is the hub the model comes from; default SageMakerPublicHub.
	// +optional
	// +kubebuilder:default=SageMakerPublicHub
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$')`,message="modelHubName must be letters, digits and hyphens, e.g. SageMakerPublicHub"
	ModelHubName string `json:"modelHubName,omitempty"`

	// modelVersion is the catalog version (e.g. 2.1.0); default the newest.
	// +optional
	// +kubebuilder:validation:MinLength=5
	// +kubebuilder:validation:MaxLength=14
	// +kubebuilder:validation:Pattern=`^\d{1,4}.\d{1,4}.\d{1,4}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^\d{1,4}.\d{1,4}.\d{1,4}$')`,message="modelVersion must be three numbers, e.g. 2.1.0; leave it empty for the newest"
	ModelVersion string `json:"modelVersion,omitempty"`

	// gatedModelDownloadRole is HyperPod's IAM role for gated models; it has no effect here
	// (the catalog's token Secret is used).
	// +optional
	// +kubebuilder:validation:MinLength=20
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$')`,message="gatedModelDownloadRole must be an IAM role ARN, e.g. arn:aws:iam::111122223333:role/model-role"
	GatedModelDownloadRole string `json:"gatedModelDownloadRole,omitempty"`

	// additionalConfigs are passed to the inference container as environment variables, after
	// the catalog's and before environmentVariables.
	// +optional
	// +kubebuilder:validation:MaxItems=10
	AdditionalConfigs []NameValue `json:"additionalConfigs,omitempty"`
}

// JumpStartServer says where a JumpStart model runs.
type JumpStartServer struct {
	// instanceType places the model on nodes of this instance type, e.g. ml.g5.24xlarge.
	// +required
	// +kubebuilder:validation:Pattern=`^ml\..*`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^ml\..*')`,message="instanceType must look like ml.g5.24xlarge: ml. and the instance type"
	InstanceType string `json:"instanceType"`

	// executionRole is HyperPod's IAM role; it has no effect here.
	// +optional
	// +kubebuilder:validation:MinLength=20
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$')`,message="executionRole must be an IAM role ARN, e.g. arn:aws:iam::111122223333:role/model-role"
	ExecutionRole string `json:"executionRole,omitempty"`

	// acceleratorPartitionType is a MIG profile (e.g. mig-1g.10gb): the inference container
	// requests one nvidia.com/<profile> in place of whole GPUs.
	// +optional
	// +kubebuilder:validation:Pattern=`^mig-.*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^mig-.*$')`,message="acceleratorPartitionType must be a MIG profile, e.g. mig-1g.10gb"
	AcceleratorPartitionType string `json:"acceleratorPartitionType,omitempty"`

	// validations are HyperPod's pre-deployment checks.
	// +optional
	Validations *ServerValidations `json:"validations,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"
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
