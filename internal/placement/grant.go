package placement

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	schedcorev1 "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

// Grant is what the standalone caches of one namespace (the ModelWeightsCacheConfigs and
// ModelImageCaches it writes, with no endpoint) may reach: the nodes the operator
// configuration's standaloneCacheNodes grants it, and the tolerations they may use there. Such a
// cache is held by prewarm's agents and image pullers, not by pods of its namespace: its own
// placement is honoured only within its grant.
type Grant struct {
	namespace string
	// at names the grant's entry in messages (standaloneCacheNodes[0]).
	at    string
	found bool
	nodes config.NodeGrant
	// allowed are the tolerations the caches may use: placement.tolerations and the grant's
	// (besides those of the extended resources' taints).
	allowed []corev1.Toleration
}

// GrantFor returns namespace ns's grant in the operator configuration o.
func GrantFor(o config.OperatorConfiguration, ns string) Grant {
	g, at, ok := o.StandaloneNodes(ns)
	return Grant{namespace: ns, at: at, found: ok, nodes: g, allowed: slices.Concat(o.Placement.Tolerations, g.Tolerations)}
}

// Refusal says why the namespace's standalone caches are kept on no node: no entry of
// standaloneCacheNodes names it ("": one does).
func (g Grant) Refusal() string {
	if g.found {
		return ""
	}
	return fmt.Sprintf("no entry of the operator configuration's standaloneCacheNodes names namespace %s, so its standalone caches are kept on no node: "+
		"the cluster admin grants it nodes with config.standaloneCacheNodes in the chart's values (- {namespaces: [%s], matchExpressions: [{key: %s, operator: DoesNotExist}]})",
		g.namespace, g.namespace, config.ControlPlaneLabel)
}

// requirements are what the grant's nodes must meet: its nodeSelector's pairs, then its
// matchExpressions.
func (g Grant) requirements() []corev1.NodeSelectorRequirement {
	var reqs []corev1.NodeSelectorRequirement
	for _, k := range slices.Sorted(maps.Keys(g.nodes.NodeSelector)) {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{g.nodes.NodeSelector[k]}})
	}
	for _, e := range g.nodes.MatchExpressions {
		reqs = append(reqs, *e.DeepCopy())
	}
	return reqs
}

// Bounded is a standalone cache's placement within its namespace's grant.
type Bounded struct {
	// Placement is the cache's placement as the grant lets it reach: its tolerations narrowed
	// to what the grant allows (Grant.Tolerations), and the grant's requirements added to every
	// required node affinity term. The image cache of a ModelImageCache is made with it, so
	// that its DaemonSet's affinity and tolerations are the grant's too.
	Placement inferencev1.Placement
	// Note says what of the cache's tolerations is not honoured ("": all is).
	Note  string
	grant Grant
	// own are the cache's tolerations as written (with placement.tolerations).
	own  []corev1.Toleration
	reqs []corev1.NodeSelectorRequirement
	// selector selects the grant's nodes (nil: every node).
	selector *nodeaffinity.LazyErrorNodeSelector
}

// Bound returns placement p, a standalone cache's own, within the grant.
func (g Grant) Bound(p inferencev1.Placement) Bounded {
	b := Bounded{Placement: *p.DeepCopy(), grant: g, own: slices.Clone(p.Tolerations), reqs: g.requirements()}
	b.Placement.Tolerations, b.Note = g.Tolerations(p.Tolerations)
	if len(b.reqs) == 0 {
		return b
	}
	b.selector = nodeaffinity.NewLazyErrorNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: b.reqs}}})
	if b.Placement.NodeAffinity == nil {
		b.Placement.NodeAffinity = &corev1.NodeAffinity{}
	}
	a := b.Placement.NodeAffinity
	if a.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(a.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		a.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := a.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, b.reqs...)
	}
	return b
}

