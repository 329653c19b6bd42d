package e2e

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// kubectl runs the real kubectl (built by hack/testbin.sh) against the cluster, with stdin.
func (e *weightsEnv) kubectl(stdin string, args ...string) string {
	e.t.Helper()
	dir, err := testutil.TestBinDir()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.CommandContext(e.ctx, dir+"/kubectl", append([]string{"--kubeconfig=" + e.cluster.KubeconfigPath}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// startTeamController starts the controller on the test's S3 and makes the namespace team-a.
func (e *weightsEnv) startTeamController() {
	e.t.Helper()
	e.startController(
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")
	if err := e.c.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		e.t.Fatal(err)
	}
}

// llamaWarm is a ModelWeightsCacheConfig of the test's model in team-a, on the ml.g5.24xlarge
// nodes, as HyperPod's docs write one.
const llamaWarm = `
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata:
  name: llama-warm
  namespace: team-a
spec:
  modelSourceConfig:
    modelSourceType: s3
    s3Storage:
      bucketName: ` + bucket + `
      region: us-west-2
    modelLocation: ` + prefix + `
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
`

// applyStandaloneCaches applies llamaWarm and a ModelImageCache of vLLM's image on the same
// nodes, in team-a, and waits until kubectl wait says both are Ready.
func (e *weightsEnv) applyStandaloneCaches() {
	e.t.Helper()
	e.kubectl(llamaWarm+`---
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelImageCache
metadata:
  name: vllm-image
  namespace: team-a
spec:
  image: vllm/vllm-openai:v0.6.3
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
`, "apply", "-f", "-")
	for _, obj := range []string{"modelweightscacheconfig/llama-warm", "modelimagecache/vllm-image"} {
		e.kubectl("", "wait", "-n", "team-a", "--for=jsonpath={.status.state}=Ready", "--timeout=4m", obj)
	}
}

// HyperPod's own cache kinds, written as HyperPod's docs write them, with no endpoint at all: a
// ModelWeightsCacheConfig warms exactly the nodes its nodeSelector picks (HyperPod's ml. instance
// type, on nodes labelled as EKS labels them), a ModelImageCache pins its image there, and
// `kubectl wait --for=jsonpath='{.status.state}'=Ready` finishes on both. Deleting the weights
// cache takes it off the nodes.
func TestHyperPodCacheKindsEndToEnd(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx, c := e.ctx, e.c
	for _, n := range []string{"g5-a", "g5-b"} {
		e.addNode(n, "g5.24xlarge", s3srv.Endpoint)
	}
	e.addNode("m5-a", "m5.xlarge", s3srv.Endpoint)
	e.startTeamController()
	e.applyStandaloneCaches()

	mw := &inferencev1.ModelWeightsCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "llama-warm"}, mw); err != nil {
		t.Fatal(err)
	}
	if mw.Status.ReadyNodes != 2 || mw.Status.TargetNodes != 2 || mw.Status.CacheName == "" {
		t.Errorf("weights cache status = %+v, want Ready on the 2 g5 nodes", mw.Status)
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: mw.Status.CacheName}, cache); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"g5-a", "g5-b"} {
		assertTree(t, e.cacheDir(n, string(cache.UID)), model)
	}
	if got := e.entries("m5-a"); len(got) != 0 {
		t.Errorf("m5-a, which the selector leaves out, holds %v", got)
	}
	mic := &inferencev1.ModelImageCache{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "vllm-image"}, mic); err != nil {
		t.Fatal(err)
	}
	if mic.Status.ReadyNodes != 2 || mic.Status.TargetNodes != 2 || mic.Status.LastTransitionTime == nil {
		t.Errorf("image cache status = %+v, want Ready on the 2 g5 nodes", mic.Status)
	}
	if got := e.podNodes(mic.Status.CacheName); strings.Join(got, ",") != "g5-a,g5-b" {
		t.Errorf("image pinned on %v, want g5-a and g5-b", got)
	}

	// kubectl get prints HyperPod's columns, under HyperPod's plural and short name.
	for _, tc := range []struct {
		args       []string
		head, cell []string
	}{
		{[]string{"get", "modelweightscacheconfigs", "-n", "team-a"}, []string{"NAME", "STATE", "READY", "TARGET", "AGE"}, []string{"llama-warm", "Ready", "2", "2"}},
		{[]string{"get", "mic", "-n", "team-a"}, []string{"NAME", "IMAGE", "STATE", "READY", "TARGET", "AGE"}, []string{"vllm-image", "vllm/vllm-openai:v0.6.3", "Ready", "2", "2"}},
	} {
		out := e.kubectl("", tc.args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !slices.Equal(strings.Fields(lines[0]), tc.head) || !slices.Equal(strings.Fields(lines[1])[:len(tc.cell)], tc.cell) {
			t.Errorf("kubectl %s:\n%s\nwant columns %v and row %v", strings.Join(tc.args, " "), out, tc.head, tc.cell)
		}
	}

	// Deleted: every node lets the cache go before the object goes.
	e.kubectl("", "delete", "-n", "team-a", "modelweightscacheconfig/llama-warm", "--wait", "--timeout=3m")
	for _, n := range []string{"g5-a", "g5-b"} {
		if got := e.entries(n); len(got) != 0 {
			t.Errorf("%s still holds %v once the ModelWeightsCacheConfig is gone", n, got)
		}
	}
	e.kubectl("", "delete", "-n", "team-a", "modelimagecache/vllm-image", "--wait", "--timeout=3m")
	e.eventually(2*time.Minute, "the image cache goes with its last parent", func() (bool, string) {
		_, err := e.imageCache(mic.Status.CacheName)
		return err != nil, "still there"
	})
}
