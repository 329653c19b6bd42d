package realnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

// The nodes of the cloud-shaped runs: two GPU nodes laid out as EKS's nodeadm lays out RAID0
// instance store (the array at /mnt/k8s-disks/0, the kubelet's directory bound onto it; GKE's
// local SSD path bound onto it too, for the GKE run), one whose /mnt/k8s-disks/0 is a directory
// of its root filesystem (nothing mounted there), one of another instance type whose NVMe is too
// small to hold the seed's model, one of that type laid out as the first two whose kubelet
// evicts pods once less than 22 GiB of the array is free, and a system node.
const (
	gpuA, gpuB, rootFS = "ip-10-0-1-11", "ip-10-0-1-12", "ip-10-0-1-13"
	smallDisk          = "ip-10-0-1-14"
	shared             = "ip-10-0-1-15"
	// smallDiskSize is a disk of its own, but too small for the seed's model (256 MiB).
	smallDiskSize = 64 << 20
	// sharedEviction is the shared node's kubelet's evictionHard nodefs.available: on its
	// array of realseed.DiskSize, it binds before the agents' reserve does.
	sharedEviction = "22Gi"
	system         = "ip-10-0-0-10"
	raid0          = "/mnt/k8s-disks/0"
	gkeSSD         = "/mnt/stateful_partition/kube-ephemeral-ssd"
	gpuTaint       = "nvidia.com/gpu=present:NoSchedule"
)

