package weightscache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/cacheref"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
)

// decision is what one reconcile decides for a cache: the request nodes get, how they read the
// source, the targets and the nodes that keep their copy for now, or why no node is asked.
type decision struct {
	entry    prewarmv1alpha1.CacheRequest
	access   access
	verdict  *verdict
	targets  []*corev1.Node
	retained map[string]retention
	// retainedNodes are the nodes of retained.
	retainedNodes []*corev1.Node
	// excluded are the nodes the placement selects that are neither targets nor retained: the
	// pods could not run there (a taint they do not tolerate, a cordon).
	excluded placement.LeftOut
	// bounded is a standalone cache's placement within its namespace's grant (nil: a parent's
	// cache, which follows its parent's pods); notGranted are the nodes its own placement
	// selects that the grant leaves out.
	bounded    *placement.Bounded
	notGranted placement.LeftOut
	// peerAddrs are the targets' peer addresses that other agents may be sent (peerAddrsOf).
	peerAddrs map[string]string
	requeue   time.Duration
	// policyProblem says what of the cache's eviction annotations its namespace's quota did not
	// allow ("": nothing).
	policyProblem string
	// size is what is known of the model's size.
	size estimate
	// quota is what the namespace's quota decides (applyQuota, in the ask phase).
	quota quotaDecision
}

// verdict is a condition the cache's spec or surroundings impose; failed marks the cache Failed
// (and then no node is asked for it).
type verdict struct {
	reason, message string
	failed          bool
}

// decide decides the cache's request and its targets. A cache being deleted has no targets: every
// request is withdrawn.
func (r *Reconciler) decide(ctx context.Context, m *inferencev1.ModelDataCacheConfig, f *fleet) (decision, error) {
	p := decision{retained: map[string]retention{}}
	src, srcErr := r.Config.CacheSource(m.Spec.ModelSourceConfig)
	if src.Type != inferencev1.ModelSourceHuggingFace && m.Status.ResolvedRevision != "" {
		// Pinned to the content the first node holds: objects rewritten under the same location
		// are not fetched by any other node (nor by a cold pod), and say so.
		src.Revision = m.Status.ResolvedRevision
	}
	p.entry = prewarmv1alpha1.CacheRequest{UID: string(m.UID), Namespace: m.Namespace, Name: m.Name, Root: m.Spec.HostPath, Source: src}
	p.entry.Priority, p.entry.Pinned, p.policyProblem = r.Config.CachePolicy(m.Namespace, m.Annotations)
	if !m.DeletionTimestamp.IsZero() {
		return p, nil
	}
	ok, why, err := r.parentWants(ctx, m)
	if err != nil {
		return p, err
	}
	if !ok {
		p.verdict = &verdict{inferencev1.ReasonParentNotFound, why, true}
		return p, nil
	}
	if allowed, why := r.Config.CacheRootAllowed(m.Spec.HostPath); !allowed {
		p.verdict = &verdict{inferencev1.ReasonHostPathNotAllowed, why, true}
		return p, nil
	}
	if srcErr != nil {
		reason := inferencev1.ReasonSourceNotAllowed
		if spec := (*controller.SpecError)(nil); errors.As(srcErr, &spec) {
			reason = inferencev1.ReasonInvalidSpec // a value no node's request holds: asked of none
		}
		p.verdict = &verdict{reason, srcErr.Error(), true}
		return p, nil
	}
	if p.access, err = r.sourceAccess(ctx, m, src); err != nil {
		return p, err
	}
	if !p.access.creds.Empty() || p.access.tokenProblem != "" || p.access.refused != "" {
		// The namespace's Secrets are read, not watched: look again, so that a replaced or
		// revoked token reaches the nodes (and a fixed one the cache) without waiting for
		// another change.
		p.requeue = secretRecheck
	}
	switch {
	case p.access.refused != "":
		p.verdict = &verdict{inferencev1.ReasonSourceNotAllowed, p.access.refused, true}
		return p, nil
	case p.access.tokenProblem != "":
		p.verdict = &verdict{reason: inferencev1.ReasonTokenSecretProblem, message: p.access.tokenProblem} // the nodes try without it
	}
	if standalone(m) {
		// A standalone cache has no pods of its namespace to follow: prewarm's agents hold it,
		// on the nodes the operator configuration grants the namespace.
		g := r.Config.Grant(m.Namespace)
		if why := g.Refusal(); why != "" {
			p.verdict = &verdict{inferencev1.ReasonNodesNotGranted, why, true}
			return p, nil
		}
		b := g.Bound(m.Spec.Placement)
		p.bounded = &b
	}
	if err = r.chooseTargets(ctx, m, f, &p); err != nil {
		return p, err
	}
	p.size = r.sizeOf(ctx, m, src, p.access, f)
	if _, limited := r.Config.ClusterLimit(m.Namespace); limited && p.entry.Source.Revision == "" && p.size.revision != "" {
		// The namespace's quota in the cluster counts each copy at the size the controller
		// listed: the nodes fetch exactly that content (a source grown since fails SourceChanged
		// on them), so what they hold stays within the quota.
		p.entry.Source.Revision = p.size.revision
	}
	return p, nil
}

// standalone reports whether m is a standalone cache's: a ModelWeightsCacheConfig's, which no
// pod of its namespace follows.
func standalone(m *inferencev1.ModelDataCacheConfig) bool {
	return m.Spec.ParentReference.Kind == "ModelWeightsCacheConfig"
}

