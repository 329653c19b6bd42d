package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// InferenceGatewayConfig is the HyperPod inference add-on's gateway: body-based routing, an
// InferencePool and an endpoint picker per model behind a Gateway. prewarm serves each model
// with a Service and leaves routing to a Gateway API inference extension of the cluster's
// (llm-d, the GIE endpoint picker): it accepts the object, so that manifests holding it apply,
// creates nothing for it, and says so in its status.
//
// AWS publishes this kind's schema only inside its EKS add-on, not in HyperPod's public chart
// or CLI repository: the spec is kept as written, unvalidated.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:metadata:labels="prewarm.io/api=true"
// +kubebuilder:resource:shortName=igwc
// +kubebuilder:printcolumn:name="ROUTING",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`
type InferenceGatewayConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is HyperPod's gateway configuration (bbr, tls, auth, observability, podDefaults,
	// schedulers), kept as written.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +required
	Spec runtime.RawExtension `json:"spec"`

	// +optional
	Status InferenceGatewayConfigStatus `json:"status,omitzero"`
}

// InferenceGatewayConfigStatus says what prewarm did with the gateway: nothing, and why.
type InferenceGatewayConfigStatus struct {
	// observedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Accepted (the object is kept) and Ready (routing is provided; never by
	// prewarm).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// InferenceGatewayConfigList is a list of InferenceGatewayConfigs.
//
// +kubebuilder:object:root=true
type InferenceGatewayConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferenceGatewayConfig `json:"items"`
}
