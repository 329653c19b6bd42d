package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HyperPodFeatures are the blocks of HyperPod's spec, shared by InferenceEndpointConfig and
// JumpStartModel, that prewarm accepts and validates but does not act on: each that asks for its
// feature is named in the parent's Unsupported condition.
type HyperPodFeatures struct {
	// tlsConfig is HyperPod's TLS certificate handling.
	// +optional
	TLSConfig *TLSConfig `json:"tlsConfig,omitempty"`

	// autoScalingSpec is HyperPod's KEDA autoscaling; scale through the scale subresource instead.
	// +optional
	AutoScalingSpec *AutoScalingSpec `json:"autoScalingSpec,omitempty"`

	// metrics is HyperPod's metrics scraping.
	// +optional
	Metrics *Metrics `json:"metrics,omitempty"`

	// loadBalancer is HyperPod's ALB; no load balancer is created here (a Service serves the model).
	// +optional
	LoadBalancer *LoadBalancer `json:"loadBalancer,omitempty"`

	// intelligentRoutingSpec is HyperPod's KV-cache-aware router.
	// +optional
	IntelligentRoutingSpec *IntelligentRoutingSpec `json:"intelligentRoutingSpec,omitempty"`

	// kvCacheSpec is HyperPod's tiered KV cache.
	// +optional
	KVCacheSpec *KVCacheSpec `json:"kvCacheSpec,omitempty"`

	// dataCapture is HyperPod's capture of requests and responses.
	// +optional
	DataCapture *DataCapture `json:"dataCapture,omitempty"`

	// dnsConfig is HyperPod's Route 53 record.
	// +optional
	DNSConfig *DNSConfig `json:"dnsConfig,omitempty"`
}

// The blocks below are HyperPod's, field for field, with its types, defaults and validation, so
// that every manifest written for HyperPod is accepted here and a malformed one is refused the same
// way. prewarm does not act on them: a parent that sets one gets an Unsupported condition and an
// event naming it (docs/hyperpod-compatibility.md lists every field and what prewarm does with it).
//
// Beside each of HyperPod's patterns here and in the other types, a CEL rule of the same pattern
// says what to write (the pattern's own refusal says only "should match '<pattern>'"). It refuses
// nothing the pattern accepts, and leaves values over 64 Ki characters to the pattern alone so
// that its cost never refuses one either (test/compat checks each rule is its pattern's twin).

// CloudWatchDimension is one dimension of a CloudWatch metric.
type CloudWatchDimension struct {
	// +required
	Name string `json:"name"`
	// +required
	Value string `json:"value"`
}

// CloudWatchTrigger scales on a CloudWatch metric (HyperPod, through KEDA).
type CloudWatchTrigger struct {
	// +kubebuilder:default=0
	// +optional
	ActivationTargetValue *float64 `json:"activationTargetValue,omitempty"`
	// +optional
	Dimensions []CloudWatchDimension `json:"dimensions,omitempty"`
	// +kubebuilder:default=300
	// +optional
	MetricCollectionPeriod *int32 `json:"metricCollectionPeriod,omitempty"`
	// +kubebuilder:default=300
	// +optional
	MetricCollectionStartTime *int32 `json:"metricCollectionStartTime,omitempty"`
	// +optional
	MetricName *string `json:"metricName,omitempty"`
	// +kubebuilder:default="Average"
	// +optional
	MetricStat *string `json:"metricStat,omitempty"`
	// +kubebuilder:validation:Enum=Value;Average
	// +kubebuilder:default="Average"
	// +optional
	MetricType *string `json:"metricType,omitempty"`
	// +kubebuilder:default=0
	// +optional
	MinValue *float64 `json:"minValue,omitempty"`
	// +optional
	Name *string `json:"name,omitempty"`
	// +optional
	Namespace *string `json:"namespace,omitempty"`
	// +optional
	TargetValue *float64 `json:"targetValue,omitempty"`
	// +kubebuilder:default=true
	// +optional
	UseCachedMetrics *bool `json:"useCachedMetrics,omitempty"`
}

