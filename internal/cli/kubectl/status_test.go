package kubectl

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// now is the clock of the golden tests: heartbeats are judged against it.
var now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func mustCreate(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

func setStatus(t *testing.T, c client.Client, obj client.Object, set func()) {
	t.Helper()
	set()
	if err := c.Status().Update(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

func cond(typ, status, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}
}

// fixture writes the objects a cluster with one warm, one downloading and one unmatched node
// would hold: what the controller and agents write, set here by hand so the output is fixed.
func fixture(t *testing.T, c client.Client) {
	for _, n := range []struct{ name, it string }{{"g5-a", "ml.g5.24xlarge"}, {"g5-b", "ml.g5.24xlarge"}, {"small-a", "ml.g5.xlarge"}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{inferencev1.InstanceTypeLabel: n.it}}}
		mustCreate(t, c, node)
		// The API server taints a new node not-ready; the node lifecycle controller lifts it
		// once the kubelet reports. Here the nodes are Ready.
		node.Spec.Taints = nil
		if err := c.Update(context.Background(), node); err != nil {
			t.Fatal(err)
		}
	}
	hb := metav1.NewTime(now.Add(-20 * time.Second))
	stale := metav1.NewTime(now.Add(-10 * time.Minute))
	for name, beat := range map[string]*metav1.Time{"g5-a": &hb, "g5-b": &stale} {
		nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: name}}
		mustCreate(t, c, nc)
		setStatus(t, c, nc, func() {
			nc.Status = prewarmv1alpha1.NodeCacheStatus{AgentVersion: "v0.1.0", HeartbeatTime: beat,
				Roots: []prewarmv1alpha1.RootStatus{{Path: "/opt/dlami/nvme", CapacityBytes: 3_800_000_000_000, FreeBytes: 1_200_000_000_000, ReservedBytes: 20_000_000_000,
					UsedBytes: 2_580_000_000_000, CachedBytes: 2_400_000_000_000}}}
		})
	}

	iec := builders.MakeInferenceEndpointConfig("default", "example-model").Obj()
	mustCreate(t, c, iec)
	setStatus(t, c, iec, func() {
		iec.Status = inferencev1.ParentStatus{State: inferencev1.DeploymentInProgress, Replicas: 1,
			DeploymentStatus: &inferencev1.DeploymentStatus{Name: "example-model", LastUpdated: metav1.Now(), Status: &inferencev1.DeploymentObjectStatus{}},
			Conditions: []metav1.Condition{
				cond(inferencev1.ConditionReady, "False", inferencev1.ReasonWaitingForCache, "the Deployment is created once the weights cache settles"),
				cond(inferencev1.ConditionGated, "True", inferencev1.ReasonWaitingForCache, "waiting for the weights cache on 1 of 2 target nodes: g5-b Downloading 40% (opens at the latest in 29m0s)"),
			}}
	})
	mdcc := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "example-model-cache"},
		Spec: inferencev1.ModelDataCacheConfigSpec{
			ParentReference:   inferencev1.ParentReference{Kind: "InferenceEndpointConfig", Namespace: "default", Name: "example-model", UID: string(iec.UID)},
			ModelSourceConfig: iec.Spec.ModelSourceConfig, HostPath: "/opt/dlami/nvme",
			Placement: placement.FromParent("ml.g5.24xlarge", nil, nil, nil),
		}}
	mustCreate(t, c, mdcc)
	setStatus(t, c, mdcc, func() {
		mdcc.Status = inferencev1.ModelDataCacheConfigStatus{State: inferencev1.CacheDownloading, TargetNodes: 2, ReadyNodes: 1, DownloadingNodes: 1,
			SettledNodes: 1, TotalBytes: 16_000_000_000,
			Nodes: []inferencev1.NodeCacheStatus{
				{Name: "g5-a", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, BytesDone: 16_000_000_000, BytesTotal: 16_000_000_000, DiskBytes: 16_000_040_960, Reason: "Verified", Message: "5 files, 16.0 GB, verified"}},
				{Name: "g5-b", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheDownloading, BytesDone: 6_400_000_000, BytesTotal: 16_000_000_000, DiskBytes: 16_000_020_480, BytesPerSecond: 800_000_000, Reason: "Downloading", Message: "Downloading: 6.4 GB of 16.0 GB"}},
			}}
	})
	ic := &inferencev1.InferenceImageCache{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperpod-inference-system", Name: "iic-vllm-openai-ml-g5-24xlarge-a1b2"},
		Spec: inferencev1.InferenceImageCacheSpec{Image: "vllm/vllm-openai:latest", Placement: placement.FromParent("ml.g5.24xlarge", nil, nil, nil),
			ParentReferences: []inferencev1.ParentReference{{Kind: "InferenceEndpointConfig", Namespace: "default", Name: "example-model", UID: string(iec.UID)}}}}
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hyperpod-inference-system"}})
	// The agents' Leases: g5-a's renewed 20 s ago, g5-b's not for 10 minutes.
	for name, renewed := range map[string]metav1.Time{"g5-a": hb, "g5-b": stale} {
		mustCreate(t, c, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperpod-inference-system", Name: name,
			Labels: map[string]string{prewarmv1alpha1.AgentLeaseLabel: "true"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("prewarm-agent-" + name), LeaseDurationSeconds: ptr.To(int32(180)), RenewTime: &metav1.MicroTime{Time: renewed.Time}}})
	}
	mustCreate(t, c, shippedConfig(t))
	mustCreate(t, c, ic)
	setStatus(t, c, ic, func() {
		ic.Status = inferencev1.InferenceImageCacheStatus{Phase: inferencev1.ImageFailed, CachedNodes: 1, TargetNodes: 2, FailedNodes: 1,
			Nodes: []inferencev1.NodeImageStatus{
				{Name: "g5-a", Phase: inferencev1.ImageComplete, Reason: "Pulled", Message: "the image is on the node and pinned by a running container"},
				{Name: "g5-b", Phase: inferencev1.ImageFailed, Reason: "ErrImagePull", Message: "429 Too Many Requests"},
			}}
	})

	jsm := builders.MakeJumpStartModel("default", "no-eula").Obj()
	jsm.Spec.Model.AcceptEula = false
	mustCreate(t, c, jsm)
	setStatus(t, c, jsm, func() {
		jsm.Status = inferencev1.ParentStatus{State: inferencev1.DeploymentFailed, Conditions: []metav1.Condition{
			cond(inferencev1.ConditionReady, "False", inferencev1.ReasonEULANotAccepted,
				"meta-textgeneration-llama-3-1-8b-instruct is a gated model: accept its end-user licence by setting spec.model.acceptEula: true"),
		}}
	})
}

