package kubectl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/scheme"
)

// StatusReport is what `kubectl prewarm status` shows: every parent with its caches.
type StatusReport struct {
	Parents []ParentReport `json:"parents"`
}

// ParentReport is one InferenceEndpointConfig or JumpStartModel.
type ParentReport struct {
	Kind          string           `json:"kind"`
	Namespace     string           `json:"namespace"`
	Name          string           `json:"name"`
	State         string           `json:"state"`
	Ready         *ConditionReport `json:"ready,omitempty"`
	Gated         *ConditionReport `json:"gated,omitempty"`
	Deployment    string           `json:"deployment,omitempty"`
	ReadyReplicas int32            `json:"readyReplicas"`
	Replicas      int32            `json:"replicas"`
	Weights       *WeightsReport   `json:"weightsCache,omitempty"`
	Image         *ImageReport     `json:"imageCache,omitempty"`
}

// ConditionReport is a condition, for people.
type ConditionReport struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// WeightsReport is a weights cache with its nodes: the counts cover every target node; nodes
// lists those that need attention first (failed, the slowest downloads, waiting, then Ready),
// all of them with --all-nodes.
type WeightsReport struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Target      int32  `json:"targetNodes"`
	Ready       int32  `json:"readyNodes"`
	Downloading int32  `json:"downloadingNodes"`
	Failed      int32  `json:"failedNodes"`
	Waiting     int32  `json:"waitingNodes"`
	TotalBytes  int64  `json:"totalBytes"`
	Revision    string `json:"revision,omitempty"`
	// NodesOmitted is how many nodes nodes leaves out.
	NodesOmitted int            `json:"nodesOmitted,omitempty"`
	Nodes        []NodeProgress `json:"nodes"`
}

