package agent

import (
	"cmp"
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
)

// podUsing returns a pod on this node (namespace/name) that mounts cache uid and has not
// finished, or "": through prewarm's CSI volume (only a pod of the cache's namespace ns, when
// known, can have it mounted: another namespace's pod naming the cache keeps nothing), or a
// hostPath of its directory (pods made before the CSI volume).
func (a *Agent) podUsing(ctx context.Context, uid, ns string) (string, error) {
	pods, err := a.podsUsing(ctx, uid, ns)
	if err != nil || len(pods) == 0 {
		return "", err
	}
	return pods[0].Namespace + "/" + pods[0].Name, nil
}

// podsUsing returns the pods on this node, not finished, that use cache uid of namespace ns
// (any namespace when ns is empty): by its CSI volume, or by a host path to its directory.
func (a *Agent) podsUsing(ctx context.Context, uid, ns string) ([]corev1.Pod, error) {
	pods, err := a.activePods(ctx)
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, root := range a.opts.Config.Roots() {
		dirs[prewarmv1alpha1.CacheDir(a.opts.nodePath(root), uid)] = true
	}
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool {
		return !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
			return (v.HostPath != nil && dirs[filepath.Clean(v.HostPath.Path)]) ||
				((ns == "" || p.Namespace == ns) && a.volumeCache(ctx, &p, v) == uid)
		})
	}), nil
}

// warnPods records a Warning event on each pod of the node that uses the job's cache.
func (a *Agent) warnPods(ctx context.Context, j *cachejob.Job, reason, msg string) {
	pods, err := a.podsUsing(ctx, j.Request().UID, j.Request().Namespace)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the node's pods to tell them", "reason", reason)
		return
	}
	for _, p := range pods {
		a.event(MountRequest{CacheUID: j.Request().UID, PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID}, corev1.EventTypeWarning, reason, msg)
	}
}

// activePods lists the pods on this node that have not finished (from the agent's cache,
// which holds this node's pods only: CacheOptions).
func (a *Agent) activePods(ctx context.Context) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := a.client.List(ctx, pods); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		return p.Spec.NodeName != a.opts.NodeName || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	}), nil
}

// demands lists the caches that the node's pods (not finished) ask for through prewarm's CSI
// volume (by UID, or by a name their namespace resolves), by namespace: the controller makes the node a target of each, for pods of the cache's
// namespace, so that a pod on a node that was not asked for its cache still gets it.
func (a *Agent) demands(ctx context.Context) ([]prewarmv1alpha1.CacheDemand, error) {
	pods, err := a.activePods(ctx)
	if err != nil {
		return nil, err
	}
	count := map[prewarmv1alpha1.CacheDemand]int32{}
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if uid := a.volumeCache(ctx, &p, v); uidPattern.MatchString(uid) {
				count[prewarmv1alpha1.CacheDemand{UID: uid, Namespace: p.Namespace}]++
			}
		}
	}
	return fairDemands(count, prewarmv1alpha1.MaxDemands), nil
}

// fairDemands lists at most limit of the demands counted (with the pods of each), shared
// fairly among namespaces: in rounds, each namespace's next demand (those most pods ask for
// first), so that one namespace's pods naming many caches cannot crowd out another's. The
// list is sorted by UID and namespace.
func fairDemands(count map[prewarmv1alpha1.CacheDemand]int32, limit int) []prewarmv1alpha1.CacheDemand {
	byNS := map[string][]prewarmv1alpha1.CacheDemand{}
	for d, n := range count {
		d.Pods = n
		byNS[d.Namespace] = append(byNS[d.Namespace], d)
	}
	namespaces := slices.Sorted(maps.Keys(byNS))
	for _, ns := range namespaces {
		slices.SortFunc(byNS[ns], func(x, y prewarmv1alpha1.CacheDemand) int {
			return cmp.Or(cmp.Compare(y.Pods, x.Pods), strings.Compare(x.UID, y.UID))
		})
	}
	var out []prewarmv1alpha1.CacheDemand
	for round := 0; len(out) < limit; round++ {
		took := false
		for _, ns := range namespaces {
			if round < len(byNS[ns]) && len(out) < limit {
				out, took = append(out, byNS[ns][round]), true
			}
		}
		if !took {
			break
		}
	}
	slices.SortFunc(out, func(x, y prewarmv1alpha1.CacheDemand) int {
		return cmp.Or(strings.Compare(x.UID, y.UID), strings.Compare(x.Namespace, y.Namespace))
	})
	return out
}