// shippedConfig is the operator configuration config/ installs (the chart's defaults), which
// explain reads for how instance types find nodes.
func shippedConfig(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "manager", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.UnmarshalStrict(b, cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

func TestStatusAndExplainGolden(t *testing.T) {
	api, path := startAPI(t)
	fixture(t, api.Client)

	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"status.txt", []string{"status", "-n", "default"}},
		{"status-example-model.json", []string{"status", "example-model", "-n", "default", "-o", "json"}},
		{"status-all.yaml", []string{"status", "-A", "-o", "yaml"}},
		{"explain-g5-a.txt", []string{"explain", "node", "g5-a"}},
		{"explain-g5-b.txt", []string{"explain", "node", "g5-b"}},
		{"explain-small-a.txt", []string{"explain", "node", "small-a"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var out bytes.Buffer
			root := newTestRoot(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
			root.SetArgs(append(tc.args, "--kubeconfig", path))
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			golden := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/cli -run Golden -update to write it)", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("kubectl prewarm %v differs from %s:\n--- got\n%s\n--- want\n%s", tc.args, golden, out.String(), want)
			}
		})
	}

	// A name that does not exist, and a kind that cannot be explained, say so.
	for _, args := range [][]string{{"status", "nope", "-n", "default"}, {"explain", "pod", "x"}, {"explain", "node", "nope"}} {
		var out bytes.Buffer
		root := newTestRoot(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
		root.SetArgs(append(args, "--kubeconfig", path))
		if err := root.ExecuteContext(context.Background()); err == nil {
			t.Errorf("%v succeeded: %s", args, out.String())
		}
	}
}

// startAPI starts an API server for the test and writes a kubeconfig for it.
func startAPI(t *testing.T) (*testutil.APIServer, string) {
	t.Helper()
	api := testutil.APIServerFor(t)
	kubeconfig, err := api.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return api, path
}

func newTestRoot(streams genericiooptions.IOStreams) *cobra.Command {
	return newRoot(streams, func() time.Time { return now })
}

func TestWatchDrawsBars(t *testing.T) {
	if got := bar(4, 10, 10); got != "[####......]" {
		t.Errorf("bar = %q", got)
	}
	if got := bar(0, 0, 4); got != "[    ]" {
		t.Errorf("bar of an unknown size = %q", got)
	}
	rep := &StatusReport{Parents: []ParentReport{{Kind: "InferenceEndpointConfig", Namespace: "d", Name: "m",
		Weights: &WeightsReport{Name: "m-cache", Nodes: []NodeProgress{{Node: "n", State: "Downloading", BytesDone: 50, BytesTotal: 100}}}}}}
	var out bytes.Buffer
	if err := renderStatus(&out, rep, true); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out.Bytes(), []byte("[##########..........] 50 B / 100 B")) {
		t.Errorf("watch output lacks the bar:\n%s", out.String())
	}
}

