package placement

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
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
		{"EKS names the type without ml.", FromParent("ml.g5.24xlarge", nil, nil, nil), node("g5.24xlarge", nil), true, ""},
		{"instance type differs", FromParent("ml.g5.24xlarge", nil, nil, nil), node("ml.g5.xlarge", nil), false, "instance type ml.g5.xlarge is not ml.g5.24xlarge or g5.24xlarge"},
		{"no instance type label", FromParent("ml.g5.24xlarge", nil, nil, nil), node("", nil), false, "instance type (no node.kubernetes.io/instance-type label) is not ml.g5.24xlarge or g5.24xlarge"},
		{"one of instance types", FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), node("ml.g5.24xlarge", nil), true, ""},
		{"none of instance types", FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), node("ml.p4d.24xlarge", nil), false,
			"instance type ml.p4d.24xlarge is not ml.g5.12xlarge or g5.12xlarge or ml.g5.24xlarge or g5.24xlarge"},
		{"a type without ml. is matched as written", FromParent("", []string{"a100-80g"}, nil, nil), node("a100-80g", nil), true, ""},
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
			got, reason := Rules{}.Match(tt.p, tt.node)
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
	it := corev1.NodeSelectorRequirement{Key: inferencev1.InstanceTypeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"ml.g5.24xlarge", "g5.24xlarge"}}
	want := []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "a", Operator: corev1.NodeSelectorOpExists}, it}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "b", Operator: corev1.NodeSelectorOpExists}, it}},
	}
	if diff := cmp.Diff(want, Rules{}.RequiredTerms(p)); diff != "" {
		t.Errorf("RequiredTerms (-want +got):\n%s", diff)
	}
	if len(aff.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 1 {
		t.Error("RequiredTerms changed the parent's node affinity")
	}
}

// A cluster whose nodes carry no AWS instance type (GKE here) maps the types parents name to its
// own labels: the same terms select the targets and go into the pods' affinity.
func TestMappedInstanceTypes(t *testing.T) {
	rules := NewRules(config.Placement{InstanceTypes: []config.InstanceTypeNodes{{
		InstanceType: "ml.g5.24xlarge", NodeSelector: map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-accelerator-count": "4"},
	}, {
		InstanceType:     "ml.p5.48xlarge",
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu.example.com/model", Operator: corev1.NodeSelectorOpIn, Values: []string{"h100", "h200"}}},
	}}}, false)
	gke := node("", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-accelerator-count": "4"})
	onPrem := node("", map[string]string{"gpu.example.com/model": "h200"})
	eks := node("g5.24xlarge", nil)
	for _, tc := range []struct {
		name string
		p    inferencev1.Placement
		n    *corev1.Node
		want bool
		why  string
	}{
		{"mapped labels", FromParent("ml.g5.24xlarge", nil, nil, nil), gke, true, ""},
		{"mapped expression", FromParent("ml.p5.48xlarge", nil, nil, nil), onPrem, true, ""},
		{"a mapping replaces the instance type label", FromParent("ml.g5.24xlarge", nil, nil, nil), eks, false,
			"ml.g5.24xlarge nodes are cloud.google.com/gke-accelerator=nvidia-l4, cloud.google.com/gke-accelerator-count=4 (placement.instanceTypes)"},
		{"mapped and unmapped types together", FromParent("", []string{"ml.g5.24xlarge", "ml.g6.xlarge"}, nil, nil), node("g6.xlarge", nil), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ok, why := rules.Match(tc.p, tc.n); ok != tc.want || why != tc.why {
				t.Errorf("Match = %v, %q; want %v, %q", ok, why, tc.want, tc.why)
			}
		})
	}
	p := FromParent("", []string{"ml.g5.24xlarge", "ml.g6.xlarge"}, nil, nil)
	want := []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: inferencev1.InstanceTypeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"ml.g6.xlarge", "g6.xlarge"}}}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "cloud.google.com/gke-accelerator", Operator: corev1.NodeSelectorOpIn, Values: []string{"nvidia-l4"}},
			{Key: "cloud.google.com/gke-accelerator-count", Operator: corev1.NodeSelectorOpIn, Values: []string{"4"}},
		}},
	}
	if diff := cmp.Diff(want, rules.RequiredTerms(p)); diff != "" {
		t.Errorf("RequiredTerms (-want +got):\n%s", diff)
	}
	if values, all := rules.Candidates(p); !all || values != nil {
		t.Errorf("Candidates = %v, %v; want every node (a mapped type is not found by its instance type label)", values, all)
	}
	if values, all := rules.Candidates(FromParent("ml.g6.xlarge", nil, nil, nil)); all || !slices.Equal(values, []string{"ml.g6.xlarge", "g6.xlarge"}) {
		t.Errorf("Candidates = %v, %v; want the two label values", values, all)
	}
}

// The pods tolerate the parent's tolerations, the operator's, and with extended-resource
// tolerations on, the taint named after each extended resource a container requests, once each.
func TestTolerations(t *testing.T) {
	gpu := corev1.Container{Name: "worker", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("1Gi")},
	}}
	efa := corev1.Container{Name: "init", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"vpc.amazonaws.com/efa": resource.MustParse("1"), "hugepages-2Mi": resource.MustParse("2Mi"), "example.kubernetes.io/x": resource.MustParse("1")},
	}}
	parent := []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	operator := []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "inference", Effect: corev1.TaintEffectNoSchedule}}
	on := NewRules(config.Placement{Tolerations: operator}, true)
	want := []corev1.Toleration{
		parent[0], operator[0],
		{Key: "vpc.amazonaws.com/efa", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if diff := cmp.Diff(want, on.Tolerations(parent, efa, gpu)); diff != "" {
		t.Errorf("Tolerations (-want +got):\n%s", diff)
	}
	off := NewRules(config.Placement{Tolerations: operator}, false)
	if diff := cmp.Diff(operator, off.Tolerations(nil, efa, gpu)); diff != "" {
		t.Errorf("Tolerations without extended resources (-want +got):\n%s", diff)
	}
	// The node EKS gives GPU node groups: a target once the pods tolerate its taint.
	tainted := node("g5.24xlarge", nil, corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	p := FromParent("ml.g5.24xlarge", nil, nil, nil)
	if ok, why := on.Match(p, tainted); ok || why != "taint nvidia.com/gpu=present:NoSchedule is not tolerated" {
		t.Errorf("Match before the tolerations = %v, %q", ok, why)
	}
	p.Tolerations = on.Tolerations(nil, gpu)
	if ok, why := on.Match(p, tainted); !ok {
		t.Errorf("Match with the pods' tolerations = %v, %q; want a target", ok, why)
	}
}

func TestIsExtendedResource(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia.com/gpu": true, "amd.com/gpu": true, "vpc.amazonaws.com/efa": true, "nvidia.com/mig-1g.10gb": true,
		"cpu": false, "memory": false, "hugepages-2Mi": false, "kubernetes.io/batch": false, "example.kubernetes.io/x": false,
		"requests.nvidia.com/gpu": false, "not a name/x": false,
	} {
		if got := IsExtendedResource(name); got != want {
			t.Errorf("IsExtendedResource(%q) = %v; want %v", name, got, want)
		}
	}
}