// PrometheusTrigger scales on an Amazon Managed Prometheus query (HyperPod, through KEDA).
type PrometheusTrigger struct {
	// +kubebuilder:default=0
	// +optional
	ActivationTargetValue *float64 `json:"activationTargetValue,omitempty"`
	// +optional
	CustomHeaders *string `json:"customHeaders,omitempty"`
	// +kubebuilder:validation:Enum=Value;Average
	// +kubebuilder:default="Average"
	// +optional
	MetricType *string `json:"metricType,omitempty"`
	// +optional
	Name *string `json:"name,omitempty"`
	// +optional
	Namespace *string `json:"namespace,omitempty"`
	// +optional
	Query *string `json:"query,omitempty"`
	// +kubebuilder:validation:Pattern=`^https:\/\/aps-workspaces\.[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*\.amazonaws\.com\/workspaces\/ws-[a-zA-Z0-9-]+$|^$`
	// +optional
	ServerAddress *string `json:"serverAddress,omitempty"`
	// +optional
	TargetValue *float64 `json:"targetValue,omitempty"`
	// +kubebuilder:default=true
	// +optional
	UseCachedMetrics *bool `json:"useCachedMetrics,omitempty"`
}

// AutoScalingSpec is HyperPod's KEDA-based autoscaling. prewarm does not act on it: scale through
// the scale subresource (e.g. with a HorizontalPodAutoscaler or KEDA pointed at it).
type AutoScalingSpec struct {
	// +optional
	CloudWatchTrigger *CloudWatchTrigger `json:"cloudWatchTrigger,omitempty"`
	// +kubebuilder:validation:MaxItems=100
	// +optional
	CloudWatchTriggerList []CloudWatchTrigger `json:"cloudWatchTriggerList,omitempty"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	CooldownPeriod *int32 `json:"cooldownPeriod,omitempty"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=0
	// +optional
	PollingInterval *int32 `json:"pollingInterval,omitempty"`
	// +optional
	PrometheusTrigger *PrometheusTrigger `json:"prometheusTrigger,omitempty"`
	// +kubebuilder:validation:MaxItems=100
	// +optional
	PrometheusTriggerList []PrometheusTrigger `json:"prometheusTriggerList,omitempty"`
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=0
	// +optional
	ScaleDownStabilizationTime *int32 `json:"scaleDownStabilizationTime,omitempty"`
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +optional
	ScaleUpStabilizationTime *int32 `json:"scaleUpStabilizationTime,omitempty"`
}

// LoadBalancerCapture turns data capture at the load balancer on or off.
type LoadBalancerCapture struct {
	// +required
	Enabled bool `json:"enabled"`
}

// CaptureBufferConfig is how captured data is batched.
type CaptureBufferConfig struct {
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	BatchSize *int32 `json:"batchSize,omitempty"`
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=300
	// +optional
	FlushIntervalSeconds *int32 `json:"flushIntervalSeconds,omitempty"`
}

// CaptureContentTypeHeader lists the content types captured as CSV or JSON.
type CaptureContentTypeHeader struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10
	// +listType=set
	// +optional
	CsvContentTypes []string `json:"csvContentTypes,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10
	// +listType=set
	// +optional
	JsonContentTypes []string `json:"jsonContentTypes,omitempty"`
}

// CaptureOption says whether requests or responses are captured.
type CaptureOption struct {
	// +kubebuilder:validation:Enum=Input;Output
	// +required
	CaptureMode string `json:"captureMode"`
}

// CapturePayloadConfig bounds the captured payloads.
type CapturePayloadConfig struct {
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10240
	// +optional
	MaxPayloadSizeKB *int32 `json:"maxPayloadSizeKB,omitempty"`
}

// ModelPodCapture is data capture in the model pods: the endpoint's settings, and how captured
// data is batched and bounded.
type ModelPodCapture struct {
	SageMakerEndpointCapture `json:",inline"`
	// +optional
	BufferConfig *CaptureBufferConfig `json:"bufferConfig,omitempty"`
	// +optional
	PayloadConfig *CapturePayloadConfig `json:"payloadConfig,omitempty"`
}

// SageMakerEndpointCapture is data capture at the registered SageMaker endpoint.
type SageMakerEndpointCapture struct {
	// +optional
	CaptureContentTypeHeader *CaptureContentTypeHeader `json:"captureContentTypeHeader,omitempty"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +optional
	CaptureOptions []CaptureOption `json:"captureOptions,omitempty"`
	// +required
	Enabled bool `json:"enabled"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	InitialSamplingPercentage *int32 `json:"initialSamplingPercentage,omitempty"`
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9:/_-]*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-zA-Z0-9:/_-]*$')`,message="kmsKeyId must be a KMS key id or ARN: letters, digits, ':', '/', '_' and '-', e.g. arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	KMSKeyID *string `json:"kmsKeyId,omitempty"`
}

