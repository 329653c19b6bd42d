package hyperpodstatus

import (
	"fmt"
	"slices"
)

// The status models of HyperPod's Python SDK (the `sagemaker-hyperpod` package, which the `hyp`
// CLI runs), as aws/sagemaker-hyperpod-cli declares them at commit 011ca92 in
// src/sagemaker/hyperpod/inference/config/hp_endpoint_config.py (InferenceEndpointConfigStatus
// and the models under it) and hp_jumpstart_endpoint_config.py (JumpStartModelStatus). Every one
// is a pydantic model with extra="forbid": a field it does not declare fails the whole status,
// which hp_endpoint.py and hp_jumpstart_endpoint.py then set to None (`hyp describe` and
// `hyp list` show no status). The SDK validates by field name (by_name=True), so the names here
// are the JSON ones.

// field is one field of a model: its kind, whether it is required, the model of an object (or
// of a list's items) and the values of a Literal.
type field struct {
	kind     kind
	required bool
	model    model
	literal  []string
}

// model is a pydantic model: its fields by name.
type model map[string]field

type kind int

const (
	str kind = iota
	integer
	boolean
	object
	list // of model, or of str when model is nil
)

func opt(k kind) field                { return field{kind: k} }
func req(k kind) field                { return field{kind: k, required: true} }
func sub(m model) field               { return field{kind: object, model: m} }
func subs(m model) field              { return field{kind: list, model: m} }
func oneOf(values ...string) field    { return field{kind: str, literal: values} }
func reqOneOf(values ...string) field { f := oneOf(values...); f.required = true; return f }
func strList() field                  { return field{kind: list} }

var (
	// Conditions, of the parent and of its Deployment.
	sdkConditions = model{
		"lastTransitionTime": opt(str), "lastUpdateTime": opt(str), "message": opt(str), "reason": opt(str),
		"status": req(str), "type": req(str), "observedGeneration": opt(integer),
	}
	// Status: the Deployment's own status.
	sdkDeploymentObject = model{
		"availableReplicas": opt(integer), "collisionCount": opt(integer), "conditions": subs(sdkConditions),
		"observedGeneration": opt(integer), "readyReplicas": opt(integer), "replicas": opt(integer),
		"terminatingReplicas": opt(integer), "unavailableReplicas": opt(integer), "updatedReplicas": opt(integer),
	}
	// DeploymentStatus.
	sdkDeploymentStatus = model{
		"deploymentObjectOverallState": opt(str), "lastUpdated": req(str), "message": opt(str), "name": req(str),
		"reason": opt(str), "status": sub(sdkDeploymentObject),
	}
	// Endpoints and Sagemaker.
	sdkEndpoints = model{"sagemaker": sub(model{
		"configArn": opt(str), "endpointArn": opt(str), "modelArn": opt(str), "state": req(str),
	})}
	// MetricsStatus and ModelMetricsStatus.
	sdkMetrics = model{
		"enabled": req(boolean), "errorMessage": opt(str), "metricsScrapeIntervalSeconds": opt(integer),
		"modelMetrics": sub(model{"path": opt(str), "port": opt(integer)}), "state": opt(str),
	}
	// TlsCertificate.
	sdkTLS = model{
		"certificateARN": opt(str), "certificateDomainNames": strList(), "certificateHealth": oneOf("Valid", "Expiring", "Expired"),
		"certificateName": opt(str), "importedCertificates": strList(), "issuerName": opt(str), "lastCertExpiryTime": opt(str),
		"tlsCertificateOutputS3Bucket": opt(str), "tlsCertificateS3Keys": strList(),
	}
	// DnsStatus.
	sdkDNS = model{
		"dnsHealth": oneOf("Active", "Pending", "Error"), "hostedZoneId": opt(str), "lastTransitionTime": opt(str),
		"managedByOperator": req(boolean), "message": opt(str), "previousHostedZoneId": opt(str),
		"previousRecordName": opt(str), "recordName": opt(str),
	}
	// DataCaptureStatus and DataCaptureModelPodStatus (JumpStartModelStatus only).
	sdkDataCapture = model{"modelPod": sub(model{
		"lastTransitionTime": opt(str), "message": opt(str), "reason": opt(str), "status": reqOneOf("Healthy", "Unhealthy"),
	})}

	sdkParentState = oneOf("DeploymentPending", "DeploymentInProgress", "DeploymentFailed", "DeploymentComplete",
		"DeletionPending", "DeletionInProgress", "DeletionFailed", "DeletionComplete")

	// InferenceEndpointConfigStatus. It has no imageCacheStatus and no dataCaptureStatus, though
	// the published CRD has both.
	sdkEndpointStatus = model{
		"conditions": subs(sdkConditions), "deploymentStatus": sub(sdkDeploymentStatus), "dnsStatus": sub(sdkDNS),
		"endpoints": sub(sdkEndpoints), "metricsStatus": sub(sdkMetrics), "observedGeneration": opt(integer),
		"replicas": opt(integer), "selector": opt(str), "state": sdkParentState, "tlsCertificate": sub(sdkTLS),
	}
	// JumpStartModelStatus: the same, and dataCaptureStatus.
	sdkJumpStartStatus = func() model {
		m := model{"dataCaptureStatus": sub(sdkDataCapture)}
		for k, f := range sdkEndpointStatus {
			m[k] = f
		}
		return m
	}()

	sdkModels = map[string]model{"InferenceEndpointConfig": sdkEndpointStatus, "JumpStartModel": sdkJumpStartStatus}
)

