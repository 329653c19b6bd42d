package compat

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/test/compat/hyperpodstatus"
)

// The status check that every status prewarm writes passes (test/integration and test/e2e run
// it on each one) refuses what HyperPod's clients refuse: a status as HyperPod itself writes it
// for a deployed model passes; a field beyond the published schema, one the SDK's models do not
// declare, a missing required field and a value outside an enum or Literal each fail, named by
// path and by the reader that refuses it.
func TestStatusCheckRefusesWhatHyperPodsClientsRefuse(t *testing.T) {
	const deployed = `{
		"state": "DeploymentComplete", "observedGeneration": 2, "replicas": 1,
		"selector": "app=example-model",
		"conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "1 of 1",
			"lastTransitionTime": "2026-12-04T09:00:00Z", "observedGeneration": 2}],
		"deploymentStatus": {"name": "example-model", "lastUpdated": "2026-12-04T09:00:00Z",
			"deploymentObjectOverallState": "DeploymentComplete",
			"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1,
				"conditions": [{"type": "Available", "status": "True", "lastUpdateTime": "2026-12-04T09:00:00Z",
					"lastTransitionTime": "2026-12-04T09:00:00Z", "reason": "MinimumReplicasAvailable", "message": "ok"}]}}
	}`
	for _, kind := range hyperpodstatus.Kinds {
		if problems := check(t, kind, deployed); len(problems) != 0 {
			t.Errorf("%s: a status as HyperPod writes it: %q; want none", kind, problems)
		}
	}
	for _, c := range []struct {
		name, kind, status string
		want               []string
	}{
		{"a field of prewarm's own", "InferenceEndpointConfig",
			`{"state": "DeploymentInProgress", "weightsCacheStatus": {"name": "m-cache", "state": "Downloading"}}`,
			[]string{".status.weightsCacheStatus: not in HyperPod's published schema", ".status.weightsCacheStatus: not a field of the SDK's model"}},
		{"the published image cache summary, which the SDK does not declare", "JumpStartModel",
			`{"imageCacheStatus": {"state": "Ready", "readyNodes": 2, "targetNodes": 2}}`,
			[]string{".status.imageCacheStatus: not a field of the SDK's model"}},
		{"a member beyond the published image cache summary", "InferenceEndpointConfig",
			`{"imageCacheStatus": {"state": "Ready", "name": "vllm"}}`,
			[]string{".status.imageCacheStatus.name: not in HyperPod's published schema"}},
		{"a Deployment without lastUpdated", "InferenceEndpointConfig",
			`{"deploymentStatus": {"name": "m"}}`,
			[]string{".status.deploymentStatus: required lastUpdated is missing (HyperPod's published schema)", ".status.deploymentStatus.lastUpdated: required, and missing"}},
		{"a state HyperPod does not have", "JumpStartModel",
			`{"state": "Pending"}`,
			[]string{`.status.state: "Pending" is none of`, `.status.state: "Pending" is none of the SDK's`}},
		{"a condition member of prewarm's own", "InferenceEndpointConfig",
			`{"conditions": [{"type": "Ready", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "2026-12-04T09:00:00Z", "nodes": 3}]}`,
			[]string{".status.conditions[0].nodes: not in HyperPod's published schema", ".status.conditions[0].nodes: not a field of the SDK's model"}},
		{"a count as a string", "InferenceEndpointConfig",
			`{"replicas": "1"}`,
			[]string{".status.replicas: a string where the schema has integer", ".status.replicas: a string where the SDK wants an int"}},
	} {
		problems := check(t, c.kind, c.status)
		for _, want := range c.want {
			found := false
			for _, p := range problems {
				found = found || strings.Contains(p, want)
			}
			if !found {
				t.Errorf("%s (%s): problems %q; want one saying %q", c.name, c.kind, problems, want)
			}
		}
	}
}

func check(t *testing.T, kind, status string) []string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(status), &v); err != nil {
		t.Fatal(err)
	}
	problems, err := hyperpodstatus.Check(kind, v)
	if err != nil {
		t.Fatal(err)
	}
	return problems
}