// Excludes says why node, which the cache's own placement selects, is not the grant's to reach
// ("": it is): the grant's requirements leave it out, or one of its taints is tolerated only by
// a toleration the grant does not honour. A taint of the node's state (node.kubernetes.io/...:
// not ready, unreachable, cordoned) is not the grant's business: that state passes, and
// Admits judges it with the narrowed tolerations.
func (b Bounded) Excludes(node *corev1.Node) string {
	g := b.grant
	if !g.found {
		return fmt.Sprintf("no entry of standaloneCacheNodes names namespace %s", g.namespace)
	}
	if b.selector != nil {
		if ok, err := b.selector.Match(node); !ok || err != nil {
			return fmt.Sprintf("%s grants namespace %s's standalone caches only nodes with %s", g.at, g.namespace, describeRequirements(b.reqs))
		}
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if (t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute) || stateTaint(t.Key) {
			continue
		}
		if schedcorev1.TolerationsTolerateTaint(logr.Discard(), b.own, t, false) &&
			!schedcorev1.TolerationsTolerateTaint(logr.Discard(), b.Placement.Tolerations, t, false) {
			return fmt.Sprintf("taint %s is tolerated only by a toleration %s does not grant namespace %s", t.ToString(), g.at, g.namespace)
		}
	}
	return ""
}

// MatchStandalone is Match for a standalone cache whose namespace's grant is g: node is a
// target when p, the cache's own placement, selects it, the grant covers it, and its state
// admits the tolerations the grant honours. The controller decides the same, node by node.
func (r Rules) MatchStandalone(g Grant, p inferencev1.Placement, node *corev1.Node) (bool, string) {
	if why := g.Refusal(); why != "" {
		return false, why
	}
	if ok, why := r.Selects(p, node); !ok {
		return false, why
	}
	b := g.Bound(p)
	if why := b.Excludes(node); why != "" {
		return false, why
	}
	return Admits(b.Placement, node)
}

// stateTaint reports whether a taint of key says what state its node is in (not ready,
// unreachable, cordoned, short of a resource, not yet initialised, shut down), as the node
// lifecycle controllers and cloud providers taint nodes, rather than whose it is.
func stateTaint(key string) bool {
	return strings.HasPrefix(key, "node.kubernetes.io/") || strings.HasPrefix(key, "node.cloudprovider.kubernetes.io/")
}

// Tolerations narrows a standalone cache's tolerations to what the grant lets it use: each is
// honoured as far as a toleration of placement.tolerations or of the grant, or of an extended
// resource's NoSchedule taint (named by its key), covers it. {operator: Exists} is honoured as
// each of those tolerations; {key: nvidia.com/gpu, operator: Exists} as its NoSchedule part.
// note says which tolerations are not honoured, or only in part, and which setting allows them
// ("": every one is).
func (g Grant) Tolerations(ts []corev1.Toleration) (honoured []corev1.Toleration, note string) {
	var short []string
	for _, t := range ts {
		var parts []corev1.Toleration
		whole := false
		for _, a := range g.allowedFor(t) {
			x, ok := intersect(t, a)
			if !ok {
				continue
			}
			whole = whole || same(x, t)
			parts = append(parts, x)
		}
		if whole {
			parts = []corev1.Toleration{t}
		}
		for _, x := range parts {
			if !slices.ContainsFunc(honoured, func(h corev1.Toleration) bool { return covers(h, x) }) {
				honoured = slices.DeleteFunc(honoured, func(h corev1.Toleration) bool { return covers(x, h) })
				honoured = append(honoured, x)
			}
		}
		switch {
		case whole:
		case len(parts) == 0:
			short = append(short, "toleration "+TolerationString(t)+" is not honoured")
		default:
			shown := make([]string, len(parts))
			for i, x := range parts {
				shown[i] = TolerationString(x)
			}
			short = append(short, fmt.Sprintf("toleration %s is honoured only as %s", TolerationString(t), summarize(shown, ", ")))
		}
	}
	if len(short) == 0 {
		return honoured, ""
	}
	return honoured, fmt.Sprintf("%s: namespace %s's standalone caches may use only placement.tolerations, the NoSchedule taint of an extended resource named by its key (nvidia.com/gpu), and the tolerations of %s; the cluster admin allows more with %s.tolerations (config.standaloneCacheNodes in the chart's values)",
		summarize(short, "; "), g.namespace, g.at, g.at)
}

