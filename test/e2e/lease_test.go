package e2e

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
)

// A node's agent says it is alive through its Lease, and writes nothing else while nothing
// changes. When its process is gone, the Lease is not renewed: once it expires, the cache counts
// the node no more and the node loses the cache's label (its pods could not mount the cache),
// though nothing was written about it; kubectl prewarm explain says why. The agent back, it
// renews the Lease and the node counts again.
func TestAgentLeaseEndToEnd(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	e.configure = func(op *config.OperatorConfiguration) {
		op.Agent.LeaseDuration = metav1.Duration{Duration: 15 * time.Second} // renewed every 5 s
	}
	ctx, c := e.ctx, e.c
	for _, n := range []string{"g5-a", "g5-b"} {
		e.addNode(n, "g5.24xlarge", s3srv.Endpoint)
	}
	e.startTeamController()
	e.kubectl(llamaWarm, "apply", "-f", "-")
	e.kubectl("", "wait", "-n", "team-a", "--for=jsonpath={.status.state}=Ready", "--timeout=4m", "modelweightscacheconfig/llama-warm")
	mw := &inferencev1.ModelWeightsCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "llama-warm"}, mw); err != nil {
		t.Fatal(err)
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: mw.Status.CacheName}, cache); err != nil {
		t.Fatal(err)
	}
	key := inferencev1.WeightsCacheReadyLabel(string(cache.UID))

	// Each agent keeps a Lease named after its node, owned by the Node (it goes with it).
	for _, n := range []string{"g5-a", "g5-b"} {
		lease := &coordinationv1.Lease{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: inferencev1.DefaultOperatorNamespace, Name: n}, lease); err != nil {
			t.Fatal(err)
		}
		if lease.Labels[prewarmv1alpha1.AgentLeaseLabel] != "true" || *lease.Spec.LeaseDurationSeconds != 15 ||
			len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].Kind != "Node" || lease.OwnerReferences[0].Name != n {
			t.Errorf("%s's agent Lease: labels %v, duration %v, owners %+v", n, lease.Labels, lease.Spec.LeaseDurationSeconds, lease.OwnerReferences)
		}
	}
	// Settled, an agent writes no status: its NodeCache's resourceVersion stays while its Lease
	// is renewed (every 5 s).
	nc := &prewarmv1alpha1.NodeCache{}
	lease := &coordinationv1.Lease{}
	read := func() (string, time.Time) {
		if err := c.Get(ctx, types.NamespacedName{Name: "g5-a"}, nc); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, types.NamespacedName{Namespace: inferencev1.DefaultOperatorNamespace, Name: "g5-a"}, lease); err != nil {
			t.Fatal(err)
		}
		return nc.ResourceVersion, lease.Spec.RenewTime.Time
	}
	rv, since := read()
	e.eventually(time.Minute, "g5-a's agent renews its Lease twice and writes no status meanwhile", func() (bool, string) {
		rv2, renewed := read()
		if rv2 != rv { // a write (the last of the download, a disk's change): watch from here
			rv, since = read()
			return false, "NodeCache written at resourceVersion " + rv2
		}
		return renewed.Sub(since) >= 9*time.Second, fmt.Sprintf("Lease renewed %s after the watch began", renewed.Sub(since))
	})

	// g5-b's agent goes: nothing is written for it, and still the node stops counting.
	stopped := e.agents["g5-b"]
	stopped.Name += "-stopped"
	stopped.Stop(5 * time.Second)
	e.eventually(90*time.Second, "g5-b counts no more once its agent's Lease expires", func() (bool, string) {
		m := &inferencev1.ModelDataCacheConfig{}
		err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: cache.Name}, m)
		if err != nil {
			return false, err.Error()
		}
		i := slices.IndexFunc(m.Status.Nodes, func(n inferencev1.NodeCacheStatus) bool { return n.Name == "g5-b" })
		labelled := e.labelled(key)
		return m.Status.ReadyNodes == 1 && i >= 0 && m.Status.Nodes[i].Reason == prewarmv1alpha1.ReasonAgentNotReporting &&
				strings.Contains(m.Status.Nodes[i].Message, "has not renewed its Lease") && slices.Equal(labelled, []string{"g5-a"}),
			fmt.Sprintf("ready %d, labelled %v", m.Status.ReadyNodes, labelled)
	})
	out, err := exec.CommandContext(ctx, cliPath, "explain", "node", "g5-b", "--kubeconfig="+e.cluster.KubeconfigPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "has not renewed its Lease hyperpod-inference-system/g5-b") ||
		!strings.Contains(string(out), "team-a/"+cache.Name+": NOT WARM: the node's agent is not alive") {
		t.Errorf("kubectl prewarm explain node g5-b (%v):\n%s", err, out)
	}

	// Back: it renews its Lease, and the node counts again, labelled.
	e.startAgent("g5-b", s3srv.Endpoint)
	e.eventually(90*time.Second, "g5-b counts again once its agent is back", func() (bool, string) {
		m := &inferencev1.ModelDataCacheConfig{}
		err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: cache.Name}, m)
		if err != nil {
			return false, err.Error()
		}
		labelled := e.labelled(key)
		return m.Status.ReadyNodes == 2 && slices.Equal(labelled, []string{"g5-a", "g5-b"}), "labelled " + strings.Join(labelled, ",")
	})
}
