package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SageMakerEndpointRegistrationSpec is HyperPod's registration of an endpoint with SageMaker.
// prewarm accepts it with HyperPod's schema and registers nothing: registering needs SageMaker.
type SageMakerEndpointRegistrationSpec struct {
	// +required
	EKSClusterDetails EKSClusterDetails `json:"eksClusterDetails"`
	// +kubebuilder:validation:MinLength=20
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$')`,message="executionRole must be an IAM role ARN, e.g. arn:aws:iam::111122223333:role/model-role"
	// +required
	ExecutionRole string `json:"executionRole"`
	// +kubebuilder:validation:MaxLength=255
	// +required
	ImageURI string `json:"imageUri"`
	// +required
	InstanceType string `json:"instanceType"`
	// +kubebuilder:default="invocations"
	// +optional
	InvocationEndpoint string `json:"invocationEndpoint,omitempty"`
	// +required
	LoadBalancerHostName string `json:"loadBalancerHostName"`
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}')`,message="name must start with a letter or digit, e.g. llama-endpoint"
	// +required
	Name string `json:"name"`
	// +required
	RestAPIID string `json:"restApiId"`
	// sageMakerEndpointDataCaptureConfig is in v1 only.
	// +optional
	SageMakerEndpointDataCaptureConfig *EndpointDataCaptureConfig `json:"sageMakerEndpointDataCaptureConfig,omitempty"`
	// +optional
	Tags []NameValue `json:"tags,omitempty"`
	// +required
	TLSConfig RegistrationTLSConfig `json:"tlsConfig"`
}

// EKSClusterDetails names the EKS cluster of a registration.
type EKSClusterDetails struct {
	// +required
	ARN string `json:"arn"`
	// +required
	ClusterSecurityGroupID string `json:"clusterSecurityGroupId"`
	// +required
	Name string `json:"name"`
	// +required
	SecurityGroupIDs []string `json:"securityGroupIds"`
	// +required
	SubnetIDs []string `json:"subnetIds"`
	// +required
	VPCID string `json:"vpcId"`
}

// EndpointDataCaptureConfig is data capture at a registered SageMaker endpoint.
type EndpointDataCaptureConfig struct {
	// +optional
	CaptureContentTypeHeader *CaptureContentTypeHeader `json:"captureContentTypeHeader,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +required
	CaptureOptions []CaptureOption `json:"captureOptions"`
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^s3://([^/]+)(/.*)?$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^s3://([^/]+)(/.*)?$')`,message="destinationS3Uri must look like s3://bucket/prefix"
	// +required
	DestinationS3URI string `json:"destinationS3Uri"`
	// +required
	Enabled bool `json:"enabled"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +required
	InitialSamplingPercentage int32 `json:"initialSamplingPercentage"`
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9:/_-]*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9:/_-]*$')`,message="kmsKeyId must be a KMS key id or ARN: letters, digits, ':', '/', '_' and '-', e.g. arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	// +optional
	KMSKeyID string `json:"kmsKeyId,omitempty"`
}

// RegistrationTLSConfig is where a registration's TLS certificate is.
type RegistrationTLSConfig struct {
	// +required
	TLSCertificateOutputS3Bucket string `json:"tlsCertificateOutputS3Bucket"`
	// +required
	TLSCertificateS3Keys []string `json:"tlsCertificateS3Keys"`
	// +optional
	TLSServerNameOverride string `json:"tlsServerNameOverride,omitempty"`
}

// RegistrationEndpoint is the registered SageMaker endpoint.
type RegistrationEndpoint struct {
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint/.*|^$)`
	// +required
	ARN string `json:"arn"`
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint-config/.*|^$)`
	// +required
	ConfigARN string `json:"configArn"`
	// +optional
	LastModifiedTime *metav1.Time `json:"lastModifiedTime,omitempty"`
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:model/.*|^$)`
	// +required
	ModelARN string `json:"modelArn"`
}

// RegistrationLoadBalancer is the load balancer a registration points at.
type RegistrationLoadBalancer struct {
	// +required
	HostName string `json:"hostName"`
}

// RegistrationState is a registration's state as HyperPod names it.
// +kubebuilder:validation:Enum=CreationInProgress;CreationFailed;CreationCompleted;DeletionInProgress;DeletionFailed;DeletionCompleted;UpdateInProgress;UpdateFailed;UpdateCompleted
type RegistrationState string

// RegistrationCreationFailed is the state of every registration prewarm reads.
const RegistrationCreationFailed RegistrationState = "CreationFailed"

// SageMakerEndpointRegistrationStatus is HyperPod's status of a registration.
type SageMakerEndpointRegistrationStatus struct {
	// state is CreationFailed: prewarm registers nothing (see the Registered condition).
	// +required
	State RegistrationState `json:"state"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	Endpoint *RegistrationEndpoint `json:"endpoint,omitempty"`
	// +optional
	LoadBalancer *RegistrationLoadBalancer `json:"loadBalancer,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=prewarm
// +kubebuilder:metadata:labels="prewarm.io/api=true"

// SageMakerEndpointRegistration is HyperPod's registration of an endpoint with SageMaker,
// accepted here with HyperPod's schema; its Registered condition says that registering with
// SageMaker is not available off SageMaker.
type SageMakerEndpointRegistration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SageMakerEndpointRegistrationSpec `json:"spec"`
	// +optional
	Status SageMakerEndpointRegistrationStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SageMakerEndpointRegistrationList is a list of SageMakerEndpointRegistration.
type SageMakerEndpointRegistrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SageMakerEndpointRegistration `json:"items"`
}