// TestSeedOnCloudShapedNodes installs prewarm as a platform engineer would on EKS and then on
// GKE: from a release (its images and chart published to a registry by make push and make
// chart-push), with only the values docs/operations.md tells them to set, on real kubelets
// labelled and tainted as those clouds' GPU node groups, the API server running the
// ExtendedResourceToleration admission plugin, and the NVMe laid out as those clouds lay it out:
// a RAID0 array the kubelet's directory is bound onto. The seed's manifests, unchanged, must
// become Ready there: the caches on the nodes with an array, the model servers verifying every
// byte. The node whose cache root is its root filesystem reports NoLocalDisk, keeps nothing,
// and its pod still starts, from the source. On the array, the caches stay short of the
// kubelet's eviction threshold, read from its configuration. The documented uninstall then
// leaves no file, label or PriorityClass behind.
func TestSeedOnCloudShapedNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("real nodes: minutes")
	}
	if why := realnode.Unsupported(); why != "" {
		t.Skip("no real nodes on this machine: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	const modelSize = 256<<20 + 2<<20
	disk := map[string]int64{raid0: realseed.DiskSize(modelSize)}
	eksLabels := map[string]string{"eks.amazonaws.com/nodegroup": "gpu", "topology.kubernetes.io/zone": "us-west-2a"}
	// A short folder: containerd's sockets are under it, and a Unix socket's path is at most
	// 104 bytes.
	dir, err := os.MkdirTemp("", "prewarm-clouds-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := start(t, ctx, realseed.Options{
		Dir: dir, ModelSize: modelSize, Logf: t.Logf, Release: true,
		// The JumpStart pods ask for a GPU, as the shipped catalog's do: on GPU nodes tainted as
		// EKS's, that is what lets them on.
		CatalogGPUs:      1,
		AdmissionPlugins: []string{"ExtendedResourceToleration"},
		Nodes: []realnode.NodeOptions{
			// The cluster's system node group: no GPU, no taint, no local disk (prewarm's
			// controller runs here).
			{Name: system, InstanceType: "m5.xlarge", Labels: map[string]string{"eks.amazonaws.com/nodegroup": "system"}},
			{Name: gpuA, InstanceType: "g5.24xlarge", GPUs: 8, Disks: disk, KubeletOn: raid0, Aliases: map[string]string{gkeSSD: raid0}, Labels: eksLabels, Taints: []string{gpuTaint}},
			{Name: gpuB, InstanceType: "g5.24xlarge", GPUs: 8, Disks: disk, KubeletOn: raid0, Aliases: map[string]string{gkeSSD: raid0}, Labels: eksLabels, Taints: []string{gpuTaint}},
			{Name: rootFS, InstanceType: "g5.24xlarge", GPUs: 8, RootPaths: []string{raid0, gkeSSD}, Labels: eksLabels, Taints: []string{gpuTaint}},
			// Not targets of the seed (another instance type): a pod of the seed placed there
			// makes them one.
			{Name: smallDisk, InstanceType: "g5.12xlarge", GPUs: 4, Disks: map[string]int64{raid0: smallDiskSize}, Labels: eksLabels, Taints: []string{gpuTaint}},
			{Name: shared, InstanceType: "g5.12xlarge", GPUs: 4, Disks: disk, KubeletOn: raid0, EvictionHard: map[string]string{"nodefs.available": sharedEviction},
				Labels: eksLabels, Taints: []string{gpuTaint}},
		},
	})

	t.Run("EKS", func(t *testing.T) {
		e.seedOnCloud(t, ctx, "values-eks.yaml")
	})
	if t.Failed() {
		t.FailNow()
	}
	// The same nodes as GKE labels its GPU nodes: its own machine types, the accelerator label,
	// the same taint.
	for _, name := range []string{gpuA, gpuB, rootFS} {
		n := &corev1.Node{}
		if err := e.C.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(n.DeepCopy())
		n.Labels[inferencev1.InstanceTypeLabel] = "g2-standard-48"
		n.Labels["cloud.google.com/gke-accelerator"] = "nvidia-l4"
		delete(n.Labels, "eks.amazonaws.com/nodegroup")
		if err := e.C.Client.Patch(ctx, n, patch); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("GKE", func(t *testing.T) {
		e.seedOnCloud(t, ctx, "values-gke.yaml")
	})
}

// seedOnCloud installs the release with the values of the doc's block named file, applies the
// seed, checks it on the nodes, and uninstalls as the doc says.
func (e *env) seedOnCloud(t *testing.T, ctx context.Context, file string) {
	values := docValues(t, file)
	// This machine's stand-ins for the cloud: the release's images from the cluster's registry
	// (the air-gapped install), S3 is versitygw and the Hub a fixture (their endpoints), the
	// agents' and the controller's IAM roles are static keys (agent.envFrom,
	// controller.envFrom), and the JumpStart catalog is the test's
	// (it points at the Hub fixture's commit). The node whose cache root is a directory of its
	// root filesystem has this machine's disk for its kubelet's filesystem, where its pods' copies
	// go: a disk the whole run shares (the other suites, the build caches), several GB fuller
	// while it runs, so the agents keep realseed.AgentReserve free there, as the runs' agents
	// do, rather than the chart's 20Gi, which is sized for a node's disk of its own.
	merge(values, map[string]any{
		"image":      map[string]any{"registry": e.Registry()},
		"agent":      map[string]any{"envFrom": []any{map[string]any{"secretRef": map[string]any{"name": "prewarm-s3"}}}},
		"controller": map[string]any{"envFrom": []any{map[string]any{"secretRef": map[string]any{"name": "prewarm-s3"}}}},
		"catalog":    map[string]any{"enabled": false},
		"config": map[string]any{
			"s3":          map[string]any{"endpoint": e.S3.Endpoint, "pathStyle": true},
			"huggingFace": map[string]any{"endpoint": e.Hub.URL},
			"agent":       map[string]any{"reserve": realseed.AgentReserve},
		},
	})
	if file == "values-gke.yaml" {
		// This run's kubelets are not GKE's: they keep their configuration where EKS's do and
		// evict at this machine's thresholds (its disk is shared), not at GKE's defaults.
		merge(values, map[string]any{"config": map[string]any{"agent": map[string]any{"kubelet": map[string]any{"configFile": realnode.KubeletConfig}}}})
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("values (%s from docs/operations.md, and the stand-ins):\n%s", file, b)
	if err := e.InstallRelease(ctx, string(b)); err != nil {
		t.Fatal(err)
	}
	if err := e.ApplySeed(ctx); err != nil {
		t.Fatal(err)
	}
	iecKey := client.ObjectKey{Namespace: "default", Name: "example-model"}
	jsKey := client.ObjectKey{Namespace: "default", Name: "example-jumpstart-model"}
	cache := e.weightsCache(t, ctx, iecKey)

	t.Run("the seed's caches are Ready on the nodes with a disk", func(t *testing.T) {
		for _, name := range []string{cache.Name, "example-jumpstart-model-cache"} {
			m := &inferencev1.ModelDataCacheConfig{}
			err := testutil.Until(ctx, 5*time.Minute, func() error {
				if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, m); err != nil {
					return err
				}
				if st := m.Status; st.State != inferencev1.CacheReady || st.TargetNodes != 2 || st.ReadyNodes != 2 {
					return fmt.Errorf("%s: %s, %d of %d target nodes ready; %v", name, st.State, st.ReadyNodes, st.TargetNodes, st.Conditions)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			c := meta.FindStatusCondition(m.Status.Conditions, inferencev1.ConditionReady)
			if c == nil || !strings.Contains(c.Message, "have no local disk for caches (NoLocalDisk: "+rootFS+")") {
				t.Errorf("%s's Ready condition does not name %s as a node with no local disk: %+v", name, rootFS, c)
			}
			t.Logf("%s: %s, TARGET %d READY %d: %s", name, m.Status.State, m.Status.TargetNodes, m.Status.ReadyNodes, c.Message)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Run("every agent renews its node's Lease, held by its pod, through the chart's RBAC and policy", func(t *testing.T) {
		e.agentLeases(t, ctx)
	})
	t.Run("the model servers are Ready on the tainted nodes and verify every byte", func(t *testing.T) {
		iec := &inferencev1.InferenceEndpointConfig{}
		e.waitComplete(t, ctx, iecKey, iec, e.Model)
		js := &inferencev1.JumpStartModel{}
		e.waitComplete(t, ctx, jsKey, js, e.JSModel)
		dep := e.deployment(t, ctx, iecKey)
		if !slices.ContainsFunc(dep.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
			return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoSchedule
		}) {
			t.Errorf("the pods do not tolerate %s: %v", gpuTaint, dep.Spec.Template.Spec.Tolerations)
		}
	})
	t.Run("the node without a disk says NoLocalDisk, and its pod starts from the source", func(t *testing.T) {
		e.noLocalDisk(t, ctx, cache, iecKey)
	})
	if file == "values-eks.yaml" {
		t.Run("the node whose disk cannot hold the cache says InsufficientCapacity, and its pod starts from the source", func(t *testing.T) {
			e.noRoom(t, ctx, cache, iecKey)
		})
		t.Run("on an array the kubelet shares, the cache stops short of the kubelet's eviction threshold; the kubelet evicts nothing", func(t *testing.T) {
			e.sharedDisk(t, ctx, cache, iecKey)
		})
		t.Run("HyperPod's ModelWeightsCacheConfig and ModelImageCache, with no endpoint, become Ready on the GPU nodes", func(t *testing.T) {
			e.standaloneCaches(t, ctx, iecKey)
		})
		t.Run("with prefetchEnabled the model server reads the model from memory", func(t *testing.T) {
			e.prefetched(t, ctx)
		})
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Run("the documented uninstall leaves nothing behind", func(t *testing.T) {
		e.uninstall(t, ctx, []string{gpuA, gpuB})
	})
}

// noLocalDisk checks the node whose cache root is its root filesystem: its NodeCache and
// `kubectl prewarm explain` say why it keeps no cache; a pod of the seed there is Ready with
// its model verified, read from a copy the agent downloaded and removes when the pod goes.
func (e *env) noLocalDisk(t *testing.T, ctx context.Context, cache *inferencev1.ModelDataCacheConfig, key client.ObjectKey) {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Name: rootFS}, nc); err != nil {
		t.Fatal(err)
	}
	var nodePath string
	if len(nc.Status.Roots) == 1 {
		nodePath = nc.Status.Roots[0].NodePath
	}
	if len(nc.Status.Roots) != 1 || nc.Status.Roots[0].Reason != prewarmv1alpha1.ReasonNoLocalDisk || (nodePath != raid0 && nodePath != gkeSSD) ||
		!strings.Contains(nc.Status.Roots[0].Message, "root filesystem") {
		t.Errorf("%s's roots: %+v; want %s (at %s or %s) with NoLocalDisk: the root filesystem", rootFS, nc.Status.Roots, realseed.CacheRoot, raid0, gkeSSD)
	} else {
		t.Logf("%s: %s", rootFS, nc.Status.Roots[0].Message)
	}
	out := e.kubectlPrewarm(t, ctx, "explain", "node", rootFS)
	if !strings.Contains(out, "NoLocalDisk") || !strings.Contains(out, nodePath) {
		t.Errorf("kubectl prewarm explain node %s does not say NoLocalDisk:\n%s", rootFS, out)
	}
	t.Logf("kubectl prewarm explain node %s:\n%s", rootFS, out)

	dep := e.deployment(t, ctx, key)
	pod := realseed.ProbePod(dep, "seed-on-"+rootFS, rootFS)
	took, err := e.TimePod(ctx, pod, realseed.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	body := e.health(t, ctx, pod)
	if !strings.Contains(body, fmt.Sprintf("%d files, %d bytes verified", len(e.Model), realseed.ModelBytes(e.Model))) {
		t.Errorf("%s on %s: /health says %q; want the whole model verified", pod.Name, rootFS, body)
	}
	mounted := e.MountEvent(ctx, pod)
	if !strings.Contains(mounted, "downloaded from the source") {
		t.Errorf("%s's model volume: %s; want the node's copy from the source", pod.Name, mounted)
	}
	t.Logf("%s Ready on %s in %s: %s; %s", pod.Name, rootFS, took.Round(time.Millisecond), mounted, strings.TrimSpace(body))
	node := e.C.Node(rootFS)
	uid := string(cache.UID)
	if _, err := os.Stat(node.HostPath(prewarmv1alpha1.CacheDir(nodePath, uid))); !os.IsNotExist(err) {
		t.Errorf("%s holds a cache under its root filesystem's %s (%v)", rootFS, nodePath, err)
	}
	scratch := node.HostPath(filepath.Join("/var/lib/kubelet/plugins", prewarmv1alpha1.CSIDriverName, "scratch", uid))
	if _, err := os.Stat(scratch); err != nil {
		t.Errorf("no copy of the cache for the node's pods at %s: %v", scratch, err)
	}
	if err := e.DeletePods(ctx, pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
	err = testutil.Until(ctx, 2*time.Minute, func() error {
		if _, err := os.Stat(scratch); !os.IsNotExist(err) {
			return fmt.Errorf("the copy %s is still there once its pod is gone (%w)", scratch, err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// noRoom checks the node whose disk is too small for the cache: a pod of the seed placed there
// makes it a target, its agent finds no room even after eviction (InsufficientCapacity), and the
// pod is Ready with its model verified, read from a copy from the source, its event saying it
// runs cold and why; the copy goes with the pod.
func (e *env) noRoom(t *testing.T, ctx context.Context, cache *inferencev1.ModelDataCacheConfig, key client.ObjectKey) {
	dep := e.deployment(t, ctx, key)
	pod := realseed.ProbePod(dep, "seed-on-"+smallDisk, smallDisk)
	took, err := e.TimePod(ctx, pod, realseed.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	body := e.health(t, ctx, pod)
	if !strings.Contains(body, fmt.Sprintf("%d files, %d bytes verified", len(e.Model), realseed.ModelBytes(e.Model))) {
		t.Errorf("%s on %s: /health says %q; want the whole model verified", pod.Name, smallDisk, body)
	}
	mounted := e.MountEvent(ctx, pod)
	if !strings.Contains(mounted, "running cold") || !strings.Contains(mounted, prewarmv1alpha1.ReasonInsufficientCapacity) {
		t.Errorf("%s's model volume: %s; want a copy from the source, running cold for want of room", pod.Name, mounted)
	}
	t.Logf("%s Ready on %s in %s: %s", pod.Name, smallDisk, took.Round(time.Millisecond), mounted)
	nc := &prewarmv1alpha1.NodeCache{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Name: smallDisk}, nc); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	i := slices.IndexFunc(nc.Status.Caches, func(c prewarmv1alpha1.CacheStatus) bool { return c.UID == uid })
	if i < 0 || nc.Status.Caches[i].Reason != prewarmv1alpha1.ReasonInsufficientCapacity {
		t.Errorf("%s's NodeCache says of the cache: %+v; want InsufficientCapacity", smallDisk, nc.Status.Caches)
	} else {
		t.Logf("%s: %s", smallDisk, nc.Status.Caches[i].Message)
	}
	node := e.C.Node(smallDisk)
	scratch := node.HostPath(filepath.Join("/var/lib/kubelet/plugins", prewarmv1alpha1.CSIDriverName, "scratch", uid))
	if err := e.DeletePods(ctx, pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
	err = testutil.Until(ctx, 2*time.Minute, func() error {
		if _, err := os.Stat(scratch); !os.IsNotExist(err) {
			return fmt.Errorf("the copy %s is still there once its pod is gone (%w)", scratch, err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// uninstall runs the doc's uninstall: the parents, then (their caches gone) the release, then
// the CRDs. Nothing prewarm made is left: no cache files on the disks, no prewarm label on a
// node, no PriorityClass, no object of the release.
func (e *env) uninstall(t *testing.T, ctx context.Context, disks []string) {
	for _, obj := range []client.Object{
		&inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "example-model"}},
		&inferencev1.JumpStartModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "example-jumpstart-model"}},
	} {
		if err := e.C.Client.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	err := testutil.Until(ctx, 5*time.Minute, func() error {
		var caches inferencev1.ModelDataCacheConfigList
		var images inferencev1.InferenceImageCacheList
		if err := errors.Join(e.C.Client.List(ctx, &caches), e.C.Client.List(ctx, &images)); err != nil {
			return err
		}
		if n := len(caches.Items) + len(images.Items); n > 0 {
			return fmt.Errorf("%d caches are still there", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Helm(ctx, "uninstall", "prewarm", "--namespace", opNS, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	// kubectl delete -f prewarm/crds/: the CRDs the release installed, which carry its label.
	crds := crdList()
	if err := e.C.Client.List(ctx, crds, client.MatchingLabels{inferencev1.APILabel: "true"}); err != nil {
		t.Fatal(err)
	}
	shipped, err := filepath.Glob(filepath.Join(e.Root, "charts", "prewarm", "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(crds.Items) != len(shipped) {
		t.Errorf("%d CRDs carry %s; want the %d of the chart's crds/", len(crds.Items), inferencev1.APILabel, len(shipped))
	}
	for _, crd := range crds.Items {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		u.SetName(crd.Name)
		if err := e.C.Client.Delete(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	err = testutil.Until(ctx, 3*time.Minute, func() error {
		var errs []error
		left := crdList()
		if err := e.C.Client.List(ctx, left, client.MatchingLabels{inferencev1.APILabel: "true"}); err != nil || len(left.Items) > 0 {
			errs = append(errs, fmt.Errorf("%d of prewarm's CRDs left (%w)", len(left.Items), err))
		}
		for _, pc := range []string{"prewarm-node-agent", "prewarm-image-cache"} {
			if err := e.C.Client.Get(ctx, client.ObjectKey{Name: pc}, &schedulingv1.PriorityClass{}); !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("PriorityClass %s is still there (%w)", pc, err))
			}
		}
		for name, obj := range map[string]client.Object{"prewarm-agent": &appsv1.DaemonSet{}, "prewarm-controller": &appsv1.Deployment{}, "prewarm-config": &corev1.ConfigMap{}} {
			if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: opNS, Name: name}, obj); !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("%T %s is still there (%w)", obj, name, err))
			}
		}
		var nodes corev1.NodeList
		if err := e.C.Client.List(ctx, &nodes); err != nil {
			return err
		}
		for _, n := range nodes.Items {
			for l := range n.Labels {
				if strings.HasPrefix(l, inferencev1.WeightsCacheReadyLabelPrefix) || strings.HasPrefix(l, inferencev1.ImageCacheReadyLabelPrefix) {
					errs = append(errs, fmt.Errorf("node %s still has %s", n.Name, l))
				}
			}
		}
		for _, name := range disks {
			dir := e.C.Node(name).HostPath(filepath.Join(raid0, prewarmv1alpha1.Directory))
			entries, err := os.ReadDir(dir)
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			for _, en := range entries {
				errs = append(errs, fmt.Errorf("%s still holds %s", name, filepath.Join(raid0, prewarmv1alpha1.Directory, en.Name())))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("uninstalled: no cache file on the disks, no prewarm label on a node, no PriorityClass, no CRD")
}

// crdList is an empty list of CRDs' metadata.
func crdList() *metav1.PartialObjectMetadataList {
	return &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinitionList"}}
}

// kubectlPrewarm runs the kubectl plugin, built from the module, against the cluster.
func (e *env) kubectlPrewarm(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	bin := filepath.Join(e.Dir, "bin", "kubectl-prewarm")
	if _, err := os.Stat(bin); err != nil {
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kubectl-prewarm")
		build.Dir = e.Root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	out, err := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", e.C.Kubeconfig)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl prewarm %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// docValues is the values file of docs/operations.md's block that starts with "# <name>".
func docValues(t *testing.T, name string) map[string]any {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(mustRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n# " + regexp.QuoteMeta(name) + "\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/operations.md has no yaml block starting with # %s", name)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(m[1], &values); err != nil {
		t.Fatalf("docs/operations.md, %s: %v", name, err)
	}
	return values
}

// merge sets over's values into base, map by map.
func merge(base, over map[string]any) {
	for k, v := range over {
		if vm, ok := v.(map[string]any); ok {
			if bm, ok := base[k].(map[string]any); ok {
				merge(bm, vm)
				continue
			}
		}
		base[k] = v
	}
}

func mustRoot(t *testing.T) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// agentLeases checks that the agent pod of every node keeps that node's Lease current, with the
// service account token the kubelet gives it (the chart's Role and node-binding policy).
func (e *env) agentLeases(t *testing.T, ctx context.Context) {
	var pods corev1.PodList
	if err := e.C.Client.List(ctx, &pods, client.InNamespace(opNS), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no agent pods")
	}
	for _, p := range pods.Items {
		if !podReady(&p) {
			t.Logf("node %s: agent pod %s is %s, not Ready: not checked", p.Spec.NodeName, p.Name, p.Status.Phase)
			continue
		}
		lease := &coordinationv1.Lease{}
		err := testutil.Until(ctx, time.Minute, func() error {
			if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: opNS, Name: p.Spec.NodeName}, lease); err != nil {
				return err
			}
			if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != p.Name || lease.Spec.RenewTime == nil ||
				time.Since(lease.Spec.RenewTime.Time) > time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second {
				return fmt.Errorf("the Lease of node %s: holder %v, renewed %v", p.Spec.NodeName, lease.Spec.HolderIdentity, lease.Spec.RenewTime)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("node %s: Lease held by %s, renewed %s ago", p.Spec.NodeName, p.Name, time.Since(lease.Spec.RenewTime.Time).Round(time.Second))
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sharedDisk checks the node laid out as nodeadm's RAID0 whose kubelet evicts pods once less than
// sharedEviction of the array is free, read by the agent from the kubelet's configuration
// (values-eks.yaml names it). With the array filled by other files to just short of that
// threshold, a pod of the seed placed there makes the node a target: the cache, which would take
// the array past it, is refused (InsufficientCapacity), and so is a copy for the pod on the
// kubelet's filesystem, the same array; nothing is written, the node reports no DiskPressure and
// no pod in the cluster is evicted. Once those files go, the cache becomes Ready on the array
// and the pod starts.
func (e *env) sharedDisk(t *testing.T, ctx context.Context, cache *inferencev1.ModelDataCacheConfig, key client.ObjectKey) {
	node := e.C.Node(shared)
	threshold := resource.MustParse(sharedEviction)
	var st unix.Statfs_t
	if err := unix.Statfs(node.HostPath(raid0), &st); err != nil {
		t.Fatal(err)
	}
	capacity := int64(st.Blocks) * st.Bsize
	// The kubelet's threshold less the margin (5 points), in percent of the array.
	wantHigh := int32(math.Floor(100-float64(threshold.Value())*100/float64(capacity))) - 5
	// Free space between the agent's high watermark and the kubelet's threshold, less than the
	// model: the cache would take the array past the threshold (the agents' reserve would
	// not keep it off).
	leave := threshold.Value() + 128<<20
	if size := realseed.ModelBytes(e.Model); size <= leave-threshold.Value() {
		t.Fatalf("the model (%d bytes) fits between the fill and the kubelet's threshold", size)
	}
	undo, err := node.Fill(raid0, leave)
	if err != nil {
		t.Fatal(err)
	}
	filled := true
	defer func() {
		if filled {
			_ = undo()
		}
	}()
	dep := e.deployment(t, ctx, key)
	pod := realseed.ProbePod(dep, "seed-on-"+shared, shared)
	if err := e.C.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	nc := &prewarmv1alpha1.NodeCache{}
	var refused prewarmv1alpha1.CacheStatus
	err = testutil.Until(ctx, 3*time.Minute, func() error {
		if err := e.C.Client.Get(ctx, client.ObjectKey{Name: shared}, nc); err != nil {
			return err
		}
		i := slices.IndexFunc(nc.Status.Caches, func(c prewarmv1alpha1.CacheStatus) bool { return c.UID == uid })
		if i < 0 || nc.Status.Caches[i].Reason != prewarmv1alpha1.ReasonInsufficientCapacity {
			return fmt.Errorf("%s's NodeCache says of the cache: %+v; want InsufficientCapacity", shared, nc.Status.Caches)
		}
		refused = nc.Status.Caches[i]
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, pod.Namespace))
	}
	t.Logf("%s: %s", shared, refused.Message)
	if !strings.Contains(refused.Message, "shared with the kubelet's directory") {
		t.Errorf("the refusal does not say the array is the kubelet's: %s", refused.Message)
	}
	if len(nc.Status.Roots) != 1 {
		t.Fatalf("%s's roots: %+v", shared, nc.Status.Roots)
	}
	root := nc.Status.Roots[0]
	t.Logf("%s's root: shared with %q, watermarks %d/%d %%: %s", shared, root.SharedWith, root.HighWatermarkPercent, root.LowWatermarkPercent, root.KubeletThresholds)
	if root.Reason != "" || !strings.Contains(root.SharedWith, "the kubelet's directory") || root.HighWatermarkPercent != wantHigh ||
		!strings.Contains(root.KubeletThresholds, "nodefs.available<"+sharedEviction+" ("+realnode.KubeletConfig+")") {
		t.Errorf("%s's root: %+v; want it shared with the kubelet's directory, its high watermark %d %% (nodefs.available<%s in %s, less 5)",
			shared, root, wantHigh, sharedEviction, realnode.KubeletConfig)
	}
	note := e.waitEvent(t, ctx, pod, agent.EventCacheRefused, "the kubelet's filesystem")
	t.Logf("%s's copy refused: %s", pod.Name, note)
	// Nothing of the model was written: the array is as free as the fill left it, short of the
	// kubelet's threshold, and the kubelet has evicted nothing.
	if err := unix.Statfs(node.HostPath(raid0), &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < threshold.Value() {
		t.Errorf("%s's array has %d bytes free, under the kubelet's threshold %s", shared, free, sharedEviction)
	}
	e.nothingEvicted(t, ctx, shared)

	if err := undo(); err != nil {
		t.Fatal(err)
	}
	filled = false
	// The refused download is tried again with its backoff (up to 5 minutes).
	err = testutil.Until(ctx, 8*time.Minute, func() error {
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if !realseed.PodReady(pod) {
			return fmt.Errorf("%s is not Ready", pod.Name)
		}
		c, err := e.nodeCache(ctx, shared, uid)
		if err != nil {
			return err
		}
		if c == nil || c.State != inferencev1.CacheReady {
			return fmt.Errorf("%s's cache: %+v; want Ready", shared, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, pod.Namespace))
	}
	t.Logf("%s Ready on %s once the array had room: %s", pod.Name, shared, e.MountEvent(ctx, pod))
	e.nothingEvicted(t, ctx, shared)
	if err := e.DeletePods(ctx, pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
}

// nothingEvicted checks that the node reports no disk pressure and no pod of the cluster was
// evicted.
func (e *env) nothingEvicted(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	n := &corev1.Node{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeDiskPressure && c.Status != corev1.ConditionFalse {
			t.Errorf("%s reports DiskPressure %s: %s", name, c.Status, c.Message)
		}
	}
	var pods corev1.PodList
	if err := e.C.Client.List(ctx, &pods); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Reason == "Evicted" || slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "TerminationByKubelet"
		}) {
			t.Errorf("pod %s/%s on %s was evicted by the kubelet: %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Message)
		}
	}
	var events eventsv1.EventList
	if err := e.C.Client.List(ctx, &events); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		// The kubelet's: a pod it evicts, a node whose threshold is met.
		if ev.Regarding.Kind == "Pod" && ev.Reason == "Evicted" || ev.Regarding.Kind == "Node" && ev.Reason == "EvictionThresholdMet" {
			t.Errorf("event %s on %s/%s: %s", ev.Reason, ev.Regarding.Kind, ev.Regarding.Name, ev.Note)
		}
	}
}
