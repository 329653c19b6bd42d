package chart

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// By default the agents run on every Linux node, tainted or not, cloud-labelled or not, but
// virtual ones (EKS Fargate, virtual-kubelet's), which have no disk and run no privileged pod;
// agent.affinity: null widens them to those too, and an affinity of the user's replaces the
// chart's.
func TestAgentsRunOnEveryNodeButVirtualOnes(t *testing.T) {
	node := func(name string, labels map[string]string) *corev1.Node {
		l := map[string]string{corev1.LabelOSStable: "linux", corev1.LabelHostname: name}
		maps.Copy(l, labels)
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	nodes := []struct {
		node *corev1.Node
		real bool
	}{
		{node("eks-gpu", map[string]string{corev1.LabelInstanceTypeStable: "g5.24xlarge", "eks.amazonaws.com/nodegroup": "gpu", "eks.amazonaws.com/compute-type": "ec2"}), true},
		{node("hyperpod", map[string]string{corev1.LabelInstanceTypeStable: "ml.g5.24xlarge", "sagemaker.amazonaws.com/compute-type": "hyperpod"}), true},
		{node("gke", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4"}), true},
		{node("on-prem-cpu", nil), true},
		{node("fargate-ip-10-0-1-1", map[string]string{"eks.amazonaws.com/compute-type": "fargate"}), false},
		{node("virtual-node-aci-linux", map[string]string{"type": "virtual-kubelet", "kubernetes.io/role": "agent"}), false},
	}
	schedulable := func(t *testing.T, args ...string) map[string]bool {
		t.Helper()
		ds := agentObject(t, render(t, args...), "DaemonSet")
		spec := &corev1.PodSpec{}
		raw, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, spec); err != nil {
			t.Fatal(err)
		}
		match := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec})
		out := map[string]bool{}
		for _, n := range nodes {
			ok, err := match.Match(n.node)
			if err != nil {
				t.Fatal(err)
			}
			out[n.node.Name] = ok
		}
		return out
	}
	got := schedulable(t)
	for _, n := range nodes {
		if got[n.node.Name] != n.real {
			t.Errorf("the agents' placement takes node %s (%v): %v; want %v", n.node.Name, n.node.Labels, got[n.node.Name], n.real)
		}
	}
	for name, ok := range schedulable(t, "--set", "agent.affinity=null") {
		if !ok {
			t.Errorf("agent.affinity=null: the agents' placement still leaves out %s", name)
		}
	}
	gpu := schedulable(t, "--set-json", `agent.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"node.kubernetes.io/instance-type","operator":"In","values":["g5.24xlarge","ml.g5.24xlarge"]}]}]}}}`)
	for name, want := range map[string]bool{"eks-gpu": true, "hyperpod": true, "gke": false, "on-prem-cpu": false, "fargate-ip-10-0-1-1": false} {
		if gpu[name] != want {
			t.Errorf("the README's affinity by instance type takes node %s: %v; want %v", name, gpu[name], want)
		}
	}
}