// DataCapture is HyperPod's capture of requests and responses to S3. prewarm does not act on it.
type DataCapture struct {
	// +optional
	LoadBalancer *LoadBalancerCapture `json:"loadBalancer,omitempty"`
	// +optional
	ModelPod *ModelPodCapture `json:"modelPod,omitempty"`
	// +kubebuilder:validation:Pattern=`^s3://([^/]+)(/[^,=]*)?$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^s3://([^/]+)(/[^,=]*)?$')`,message="s3Uri must look like s3://bucket/prefix, with no ',' or '=' in the prefix"
	// +kubebuilder:validation:MaxLength=512
	// +optional
	S3URI *string `json:"s3Uri,omitempty"`
	// +optional
	SagemakerEndpoint *SageMakerEndpointCapture `json:"sagemakerEndpoint,omitempty"`
}

// DNSConfig is HyperPod's Route 53 record for the endpoint. prewarm does not act on it.
type DNSConfig struct {
	// +kubebuilder:validation:Pattern=`^Z[A-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^Z[A-Z0-9]+$')`,message="hostedZoneId must be a Route 53 hosted zone id: Z and upper-case letters or digits, e.g. Z0123456789ABCDEFGHIJ"
	// +required
	HostedZoneID string `json:"hostedZoneId"`
}

// IntelligentRoutingSpec is HyperPod's KV-cache-aware request router. prewarm does not act on it.
type IntelligentRoutingSpec struct {
	// +optional
	AutoScalingSpec *AutoScalingSpec `json:"autoScalingSpec,omitempty"`
	// +kubebuilder:default=false
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +kubebuilder:validation:Enum=prefixaware;kvaware;session;roundrobin
	// +kubebuilder:default="prefixaware"
	// +optional
	RoutingStrategy *string `json:"routingStrategy,omitempty"`
}

// L2CacheSpec is the second tier of the KV cache.
type L2CacheSpec struct {
	// +kubebuilder:validation:Pattern=`(?i)redis|tieredstorage`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'(?i)redis|tieredstorage')`,message="l2CacheBackend must name redis or tieredstorage"
	// +optional
	L2CacheBackend *string `json:"l2CacheBackend,omitempty"`
	// +optional
	L2CacheLocalURL *string `json:"l2CacheLocalUrl,omitempty"`
}

// KVCacheSpec is HyperPod's tiered KV cache. prewarm does not act on it.
type KVCacheSpec struct {
	// +optional
	CacheConfigFile *string `json:"cacheConfigFile,omitempty"`
	// +kubebuilder:default=true
	// +optional
	EnableL1Cache *bool `json:"enableL1Cache,omitempty"`
	// +kubebuilder:default=false
	// +optional
	EnableL2Cache *bool `json:"enableL2Cache,omitempty"`
	// +optional
	L2CacheSpec *L2CacheSpec `json:"l2CacheSpec,omitempty"`
}

// LoadBalancer is HyperPod's Application Load Balancer. prewarm does not create one: it serves the
// model through a Service.
type LoadBalancer struct {
	// +kubebuilder:default="/ping"
	// +kubebuilder:validation:Pattern=`^/.*`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^/.*')`,message="healthCheckPath must be a path starting with /, e.g. /ping"
	// +optional
	HealthCheckPath *string `json:"healthCheckPath,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4000
	// +optional
	IdleTimeoutSeconds *int32 `json:"idleTimeoutSeconds,omitempty"`
	// +kubebuilder:validation:Enum=least_outstanding_requests;round_robin
	// +kubebuilder:default="least_outstanding_requests"
	// +optional
	RoutingAlgorithm *string `json:"routingAlgorithm,omitempty"`
}

// ModelMetrics is where the model server publishes its metrics.
type ModelMetrics struct {
	// +kubebuilder:default="/metrics"
	// +kubebuilder:validation:Pattern=`^/[a-zA-Z0-9\-_.\/]*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^/[a-zA-Z0-9\-_.\/]*$')`,message="path must be a path starting with /, of letters, digits, '-', '_', '.' and '/', e.g. /metrics"
	// +optional
	Path *string `json:"path,omitempty"`
	// +kubebuilder:default=8080
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port *int32 `json:"port,omitempty"`
}