// On a fleet, a cache's status lists only the nodes that need attention first; status shows
// the counts, the failed and the slowest nodes first, and says how many it leaves out;
// --all-nodes lists every node from the nodes' own NodeCaches.
func TestStatusOnAFleet(t *testing.T) {
	api, path := startAPI(t)
	c := api.Client
	ctx := context.Background()
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fleet"}})
	iec := builders.MakeInferenceEndpointConfig("fleet", "big").Obj()
	mustCreate(t, c, iec)
	setStatus(t, c, iec, func() {
		iec.Status = inferencev1.ParentStatus{State: inferencev1.DeploymentInProgress}
	})
	mdcc := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: "big-cache"},
		Spec: inferencev1.ModelDataCacheConfigSpec{
			ParentReference:   inferencev1.ParentReference{Kind: "InferenceEndpointConfig", Namespace: "fleet", Name: "big", UID: string(iec.UID)},
			ModelSourceConfig: iec.Spec.ModelSourceConfig, HostPath: "/opt/dlami/nvme", Placement: placement.FromParent("ml.g5.24xlarge", nil, nil, nil),
		}}
	mustCreate(t, c, mdcc)

	// 150 nodes: two failed, three downloading (10, 20 and 30 % done), the rest Ready.
	const total, size = 150, int64(1_000_000_000)
	report := func(i int) prewarmv1alpha1.CacheStatus {
		r := prewarmv1alpha1.CacheStatus{
			UID:        string(mdcc.UID),
			CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, Reason: "Verified", BytesDone: size, BytesTotal: size, Message: "3 files, 1.0 GB, verified", DiskBytes: size + 4096},
		}
		switch i {
		case 7, 100:
			r.State, r.Reason, r.BytesDone, r.Message = inferencev1.CacheFailed, "InsufficientCapacity", 0, "needs 1.0 GB, 0 B free under /opt/dlami/nvme"
		case 50, 51, 52:
			r.State, r.Reason, r.BytesDone, r.BytesPerSecond = inferencev1.CacheDownloading, "Downloading", size*int64(i-49)/10, 100_000_000
			r.Message = "Downloading: of 1.0 GB"
		}
		return r
	}
	var entries []inferencev1.NodeCacheStatus
	for i := range total {
		name := fmt.Sprintf("n-%03d", i)
		r := report(i)
		nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{
			UID: string(mdcc.UID), Namespace: "fleet", Name: "big-cache", Root: "/opt/dlami/nvme",
			Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "example-bucket", Prefix: "models/big"}}}}}
		mustCreate(t, c, nc)
		setStatus(t, c, nc, func() {
			nc.Status = prewarmv1alpha1.NodeCacheStatus{HeartbeatTime: &metav1.Time{Time: now}, Caches: []prewarmv1alpha1.CacheStatus{r}}
		})
		entries = append(entries, inferencev1.NodeCacheStatus{
			Name:       name,
			CopyStatus: inferencev1.CopyStatus{State: r.State, Reason: r.Reason, Message: r.Message, BytesDone: r.BytesDone, BytesTotal: r.BytesTotal, BytesPerSecond: r.BytesPerSecond},
		})
	}
	// As the controller writes it: the counts, and the first MaxStatusNodes nodes by attention.
	slices.SortFunc(entries, inferencev1.CompareAttention)
	setStatus(t, c, mdcc, func() {
		mdcc.Status = inferencev1.ModelDataCacheConfigStatus{State: inferencev1.CacheDownloading, TargetNodes: total, ReadyNodes: total - 5,
			DownloadingNodes: 3, FailedNodes: 2, SettledNodes: total - 3, TotalBytes: size, Nodes: entries[:inferencev1.MaxStatusNodes]}
	})

	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		root := newTestRoot(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
		root.SetArgs(append(args, "--kubeconfig", path, "-n", "fleet"))
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	text := run("status", "big", "--max-nodes", "4")
	rows := nodeRows(text)
	if want := []string{"n-007", "n-100", "n-050", "n-051"}; !slices.Equal(rows, want) {
		t.Errorf("rows %v, want the failed nodes then the slowest downloads %v:\n%s", rows, want, text)
	}
	for _, want := range []string{"145/150 nodes ready", "3 downloading, 0 waiting, 2 failed", "… and 146 more nodes"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	if rows := nodeRows(run("status", "big")); len(rows) != defaultNodeLimit {
		t.Errorf("the default lists %d nodes, want %d", len(rows), defaultNodeLimit)
	}
	var rep StatusReport
	if err := json.Unmarshal([]byte(run("status", "big", "--all-nodes", "-o", "json")), &rep); err != nil {
		t.Fatal(err)
	}
	w := rep.Parents[0].Weights
	if last := w.Nodes[len(w.Nodes)-1]; last.DiskBytes != size+4096 {
		t.Errorf("--all-nodes: node %s takes %d bytes on disk by the report, its agent says %d", last.Node, last.DiskBytes, size+4096)
	}
	if len(w.Nodes) != total || w.NodesOmitted != 0 || w.Ready != total-5 || w.Failed != 2 || w.Downloading != 3 || w.Nodes[0].Node != "n-007" || w.Nodes[total-1].Node != "n-149" {
		t.Errorf("--all-nodes: %d nodes (%d left out), counts %d/%d/%d, first %s, last %s", len(w.Nodes), w.NodesOmitted,
			w.Ready, w.Downloading, w.Failed, w.Nodes[0].Node, w.Nodes[len(w.Nodes)-1].Node)
	}
	// A Ready node the status does not list is explained from its own NodeCache.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-149", Labels: map[string]string{inferencev1.InstanceTypeLabel: "ml.g5.24xlarge"}}}
	mustCreate(t, c, node)
	node.Spec.Taints = nil // the kubelet is up
	if err := c.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	if out := run("explain", "node", "n-149"); !strings.Contains(out, "fleet/big-cache: WARM: Ready: 3 files, 1.0 GB, verified [1.0 GB on disk]") {
		t.Errorf("explain of a node past the status list:\n%s", out)
	}
}

// nodeRows lists the NODE column of status's weights table.
func nodeRows(text string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "NODE" && len(f) > 1 && f[1] == "STATE":
			in = true
		case in && len(f) > 1 && strings.HasPrefix(f[0], "n-"):
			out = append(out, f[0])
		default:
			in = in && len(f) > 0 && strings.HasPrefix(f[0], "n-")
		}
	}
	return out
}

