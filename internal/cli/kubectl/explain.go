package kubectl

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/pkg/engine"
)

// NodeExplanation is what `kubectl prewarm explain node` shows.
type NodeExplanation struct {
	Node         string             `json:"node"`
	InstanceType string             `json:"instanceType,omitempty"`
	Agent        string             `json:"agent"`
	Roots        []RootReport       `json:"roots"`
	Weights      []CacheExplanation `json:"weightsCaches"`
	Images       []CacheExplanation `json:"imageCaches"`
	// Note says what the explanation could not take into account.
	Note string `json:"note,omitempty"`
}

// RootReport is the disk under an allowed root.
type RootReport struct {
	Path          string `json:"path"`
	NodePath      string `json:"nodePath,omitempty"`
	CapacityBytes int64  `json:"capacityBytes"`
	FreeBytes     int64  `json:"freeBytes"`
	ReservedBytes int64  `json:"reservedBytes"`
	// UsedBytes is what the filesystem has in use, by anyone; CachedBytes what prewarm's files
	// take of it, measured by the agent.
	UsedBytes   int64 `json:"usedBytes"`
	CachedBytes int64 `json:"cachedBytes"`
	// HighWatermarkPercent and LowWatermarkPercent are where the agent starts and stops
	// evicting.
	HighWatermarkPercent int32 `json:"highWatermarkPercent,omitempty"`
	LowWatermarkPercent  int32 `json:"lowWatermarkPercent,omitempty"`
	// SharedWith names what else uses the disk (the kubelet's directory, the container
	// runtime's, the node's root filesystem); KubeletThresholds the kubelet's thresholds the
	// watermarks then derive from.
	SharedWith        string `json:"sharedWith,omitempty"`
	KubeletThresholds string `json:"kubeletThresholds,omitempty"`
	// Reason and Message say why the node keeps no cache under the root (NoLocalDisk).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// CacheExplanation says whether a node holds a cache, and why not.
type CacheExplanation struct {
	Cache string `json:"cache"`
	Warm  bool   `json:"warm"`
	Why   string `json:"why"`
	// DiskBytes is what the cache takes on the node's disk, as its agent measured it.
	DiskBytes int64 `json:"diskBytes,omitempty"`
}

// operatorRules reads the operator configuration (the prewarm-config ConfigMap in namespace ns)
// and its placement rules: how instance types find nodes (the caches' tolerations are the pods'
// own already), and, in the configuration, which nodes standalone caches are granted. When the
// configuration cannot be read, the defaults, and a note saying so.
func operatorRules(ctx context.Context, c client.Client, ns string) (placement.Rules, config.OperatorConfiguration, string) {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: operatorConfigMap}, cm); err != nil {
		return placement.Rules{}, config.Default(), fmt.Sprintf("the operator configuration (ConfigMap %s/%s) could not be read (%v): instance types are matched by their node label alone", ns, operatorConfigMap, err)
	}
	op, err := config.Parse([]byte(cm.Data[filepath.Base(config.File)]))
	if err != nil {
		return placement.Rules{}, config.Default(), fmt.Sprintf("the operator configuration (ConfigMap %s/%s) does not parse (%v): instance types are matched by their node label alone", ns, operatorConfigMap, err)
	}
	return placement.NewRules(op.Placement, false), op, ""
}

// operatorConfigMap is the ConfigMap of the operator configuration (the chart's and config/'s).
const operatorConfigMap = "prewarm-config"