// Metrics is HyperPod's metrics scraping. prewarm does not act on it.
type Metrics struct {
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=300
	// +optional
	MetricsScrapeIntervalSeconds *int32 `json:"metricsScrapeIntervalSeconds,omitempty"`
	// +optional
	ModelMetrics *ModelMetrics `json:"modelMetrics,omitempty"`
}

// PDAutoScalingSpec scales the prefill and decode workers apart.
type PDAutoScalingSpec struct {
	// +optional
	DecodingAutoScaling *AutoScalingSpec `json:"decodingAutoScaling,omitempty"`
	// +optional
	PrefillAutoScaling *AutoScalingSpec `json:"prefillAutoScaling,omitempty"`
}

// PDWorkerSpec is one side of a disaggregated deployment: prefill or decode workers.
type PDWorkerSpec struct {
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// PDTopologySpec is where the prefill and decode workers run relative to each other.
type PDTopologySpec struct {
	// +optional
	AvailabilityZone *string `json:"availabilityZone,omitempty"`
	// +optional
	PlacementGroup *string `json:"placementGroup,omitempty"`
	// +kubebuilder:default=true
	// +optional
	SameAZ *bool `json:"sameAZ,omitempty"`
}

// PDSpec is HyperPod's prefill/decode disaggregation. prewarm does not act on it.
type PDSpec struct {
	// +optional
	AutoScalingSpec *PDAutoScalingSpec `json:"autoScalingSpec,omitempty"`
	// +required
	DecodingSpec PDWorkerSpec `json:"decodingSpec"`
	// +required
	PrefillSpec PDWorkerSpec `json:"prefillSpec"`
	// +kubebuilder:default=4096
	// +kubebuilder:validation:Minimum=0
	// +optional
	RoutingThreshold *int32 `json:"routingThreshold,omitempty"`
	// +optional
	TopologySpec *PDTopologySpec `json:"topologySpec,omitempty"`
}

// CustomCertificateConfig is an ACM certificate for the endpoint.
type CustomCertificateConfig struct {
	// +kubebuilder:validation:Pattern=`^arn:aws:acm:[a-z0-9-]+:[0-9]{12}:certificate/[a-fA-F0-9-]+$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^arn:aws:acm:[a-z0-9-]+:[0-9]{12}:certificate/[a-fA-F0-9-]+$')`,message="acmArn must be an ACM certificate ARN, e.g. arn:aws:acm:us-west-2:111122223333:certificate/12345678-1234-1234-1234-123456789012"
	// +required
	ACMArn string `json:"acmArn"`
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$')`,message="domainName must be a lower-case DNS name, e.g. model.example.com"
	// +kubebuilder:validation:MaxLength=253
	// +required
	DomainName string `json:"domainName"`
}

// TLSConfig is HyperPod's TLS certificate handling. prewarm does not act on it.
type TLSConfig struct {
	// +optional
	CustomCertificateConfig *CustomCertificateConfig `json:"customCertificateConfig,omitempty"`
	// +kubebuilder:validation:Pattern=`^s3://([^/]+)/?(.*)$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^s3://([^/]+)/?(.*)$')`,message="tlsCertificateOutputS3Uri must look like s3://bucket/prefix"
	// +optional
	TLSCertificateOutputS3URI *string `json:"tlsCertificateOutputS3Uri,omitempty"`
}

// ModelPodCaptureStatus is the health of data capture in the model pods.
type ModelPodCaptureStatus struct {
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +kubebuilder:validation:Enum=Healthy;Unhealthy
	// +required
	Status string `json:"status"`
}

// DataCaptureStatus is HyperPod's data capture status; prewarm does not set it.
type DataCaptureStatus struct {
	// +optional
	ModelPod *ModelPodCaptureStatus `json:"modelPod,omitempty"`
}

// DNSStatus is HyperPod's Route 53 status; prewarm does not set it.
type DNSStatus struct {
	// +kubebuilder:validation:Enum=Active;Pending;Error
	// +optional
	DNSHealth string `json:"dnsHealth,omitempty"`
	// +optional
	HostedZoneID string `json:"hostedZoneId,omitempty"`
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// +required
	ManagedByOperator bool `json:"managedByOperator"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	PreviousHostedZoneId string `json:"previousHostedZoneId,omitempty"`
	// +optional
	PreviousRecordName string `json:"previousRecordName,omitempty"`
	// +optional
	RecordName string `json:"recordName,omitempty"`
}

// SageMakerEndpointStatus is a registered SageMaker endpoint.
type SageMakerEndpointStatus struct {
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint-config/.*|^$)`
	// +optional
	ConfigARN string `json:"configArn,omitempty"`
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint/.*|^$)`
	// +optional
	EndpointARN string `json:"endpointArn,omitempty"`
	// +kubebuilder:validation:Pattern=`(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:model/.*|^$)`
	// +optional
	ModelARN string `json:"modelArn,omitempty"`
	// +required
	State string `json:"state"`
}

// EndpointsStatus lists the endpoints registered for the model; prewarm registers none.
type EndpointsStatus struct {
	// +optional
	Sagemaker *SageMakerEndpointStatus `json:"sagemaker,omitempty"`
}

// ModelMetricsStatus is where metrics are scraped from.
type ModelMetricsStatus struct {
	// +optional
	Path string `json:"path,omitempty"`
	// +optional
	Port int32 `json:"port,omitempty"`
}

// MetricsStatus is HyperPod's metrics status; prewarm does not set it.
type MetricsStatus struct {
	// +required
	Enabled bool `json:"enabled"`
	// +optional
	ErrorMessage string `json:"errorMessage,omitempty"`
	// +optional
	MetricsScrapeIntervalSeconds int32 `json:"metricsScrapeIntervalSeconds,omitempty"`
	// +optional
	ModelMetrics *ModelMetricsStatus `json:"modelMetrics,omitempty"`
	// +optional
	State string `json:"state,omitempty"`
}

// TLSCertificateStatus is HyperPod's certificate status; prewarm does not set it.
type TLSCertificateStatus struct {
	// +kubebuilder:validation:Pattern=`arn:aws[a-z\-]*:acm:[a-z0-9\-]*:[0-9]{12}:certificate/.*`
	// +optional
	CertificateARN string `json:"certificateARN,omitempty"`
	// +optional
	CertificateDomainNames []string `json:"certificateDomainNames,omitempty"`
	// +kubebuilder:validation:Enum=Valid;Expiring;Expired
	// +optional
	CertificateHealth string `json:"certificateHealth,omitempty"`
	// +optional
	CertificateName string `json:"certificateName,omitempty"`
	// +optional
	ImportedCertificates []string `json:"importedCertificates,omitempty"`
	// +optional
	IssuerName string `json:"issuerName,omitempty"`
	// +optional
	LastCertExpiryTime *metav1.Time `json:"lastCertExpiryTime,omitempty"`
	// +optional
	TLSCertificateOutputS3Bucket string `json:"tlsCertificateOutputS3Bucket,omitempty"`
	// +optional
	TLSCertificateS3Keys []string `json:"tlsCertificateS3Keys,omitempty"`
}

// SageMakerEndpoint is the SageMaker endpoint HyperPod registers for a JumpStartModel. prewarm does
// not register one.
type SageMakerEndpoint struct {
	// +kubebuilder:default=""
	// +kubebuilder:validation:Pattern=`^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$`
	// +kubebuilder:validation:XValidation:rule=`size(self) > 65536 || self.matches(r'^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$')`,message="name must be letters, digits and hyphens, starting and ending with a letter or digit, e.g. llama-endpoint"
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Name *string `json:"name,omitempty"`
}

// ServerValidations are the checks HyperPod makes before it deploys.
type ServerValidations struct {
	// +kubebuilder:default=true
	// +optional
	AcceleratorPartitionValidation *bool `json:"acceleratorPartitionValidation,omitempty"`
}