// A ModelWeightsCacheConfig a user wrote is listed with its cache, as a parent is; the views
// prewarm writes of a parent's caches are not listed twice.
func TestStatusListsStandaloneCaches(t *testing.T) {
	api, path := startAPI(t)
	c := api.Client
	ctx := context.Background()
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "warm"}})
	src := inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceS3,
		S3Storage: &inferencev1.S3Storage{BucketName: "example-bucket", Region: "us-west-2"}, ModelLocation: "models/llama"}
	mw := &inferencev1.ModelWeightsCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "warm", Name: "llama-warm"},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: src}}
	mustCreate(t, c, mw)
	setStatus(t, c, mw, func() {
		mw.Status = inferencev1.ModelWeightsCacheConfigStatus{State: "Downloading", TargetNodes: 2, CacheName: "llama-warm-cache"}
	})
	mdcc := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "warm", Name: "llama-warm-cache"},
		Spec: inferencev1.ModelDataCacheConfigSpec{
			ParentReference:   inferencev1.ParentReference{Kind: "ModelWeightsCacheConfig", Namespace: "warm", Name: "llama-warm", UID: string(mw.UID)},
			ModelSourceConfig: src, HostPath: "/opt/dlami/nvme", Placement: placement.FromParent("ml.g5.24xlarge", nil, nil, nil),
		}}
	mustCreate(t, c, mdcc)
	setStatus(t, c, mdcc, func() {
		mdcc.Status = inferencev1.ModelDataCacheConfigStatus{State: inferencev1.CacheDownloading, TargetNodes: 2, DownloadingNodes: 2}
	})
	// A view of that cache, as prewarm would write one of a parent's: not listed.
	view := &inferencev1.ModelWeightsCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "warm", Name: "view",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "inference.sagemaker.aws.amazon.com/v1", Kind: "ModelDataCacheConfig",
			Name: mdcc.Name, UID: mdcc.UID, Controller: ptr.To(true)}}},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: src}}
	mustCreate(t, c, view)

	var out bytes.Buffer
	root := newTestRoot(genericiooptions.IOStreams{Out: &out, ErrOut: &out})
	root.SetArgs([]string{"status", "--kubeconfig", path, "-n", "warm"})
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{"ModelWeightsCacheConfig warm/llama-warm: Downloading", "weights cache llama-warm-cache: Downloading, 0/2 nodes ready"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "warm/view") {
		t.Errorf("status lists the view:\n%s", text)
	}
}
