package e2e

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// One namespace's odd caches never reach another's, with the real controller and agents. A
// careless tenant's ModelWeightsCacheConfig names a Hugging Face model id longer than a node's
// request holds, another an S3 location of 1,010 characters (within the request, but every
// message about it, "listing s3://…" or "nothing under s3://…", is longer than a report holds).
// Both are written beside another namespace's ordinary cache on the same nodes: that cache turns
// Ready on every node, the first careless cache is refused on its own object naming the field,
// and the second fails on its own with its messages clipped.
func TestOneTenantsOddCachesReachNoOtherNamespace(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx, c := e.ctx, e.c
	for _, n := range []string{"g5-a", "g5-b"} {
		e.addNode(n, "g5.24xlarge", s3srv.Endpoint)
	}
	e.startTeamController()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "careless"}}); err != nil {
		t.Fatal(err)
	}
	longLocation := strings.Repeat("l", 1010)
	e.kubectl(`
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata:
  name: long-id
  namespace: careless
spec:
  modelSourceConfig:
    modelSourceType: huggingface
    huggingFaceModel:
      modelId: org/`+strings.Repeat("x", 296)+`
      commitSHA: 0e9e39f249a16976918f6564b8830bc894c89659
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
---
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata:
  name: long-location
  namespace: careless
spec:
  modelSourceConfig:
    modelSourceType: s3
    s3Storage:
      bucketName: `+bucket+`
      region: us-west-2
    modelLocation: `+longLocation+`
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
`, "apply", "-f", "-")
	e.kubectl(llamaWarm, "apply", "-f", "-")
	e.kubectl("", "wait", "-n", "team-a", "--for=jsonpath={.status.state}=Ready", "--timeout=4m", "modelweightscacheconfig/llama-warm")

	got := func(name string) *inferencev1.ModelWeightsCacheConfig {
		t.Helper()
		mw := &inferencev1.ModelWeightsCacheConfig{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "careless", Name: name}, mw); err != nil {
			t.Fatal(err)
		}
		return mw
	}
	e.eventually(2*time.Minute, "the careless caches fail on their own", func() (bool, string) {
		id, loc := got("long-id"), got("long-location")
		return id.Status.State == string(inferencev1.CacheFailed) && strings.Contains(id.Status.Message, "modelSourceConfig.huggingFaceModel.modelId is too long") &&
				loc.Status.State == string(inferencev1.CacheFailed),
			id.Status.State + ": " + id.Status.Message + " / " + loc.Status.State + ": " + loc.Status.Message
	})
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "careless", Name: got("long-location").Status.CacheName}, cache); err != nil {
		t.Fatal(err)
	}
	if len(cache.Status.Nodes) != 2 {
		t.Errorf("the long location's cache reports %d nodes; want both", len(cache.Status.Nodes))
	}
	for _, n := range cache.Status.Nodes {
		if n.State != inferencev1.CacheFailed || utf8.RuneCountInString(n.Message) > 1024 || !strings.Contains(n.Message, "lllll") {
			t.Errorf("node %s: %s %s (%d characters); want Failed, its message about the location clipped", n.Name, n.State, n.Reason, utf8.RuneCountInString(n.Message))
		}
	}
}
