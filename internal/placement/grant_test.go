package placement

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

// grantConfig is a configuration whose operator pods tolerate an "ops" taint, that grants team-b
// its dedicated pool and a taint with a toleration time, and every other namespace the default.
func grantConfig() config.OperatorConfiguration {
	o := config.Default()
	o.Placement.Tolerations = []corev1.Toleration{{Key: "ops", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	o.StandaloneCacheNodes = append([]config.NodeGrant{{
		Namespaces:   []string{"team-b"},
		NodeSelector: map[string]string{"pool": "team-b"},
		Tolerations: []corev1.Toleration{
			{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "team-b", Effect: corev1.TaintEffectNoSchedule},
			{Key: "flaky", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)},
		},
	}}, config.DefaultStandaloneCacheNodes()...)
	return o
}

// A standalone cache's toleration is honoured as far as what its namespace may use covers it:
// placement.tolerations, its grant's, and an extended resource's NoSchedule taint named by key.
func TestGrantHonoursOnlyWhatItCovers(t *testing.T) {
	exists := corev1.Toleration{Operator: corev1.TolerationOpExists}
	gpu := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	ops := corev1.Toleration{Key: "ops", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	teamB := corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "team-b", Effect: corev1.TaintEffectNoSchedule}
	flaky60 := corev1.Toleration{Key: "flaky", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)}
	for _, tc := range []struct {
		name, ns string
		in       []corev1.Toleration
		want     []corev1.Toleration
		note     string // "" when every toleration is honoured whole
	}{
		{"an extended resource's taint, named", "team-a", []corev1.Toleration{gpu, ops}, []corev1.Toleration{gpu, ops}, ""},
		{"Exists is honoured as what the namespace may use", "team-a", []corev1.Toleration{exists, ops}, []corev1.Toleration{ops},
			"toleration {operator: Exists} is honoured only as {key: ops, operator: Exists, effect: NoSchedule}: namespace team-a's standalone caches may use only"},
		{"an extended resource's taint of every effect, as NoSchedule", "team-a",
			[]corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}, []corev1.Toleration{gpu},
			"{key: nvidia.com/gpu, operator: Exists} is honoured only as {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}"},
		{"another tenant's pool is not", "team-a", []corev1.Toleration{teamB}, nil,
			"{key: dedicated, operator: Equal, value: team-b, effect: NoSchedule} is not honoured: namespace team-a's standalone caches may use only placement.tolerations, the NoSchedule taint of an extended resource named by its key (nvidia.com/gpu), and the tolerations of standaloneCacheNodes[1]; the cluster admin allows more with standaloneCacheNodes[1].tolerations"},
		{"the grant's own", "team-b", []corev1.Toleration{teamB}, []corev1.Toleration{teamB}, ""},
		{"Exists on the grant's key, as its value", "team-b",
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}, []corev1.Toleration{teamB},
			"{key: dedicated, operator: Exists} is honoured only as {key: dedicated, operator: Equal, value: team-b, effect: NoSchedule}"},
		{"another value of the grant's key", "team-b",
			[]corev1.Toleration{{Key: "dedicated", Value: "team-c", Effect: corev1.TaintEffectNoSchedule}}, nil, "{key: dedicated, value: team-c, effect: NoSchedule} is not honoured"},
		{"for no longer than the grant allows", "team-b",
			[]corev1.Toleration{{Key: "flaky", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, []corev1.Toleration{flaky60},
			"is honoured only as {key: flaky, operator: Exists, effect: NoExecute, tolerationSeconds: 60}"},
		{"Exists everywhere, for the grant's namespace", "team-b", []corev1.Toleration{exists}, []corev1.Toleration{ops, teamB, flaky60},
			"{operator: Exists} is honoured only as {key: ops, operator: Exists, effect: NoSchedule}, {key: dedicated, operator: Equal, value: team-b, effect: NoSchedule}, {key: flaky, operator: Exists, effect: NoExecute, tolerationSeconds: 60}"},
		{"Lt and Gt tolerate nothing here", "team-b", []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpLt, Value: "3"}}, nil, "is not honoured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, note := GrantFor(grantConfig(), tc.ns).Tolerations(tc.in)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("honoured (-want +got):\n%s", diff)
			}
			if (tc.note == "") != (note == "") || !strings.Contains(note, tc.note) {
				t.Errorf("note %q; want one saying %q", note, tc.note)
			}
		})
	}
}