// chooseTargets picks the cache's targets: the nodes the parent's pods may run on. A node the
// placement selects but whose scheduling state keeps the pods off for now (cordoned, tainted,
// unreachable) is not a target, but keeps what it was asked for until the retention passes:
// that state passes, and the model will be wanted there again. A standalone cache's targets are
// also within its namespace's grant: a node outside it is left out at once (unless pods of the
// namespace there ask for the cache), and the state of the others is judged with the
// tolerations the grant honours.
func (r *Reconciler) chooseTargets(ctx context.Context, m *inferencev1.ModelDataCacheConfig, f *fleet, p *decision) error {
	now := r.Now()
	rules := r.Config.Rules()
	admitted := m.Spec.Placement
	if p.bounded != nil {
		admitted = p.bounded.Placement
	}
	for _, n := range f.nodes {
		selected, _ := rules.Selects(m.Spec.Placement, n)
		notGranted := ""
		if selected && p.bounded != nil {
			notGranted = p.bounded.Excludes(n)
		}
		if !selected || notGranted != "" {
			// Pods of the cache's namespace on this node ask for it (their CSI volume),
			// though the placement does not select it (or its grant does not cover it): the
			// node holds it for them while they are there. The agent's word for it is not
			// enough (it would get the namespace's credentials and its pods' preference): the
			// pods must be there.
			there := false
			if demanded(f.nodeCache(n.Name), m) {
				var err error
				if there, err = r.podsDemand(ctx, n.Name, m); err != nil {
					return err
				}
			}
			switch {
			case there:
				p.targets = append(p.targets, n)
			case notGranted != "":
				p.notGranted.Add(notGranted, n.Name) // never the namespace's to hold: withdrawn at once
			}
			continue
		}
		ok, why := placement.Admits(admitted, n)
		if ok {
			p.targets = append(p.targets, n)
			continue
		}
		r.retain(p, n, f.request(n.Name), why, now)
	}
	return nil
}

// retain keeps node n, which the pods cannot run on now (why), among the cache's nodes until
// the retention passes since it was first kept; a node never asked, or kept long enough, is
// left out.
func (r *Reconciler) retain(p *decision, n *corev1.Node, asked *prewarmv1alpha1.CacheRequest, why string, now time.Time) {
	if asked == nil {
		p.excluded.Add(why, n.Name) // never asked here: nothing to keep
		return
	}
	since := asked.RetainedSince
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		since, t = now.UTC().Format(time.RFC3339), now
	}
	left := r.Config.Retention() - now.Sub(t)
	if left <= 0 {
		p.excluded.Add(why, n.Name) // kept long enough: withdrawn
		return
	}
	p.retained[n.Name] = retention{since: since, until: t.Add(r.Config.Retention()), why: why}
	p.retainedNodes = append(p.retainedNodes, n)
	if p.requeue == 0 || left < p.requeue {
		p.requeue = left
	}
}

// podsDemand reports whether a pod of m's namespace that has not finished runs on node (is
// bound to it) with prewarm's CSI volume naming m (by UID, or by a name that means m there): what a node's reported demand must be borne
// out by. It asks the API server (pods bound to one node, of one namespace), not the agent.
func (r *Reconciler) podsDemand(ctx context.Context, node string, m *inferencev1.ModelDataCacheConfig) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(m.Namespace), client.MatchingFields{"spec.nodeName": node}); err != nil {
		return false, fmt.Errorf("listing namespace %s's pods on node %s, to check its demand: %w", m.Namespace, node, err)
	}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName != node || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if prewarmv1alpha1.VolumeCacheUID(v) == string(m.UID) {
				return true, nil
			}
			if named, err := r.namesCache(ctx, m, prewarmv1alpha1.VolumeCacheByName(v)); named || err != nil {
				return named, err
			}
		}
	}
	return false, nil
}

// namesCache reports whether name, given by a pod of m's namespace as the cache its volume
// mounts, means m: resolved as the node's agent resolves it, in m's namespace, from the
// controller's own view of the cache objects, not the agent's word. Only the names that can
// mean m are looked up: m's own (its view's) and its standalone ModelWeightsCacheConfig's.
func (r *Reconciler) namesCache(ctx context.Context, m *inferencev1.ModelDataCacheConfig, name string) (bool, error) {
	ownName := name == m.Name || (standalone(m) && name == m.Spec.ParentReference.Name)
	if name == "" || !ownName {
		return false, nil
	}
	_, uid, err := cacheref.Resolve(ctx, r.Client, m.Namespace, name)
	if err != nil && !errors.Is(err, cacheref.ErrNotFound) && !errors.Is(err, cacheref.ErrNotReady) && !errors.Is(err, cacheref.ErrInvalid) {
		return false, err
	}
	return uid == m.UID, nil
}

// demanded reports whether pods of m's namespace on nc's node ask for m through prewarm's CSI
// volume, as nc's agent reports it. Pods of another namespace naming m make nothing happen
// (their mount is refused).
func demanded(nc *prewarmv1alpha1.NodeCache, m *inferencev1.ModelDataCacheConfig) bool {
	if nc == nil {
		return false
	}
	return slices.ContainsFunc(nc.Status.Demands, func(d prewarmv1alpha1.CacheDemand) bool {
		return d.UID == string(m.UID) && d.Namespace == m.Namespace
	})
}

// retention is why and how long a node that is not a target keeps a cache.
type retention struct {
	since string // RFC 3339, as in the NodeCache request
	until time.Time
	why   string
}