// NodeProgress is one node's copy of a weights cache: every field of inferencev1.CopyStatus under
// its own JSON name (TestCopyStatusReachesKubectl holds it to that), with the byte counts
// written even when zero, as scripts read them, and the time the download has left.
type NodeProgress struct {
	Node           string `json:"node"`
	State          string `json:"state"`
	BytesDone      int64  `json:"bytesDone"`
	BytesTotal     int64  `json:"bytesTotal"`
	BytesPerSecond int64  `json:"bytesPerSecond"`
	ETASeconds     *int64 `json:"etaSeconds,omitempty"`
	// DiskBytes is what the copy takes on the node's disk, as its agent measured it.
	DiskBytes int64  `json:"diskBytes,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
}

// ImageReport is an image cache with its nodes.
type ImageReport struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Image     string `json:"image"`
	Phase     string `json:"phase"`
	Cached    int32  `json:"cachedNodes"`
	Target    int32  `json:"targetNodes"`
	Digest    string `json:"digest,omitempty"`
	// Failed is how many target nodes cannot pull the image.
	Failed int32 `json:"failedNodes"`
	// NodesOmitted is how many target nodes nodes leaves out (each node's own state is its
	// pod of the cache's DaemonSet).
	NodesOmitted int         `json:"nodesOmitted,omitempty"`
	Nodes        []ImageNode `json:"nodes"`
}

// ImageNode is one node's copy of an image.
type ImageNode struct {
	Node    string `json:"node"`
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// clientFor builds a client from kubectl's standard flags.
func clientFor(flags *genericclioptions.ConfigFlags) (client.Client, string, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	return c, ns, err
}

func condition(conds []metav1.Condition, typ string) *ConditionReport {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return nil
	}
	return &ConditionReport{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
}

// newestCaches maps each parent's UID to the weights cache its pods read: of the caches made
// for it (whose parent reference names its UID) and not being deleted, the newest.
func newestCaches(caches []inferencev1.ModelDataCacheConfig) map[string]*inferencev1.ModelDataCacheConfig {
	newest := map[string]*inferencev1.ModelDataCacheConfig{}
	for i := range caches {
		m := &caches[i]
		if m.DeletionTimestamp != nil {
			continue
		}
		uid := m.Spec.ParentReference.UID
		if n := newest[uid]; n == nil || n.CreationTimestamp.Before(&m.CreationTimestamp) {
			newest[uid] = m
		}
	}
	return newest
}

// listImageCaches lists the image caches, wherever the operator keeps them; none when the
// caller may not list them (the report then has no image section).
func listImageCaches(ctx context.Context, c client.Client) ([]inferencev1.InferenceImageCache, error) {
	list := &inferencev1.InferenceImageCacheList{}
	if err := c.List(ctx, list); err != nil {
		if apierrors.IsForbidden(err) {
			return []inferencev1.InferenceImageCache{}, nil
		}
		return nil, err
	}
	return list.Items, nil
}

// nodeView is how many nodes of a cache the status lists: the first limit by attention, or
// every node (read from the nodes' own NodeCaches) when all.
type nodeView struct {
	limit int
	all   bool
}

// parent is what status shows of an object that asks for caches.
type parent struct {
	kind       string
	obj        client.Object
	state      string
	conditions []metav1.Condition
	st         *inferencev1.ParentStatus // nil for a standalone cache
}

// listParents lists the objects that ask for caches: the parents, and HyperPod's cache kinds a
// user wrote.
func listParents(ctx context.Context, c client.Client, opts []client.ListOption) ([]parent, error) {
	var parents []parent
	iecs := &inferencev1.InferenceEndpointConfigList{}
	if err := c.List(ctx, iecs, opts...); err != nil {
		return nil, err
	}
	for i := range iecs.Items {
		st := &iecs.Items[i].Status
		parents = append(parents, parent{"InferenceEndpointConfig", &iecs.Items[i], string(st.State), st.Conditions, st})
	}
	jsms := &inferencev1.JumpStartModelList{}
	if err := c.List(ctx, jsms, opts...); err != nil {
		return nil, err
	}
	for i := range jsms.Items {
		st := &jsms.Items[i].Status
		parents = append(parents, parent{"JumpStartModel", &jsms.Items[i], string(st.State), st.Conditions, st})
	}
	// HyperPod's cache kinds that a user wrote are parents too; the views prewarm writes of its
	// own caches are not (their caches are listed under their parents).
	mwccs := &inferencev1.ModelWeightsCacheConfigList{}
	if err := c.List(ctx, mwccs, opts...); err != nil {
		return nil, err
	}
	for i := range mwccs.Items {
		if mw := &mwccs.Items[i]; !isView(mw) {
			parents = append(parents, parent{"ModelWeightsCacheConfig", mw, mw.Status.State, mw.Status.Conditions, nil})
		}
	}
	mics := &inferencev1.ModelImageCacheList{}
	if err := c.List(ctx, mics, opts...); err != nil {
		return nil, err
	}
	for i := range mics.Items {
		if mic := &mics.Items[i]; !isView(mic) {
			parents = append(parents, parent{"ModelImageCache", mic, string(mic.Status.State), mic.Status.Conditions, nil})
		}
	}
	return parents, nil
}

// isView reports whether o is a view prewarm writes of one of its own caches (owned by it).
func isView(o client.Object) bool {
	owner := metav1.GetControllerOf(o)
	return owner != nil && (owner.Kind == "ModelDataCacheConfig" || owner.Kind == "InferenceImageCache")
}

// defaultNodeLimit is how many nodes of each cache status lists unless told otherwise.
const defaultNodeLimit = 20

// buildStatus gathers the parents in namespace (all when empty), or the one named.
func buildStatus(ctx context.Context, c client.Client, namespace, name string, view nodeView) (*StatusReport, error) {
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	parents, err := listParents(ctx, c, opts)
	if err != nil {
		return nil, err
	}
	rep := &StatusReport{Parents: []ParentReport{}}
	var nodeCaches []prewarmv1alpha1.NodeCache // read once, for --all-nodes
	read := false
	caches := &inferencev1.ModelDataCacheConfigList{}
	if err := c.List(ctx, caches, opts...); err != nil {
		return nil, err
	}
	weights := newestCaches(caches.Items)
	images, err := listImageCaches(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, p := range parents {
		if name != "" && p.obj.GetName() != name {
			continue
		}
		pr := ParentReport{Kind: p.kind, Namespace: p.obj.GetNamespace(), Name: p.obj.GetName(), State: p.state,
			Ready: condition(p.conditions, inferencev1.ConditionReady)}
		if p.st != nil {
			pr.Gated, pr.Replicas = condition(p.conditions, inferencev1.ConditionGated), p.st.Replicas
			if d := p.st.DeploymentStatus; d != nil {
				pr.Deployment = d.Name
				if d.Status != nil {
					pr.ReadyReplicas = d.Status.ReadyReplicas
				}
			}
		}
		if m := weights[string(p.obj.GetUID())]; m != nil {
			if view.all && !read {
				list := &prewarmv1alpha1.NodeCacheList{}
				if err := c.List(ctx, list); err != nil {
					return nil, err
				}
				nodeCaches, read = list.Items, true
			}
			pr.Weights = weightsReport(m, nodeCaches, view)
		}
		if i := slices.IndexFunc(images, func(x inferencev1.InferenceImageCache) bool {
			return slices.ContainsFunc(x.Spec.ParentReferences, func(r inferencev1.ParentReference) bool { return r.UID == string(p.obj.GetUID()) })
		}); i >= 0 {
			pr.Image = imageReport(&images[i], view)
		}
		rep.Parents = append(rep.Parents, pr)
	}
	slices.SortFunc(rep.Parents, func(a, b ParentReport) int {
		return strings.Compare(a.Namespace+"/"+a.Kind+"/"+a.Name, b.Namespace+"/"+b.Kind+"/"+b.Name)
	})
	if name != "" && len(rep.Parents) == 0 {
		return nil, fmt.Errorf("no InferenceEndpointConfig, JumpStartModel, ModelWeightsCacheConfig or ModelImageCache named %s%s", name, inNamespace(namespace))
	}
	return rep, nil
}

func inNamespace(ns string) string {
	if ns == "" {
		return ""
	}
	return " in namespace " + ns
}

// weightsReport is a cache's counts and nodes. The cache's status lists the nodes that need
// attention first, and at most MaxStatusNodes of them; with view.all, every node that is asked
// for the cache comes from its own NodeCache (what its agent reports now), and the cache's
// status adds the nodes only the controller knows of (a node too full to be asked).
func weightsReport(m *inferencev1.ModelDataCacheConfig, nodeCaches []prewarmv1alpha1.NodeCache, view nodeView) *WeightsReport {
	st := m.Status
	w := &WeightsReport{Name: m.Name, State: string(st.State), Target: st.TargetNodes, Ready: st.ReadyNodes,
		Downloading: st.DownloadingNodes, Failed: st.FailedNodes, Waiting: max(0, st.TargetNodes-st.ReadyNodes-st.DownloadingNodes-st.FailedNodes),
		TotalBytes: st.TotalBytes, Revision: st.ResolvedRevision, Nodes: []NodeProgress{}}
	byName := map[string]inferencev1.NodeCacheStatus{}
	for _, n := range st.Nodes {
		byName[n.Name] = n
	}
	if view.all {
		uid := string(m.UID)
		for i := range nodeCaches {
			nc := &nodeCaches[i]
			if !slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uid }) {
				continue
			}
			r, _ := nc.Report(uid)
			if prev, ok := byName[nc.Name]; ok && prev.State == inferencev1.CacheFailed && r.State == inferencev1.CacheReady {
				continue // the controller's verdict (e.g. another revision than the pinned one)
			}
			byName[nc.Name] = inferencev1.NodeCacheStatus{Name: nc.Name, CopyStatus: r.CopyStatus, Retained: byName[nc.Name].Retained}
		}
	}
	nodes := slices.SortedFunc(maps.Values(byName), inferencev1.CompareAttention)
	for _, n := range nodes {
		np := NodeProgress{Node: n.Name, State: string(n.State), BytesDone: n.BytesDone, BytesTotal: n.BytesTotal,
			BytesPerSecond: n.BytesPerSecond, Reason: n.Reason, Message: n.Message, DiskBytes: n.DiskBytes}
		if n.BytesPerSecond > 0 && n.BytesTotal > n.BytesDone && n.State == inferencev1.CacheDownloading {
			eta := (n.BytesTotal - n.BytesDone) / n.BytesPerSecond
			np.ETASeconds = &eta
		}
		w.Nodes = append(w.Nodes, np)
	}
	if !view.all && view.limit > 0 && len(w.Nodes) > view.limit {
		w.Nodes = w.Nodes[:view.limit]
	}
	if listed := int(st.TargetNodes) + retained(st.Nodes); listed > len(w.Nodes) {
		w.NodesOmitted = listed - len(w.Nodes)
	}
	return w
}

func retained(nodes []inferencev1.NodeCacheStatus) int {
	n := 0
	for _, x := range nodes {
		if x.Retained {
			n++
		}
	}
	return n
}

// imageReport is an image cache's counts and the nodes its status lists (those that need
// attention first), at most view.limit of them unless view.all.
func imageReport(x *inferencev1.InferenceImageCache, view nodeView) *ImageReport {
	r := &ImageReport{Name: x.Name, Namespace: x.Namespace, Image: x.Spec.Image, Phase: string(x.Status.Phase),
		Cached: x.Status.CachedNodes, Target: x.Status.TargetNodes, Digest: x.Status.ImageDigest, Failed: x.Status.FailedNodes, Nodes: []ImageNode{}}
	for _, n := range x.Status.Nodes {
		r.Nodes = append(r.Nodes, ImageNode{Node: n.Name, Phase: string(n.Phase), Reason: n.Reason, Message: n.Message})
	}
	if !view.all && view.limit > 0 && len(r.Nodes) > view.limit {
		r.Nodes = r.Nodes[:view.limit]
	}
	// The status lists at most MaxStatusNodes nodes, those that need attention first.
	r.NodesOmitted = max(0, int(x.Status.TargetNodes)-len(r.Nodes))
	return r
}
