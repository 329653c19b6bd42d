// Package realnode runs prewarm as a user would, on real kubelet nodes (internal/testutil/realseed):
// its images pushed to a loopback registry, its Helm chart installed, the seed's two manifests
// applied unchanged, real pods started, downloads made by the chart's agent pods.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
	"github.com/prewarm/prewarm/pkg/engine"
)

// TestSeedOnRealNodes is the seed's flow on real kubelets, in order: prewarm installed from its
// images with the chart; the seed's manifests applied unchanged; an agent pod deleted in the
// middle of its node's download, its replacement resuming; both parents DeploymentComplete with
// model servers that read every byte of their models; pods timed warm against cold, and an image
// cached against not; the cached image kept through image garbage collection and released with
// its parent; Deployments of another serving stack naming a standalone cache by name; the
// parent's files and labels gone from the nodes once it is deleted.
func TestSeedOnRealNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("real nodes: minutes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	e := setup(t, ctx, 1<<30+4<<20)
	checkNonRoot(t, "/controller", "/agent")
	rep := &realseed.Report{}

	// The second node's downloads are slowed, so that its agent can be replaced mid-download.
	if err := e.C.Node(warm2).Throttle(24 << 20); err != nil {
		t.Fatal(err)
	}
	if err := e.ApplySeed(ctx); err != nil {
		t.Fatal(err)
	}
	iec := &inferencev1.InferenceEndpointConfig{}
	key := client.ObjectKey{Namespace: "default", Name: "example-model"}
	cache := e.weightsCache(t, ctx, key)
	t.Run("agent pod replaced mid-download resumes", func(t *testing.T) {
		e.replaceAgentMidDownload(t, ctx, warm2, cache)
	})
	if err := e.C.Node(warm2).Throttle(0); err != nil {
		t.Fatal(err)
	}

	t.Run("seed reaches DeploymentComplete with verified model servers", func(t *testing.T) {
		e.waitComplete(t, ctx, key, iec, e.Model)
		js := &inferencev1.JumpStartModel{}
		e.waitComplete(t, ctx, client.ObjectKey{Namespace: "default", Name: "example-jumpstart-model"}, js, e.JSModel)
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Run("autoScalingSpec on KEDA and Prometheus scales the endpoint 1 to 3 on its load, on warm nodes, and back", func(t *testing.T) {
		e.autoscale(t, ctx, key)
	})
	// Before any other pod runs on the node the image cache does not target.
	t.Run("image cached on every target node against not cached", func(t *testing.T) {
		if err := e.MeasureImage(ctx, rep); err != nil {
			t.Fatal(err)
		}
	})
	var tenant *inferencev1.InferenceEndpointConfig
	var tenantCache *inferencev1.ModelDataCacheConfig
	t.Run("a namespace enforcing the restricted level gets its own cache, read-only, nothing else", func(t *testing.T) {
		tenant = e.restrictedTenant(t, ctx)
		tenantCache = e.weightsCache(t, ctx, client.ObjectKeyFromObject(tenant))
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Run("a pod of another namespace is refused that cache", func(t *testing.T) {
		e.intruderRefused(t, ctx, tenantCache)
	})
	t.Run("a namespace whose token the Hub no longer accepts gets no new mount", func(t *testing.T) {
		e.gatedRevoked(t, ctx)
	})
	t.Run("pods started together on a cold node share one download", func(t *testing.T) {
		got, err := e.MeasureSharedFill(ctx, key, 3, rep)
		if err != nil {
			t.Fatal(err)
		}
		size := realseed.ModelBytes(e.Model)
		// One copy of the model, and the protocol's overhead (headers, retransmits): not 3.
		if got < size || float64(got) > 1.05*float64(size) {
			t.Errorf("3 pods on %s received %d bytes from S3; want about one model, %d", cold, got, size)
		}
		t.Logf("3 pods on %s: %d bytes from S3 for a %d-byte model (%.3f×)", cold, got, size, float64(got)/float64(size))
	})
	t.Run("the agent killed during a fill: its replacement finishes, the pod starts", func(t *testing.T) {
		e.agentKilledDuringFill(t, ctx, key, cache)
	})
	if err := e.C.Client.Get(ctx, key, iec); err != nil {
		t.Fatal(err)
	}
	image := e.imageCacheName(t, ctx, iec)
	t.Run("pod created to Ready on a warm node against a cold one", func(t *testing.T) {
		if err := e.MeasureWeights(ctx, key, rep); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cached image survives image garbage collection", func(t *testing.T) {
		e.imageGC(t, ctx)
	})
	t.Run("a deleted cache stays on a node while a pod there uses it", func(t *testing.T) {
		e.deletedWhileInUse(t, ctx, tenant, tenantCache)
	})
	t.Run("Deployments written by hand mount a standalone cache by name, on a warm node and a cold one", func(t *testing.T) {
		e.deploymentsByName(t, ctx)
	})
	t.Run("deleting the parent removes files, labels and the image pin", func(t *testing.T) {
		e.deleteParent(t, ctx, iec, cache, image)
	})
	var table strings.Builder
	rep.Table(&table)
	t.Logf("measured:\n%s", table.String())
	if path := os.Getenv("PREWARM_REALNODE_REPORT"); path != "" && !t.Failed() {
		if err := rep.WriteMarkdown(path, "make bench-nodes"); err != nil {
			t.Fatal(err)
		}
		t.Logf("figures written to %s", path)
	}
}

func TestMain(m *testing.M) {
	if testutil.SkipPackageIfShort() {
		return
	}
	os.Exit(realnode.Main(m.Run))
}

const (
	opNS        = realseed.OpNS
	cacheRoot   = realseed.CacheRoot
	serverImage = realseed.ServerImage
	warm1       = realseed.Warm1
	warm2       = realseed.Warm2
	cold        = realseed.Cold
)

// env is the run: the cluster with prewarm installed, and the sources.
type env struct{ *realseed.Env }

// setup starts the run, or skips where the machine cannot run real nodes, saying why.
func setup(t *testing.T, ctx context.Context, modelSize int64) *env {
	t.Helper()
	if why := realnode.Unsupported(); why != "" {
		t.Skip("no real nodes on this machine: " + why)
	}
	return start(t, ctx, realseed.Options{Dir: t.TempDir(), ModelSize: modelSize, Logf: t.Logf})
}

// start starts the run o describes; the cluster is stopped when the test ends (its logs kept
// in $PREWARM_KEEP_LOGS if it failed).
func start(t *testing.T, ctx context.Context, o realseed.Options) *env {
	t.Helper()
	re, err := realseed.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if dest := os.Getenv("PREWARM_KEEP_LOGS"); t.Failed() && dest != "" {
			if err := re.KeepLogs(dest); err != nil {
				t.Logf("keeping the logs: %v", err)
			}
		}
		if err := re.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	return &env{re}
}

// onlyTheModel is what the model server says of a model directory that holds the model's files
// and prewarm's manifest of them, nothing else.
var onlyTheModel = fmt.Sprintf("1 other entries [%s];", engine.ManifestName)

// deployment returns the parent's Deployment.
func (e *env) deployment(t *testing.T, ctx context.Context, key client.ObjectKey) *appsv1.Deployment {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := e.C.Client.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	return dep
}

// health waits until the pod's model server has read its model and returns what it says.
func (e *env) health(t *testing.T, ctx context.Context, p *corev1.Pod) string {
	t.Helper()
	body, err := e.Health(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// checkNonRoot checks that each named binary runs, in its container, as a non-root user: the
// images' user, read from the processes' credentials on this machine.
func checkNonRoot(t *testing.T, binaries ...string) {
	t.Helper()
	for _, bin := range binaries {
		uids := processUIDs(bin)
		if len(uids) == 0 {
			t.Errorf("no %s process on the nodes", bin)
		}
		for _, uid := range uids {
			// The agent alone runs as root (privileged: it is the CSI node plugin that mounts the
			// caches into pods): the chart says so.
			if bin == "/agent" {
				continue
			}
			if uid == "0" {
				t.Errorf("%s runs as root", bin)
			}
		}
		t.Logf("%s runs as uid %v", bin, uids)
	}
}

// processUIDs returns the real uid of each process whose command is bin.
func processUIDs(bin string) []string {
	var uids []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || strings.SplitN(string(b), "\x00", 2)[0] != bin {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(f), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				uids = append(uids, f[1])
			}
		}
	}
	return uids
}

// weightsCache waits for the parent's weights cache and returns it.
func (e *env) weightsCache(t *testing.T, ctx context.Context, key client.ObjectKey) *inferencev1.ModelDataCacheConfig {
	t.Helper()
	var cache *inferencev1.ModelDataCacheConfig
	err := testutil.Eventually(ctx, time.Minute, func() (bool, error) {
		var list inferencev1.ModelDataCacheConfigList
		if err := e.C.Client.List(ctx, &list); err != nil {
			return false, err
		}
		for i := range list.Items {
			for _, ref := range list.Items[i].OwnerReferences {
				if ref.Name == key.Name && ref.Kind == "InferenceEndpointConfig" {
					cache = &list.Items[i]
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no weights cache for %s: %v", key, err)
	}
	return cache
}

// nodeCache returns the node's status entry for the cache (nil if none).
func (e *env) nodeCache(ctx context.Context, node string, uid string) (*prewarmv1alpha1.CacheStatus, error) {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	for i := range nc.Status.Caches {
		if nc.Status.Caches[i].UID == uid {
			return &nc.Status.Caches[i], nil
		}
	}
	return nil, nil
}

// agentPod returns the agent DaemonSet's pod on node.
func (e *env) agentPod(ctx context.Context, node string) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := e.C.Client.List(ctx, &pods, client.InNamespace(opNS), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no agent pod on %s", node)
}

// replaceAgentMidDownload deletes the node's agent pod once its download of cache is under way,
// and checks that the DaemonSet's replacement finishes it without fetching what was kept.
func (e *env) replaceAgentMidDownload(t *testing.T, ctx context.Context, node string, cache *inferencev1.ModelDataCacheConfig) {
	uid := string(cache.UID)
	var done, total int64
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		st, err := e.nodeCache(ctx, node, uid)
		if err != nil || st == nil {
			return errors.Join(err, fmt.Errorf("%s reports nothing of the cache yet", node))
		}
		if st.State == inferencev1.CacheReady {
			return fmt.Errorf("the download finished before the agent could be replaced (%d bytes)", st.BytesTotal)
		}
		done, total = st.BytesDone, st.BytesTotal
		// Well past the first parts in flight (concurrency × part size), so that some are done.
		if total == 0 || done <= total*2/5 {
			return fmt.Errorf("%s: %s %d of %d bytes", node, st.State, done, total)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	old, err := e.agentPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	// The deleted pod's own account of how it stopped, followed until its container ends.
	oldLogs := make(chan string, 1)
	go func() { oldLogs <- e.followLogs(ctx, old) }()
	deleted := time.Now()
	if err := e.C.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted agent pod %s at %d of %d bytes (its last status)", old.Name, done, total)
	var repl *corev1.Pod
	err = testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) {
		p, err := e.agentPod(ctx, node)
		if err != nil {
			return false, err
		}
		repl = p
		return p.UID != old.UID && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("no replacement agent pod: %v\n%s", err, e.PodReport(ctx, opNS))
	}
	t.Logf("replacement %s running %s after the deletion", repl.Name, time.Since(deleted).Round(10*time.Millisecond))
	select {
	case l := <-oldLogs:
		t.Logf("the deleted pod's last lines:\n%s", lastLines(l, 6))
	case <-time.After(10 * time.Second):
		t.Log("the deleted pod's log did not end")
	}
	if err := e.C.Node(node).Throttle(0); err != nil {
		t.Fatal(err)
	}
	err = testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) {
		st, err := e.nodeCache(ctx, node, uid)
		return err == nil && st != nil && st.State == inferencev1.CacheReady, err
	})
	if err != nil {
		t.Fatalf("the replacement did not finish: %v", err)
	}
	// The replacement's own account of its download: what it fetched this time.
	logs := e.podLogs(t, ctx, repl)
	fetched, ok := logField(logs, uid, "cache ready", "fetched")
	if !ok {
		t.Fatalf("the replacement agent's log has no \"cache ready\" line with fetched=:\n%s", logs)
	}
	t.Logf("the replacement %s fetched %d of the cache's %d bytes; %d were kept from the deleted pod", repl.Name, fetched, total, total-fetched)
	// What the deleted pod had, less the parts it had in flight (a part is kept once whole):
	// the engine's guarantee.
	inFlight := int64(realseed.AgentConcurrency * realseed.AgentPartSize)
	if fetched <= 0 || fetched >= total || fetched > total-(done-inFlight) {
		t.Errorf("the replacement fetched %d bytes of %d; the deleted pod had %d, at most %d of them in parts in flight: want the rest kept",
			fetched, total, done, inFlight)
	}
}

// followLogs returns the pod's log once its container ends (or ctx does).
func (e *env) followLogs(ctx context.Context, pod *corev1.Pod) string {
	logs, err := e.logs(ctx, pod, true)
	if err != nil {
		return err.Error()
	}
	return logs
}

// logs reads the pod's log, to its container's end with follow.
func (e *env) logs(ctx context.Context, pod *corev1.Pod, follow bool) (string, error) {
	cs, err := kubernetes.NewForConfig(e.C.Config)
	if err != nil {
		return "", err
	}
	rc, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Follow: follow}).Stream(ctx)
	if err != nil {
		return "", fmt.Errorf("logs of %s: %w", pod.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (e *env) podLogs(t *testing.T, ctx context.Context, pod *corev1.Pod) string {
	t.Helper()
	logs, err := e.logs(ctx, pod, false)
	if err != nil {
		t.Fatal(err)
	}
	return logs
}

// logField finds the first line of the cache uid holding msg (the agent logs every cache's jobs
// with its UID) and returns the integer of its field key (JSON or key=value logs).
func logField(logs, uid, msg, key string) (int64, bool) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, msg) || !strings.Contains(line, uid) {
			continue
		}
		for _, sep := range []string{`"` + key + `":`, key + "="} {
			if i := strings.Index(line, sep); i >= 0 {
				var n int64
				if _, err := fmt.Sscan(strings.TrimLeft(line[i+len(sep):], `"`), &n); err == nil {
					return n, true
				}
			}
		}
	}
	return 0, false
}

// waitComplete waits until the parent is DeploymentComplete and its pods are Ready, then asks
// each pod's model server whether it verified the whole model.
func (e *env) waitComplete(t *testing.T, ctx context.Context, key client.ObjectKey, parent client.Object, model []realseed.FileSpec) {
	t.Helper()
	status := func() *inferencev1.ParentStatus {
		switch p := parent.(type) {
		case *inferencev1.InferenceEndpointConfig:
			return &p.Status
		case *inferencev1.JumpStartModel:
			return &p.Status
		}
		return nil
	}
	err := testutil.Until(ctx, 8*time.Minute, func() error {
		if err := e.C.Client.Get(ctx, key, parent); err != nil {
			return err
		}
		if st := status(); st.State != inferencev1.DeploymentComplete {
			return fmt.Errorf("%s is %s", key, st.State)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, "default"))
	}
	pods := e.parentPods(t, ctx, parent)
	var want int64
	for _, f := range model {
		want += f.Size
	}
	for _, p := range pods {
		body := e.health(t, ctx, &p)
		if !strings.Contains(body, fmt.Sprintf("%d files, %d bytes verified", len(model), want)) {
			t.Errorf("%s on %s: /health says %q; want every one of %d files, %d bytes, verified", p.Name, p.Spec.NodeName, body, len(model), want)
		}
		// The pod sees its model (and prewarm's manifest of it) and nothing else of the node: no
		// other cache, no partial download; and it cannot write there.
		if !strings.Contains(body, onlyTheModel) || !strings.Contains(body, "; read-only; on ") {
			t.Errorf("%s on %s: /health says %q; want no entry beside the model's files and %s, read-only", p.Name, p.Spec.NodeName, body, engine.ManifestName)
		}
		t.Logf("%s Ready on %s: %s", p.Name, p.Spec.NodeName, strings.TrimSpace(body))
	}
}

// parentPods returns the parent's Ready pods (at least one).
func (e *env) parentPods(t *testing.T, ctx context.Context, parent client.Object) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	err := testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) {
		var pods corev1.PodList
		if err := e.C.Client.List(ctx, &pods, client.InNamespace(parent.GetNamespace()),
			client.MatchingLabels{controller.EndpointLabel: string(parent.GetUID())}); err != nil {
			return false, err
		}
		ready = ready[:0]
		for _, p := range pods.Items {
			if realseed.PodReady(&p) {
				ready = append(ready, p)
			}
		}
		return len(ready) > 0, nil
	})
	if err != nil {
		t.Fatalf("no Ready pod of %s: %v\n%s", parent.GetName(), err, e.PodReport(ctx, parent.GetNamespace()))
	}
	return ready
}

func (e *env) imageCacheName(t *testing.T, ctx context.Context, iec *inferencev1.InferenceEndpointConfig) string {
	t.Helper()
	list := &inferencev1.InferenceImageCacheList{}
	if err := e.C.Client.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	for _, ic := range list.Items {
		for _, r := range ic.Spec.ParentReferences {
			if r.UID == string(iec.UID) {
				return ic.Name
			}
		}
	}
	t.Fatalf("no image cache names %s (%s) among its parents", iec.Name, iec.UID)
	return ""
}

// deleteParent deletes the InferenceEndpointConfig and checks that its cache's files leave the
// nodes' disks, its labels leave the nodes, and its image, unpinned, is collected like any other.
func (e *env) deleteParent(t *testing.T, ctx context.Context, iec *inferencev1.InferenceEndpointConfig, cache *inferencev1.ModelDataCacheConfig, image string) {
	if err := e.C.Client.Delete(ctx, iec); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	dirs := []string{}
	for _, n := range []string{warm1, warm2} {
		dirs = append(dirs, e.C.Node(n).HostPath(prewarmv1alpha1.CacheDir(cacheRoot, uid)))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("before deletion, %s: %v (want the cache's directory on the node's disk)", d, err)
		}
	}
	err := testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) {
		err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(iec), &inferencev1.InferenceEndpointConfig{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("the parent is still there (%w)", err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				return false, fmt.Errorf("%s is still on the disk", d)
			}
		}
		var nodes corev1.NodeList
		if err := e.C.Client.List(ctx, &nodes); err != nil {
			return false, err
		}
		for _, n := range nodes.Items {
			for l := range n.Labels {
				if strings.HasSuffix(l, uid) {
					return false, fmt.Errorf("node %s still has %s", n.Name, l)
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("parent gone; %s's directories gone from %s and %s; no node has its label", uid, warm1, warm2)
	// The image cache's pods are gone with it: the image is an unused image again.
	err = testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) {
		var pods corev1.PodList
		if err := e.C.Client.List(ctx, &pods, client.MatchingLabels{controller.ImageCacheLabel: image}); err != nil {
			return false, err
		}
		if len(pods.Items) > 0 {
			return false, fmt.Errorf("image cache pod %s is still there", pods.Items[0].Name)
		}
		removed, err := e.C.Node(warm1).PruneImages(ctx)
		if err != nil {
			return false, err
		}
		if has, err := e.C.Node(warm1).HasImage(ctx, "docker.io/"+serverImage); err != nil || has {
			return false, errors.Join(err, fmt.Errorf("%s still on %s after pruning (removed %v)", serverImage, warm1, removed))
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s collected on %s once its last parent was deleted", serverImage, warm1)
}
