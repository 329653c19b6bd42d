package serving

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
)

// cacheKey identifies a cache's content: what is downloaded, and where it is kept. A parent
// whose key changes gets a new cache (a new UID, so new directories and labels).
func cacheKey(m *model) string {
	s := m.source
	id := struct {
		Type                    inferencev1.ModelSourceType
		Bucket, Region          string
		FSx, Repo, Commit, Path string
		HostPath                string
	}{Type: s.ModelSourceType, Path: strings.Trim(s.ModelLocation, "/"), HostPath: m.weights.HostPath}
	if s.S3Storage != nil {
		id.Bucket, id.Region = s.S3Storage.BucketName, s.S3Storage.Region
	}
	if s.FSxStorage != nil {
		id.FSx = s.FSxStorage.FileSystemID
	}
	if s.HuggingFaceModel != nil {
		id.Repo, id.Commit = s.HuggingFaceModel.ModelID, s.HuggingFaceModel.CommitSHA
	}
	b, _ := json.Marshal(id)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// ownedCaches lists the parent's caches, oldest first.
func (r *Reconciler) ownedCaches(ctx context.Context, m *model) ([]inferencev1.ModelDataCacheConfig, error) {
	list := &inferencev1.ModelDataCacheConfigList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.owner.GetNamespace()),
		client.MatchingLabels{controller.ParentUIDLabel: m.uid()}); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b inferencev1.ModelDataCacheConfig) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return list.Items, nil
}

// ensureCache returns the parent's cache for its current source and hostPath, created if
// missing (named <parent>-cache, or <parent>-cache-<key> while an older cache still holds that
// name), with its placement kept up to date.
func (r *Reconciler) ensureCache(ctx context.Context, m *model, owned []inferencev1.ModelDataCacheConfig) (*inferencev1.ModelDataCacheConfig, error) {
	key := cacheKey(m)
	spec := inferencev1.ModelDataCacheConfigSpec{
		ParentReference: inferencev1.ParentReference{
			Kind: m.kind, Namespace: m.owner.GetNamespace(), Name: m.owner.GetName(), UID: m.uid(),
		},
		ModelSourceConfig: m.source,
		HostPath:          m.weights.HostPath,
		Placement:         m.placement,
	}
	// The parent's eviction annotations are the cache's (the namespace's grant bounds them).
	policy := map[string]string{}
	for _, k := range []string{config.PriorityAnnotation, config.PinnedAnnotation} {
		if v, ok := m.owner.GetAnnotations()[k]; ok {
			policy[k] = v
		}
	}
	for i := range owned {
		c := &owned[i]
		if c.Labels[controller.CacheKeyLabel] != key || !c.DeletionTimestamp.IsZero() {
			continue
		}
		if equality.Semantic.DeepEqual(c.Spec, spec) && samePolicy(c.Annotations, policy) {
			return c, nil
		}
		// Same content; placement (or a credential reference, or the eviction annotations)
		// changed: update in place.
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec = spec
		setPolicy(c, policy)
		return c, r.Client.Patch(ctx, c, patch)
	}
	name := truncate(m.owner.GetName(), 253-len("-cache")) + "-cache"
	if slices.ContainsFunc(owned, func(c inferencev1.ModelDataCacheConfig) bool { return c.Name == name }) {
		name = truncate(m.owner.GetName(), 253-len("-cache-")-8) + "-cache-" + key[:8]
	}
	c := &inferencev1.ModelDataCacheConfig{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: m.owner.GetNamespace(),
			Labels: map[string]string{
				controller.ParentUIDLabel: m.uid(), controller.CacheKeyLabel: key, controller.ManagedByLabel: controller.ManagedBy,
			},
		},
		Spec: spec,
	}
	setPolicy(c, policy)
	if err := controllerutil.SetControllerReference(m.owner, c, r.Client.Scheme()); err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, c); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, &problem{inferencev1.ReasonNameConflict, fmt.Sprintf(
				"ModelDataCacheConfig %s/%s exists and is not this %s's; prewarm does not take it over: delete or rename it, or rename this %s",
				c.Namespace, name, m.kind, m.kind)}
		}
		return nil, err
	}
	return c, nil
}

