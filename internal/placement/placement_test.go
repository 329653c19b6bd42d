package placement

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

func node(instanceType string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{}}, Spec: corev1.NodeSpec{Taints: taints}}
	if instanceType != "" {
		n.Labels[inferencev1.InstanceTypeLabel] = instanceType
	}
	for k, v := range labels {
		n.Labels[k] = v
	}
	return n
}

func TestMatch(t *testing.T) {
	gpuTaint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	zoneAffinity := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"us-west-2a"},
		}}}},
	}}
	tests := []struct {
		name   string
		p      inferencev1.Placement
		node   *corev1.Node
		want   bool
		reason string
	}{
		{"instance type matches", FromParent("ml.g5.24xlarge", nil, nil, nil), node("ml.g5.24xlarge", nil), true, ""},
		{"instance type differs", FromParent("ml.g5.24xlarge", nil, nil, nil), node("ml.g5.xlarge", nil), false, "instance type ml.g5.xlarge is not ml.g5.24xlarge"},
		{"no instance type label", FromParent("ml.g5.24xlarge", nil, nil, nil), node("", nil), false, "instance type (no node.kubernetes.io/instance-type label) is not ml.g5.24xlarge"},
		{"one of instance types", FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), node("ml.g5.24xlarge", nil), true, ""},
		{"none of instance types", FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), node("ml.p4d.24xlarge", nil), false, "instance type ml.p4d.24xlarge is not ml.g5.12xlarge or ml.g5.24xlarge"},
		{"node affinity selects", FromParent("", nil, zoneAffinity, nil), node("x", map[string]string{"topology.kubernetes.io/zone": "us-west-2a"}), true, ""},
		{"node affinity does not select", FromParent("", nil, zoneAffinity, nil), node("x", map[string]string{"topology.kubernetes.io/zone": "us-west-2b"}), false, "the node affinity does not select it"},
		{"untolerated taint", FromParent("ml.g5.24xlarge", nil, nil, nil), node("ml.g5.24xlarge", nil, gpuTaint), false, "taint nvidia.com/gpu=present:NoSchedule is not tolerated"},
		{"tolerated taint", FromParent("ml.g5.24xlarge", nil, nil, []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}), node("ml.g5.24xlarge", nil, gpuTaint), true, ""},
		{"PreferNoSchedule taint is no bar", FromParent("ml.g5.24xlarge", nil, nil, nil),
			node("ml.g5.24xlarge", nil, corev1.Taint{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}), true, ""},
		{"no placement selects every node", inferencev1.Placement{}, node("", nil), true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason := Match(tt.p, tt.node)
			if got != tt.want || reason != tt.reason {
				t.Errorf("Match = %v, %q; want %v, %q", got, reason, tt.want, tt.reason)
			}
		})
	}
}

func TestRequiredTermsANDsInstanceTypesIntoEachTerm(t *testing.T) {
	aff := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "a", Operator: corev1.NodeSelectorOpExists}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "b", Operator: corev1.NodeSelectorOpExists}}},
		},
	}}
	p := inferencev1.Placement{InstanceTypes: []string{"ml.g5.24xlarge"}, NodeAffinity: aff}
	it := corev1.NodeSelectorRequirement{Key: inferencev1.InstanceTypeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"ml.g5.24xlarge"}}
	want := []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "a", Operator: corev1.NodeSelectorOpExists}, it}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "b", Operator: corev1.NodeSelectorOpExists}, it}},
	}
	if diff := cmp.Diff(want, RequiredTerms(p)); diff != "" {
		t.Errorf("RequiredTerms (-want +got):\n%s", diff)
	}
	if len(aff.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 1 {
		t.Error("RequiredTerms changed the parent's node affinity")
	}
}
