// Package keda holds the part of KEDA's ScaledObject (keda.sh/v1alpha1) that prewarm writes and
// reads: the fields HyperPod's autoScalingSpec maps to, and the status that says whether KEDA
// scales. The JSON names are KEDA's (apis/keda/v1alpha1 in github.com/kedacore/keda/v2); fields
// prewarm never sets are left out, so that an update written from these types would drop them —
// prewarm writes only ScaledObjects it owns, whole.
//
// +kubebuilder:object:generate=true
// +groupName=keda.sh
package keda

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is KEDA's API group and version of ScaledObject.
var GroupVersion = schema.GroupVersion{Group: "keda.sh", Version: "v1alpha1"}

var schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ScaledObject{}, &ScaledObjectList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
})

// AddToScheme registers ScaledObject and its list.
var AddToScheme = schemeBuilder.AddToScheme

// ScaledObject asks KEDA to scale a workload on triggers, through an HPA KEDA makes.
//
// +kubebuilder:object:root=true
type ScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ScaledObjectSpec   `json:"spec"`
	Status ScaledObjectStatus `json:"status,omitempty"`
}

// ScaledObjectList is a list of ScaledObjects.
//
// +kubebuilder:object:root=true
type ScaledObjectList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ScaledObject `json:"items"`
}

// ScaledObjectSpec is what to scale, between which counts, how often and on what.
type ScaledObjectSpec struct {
	ScaleTargetRef        ScaleTarget     `json:"scaleTargetRef"`
	PollingInterval       *int32          `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32          `json:"cooldownPeriod,omitempty"`
	MinReplicaCount       *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32          `json:"maxReplicaCount,omitempty"`
	Advanced              *AdvancedConfig `json:"advanced,omitempty"`
	Triggers              []ScaleTriggers `json:"triggers"`
}

// ScaleTarget is the workload KEDA scales through its scale subresource.
type ScaleTarget struct {
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// AdvancedConfig carries the HPA's behaviour.
type AdvancedConfig struct {
	HorizontalPodAutoscalerConfig *HorizontalPodAutoscalerConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
}

// HorizontalPodAutoscalerConfig is what KEDA copies into the HPA it makes.
type HorizontalPodAutoscalerConfig struct {
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

// ScaleTriggers is one trigger: a scaler's type and its metadata, all strings.
type ScaleTriggers struct {
	Type              string                         `json:"type"`
	Name              string                         `json:"name,omitempty"`
	UseCachedMetrics  bool                           `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string              `json:"metadata"`
	AuthenticationRef *AuthenticationRef             `json:"authenticationRef,omitempty"`
	MetricType        autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

// AuthenticationRef names a TriggerAuthentication (in the ScaledObject's namespace) or a
// ClusterTriggerAuthentication.
type AuthenticationRef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

// ScaledObjectStatus is what KEDA reports: its conditions (Ready, Active, Fallback, Paused) and
// the HPA it made.
type ScaledObjectStatus struct {
	HpaName    string      `json:"hpaName,omitempty"`
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is one of KEDA's conditions (its own type: reason and message may be empty).
type Condition struct {
	Type    string                 `json:"type"`
	Status  metav1.ConditionStatus `json:"status"`
	Reason  string                 `json:"reason,omitempty"`
	Message string                 `json:"message,omitempty"`
}

// Condition types KEDA sets on a ScaledObject.
const (
	ConditionReady  = "Ready"
	ConditionActive = "Active"
)

// Find is the condition of type typ, or nil.
func (s *ScaledObjectStatus) Find(typ string) *Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == typ {
			return &s.Conditions[i]
		}
	}
	return nil
}
