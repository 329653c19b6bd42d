package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// nodeUpdate is an update of a node to new, and whether a predicate should let it through.
type nodeUpdate struct {
	name string
	new  *corev1.Node
	want bool
}

// changer returns a function making a changed copy of base.
func changer(base *corev1.Node) func(func(n *corev1.Node)) *corev1.Node {
	return func(f func(n *corev1.Node)) *corev1.Node { n := base.DeepCopy(); f(n); return n }
}

func TestNodePlacementChanged(t *testing.T) {
	base := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "1"}}}
	change := changer(base)
	tests := []nodeUpdate{
		{"a kubelet status update", change(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			n.ResourceVersion = "2"
		}), false},
		{"a label", change(func(n *corev1.Node) { n.Labels["b"] = "2" }), true},
		{"a weights cache's own label", change(func(n *corev1.Node) { n.Labels["inference.sagemaker.aws.amazon.com/weights-cache-ready.u"] = "true" }), false},
		{"an image cache's own label", change(func(n *corev1.Node) { n.Labels["inference.sagemaker.aws.amazon.com/image-cache-ready.u"] = "true" }), false},
		{"a taint lifted", change(func(n *corev1.Node) {}), true},
		{"cordoned", change(func(n *corev1.Node) { n.Spec.Unschedulable = true }), true},
	}
	tainted := base.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}}
	for _, tt := range tests {
		old := base
		if tt.name == "a taint lifted" {
			old = tainted
		}
		if got := NodePlacementChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tt.new}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if !NodePlacementChanged.Create(event.CreateEvent{Object: base}) || !NodePlacementChanged.Delete(event.DeleteEvent{Object: base}) {
		t.Error("node creation and deletion must count")
	}
}

func TestNodeAddressesChanged(t *testing.T) {
	base := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}}}}
	change := changer(base)
	tests := []nodeUpdate{
		{"a kubelet status update", change(func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		}), false},
		{"a label", change(func(n *corev1.Node) { n.Labels = map[string]string{"b": "2"} }), false},
		{"another InternalIP", change(func(n *corev1.Node) { n.Status.Addresses[0].Address = "10.0.0.8" }), true},
		{"an address added", change(func(n *corev1.Node) {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n"})
		}), true},
		{"a pod CIDR", change(func(n *corev1.Node) { n.Spec.PodCIDR = "10.244.1.0/24" }), true},
		{"pod CIDRs", change(func(n *corev1.Node) { n.Spec.PodCIDRs = []string{"10.244.1.0/24"} }), true},
	}
	for _, tt := range tests {
		if got := NodeAddressesChanged.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: tt.new}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
