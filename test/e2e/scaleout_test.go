package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/keda"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// A scale-out burst as KEDA's HPA makes it, scheduled by the real kube-scheduler: with three
// warm nodes and three cold ones of the same instance type (joined late, no agent: they never
// hold the model), three replicas asked at once all land warm; five put the two past the warm
// nodes on cold ones, and the parent says so in its Ready condition and in
// prewarm_parent_pods, and its Autoscaling condition warns that maxReplicaCount exceeds the
// warm nodes. A node that joins with an agent during the burst is warmed, as a target.
func TestScaleOutBurstLandsWarm(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{CRDs: []string{testutil.KEDACRDs()}})
	e.configure = func(o *config.OperatorConfiguration) {
		o.Autoscaling.Prometheus.ServerAddress = "http://prometheus-operated.monitoring:9090"
	}
	for _, n := range []string{"g5-a", "g5-b", "g5-c"} {
		e.addNode(n, "ml.g5.24xlarge", s3srv.Endpoint)
	}
	metricsAddr := freeAddr(t)
	e.startController("--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address="+metricsAddr, "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--gate-timeout=3m", "--agent-image=prewarm/agent:e2e")

	parent := builders.MakeInferenceEndpointConfig("default", "burst").Obj()
	parent.Spec.ModelSourceConfig.ModelLocation = prefix
	parent.Spec.ModelCacheConfig.ImageCache = nil
	parent.Spec.AutoScalingSpec = &inferencev1.AutoScalingSpec{
		MinReplicaCount: ptr.To[int32](1), MaxReplicaCount: ptr.To[int32](6),
		PrometheusTrigger: &inferencev1.PrometheusTrigger{Query: ptr.To("sum(vllm:num_requests_waiting)"), TargetValue: ptr.To(4.0)},
	}
	if err := e.c.Create(e.ctx, parent); err != nil {
		t.Fatal(err)
	}
	e.waitCache("burst-cache", 3)
	key := types.NamespacedName{Namespace: "default", Name: "burst"}
	e.eventually(60*time.Second, "Deployment and ScaledObject", func() (bool, string) {
		errDep := e.c.Get(e.ctx, key, &appsv1.Deployment{})
		errSO := e.c.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: "burst-scaled-object"}, &keda.ScaledObject{})
		return errDep == nil && errSO == nil, fmt.Sprintf("Deployment: %v; ScaledObject: %v", errDep, errSO)
	})
	// Cold nodes: of the instance type, targets of the cache, but with no agent to fill them.
	for _, n := range []string{"cold-a", "cold-b", "cold-c"} {
		if _, err := e.cluster.AddNode(e.ctx, n, testutil.NodeOptions{InstanceType: "ml.g5.24xlarge", GPUs: 4}); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(60*time.Second, "the cold nodes are targets", func() (bool, string) {
		m, err := e.mdcc("burst-cache")
		return err == nil && m.Status.TargetNodes == 6, fmt.Sprintf("%v, %+v", err, m.Status)
	})

	warm := []string{"g5-a", "g5-b", "g5-c"}
	scaleDeployment(t, e, key, 3)
	nodes := e.waitPodsScheduled(key, 3)
	for _, n := range nodes {
		if !slices.Contains(warm, n) {
			t.Errorf("a pod of the burst of three landed on %s; want only warm nodes %v (all: %v)", n, warm, nodes)
		}
	}
	e.waitParentSays(key, inferencev1.ConditionReady, "pods on warm nodes 3, on cold nodes 0")

	// A node joining mid-burst with an agent is a target at once and is warmed; the next
	// burst, past the four warm nodes, puts two replicas on cold ones.
	e.addNode("g5-d", "ml.g5.24xlarge", s3srv.Endpoint)
	e.eventually(90*time.Second, "g5-d warmed", func() (bool, string) {
		m, err := e.mdcc("burst-cache")
		if err != nil {
			return false, err.Error()
		}
		i := slices.IndexFunc(m.Status.Nodes, func(n inferencev1.NodeCacheStatus) bool { return n.Name == "g5-d" })
		return i >= 0 && m.Status.Nodes[i].State == inferencev1.CacheReady, fmt.Sprintf("%+v", m.Status.Nodes)
	})
	scaleDeployment(t, e, key, 6)
	nodes = e.waitPodsScheduled(key, 6)
	cold := 0
	for _, n := range nodes {
		if strings.HasPrefix(n, "cold-") {
			cold++
		}
	}
	if cold != 2 {
		t.Errorf("six replicas on %v: %d on cold nodes; want the 2 past the 4 warm nodes", nodes, cold)
	}
	e.waitParentSays(key, inferencev1.ConditionReady, "pods on warm nodes 4, on cold nodes 2 (cold-")
	e.waitParentSays(key, inferencev1.ConditionAutoscaling, "maxReplicaCount 6 is more than the 4 nodes that hold the model")
	e.eventually(30*time.Second, "prewarm_parent_pods", func() (bool, string) {
		series := `prewarm_parent_pods{kind="InferenceEndpointConfig",name="burst",namespace="default",node="%s"}`
		w, err1 := scrape(metricsAddr, fmt.Sprintf(series, controller.PodsWarm))
		c, err2 := scrape(metricsAddr, fmt.Sprintf(series, controller.PodsCold))
		return err1 == nil && err2 == nil && w == 4 && c == 2, fmt.Sprintf("warm %v (%v), cold %v (%v)", w, err1, c, err2)
	})
}

// scaleDeployment sets the Deployment's replicas through its scale subresource, as an HPA does.
func scaleDeployment(t *testing.T, e *weightsEnv, key types.NamespacedName, n int32) {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := e.c.Get(e.ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	if err := e.c.SubResource("scale").Update(e.ctx, dep, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: n}})); err != nil {
		t.Fatal(err)
	}
}

// waitPodsScheduled waits until the parent's Deployment has n pods, each on a node, and
// returns their nodes.
func (e *weightsEnv) waitPodsScheduled(key types.NamespacedName, n int) []string {
	e.t.Helper()
	var nodes []string
	e.eventually(90*time.Second, fmt.Sprintf("%d pods scheduled", n), func() (bool, string) {
		pods := &corev1.PodList{}
		if err := e.c.List(e.ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{"app.kubernetes.io/name": key.Name}); err != nil {
			return false, err.Error()
		}
		nodes = nodes[:0]
		for _, p := range pods.Items {
			if p.DeletionTimestamp.IsZero() && p.Spec.NodeName != "" {
				nodes = append(nodes, p.Spec.NodeName)
			}
		}
		slices.Sort(nodes)
		return len(nodes) == n, fmt.Sprintf("%d pods, on %v", len(pods.Items), nodes)
	})
	return nodes
}

// waitParentSays waits until the parent's condition typ's message holds text.
func (e *weightsEnv) waitParentSays(key types.NamespacedName, typ, text string) {
	e.t.Helper()
	e.eventually(60*time.Second, typ+" says "+text, func() (bool, string) {
		p := &inferencev1.InferenceEndpointConfig{}
		if err := e.c.Get(e.ctx, key, p); err != nil {
			return false, err.Error()
		}
		c := condition(p.Status.Conditions, typ)
		return strings.Contains(c.Message, text), c.Message
	})
}