// walkModel checks v against model m at path, as pydantic would: no field m does not declare,
// every required one present and not null, each of its type and within its Literal.
func walkModel(path string, m model, v any, out *[]string) {
	refuse := func(p, format string, args ...any) {
		*out = append(*out, fmt.Sprintf("%s: %s (HyperPod's SDK status model)", p, fmt.Sprintf(format, args...)))
	}
	obj, ok := v.(map[string]any)
	if !ok {
		refuse(path, "%s where the SDK wants an object", describe(v))
		return
	}
	for _, name := range sortedKeys(m.asAny()) {
		if f := m[name]; f.required && obj[name] == nil {
			refuse(path+"."+name, "required, and missing")
		}
	}
	for _, k := range sortedKeys(obj) {
		p := path + "." + k
		f, ok := m[k]
		if !ok {
			refuse(p, "not a field of the SDK's model (extra=\"forbid\")")
			continue
		}
		val := obj[k]
		if val == nil {
			continue // Optional
		}
		switch f.kind {
		case str:
			s, ok := val.(string)
			if !ok {
				refuse(p, "%s where the SDK wants a string", describe(val))
			} else if len(f.literal) > 0 && !slices.Contains(f.literal, s) {
				refuse(p, "%q is none of the SDK's %v", s, f.literal)
			}
		case integer:
			if !isInt(val) {
				refuse(p, "%s where the SDK wants an int", describe(val))
			}
		case boolean:
			if _, ok := val.(bool); !ok {
				refuse(p, "%s where the SDK wants a bool", describe(val))
			}
		case object:
			walkModel(p, f.model, val, out)
		case list:
			items, ok := val.([]any)
			if !ok {
				refuse(p, "%s where the SDK wants a list", describe(val))
				continue
			}
			for i, e := range items {
				ip := fmt.Sprintf("%s[%d]", p, i)
				if f.model != nil {
					walkModel(ip, f.model, e, out)
				} else if _, ok := e.(string); !ok {
					refuse(ip, "%s where the SDK wants a string", describe(e))
				}
			}
		}
	}
}

func (m model) asAny() map[string]any {
	out := make(map[string]any, len(m))
	for k := range m {
		out[k] = nil
	}
	return out
}
