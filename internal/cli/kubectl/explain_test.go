package kubectl

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/placement"
)

// explain says of a standalone cache what the controller decides: a node its own placement
// selects is no target where its namespace's grant does not reach (the control plane, a pool
// whose taint only an ungranted toleration tolerates); a parent's cache is judged by its
// placement alone.
func TestExplainHoldsStandaloneCachesToTheirGrant(t *testing.T) {
	everything := inferencev1.Placement{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}
	cache := func(kind string) *inferencev1.ModelDataCacheConfig {
		return &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "warm-cache"},
			Spec: inferencev1.ModelDataCacheConfigSpec{ParentReference: inferencev1.ParentReference{Kind: kind, Name: "warm"}, Placement: everything}}
	}
	controlPlane := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1", Labels: map[string]string{config.ControlPlaneLabel: ""}}}
	pool := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pool-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "dedicated", Value: "team-b", Effect: corev1.TaintEffectNoSchedule}}}}
	op := config.Default()
	rules := placement.NewRules(op.Placement, false)
	for _, tc := range []struct {
		kind string
		node *corev1.Node
		why  string
	}{
		{"ModelWeightsCacheConfig", controlPlane, "not a target: standaloneCacheNodes[0] grants namespace team-a's standalone caches only nodes with node-role.kubernetes.io/control-plane DoesNotExist"},
		{"ModelWeightsCacheConfig", pool, "not a target: taint dedicated=team-b:NoSchedule is tolerated only by a toleration standaloneCacheNodes[0] does not grant namespace team-a"},
		{"InferenceEndpointConfig", controlPlane, "a target, but no agent reports on this node"},
		{"InferenceEndpointConfig", pool, "a target, but no agent reports on this node"},
	} {
		if e := explainWeights(rules, op, cache(tc.kind), tc.node, nil); e.Why != tc.why || e.Warm {
			t.Errorf("%s on %s: %q (warm %v); want %q", tc.kind, tc.node.Name, e.Why, e.Warm, tc.why)
		}
	}
	op.StandaloneCacheNodes = []config.NodeGrant{{Namespaces: []string{"team-b"}}}
	if e := explainWeights(rules, op, cache("ModelWeightsCacheConfig"), pool, nil); !strings.Contains(e.Why, "no entry of the operator configuration's standaloneCacheNodes names namespace team-a") {
		t.Errorf("a namespace granted nothing: %q", e.Why)
	}
}
