package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// kubectl runs the real kubectl (hack/testbin.sh builds it) against the cluster, with stdin.
func (e *env) kubectl(t *testing.T, ctx context.Context, stdin string, args ...string) {
	t.Helper()
	dir, err := testutil.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, dir+"/kubectl", append([]string{"--kubeconfig=" + e.C.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// standaloneCaches warms the GPU nodes with HyperPod's own cache kinds and no endpoint, as a
// platform team stages a model before a launch: a ModelWeightsCacheConfig of the seed's model
// and a ModelImageCache of its server image, selected by HyperPod's instance type and tolerating
// the GPU taint. Both reach state Ready (kubectl wait) on the nodes with a disk, then go.
func (e *env) standaloneCaches(t *testing.T, ctx context.Context, seed client.ObjectKey) {
	iec := &inferencev1.InferenceEndpointConfig{}
	if err := e.C.Client.Get(ctx, seed, iec); err != nil {
		t.Fatal(err)
	}
	src, err := json.Marshal(iec.Spec.ModelSourceConfig)
	if err != nil {
		t.Fatal(err)
	}
	e.kubectl(t, ctx, fmt.Sprintf(`
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelWeightsCacheConfig
metadata:
  name: fleet-warm
  namespace: default
spec:
  modelSourceConfig: %s
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
---
apiVersion: inference.sagemaker.aws.amazon.com/v1
kind: ModelImageCache
metadata:
  name: server-image
  namespace: default
spec:
  image: %s
  nodeSelector:
    node.kubernetes.io/instance-type: ml.g5.24xlarge
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
`, src, iec.Spec.Worker.Image), "apply", "-f", "-")
	for _, obj := range []string{"modelweightscacheconfig/fleet-warm", "modelimagecache/server-image"} {
		e.kubectl(t, ctx, "", "wait", "-n", "default", "--for=jsonpath={.status.state}=Ready", "--timeout=5m", obj)
	}
	mw := &inferencev1.ModelWeightsCacheConfig{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "fleet-warm"}, mw); err != nil {
		t.Fatal(err)
	}
	// The two nodes with a disk hold it; the node whose root is its root filesystem keeps none.
	if mw.Status.ReadyNodes != 2 || mw.Status.TargetNodes != 2 {
		t.Errorf("weights cache: %+v, want Ready on %s and %s", mw.Status, gpuA, gpuB)
	}
	for _, node := range []string{gpuA, gpuB} {
		cs, err := e.nodeCache(ctx, node, mustUID(t, ctx, e, mw.Status.CacheName))
		if err != nil || cs == nil || cs.State != inferencev1.CacheReady {
			t.Errorf("%s: %+v %v, want the cache Ready", node, cs, err)
		}
	}
	mic := &inferencev1.ModelImageCache{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "server-image"}, mic); err != nil {
		t.Fatal(err)
	}
	if mic.Status.ReadyNodes != 3 || mic.Status.TargetNodes != 3 || mic.Status.ResolvedDigest == "" {
		t.Errorf("image cache: %+v, want Ready on the three g5.24xlarge nodes with the image's digest", mic.Status)
	}
	t.Logf("%s: %s %d/%d; %s: %s %d/%d %s", mw.Name, mw.Status.State, mw.Status.ReadyNodes, mw.Status.TargetNodes,
		mic.Name, mic.Status.State, mic.Status.ReadyNodes, mic.Status.TargetNodes, mic.Status.ResolvedDigest)
	e.kubectl(t, ctx, "", "delete", "-n", "default", "modelweightscacheconfig/fleet-warm", "modelimagecache/server-image", "--wait", "--timeout=3m")
}

// mustUID is the UID of the ModelDataCacheConfig default/name.
func mustUID(t *testing.T, ctx context.Context, e *env, name string) string {
	t.Helper()
	m := &inferencev1.ModelDataCacheConfig{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, m); err != nil {
		t.Fatal(err)
	}
	return string(m.UID)
}

// prefetched serves a copy of the seed with HyperPod's prefetchEnabled: its pod on a real
// kubelet reads the model, every byte verified, from memory (model-weights-copy, a tmpfs the
// prefetch init container filled from the node's cache), read-only.
func (e *env) prefetched(t *testing.T, ctx context.Context) {
	iec := e.seedCopy(t, ctx, "default", "prefetch-model")
	iec.Spec.ModelSourceConfig.PrefetchEnabled = ptr.To(true)
	// The copy counts against the pod's memory: a limit the model fits in.
	iec.Spec.Worker.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("2Gi")
	if err := e.C.Client.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	e.waitComplete(t, ctx, client.ObjectKeyFromObject(iec), iec, e.Model)
	for _, p := range e.parentPods(t, ctx, iec) {
		if body := e.health(t, ctx, &p); !strings.Contains(body, "read-only; on tmpfs") {
			t.Errorf("%s on %s: /health says %q; want the model read from memory (tmpfs), read-only", p.Name, p.Spec.NodeName, body)
		}
		i := slices.IndexFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "model-weights-copy" })
		if i < 0 || p.Spec.Volumes[i].EmptyDir == nil || p.Spec.Volumes[i].EmptyDir.Medium != corev1.StorageMediumMemory {
			t.Errorf("%s: volumes %+v, want model-weights-copy in memory", p.Name, p.Spec.Volumes)
		}
	}
	if err := e.C.Client.Delete(ctx, iec); err != nil {
		t.Fatal(err)
	}
}