// samePolicy reports whether a cache's annotations carry exactly the eviction annotations policy.
func samePolicy(annotations, policy map[string]string) bool {
	for _, k := range []string{config.PriorityAnnotation, config.PinnedAnnotation} {
		v, ok := annotations[k]
		w, want := policy[k]
		if ok != want || v != w {
			return false
		}
	}
	return true
}

// setPolicy gives c exactly the eviction annotations policy.
func setPolicy(c *inferencev1.ModelDataCacheConfig, policy map[string]string) {
	for _, k := range []string{config.PriorityAnnotation, config.PinnedAnnotation} {
		if v, ok := policy[k]; ok {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[k] = v
		} else {
			delete(c.Annotations, k)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "-.")
}

// gate says whether the Deployment may use cache c: every target node is settled (Ready, or
// failed for a reason waiting will not fix), or the gate timeout has passed. When it is closed,
// wait is how long until the timeout opens it.
type gateState struct {
	open    bool
	reason  string
	message string
	wait    time.Duration
}

func (r *Reconciler) gate(c *inferencev1.ModelDataCacheConfig) gateState {
	st := &c.Status
	timeout := r.Config.GateTimeout()
	if st.ObservedGeneration == c.Generation && c.Generation > 0 {
		if st.TargetNodes == 0 {
			return gateState{open: true, reason: inferencev1.ReasonNoTargetNodes,
				message: "no node matches the placement yet; the Deployment is created so that its pending pods can bring nodes up"}
		}
		// The counts cover every target node; status.nodes names the ones that need attention
		// first (bounded), which the messages quote.
		var unsettled, failed []string
		for _, n := range st.Nodes {
			switch {
			case n.Retained || n.State == inferencev1.CacheReady:
			case n.State == inferencev1.CacheFailed && prewarmv1alpha1.Terminal(n.Reason):
				failed = append(failed, fmt.Sprintf("%s (%s: %s)", n.Name, n.Reason, n.Message))
			default:
				unsettled = append(unsettled, fmt.Sprintf("%s %s", n.Name, progress(n)))
			}
		}
		waiting := int(st.TargetNodes - st.SettledNodes)
		if waiting <= 0 {
			if st.SettledNodes == st.ReadyNodes {
				return gateState{open: true, reason: inferencev1.ReasonGateOpen,
					message: fmt.Sprintf("all %d target nodes hold the weights cache", st.TargetNodes)}
			}
			return gateState{open: true, reason: inferencev1.ReasonGateOpen,
				message: fmt.Sprintf("%d of %d target nodes hold the weights cache; the others cannot: %s",
					st.ReadyNodes, st.TargetNodes, controller.SummarizeOf(failed, int(st.SettledNodes-st.ReadyNodes), 5, ", "))}
		}
		named := controller.SummarizeOf(unsettled, waiting, 5, ", ")
		waited := r.Now().Sub(c.CreationTimestamp.Time)
		if waited >= timeout {
			return gateState{open: true, reason: inferencev1.ReasonGateTimeout,
				message: fmt.Sprintf("opened after the %s gate timeout with %d of %d target nodes ready; not settled: %s",
					timeout, st.ReadyNodes, st.TargetNodes, named)}
		}
		return gateState{reason: inferencev1.ReasonWaitingForCache, wait: timeout - waited,
			message: fmt.Sprintf("waiting for the weights cache on %d of %d target nodes: %s (opens at the latest in %s)",
				waiting, st.TargetNodes, named, (timeout - waited).Round(time.Second))}
	}
	waited := r.Now().Sub(c.CreationTimestamp.Time)
	if waited >= timeout {
		return gateState{open: true, reason: inferencev1.ReasonGateTimeout,
			message: fmt.Sprintf("opened after the %s gate timeout; the weights cache has not reported", timeout)}
	}
	return gateState{reason: inferencev1.ReasonWaitingForCache, wait: timeout - waited,
		message: "waiting for the weights cache to report its target nodes"}
}

func progress(n inferencev1.NodeCacheStatus) string {
	if n.BytesTotal > 0 {
		return fmt.Sprintf("%s %d%%", n.State, n.BytesDone*100/n.BytesTotal)
	}
	if n.Reason != "" {
		return fmt.Sprintf("%s (%s)", n.State, n.Reason)
	}
	return string(n.State)
}
