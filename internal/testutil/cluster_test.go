package testutil

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The harness the end-to-end tests stand on: real controllers and scheduler put real pods on
// kwok nodes, honouring resources, node selectors and preferred affinity.
func TestClusterRunsWorkloadsOnKwokNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole control plane")
	}
	NeedsTestBin(t)
	c, err := StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	// gpu-b carries a label the Deployment prefers. It is there from the node's creation, so the
	// scheduler has seen it before any pod exists.
	for _, n := range []struct {
		name, instanceType string
		gpus               int64
		labels             map[string]string
	}{
		{"gpu-a", "ml.g5.24xlarge", 8, nil},
		{"gpu-b", "ml.g5.24xlarge", 8, map[string]string{"warm": "true"}},
		{"small", "ml.g5.xlarge", 0, nil},
	} {
		if _, err := c.AddNode(ctx, n.name, NodeOptions{InstanceType: n.instanceType, GPUs: n.gpus, Labels: n.labels}); err != nil {
			t.Fatal(err)
		}
	}

	// A node being Ready to us does not mean the scheduler has seen its GPU capacity yet. A pod
	// that needs one GPU on each GPU node, once running, proves it has.
	for _, name := range []string{"gpu-a", "gpu-b"} {
		probe := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "probe-" + name, Labels: map[string]string{"app": "probe"}},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": name},
				Containers: []corev1.Container{{Name: "c", Image: "busybox",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}},
			},
		}
		if err := c.Client.Create(ctx, probe); err != nil {
			t.Fatal(err)
		}
	}
	err = Eventually(ctx, 60*time.Second, func() (bool, error) {
		pods := &corev1.PodList{}
		if err := c.Client.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "probe"}); err != nil {
			return false, err
		}
		n := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n == 2, nil
	})
	if err != nil {
		t.Fatalf("probe pods not running: %v", err)
	}

	labels := map[string]string{"app": "inference"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "inference"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"node.kubernetes.io/instance-type": "ml.g5.24xlarge"},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
							Weight: 100,
							Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
								Key: "warm", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}},
						}},
					}},
					Containers: []corev1.Container{{
						Name: "server", Image: "vllm/vllm-openai:latest",
						Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}},
					}},
				},
			},
		},
	}
	if err := c.Client.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "everywhere"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "everywhere"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "everywhere"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
	if err := c.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}

	running := func(selector map[string]string) ([]string, error) {
		pods := &corev1.PodList{}
		if err := c.Client.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels(selector)); err != nil {
			return nil, err
		}
		var nodes []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				nodes = append(nodes, p.Spec.NodeName)
			}
		}
		sort.Strings(nodes)
		return nodes, nil
	}
	var inferenceNodes, dsNodes []string
	err = Eventually(ctx, 60*time.Second, func() (bool, error) {
		var err error
		if inferenceNodes, err = running(labels); err != nil {
			return false, err
		}
		if dsNodes, err = running(map[string]string{"app": "everywhere"}); err != nil {
			return false, err
		}
		return len(inferenceNodes) == 1 && len(dsNodes) == 3, nil
	})
	if err != nil {
		t.Fatalf("pods not running: inference on %v, daemonset on %v: %v (%v)", inferenceNodes, dsNodes, err, c.CheckProcesses())
	}
	if diff := cmp.Diff([]string{"gpu-b"}, inferenceNodes); diff != "" {
		t.Errorf("inference pod placement (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"gpu-a", "gpu-b", "small"}, dsNodes); diff != "" {
		t.Errorf("daemonset placement (-want +got):\n%s", diff)
	}
}