func buildExplanation(ctx context.Context, c client.Client, nodeName, operatorNS string, now time.Time) (*NodeExplanation, error) {
	rules, op, note := operatorRules(ctx, c, operatorNS)
	node := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: nodeName}, node); err != nil {
		return nil, err
	}
	ex := &NodeExplanation{Node: node.Name, InstanceType: node.Labels[inferencev1.InstanceTypeLabel], Roots: []RootReport{},
		Weights: []CacheExplanation{}, Images: []CacheExplanation{}, Note: note}
	nc := &prewarmv1alpha1.NodeCache{}
	err := c.Get(ctx, types.NamespacedName{Name: nodeName}, nc)
	switch {
	case client.IgnoreNotFound(err) != nil:
		return nil, err
	case err != nil:
		nc = nil
		ex.Agent = "no NodeCache: no weights cache has been asked of this node yet"
	case nc.Status.HeartbeatTime == nil:
		ex.Agent = "no agent reports on this node: is the prewarm-agent DaemonSet's pod running here?"
	}
	agent := controller.Agent{Alive: true}
	if nc != nil && nc.Status.HeartbeatTime != nil {
		agent, err = controller.Liveness{Reader: c, Namespace: operatorNS, Now: func() time.Time { return now }}.Of(ctx, nodeName, nc)
		switch {
		case err != nil:
			agent = controller.Agent{Alive: true}
			ex.Agent = fmt.Sprintf("its Lease (%s/%s) could not be read (%v); it last wrote its NodeCache status at %s", operatorNS, nodeName, err, nc.Status.HeartbeatTime.UTC().Format(time.RFC3339))
		case !agent.Alive:
			ex.Agent = agent.Why
		case agent.Renewed.IsZero():
			ex.Agent = fmt.Sprintf("alive (agent %s, which keeps no Lease; status last written at %s)", nc.Status.AgentVersion, nc.Status.HeartbeatTime.UTC().Format(time.RFC3339))
		default:
			ex.Agent = fmt.Sprintf("alive (agent %s; Lease renewed at %s; status last written at %s)", nc.Status.AgentVersion,
				agent.Renewed.UTC().Format(time.RFC3339), nc.Status.HeartbeatTime.UTC().Format(time.RFC3339))
		}
	}
	if nc != nil {
		for _, r := range nc.Status.Roots {
			ex.Roots = append(ex.Roots, RootReport{Path: r.Path, NodePath: r.NodePath, CapacityBytes: r.CapacityBytes, FreeBytes: r.FreeBytes,
				ReservedBytes: r.ReservedBytes, UsedBytes: r.UsedBytes, CachedBytes: r.CachedBytes, Reason: r.Reason, Message: r.Message,
				HighWatermarkPercent: r.HighWatermarkPercent, LowWatermarkPercent: r.LowWatermarkPercent,
				SharedWith: r.SharedWith, KubeletThresholds: r.KubeletThresholds})
		}
	}

	caches := &inferencev1.ModelDataCacheConfigList{}
	if err := c.List(ctx, caches); err != nil {
		return nil, err
	}
	for _, m := range caches.Items {
		e := explainWeights(rules, op, &m, node, nc)
		if e.Warm && !agent.Alive {
			e.Warm, e.Why = false, "the node's agent is not alive, so its pods cannot mount the cache: "+agent.Why
		}
		ex.Weights = append(ex.Weights, e)
	}
	images := &inferencev1.InferenceImageCacheList{}
	if err := c.List(ctx, images); err != nil {
		return nil, err
	}
	for _, x := range images.Items {
		ex.Images = append(ex.Images, explainImage(rules, &x, node))
	}
	return ex, nil
}

func explainWeights(rules placement.Rules, op config.OperatorConfiguration, m *inferencev1.ModelDataCacheConfig, node *corev1.Node, nc *prewarmv1alpha1.NodeCache) CacheExplanation {
	e := CacheExplanation{Cache: m.Namespace + "/" + m.Name}
	ok, why := rules.Match(m.Spec.Placement, node)
	if m.Spec.ParentReference.Kind == "ModelWeightsCacheConfig" {
		// A standalone cache: within what its namespace is granted.
		ok, why = rules.MatchStandalone(placement.GrantFor(op, m.Namespace), m.Spec.Placement, node)
	}
	if !ok {
		e.Why = "not a target: " + why
		return e
	}
	// What the node's agent reports comes first (the cache's status lists only the nodes that
	// need attention most, on a large fleet); the cache's status adds the controller's verdicts.
	var ns *inferencev1.NodeCacheStatus
	for i := range m.Status.Nodes {
		if m.Status.Nodes[i].Name == node.Name {
			ns = &m.Status.Nodes[i]
		}
	}
	uid := string(m.UID)
	var rep *prewarmv1alpha1.CacheStatus
	if r, ok := nc.Report(uid); ok {
		rep = &r
		e.DiskBytes = r.DiskBytes
	}
	asked := nc != nil && slices.ContainsFunc(nc.Spec.Caches, func(r prewarmv1alpha1.CacheRequest) bool { return r.UID == uid })
	// The entry to explain: the controller's verdict of a failure, else the agent's report,
	// else what the cache's status lists.
	var x *inferencev1.NodeCacheStatus
	switch {
	case ns != nil && ns.State == inferencev1.CacheFailed:
		x = ns
	case rep != nil:
		x = &inferencev1.NodeCacheStatus{CopyStatus: rep.CopyStatus}
	default:
		x = ns
	}
	switch {
	case x != nil && x.State == inferencev1.CacheReady:
		e.Warm, e.Why = true, "Ready: "+x.Message
	case x != nil && x.State == inferencev1.CacheDownloading:
		e.Why = fmt.Sprintf("Downloading: %s", progressText(x.BytesDone, x.BytesTotal, x.BytesPerSecond))
	case nc == nil || nc.Status.HeartbeatTime == nil:
		e.Why = "a target, but no agent reports on this node"
	case x != nil:
		e.Why = fmt.Sprintf("%s (%s): %s", x.State, x.Reason, x.Message)
	case asked:
		e.Why = "asked for the cache; the node's agent has not picked it up yet"
	default:
		e.Why = "a target, not yet asked for the cache (the controller has not reconciled since the node appeared)"
	}
	return e
}

