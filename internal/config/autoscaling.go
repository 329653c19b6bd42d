package config

import (
	"net/url"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Autoscaling is what parents' autoScalingSpec needs of the cluster: KEDA turns each into a
// ScaledObject, and triggers that leave out where their metrics are (HyperPod's run inside AWS,
// where the answer is implied) are completed from here.
type Autoscaling struct {
	// Disabled leaves every autoScalingSpec without effect (reported on the parent), even with
	// KEDA installed: for clusters where another system scales the Deployments.
	Disabled bool `json:"disabled,omitempty"`
	// Prometheus is the server a prometheusTrigger with an empty serverAddress queries.
	Prometheus PrometheusServer `json:"prometheus,omitempty"`
	// AWS is how KEDA reaches CloudWatch and Amazon Managed Prometheus for the triggers that
	// name them.
	AWS AWSMetrics `json:"aws,omitempty"`
}

// PrometheusServer is a Prometheus-compatible query endpoint KEDA's prometheus scaler reads.
type PrometheusServer struct {
	// ServerAddress is its base URL, e.g. http://prometheus-operated.monitoring:9090 (KEDA
	// queries <serverAddress>/api/v1/query). Empty: a prometheusTrigger without one cannot
	// scale, and says so.
	ServerAddress string `json:"serverAddress,omitempty"`
	// AuthenticationRef names the KEDA TriggerAuthentication (in each parent's namespace) or
	// ClusterTriggerAuthentication KEDA queries it with; unset: none.
	AuthenticationRef *TriggerAuthenticationRef `json:"authenticationRef,omitempty"`
}

// AWSMetrics is how KEDA reads CloudWatch and Amazon Managed Prometheus.
type AWSMetrics struct {
	// Region is the region of CloudWatch metrics (default: jumpStart.region). Empty and no
	// default: a cloudWatchTrigger cannot scale, and says so. An Amazon Managed Prometheus
	// trigger takes its region from its workspace URL.
	Region string `json:"region,omitempty"`
	// AuthenticationRef names the KEDA TriggerAuthentication or ClusterTriggerAuthentication
	// (podIdentity provider aws) KEDA signs its AWS requests with; unset: the keda-operator
	// pod's own AWS identity (identityOwner: operator), e.g. IRSA or EKS Pod Identity on its
	// service account.
	AuthenticationRef *TriggerAuthenticationRef `json:"authenticationRef,omitempty"`
}

// TriggerAuthenticationRef names a KEDA TriggerAuthentication or ClusterTriggerAuthentication.
type TriggerAuthenticationRef struct {
	Name string `json:"name"`
	// Kind is TriggerAuthentication (the default) or ClusterTriggerAuthentication.
	Kind string `json:"kind,omitempty"`
}

// CloudWatchRegion is the region of CloudWatch triggers: autoscaling.aws.region, else
// jumpStart.region.
func (o OperatorConfiguration) CloudWatchRegion() string {
	if r := o.Autoscaling.AWS.Region; r != "" {
		return r
	}
	return o.JumpStart.Region
}

func (a Autoscaling) validate() field.ErrorList {
	var errs field.ErrorList
	at := field.NewPath("autoscaling")
	if s := a.Prometheus.ServerAddress; s != "" {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(at.Child("prometheus", "serverAddress"), s, "want an http:// or https:// URL such as http://prometheus-operated.monitoring:9090"))
		}
	}
	if r := a.AWS.Region; r != "" && !regionPattern.MatchString(r) {
		errs = append(errs, field.Invalid(at.Child("aws", "region"), r, "want an AWS region such as us-west-2"))
	}
	errs = append(errs, a.Prometheus.AuthenticationRef.validate(at.Child("prometheus", "authenticationRef"))...)
	errs = append(errs, a.AWS.AuthenticationRef.validate(at.Child("aws", "authenticationRef"))...)
	return errs
}

func (r *TriggerAuthenticationRef) validate(at *field.Path) field.ErrorList {
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	if r.Name == "" {
		errs = append(errs, field.Required(at.Child("name"), "the TriggerAuthentication's name"))
	}
	if r.Kind != "" && r.Kind != "TriggerAuthentication" && r.Kind != "ClusterTriggerAuthentication" {
		errs = append(errs, field.NotSupported(at.Child("kind"), r.Kind, []string{"TriggerAuthentication", "ClusterTriggerAuthentication"}))
	}
	return errs
}