// The nodes a standalone cache's own placement selects are its targets only within its grant:
// not the control plane's by default, not a pool whose taint only an ungranted toleration
// tolerates. A node's passing state (a cordon, an outage) is left to Admits.
func TestGrantExcludesNodesItDoesNotGrant(t *testing.T) {
	everything := inferencev1.Placement{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}
	controlPlane := node("m5.large", map[string]string{config.ControlPlaneLabel: ""})
	pool := node("g5.24xlarge", map[string]string{"pool": "team-b"}, corev1.Taint{Key: "dedicated", Value: "team-b", Effect: corev1.TaintEffectNoSchedule})
	gpu := node("g5.24xlarge", nil, corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	cordoned := node("g5.24xlarge", map[string]string{"pool": "team-b"}, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule})
	soft := node("m5.large", nil, corev1.Taint{Key: "dedicated", Value: "team-c", Effect: corev1.TaintEffectPreferNoSchedule})
	gpuToleration := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name, ns string
		p        inferencev1.Placement
		n        *corev1.Node
		why      string
	}{
		{"the control plane, by default", "team-a", inferencev1.Placement{}, controlPlane,
			"standaloneCacheNodes[1] grants namespace team-a's standalone caches only nodes with node-role.kubernetes.io/control-plane DoesNotExist"},
		{"another tenant's pool, through Exists", "team-a", everything, pool,
			"taint dedicated=team-b:NoSchedule is tolerated only by a toleration standaloneCacheNodes[1] does not grant namespace team-a"},
		{"the GPU pool, through Exists", "team-a", everything, gpu,
			"taint nvidia.com/gpu=present:NoSchedule is tolerated only by a toleration standaloneCacheNodes[1] does not grant namespace team-a"},
		{"the GPU pool, its toleration named", "team-a", inferencev1.Placement{Tolerations: []corev1.Toleration{gpuToleration}}, gpu, ""},
		{"a soft taint is no bar", "team-a", everything, soft, ""},
		{"its own pool", "team-b", everything, pool, ""},
		{"not of its pool", "team-b", everything, gpu, "standaloneCacheNodes[0] grants namespace team-b's standalone caches only nodes with pool=team-b"},
		{"a cordon passes", "team-b", everything, cordoned, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if why := GrantFor(grantConfig(), tc.ns).Bound(tc.p).Excludes(tc.n); why != tc.why {
				t.Errorf("Excludes = %q; want %q", why, tc.why)
			}
		})
	}
	// The narrowed tolerations judge a cordon: Exists tolerated it, the grant does not.
	b := GrantFor(grantConfig(), "team-b").Bound(everything)
	if ok, why := Admits(b.Placement, cordoned); ok || why != "the node is cordoned" {
		t.Errorf("Admits(cordoned) = %v, %q; want the cordon to keep the cache off for now", ok, why)
	}
}

// A standalone image cache's placement carries its grant: the requirements in every required
// term, so that its DaemonSet's affinity keeps to the grant's nodes.
func TestBoundPlacementCarriesTheGrant(t *testing.T) {
	cp := corev1.NodeSelectorRequirement{Key: config.ControlPlaneLabel, Operator: corev1.NodeSelectorOpDoesNotExist}
	zone := func(z string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{z}}}}
	}
	own := FromSelector(map[string]string{inferencev1.InstanceTypeLabel: "ml.g5.24xlarge"},
		&corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{zone("a"), zone("b")}}}, nil)
	b := GrantFor(config.Default(), "team-a").Bound(own)
	withCP := func(t corev1.NodeSelectorTerm) corev1.NodeSelectorTerm {
		t.MatchExpressions = append(t.MatchExpressions, cp)
		return t
	}
	want := inferencev1.Placement{InstanceTypes: []string{"ml.g5.24xlarge"}, NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{withCP(zone("a")), withCP(zone("b"))}}}}
	if diff := cmp.Diff(want, b.Placement); diff != "" {
		t.Errorf("bounded placement (-want +got):\n%s", diff)
	}
	if len(own.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 1 {
		t.Error("Bound changed the cache's own placement")
	}
	plain := GrantFor(config.Default(), "team-a").Bound(inferencev1.Placement{})
	if diff := cmp.Diff(&corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{cp}}}}}, plain.Placement.NodeAffinity); diff != "" {
		t.Errorf("a placement of no affinity (-want +got):\n%s", diff)
	}
	// A namespace no entry names has no nodes, and is told which setting grants them.
	o := config.Default()
	o.StandaloneCacheNodes = []config.NodeGrant{{Namespaces: []string{"team-b"}}}
	if why := GrantFor(o, "team-a").Refusal(); !strings.Contains(why, "no entry of the operator configuration's standaloneCacheNodes names namespace team-a") ||
		!strings.Contains(why, "config.standaloneCacheNodes") {
		t.Errorf("Refusal = %q", why)
	}
	if why := GrantFor(o, "team-b").Refusal(); why != "" {
		t.Errorf("Refusal for a namespace with a grant = %q", why)
	}
}
