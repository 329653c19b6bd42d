package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// A parent that names its HyperPod instance type finds the nodes of the cluster it runs on: an
// EKS node of the type less "ml.", a GKE node through the configuration's mapping; a GPU node's
// taint keeps it out until the pods prewarm creates tolerate it (extended-resource tolerations),
// and the cache says which nodes it left out and why. The pods' affinity and tolerations are the
// same rules.
func TestPlacementOnCloudNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	// The gate opens at once: no agent reports here, and the test reads the Deployment.
	rc := newReconcilers(t, ctx, "pl-operator", "pl").with(func(c *controller.Config) { c.Controller.GateTimeout = metav1.Duration{Duration: time.Nanosecond} })
	const itype = "ml.pl-suite.24xlarge"
	upNode(t, ctx, "pl-hyperpod", itype)
	upNode(t, ctx, "pl-eks", strings.TrimPrefix(itype, "ml."))
	upNode(t, ctx, "pl-gke", "g2-pl-suite")
	taint(t, ctx, "pl-eks", corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	labelNode(t, ctx, "pl-gke", "cloud.google.com/gke-accelerator", "nvidia-pl")
	parent := builders.MakeInferenceEndpointConfig("pl", "placed").Obj()
	parent.Spec.InstanceType = itype
	parent.Spec.Worker.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}}
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(parent)
	targets := func(rc *reconcilers) (*inferencev1.ModelDataCacheConfig, []string, *appsv1.Deployment) {
		t.Helper()
		rc.endpoint(t, ctx, key)
		var list inferencev1.ModelDataCacheConfigList
		if err := c.List(ctx, &list, client.InNamespace("pl")); err != nil || len(list.Items) != 1 {
			t.Fatalf("caches: %v, %v", list.Items, err)
		}
		m := rc.cache(t, ctx, &list.Items[0])
		var asked []string
		for _, n := range []string{"pl-hyperpod", "pl-eks", "pl-gke"} {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := c.Get(ctx, client.ObjectKey{Name: n}, nc); err == nil && slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == string(m.UID) }) {
				asked = append(asked, n)
			}
		}
		dep := &appsv1.Deployment{}
		if err := c.Get(ctx, key, dep); err != nil {
			t.Fatal(err)
		}
		return m, asked, dep
	}

	// The defaults, with an API server that adds no tolerations (extendedResourceTolerations
	// auto resolved to off): HyperPod's node; EKS's is of the type but tainted.
	m, asked, dep := targets(rc)
	if !slices.Equal(asked, []string{"pl-hyperpod"}) {
		t.Errorf("asked %v; want pl-hyperpod only", asked)
	}
	cond := meta.FindStatusCondition(m.Status.Conditions, inferencev1.ConditionReady)
	if want := "1 node(s) the placement selects are left out, the pods could not run there: taint nvidia.com/gpu=present:NoSchedule is not tolerated (pl-eks)"; cond == nil || !strings.Contains(cond.Message, want) {
		t.Errorf("Ready condition %+v; want it to say %q", cond, want)
	}
	terms := dep.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || !slices.Equal(terms[0].MatchExpressions[0].Values, []string{itype, "pl-suite.24xlarge"}) {
		t.Errorf("the pods' required terms %+v; want the instance type with and without ml.", terms)
	}

	// The pods tolerate the taint of the GPUs they request: EKS's node is a target too.
	on := rc.with(func(c *controller.Config) { c.ExtendedResourceTolerations = true })
	_, asked, dep = targets(on)
	if !slices.Equal(asked, []string{"pl-hyperpod", "pl-eks"}) {
		t.Errorf("with extended-resource tolerations, asked %v; want pl-hyperpod and pl-eks", asked)
	}
	if !slices.ContainsFunc(dep.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("the pods' tolerations %v lack nvidia.com/gpu", dep.Spec.Template.Spec.Tolerations)
	}

	// GKE: the type mapped to the accelerator label; the instance type label no longer counts.
	gke := on.with(func(c *controller.Config) {
		c.Placement.InstanceTypes = []config.InstanceTypeNodes{{InstanceType: itype, NodeSelector: map[string]string{"cloud.google.com/gke-accelerator": "nvidia-pl"}}}
	})
	_, asked, dep = targets(gke)
	if !slices.Equal(asked, []string{"pl-gke"}) {
		t.Errorf("with the mapping, asked %v; want pl-gke only", asked)
	}
	terms = dep.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != "cloud.google.com/gke-accelerator" {
		t.Errorf("the pods' required terms %+v; want the mapped label", terms)
	}
}

func taint(t *testing.T, ctx context.Context, node string, taint corev1.Taint) {
	t.Helper()
	n := &corev1.Node{}
	if err := server.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, taint)
	if err := server.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func labelNode(t *testing.T, ctx context.Context, node, key, value string) {
	t.Helper()
	n := &corev1.Node{}
	if err := server.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Labels[key] = value
	if err := server.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}