func explainImage(rules placement.Rules, x *inferencev1.InferenceImageCache, node *corev1.Node) CacheExplanation {
	e := CacheExplanation{Cache: x.Namespace + "/" + x.Name}
	if ok, why := rules.Match(x.Spec.Placement, node); !ok {
		e.Why = "not a target: " + why
		return e
	}
	for _, n := range x.Status.Nodes {
		if n.Name == node.Name {
			e.Warm = n.Phase == inferencev1.ImageComplete
			e.Why = fmt.Sprintf("%s (%s): %s", n.Phase, n.Reason, n.Message)
			return e
		}
	}
	// On a large fleet the status lists the nodes that need attention first; the node's label
	// says it holds the image.
	if node.Labels[inferencev1.ImageCacheReadyLabel(string(x.UID))] == inferencev1.LabelTrue {
		e.Warm, e.Why = true, "Complete: the node holds the image (labelled)"
		return e
	}
	e.Why = "a target, not yet in the cache's status"
	return e
}

func newExplainCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, now func() time.Time) *cobra.Command {
	o := &statusOptions{flags: flags, streams: streams, now: now}
	cmd := &cobra.Command{
		Use:   "explain node NODE",
		Short: "Say, for each cache, why a node is or is not warm",
		Long: `For every weights cache and image cache in the cluster, say whether NODE holds it, and if
not, why: not a target (instance type, affinity, taint), its agent missing, downloading (how
far), failed (the message), or the disk it would need.`,
		Example: `  kubectl prewarm explain node ip-10-0-1-23.us-west-2.compute.internal`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "node" {
				return fmt.Errorf("explain %s: only nodes can be explained: kubectl prewarm explain node NODE", args[0])
			}
			c, _, err := clientFor(o.flags)
			if err != nil {
				return err
			}
			ex, err := buildExplanation(cmd.Context(), c, args[1], o.operatorNamespace, o.now())
			if err != nil {
				return err
			}
			return o.print(ex, func(w io.Writer) error { return renderExplanation(w, ex) })
		},
	}
	o.addOutput(cmd)
	cmd.Flags().StringVar(&o.operatorNamespace, "operator-namespace", inferencev1.DefaultOperatorNamespace, "namespace of prewarm's operator configuration (the prewarm-config ConfigMap), which says how instance types find nodes")
	return cmd
}

func renderExplanation(w io.Writer, ex *NodeExplanation) error {
	fmt.Fprintf(w, "node %s (%s)\n", ex.Node, orDash(ex.InstanceType))
	fmt.Fprintf(w, "  agent: %s\n", ex.Agent)
	for _, r := range ex.Roots {
		at := r.Path
		if r.NodePath != "" {
			at += " (at " + r.NodePath + ")"
		}
		if r.Reason != "" {
			fmt.Fprintf(w, "  disk %s: %s: %s\n", at, r.Reason, r.Message)
			continue
		}
		fmt.Fprintf(w, "  disk %s: %s, %s used (%s of it prewarm's), %s free for caches (%s kept free)", at,
			engine.HumanBytes(r.CapacityBytes), engine.HumanBytes(r.UsedBytes), engine.HumanBytes(r.CachedBytes),
			engine.HumanBytes(r.FreeBytes), engine.HumanBytes(r.ReservedBytes))
		if r.HighWatermarkPercent > 0 {
			fmt.Fprintf(w, "; evicts above %d%%, down to %d%%", r.HighWatermarkPercent, r.LowWatermarkPercent)
		}
		fmt.Fprintln(w)
		if r.SharedWith != "" {
			fmt.Fprintf(w, "    shared with %s: %s\n", r.SharedWith, r.KubeletThresholds)
		}
	}
	if ex.Note != "" {
		fmt.Fprintf(w, "  note: %s\n", ex.Note)
	}
	section := func(title string, list []CacheExplanation) {
		fmt.Fprintf(w, "  %s:\n", title)
		if len(list) == 0 {
			fmt.Fprintln(w, "    (none)")
		}
		for _, c := range list {
			word := "NOT WARM"
			if c.Warm {
				word = "WARM"
			}
			disk := ""
			if c.DiskBytes > 0 {
				disk = fmt.Sprintf(" [%s on disk]", engine.HumanBytes(c.DiskBytes))
			}
			fmt.Fprintf(w, "    %s: %s: %s%s\n", c.Cache, word, c.Why, disk)
		}
	}
	section("weights caches", ex.Weights)
	section("image caches", ex.Images)
	return nil
}