// allowedFor are the tolerations t may be honoured as: the allowed ones, and, when t names an
// extended resource, the toleration of that resource's NoSchedule taint.
func (g Grant) allowedFor(t corev1.Toleration) []corev1.Toleration {
	if t.Key != "" && IsExtendedResource(t.Key) {
		return append(slices.Clone(g.allowed), corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return g.allowed
}

// narrower is the narrower of two of a toleration's key or effect, where empty means any; ok is
// false when they name different ones.
func narrower(t, a string) (string, bool) {
	switch {
	case t == "":
		return a, true
	case a == "" || a == t:
		return t, true
	}
	return "", false
}

// intersect is the toleration that tolerates exactly the taints both t and a tolerate; ok is
// false when there are none. Lt and Gt, which prewarm's matching does not use, tolerate none.
func intersect(t, a corev1.Toleration) (x corev1.Toleration, ok bool) {
	if !plainOperator(t.Operator) || !plainOperator(a.Operator) {
		return x, false
	}
	if x.Key, ok = narrower(t.Key, a.Key); !ok {
		return x, false
	}
	tAny, aAny := t.Operator == corev1.TolerationOpExists, a.Operator == corev1.TolerationOpExists
	switch {
	case tAny && aAny:
		x.Operator = corev1.TolerationOpExists
	case tAny:
		x.Operator, x.Value = corev1.TolerationOpEqual, a.Value
	case aAny || t.Value == a.Value:
		x.Operator, x.Value = corev1.TolerationOpEqual, t.Value
	default:
		return x, false
	}
	var effect string
	if effect, ok = narrower(string(t.Effect), string(a.Effect)); !ok {
		return x, false
	}
	x.Effect = corev1.TaintEffect(effect)
	switch {
	case t.TolerationSeconds == nil:
		x.TolerationSeconds = a.TolerationSeconds
	case a.TolerationSeconds == nil || *t.TolerationSeconds <= *a.TolerationSeconds:
		x.TolerationSeconds = t.TolerationSeconds
	default:
		x.TolerationSeconds = a.TolerationSeconds
	}
	if x.Operator == corev1.TolerationOpEqual && t.Operator == "" {
		x.Operator = "" // as written: Equal is the default
	}
	return x, true
}

// plainOperator reports whether op is Exists or Equal (empty: Equal).
func plainOperator(op corev1.TolerationOperator) bool {
	return op == "" || op == corev1.TolerationOpEqual || op == corev1.TolerationOpExists
}

// covers reports whether h tolerates everything x does.
func covers(h, x corev1.Toleration) bool {
	i, ok := intersect(x, h)
	return ok && same(i, x)
}

// same reports whether a and b tolerate the same taints for as long.
func same(a, b corev1.Toleration) bool {
	op := func(o corev1.TolerationOperator) corev1.TolerationOperator {
		if o == "" {
			return corev1.TolerationOpEqual
		}
		return o
	}
	seconds := func(s *int64) int64 {
		if s == nil {
			return -1
		}
		return *s
	}
	return a.Key == b.Key && op(a.Operator) == op(b.Operator) && a.Value == b.Value && a.Effect == b.Effect &&
		seconds(a.TolerationSeconds) == seconds(b.TolerationSeconds)
}

// TolerationString writes a toleration as it is written in YAML, for messages:
// {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}.
func TolerationString(t corev1.Toleration) string {
	var parts []string
	if t.Key != "" {
		parts = append(parts, "key: "+t.Key)
	}
	if t.Operator != "" {
		parts = append(parts, "operator: "+string(t.Operator))
	}
	if t.Value != "" {
		parts = append(parts, "value: "+t.Value)
	}
	if t.Effect != "" {
		parts = append(parts, "effect: "+string(t.Effect))
	}
	if t.TolerationSeconds != nil {
		parts = append(parts, "tolerationSeconds: "+strconv.FormatInt(*t.TolerationSeconds, 10))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// describeRequirements writes node selector requirements for people.
func describeRequirements(reqs []corev1.NodeSelectorRequirement) string {
	parts := make([]string, len(reqs))
	for i, e := range reqs {
		switch e.Operator {
		case corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
			parts[i] = fmt.Sprintf("%s %s", e.Key, e.Operator)
		case corev1.NodeSelectorOpIn:
			if len(e.Values) == 1 {
				parts[i] = e.Key + "=" + e.Values[0]
				continue
			}
			fallthrough
		default:
			parts[i] = fmt.Sprintf("%s %s %s", e.Key, e.Operator, strings.Join(e.Values, ","))
		}
	}
	return strings.Join(parts, ", ")
}

// maxShown is how many items a message lists before it counts the rest.
const maxShown = 5

// summarize joins the first maxShown items with sep, and counts the rest.
func summarize(items []string, sep string) string {
	if len(items) <= maxShown {
		return strings.Join(items, sep)
	}
	return fmt.Sprintf("%s%sand %d more", strings.Join(items[:maxShown], sep), sep, len(items)-maxShown)
}
