package kubectl

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/testutil"
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
				Roots: []prewarmv1alpha1.RootStatus{{Path: "/opt/dlami/nvme", CapacityBytes: 3_800_000_000_000, FreeBytes: 1_200_000_000_000, ReservedBytes: 20_000_000_000}}}
		})
	}

	iec := testutil.MakeInferenceEndpointConfig("default", "example-model").Obj()
	mustCreate(t, c, iec)
	setStatus(t, c, iec, func() {
		iec.Status = inferencev1.ParentStatus{State: inferencev1.DeploymentInProgress, Replicas: 1,
			WeightsCacheStatus: &inferencev1.WeightsCacheRollup{Name: "example-model-cache"},
			ImageCacheStatus:   &inferencev1.ImageCacheRollup{Name: "iic-vllm-openai-ml-g5-24xlarge-a1b2", Namespace: "hyperpod-inference-system"},
			DeploymentStatus:   &inferencev1.DeploymentStatus{Name: "example-model", LastUpdated: metav1.Now(), Status: &inferencev1.DeploymentObjectStatus{}},
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
		mdcc.Status = inferencev1.ModelDataCacheConfigStatus{State: inferencev1.CacheDownloading, TargetNodes: 2, ReadyNodes: 1, TotalBytes: 16_000_000_000,
			Nodes: []inferencev1.NodeCacheStatus{
				{Name: "g5-a", State: inferencev1.CacheReady, BytesDone: 16_000_000_000, BytesTotal: 16_000_000_000, Reason: "Verified", Message: "5 files, 16.0 GB, verified"},
				{Name: "g5-b", State: inferencev1.CacheDownloading, BytesDone: 6_400_000_000, BytesTotal: 16_000_000_000, BytesPerSecond: 800_000_000, Reason: "Downloading", Message: "Downloading: 6.4 GB of 16.0 GB"},
			}}
	})
	ic := &inferencev1.InferenceImageCache{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperpod-inference-system", Name: "iic-vllm-openai-ml-g5-24xlarge-a1b2"},
		Spec: inferencev1.InferenceImageCacheSpec{Image: "vllm/vllm-openai:latest", Placement: placement.FromParent("ml.g5.24xlarge", nil, nil, nil)}}
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hyperpod-inference-system"}})
	mustCreate(t, c, ic)
	setStatus(t, c, ic, func() {
		ic.Status = inferencev1.InferenceImageCacheStatus{Phase: inferencev1.ImageFailed, CachedNodes: 1, TargetNodes: 2,
			Nodes: []inferencev1.NodeImageStatus{
				{Name: "g5-a", Phase: inferencev1.ImageComplete, Reason: "Pulled", Message: "the image is on the node and pinned by a running container"},
				{Name: "g5-b", Phase: inferencev1.ImageFailed, Reason: "ErrImagePull", Message: "429 Too Many Requests"},
			}}
	})

	jsm := testutil.MakeJumpStartModel("default", "no-eula").Obj()
	jsm.Spec.Model.AcceptEula = false
	mustCreate(t, c, jsm)
	setStatus(t, c, jsm, func() {
		jsm.Status = inferencev1.ParentStatus{State: inferencev1.DeploymentFailed, Conditions: []metav1.Condition{
			cond(inferencev1.ConditionReady, "False", inferencev1.ReasonEULANotAccepted,
				"meta-textgeneration-llama-3-1-8b-instruct is a gated model: accept its end-user licence by setting spec.model.acceptEula: true"),
		}}
	})
}

func TestStatusAndExplainGolden(t *testing.T) {
	api, err := testutil.StartAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	kubeconfig, err := api.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
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
