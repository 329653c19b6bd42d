package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/csikubelet"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/pkg/engine"
)

// kubelet plays node name's kubelet for prewarm's volumes (csikubelet) against its agent.
type kubelet struct {
	t *testing.T
	k *csikubelet.Kubelet
}

func (e *weightsEnv) kubeletDir(name string) string {
	return filepath.Join(e.nodes, name, "var/lib/kubelet")
}

func (e *weightsEnv) kubelet(name string) *kubelet {
	e.t.Helper()
	k, err := csikubelet.New(e.kubeletDir(name))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { k.Close() })
	return &kubelet{t: e.t, k: k}
}

// csiArgs are the agent flags that serve the node plugin under the node's kubelet directory.
func (e *weightsEnv) csiArgs(name string) []string {
	return csikubelet.AgentArgs(e.kubeletDir(name), 5*time.Second)
}

func (k *kubelet) target(p *corev1.Pod) string { return k.k.Target(p, "model-weights") }

func (k *kubelet) cleanup(p *corev1.Pod) {
	target := k.target(p)
	k.t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
}

// publish asks for p's model volume once.
func (k *kubelet) publish(p *corev1.Pod) error {
	k.cleanup(p)
	_, err := k.k.Publish(context.Background(), p)
	return err
}

// mount publishes p's volume, calling again while the plugin says to wait; it returns the
// answers it got.
func (k *kubelet) mount(p *corev1.Pod) ([]codes.Code, error) {
	k.cleanup(p)
	_, answers, err := k.k.Mount(context.Background(), p, 2*time.Minute)
	return answers, err
}

func (k *kubelet) unmount(p *corev1.Pod) error {
	return k.k.Unmount(context.Background(), p, k.target(p))
}

// The CSI node plugin, in the agent binary, on kwok nodes, driven over its socket as the
// kubelet drives it: a pod of the cache's namespace mounts exactly its model, read-only; a pod
// of another namespace is refused; three pods on a node that was never a target share one
// download (the node's agent is asked for the cache through their demand and fetches it once,
// measured at S3), are all served once it is verified, and the node is labelled warm; when the
// pods go, so does the cache.
func TestCSINodePluginEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the node plugin mounts: root only")
	}
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	counted, err := shaper.Start(s3srv.Endpoint, shaper.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = counted.Close() })
	// csi-warm reads its caches back every 3 s: a byte flipped on its disk is caught (below).
	e.addNode("csi-warm", "ml.g5.24xlarge", s3srv.Endpoint, append(e.csiArgs("csi-warm"), "--verify-interval=3s")...)
	// Sharing off on csi-cold: its S3 reads are what shows the pods sharing one download.
	e.addNode("csi-cold", "ml.g5.xlarge", counted.URL, append(e.csiArgs("csi-cold"), noSharing)...)
	e.startController("--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect", "--leader-election-namespace=default", "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--gate-timeout=3m", "--agent-image=prewarm/agent:e2e")
	for _, ns := range []string{"team-a", "team-b"} {
		if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	iec := builders.MakeInferenceEndpointConfig("team-a", "csi-model").Location(prefix).Obj()
	if err := e.c.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	cache := e.waitCacheIn("team-a", "csi-model-cache", 1)
	uid := string(cache.UID)
	dep := &appsv1.Deployment{}
	var served *corev1.Pod
	e.eventually(60*time.Second, "the parent's pod running on csi-warm", func() (bool, string) {
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "csi-model"}, dep); err != nil {
			return false, err.Error()
		}
		pods := &corev1.PodList{}
		if err := e.c.List(ctx, pods, client.InNamespace("team-a"), client.MatchingLabels{"prewarm.io/endpoint-uid": string(iec.UID)}); err != nil {
			return false, err.Error()
		}
		for i, p := range pods.Items {
			if p.Spec.NodeName == "csi-warm" && p.Status.Phase == corev1.PodRunning {
				served = &pods.Items[i]
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items))
	})
	warm := e.kubelet("csi-warm")

	t.Run("a pod of the cache's namespace mounts its model, read-only, and nothing else", func(t *testing.T) {
		if err := warm.publish(served); err != nil {
			t.Fatal(err)
		}
		target := warm.target(served)
		assertTree(t, target, model)
		if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("writing into the volume: %v, want EROFS", err)
		}
		if err := warm.unmount(served); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("target after unpublish: %v", err)
		}
	})

	t.Run("a byte flipped under a mounted pod is caught at the verify interval and repaired, and the pod is told", func(t *testing.T) {
		if err := warm.publish(served); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := warm.unmount(served); err != nil {
				t.Error(err)
			}
		}()
		const shard = "model-00002-of-00003.safetensors"
		f, err := os.OpenFile(filepath.Join(e.cacheDir("csi-warm", uid), shard), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		// In place, the size kept: what a failing disk or a stray write does.
		if _, err := f.WriteAt([]byte{model[shard][4321] ^ 0x80}, 4321); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		e.waitEvent("team-a", served.Name, "CacheDamaged")
		e.eventually(30*time.Second, "the shard repaired, as the mounted pod sees it", func() (bool, string) {
			b, err := os.ReadFile(filepath.Join(warm.target(served), shard))
			return err == nil && bytes.Equal(b, model[shard]), fmt.Sprint(err)
		})
		e.eventually(30*time.Second, "csi-warm Ready again", func() (bool, string) {
			m := &inferencev1.ModelDataCacheConfig{}
			err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "csi-model-cache"}, m)
			return err == nil && m.Status.ReadyNodes == 1, fmt.Sprint(m.Status.Nodes, err)
		})
	})

	t.Run("a copy replaced under a mounted pod is kept for the pod until it unmounts", func(t *testing.T) {
		if err := warm.publish(served); err != nil {
			t.Fatal(err)
		}
		target := warm.target(served)
		var mounted unix.Stat_t
		if err := unix.Stat(target, &mounted); err != nil {
			t.Fatal(err)
		}
		// The copy's manifest unreadable: the node fetches the whole model again, into a new
		// directory.
		if err := os.WriteFile(filepath.Join(e.cacheDir("csi-warm", uid), engine.ManifestName), []byte("{garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "csi-warm Ready again on a new copy", func() (bool, string) {
			var now unix.Stat_t
			err := unix.Stat(e.cacheDir("csi-warm", uid), &now)
			m := &inferencev1.ModelDataCacheConfig{}
			if err == nil {
				err = e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "csi-model-cache"}, m)
			}
			return err == nil && now.Ino != mounted.Ino && m.Status.ReadyNodes == 1, fmt.Sprint(m.Status.Nodes, err)
		})
		assertTree(t, e.cacheDir("csi-warm", uid), model)
		// The pod still reads every file of the copy it mounted.
		for p, data := range model {
			if got, err := os.ReadFile(filepath.Join(target, p)); err != nil || !bytes.Equal(got, data) {
				t.Errorf("the mounted pod's %s: %v (read %d bytes); want the model's file", p, err, len(got))
			}
		}
		aside := func() []string {
			entries, _ := os.ReadDir(filepath.Dir(e.cacheDir("csi-warm", uid)))
			var names []string
			for _, x := range entries {
				if strings.Contains(x.Name(), "set-aside") {
					names = append(names, x.Name())
				}
			}
			return names
		}
		if got := aside(); len(got) != 1 {
			t.Errorf("copies set aside while the pod mounts one: %v, want 1", got)
		}
		if err := warm.unmount(served); err != nil {
			t.Fatal(err)
		}
		e.eventually(30*time.Second, "the copy set aside removed once unmounted", func() (bool, string) {
			got := aside()
			return len(got) == 0, fmt.Sprint(got)
		})
	})

	t.Run("a pod of another namespace is refused, with an event", func(t *testing.T) {
		p := csiPod("team-b", "intruder", "csi-warm", dep)
		if err := e.c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := warm.publish(p); status.Code(err) != codes.PermissionDenied {
			t.Errorf("publish for team-b: %v, want PermissionDenied", err)
		}
		e.waitEvent("team-b", "intruder", "CacheRefused")
		if entries, _ := os.ReadDir(warm.target(p)); len(entries) != 0 {
			t.Errorf("the refused pod's target shows %v", entries)
		}
	})

	t.Run("three pods on a node that was no target share one download", func(t *testing.T) {
		before := counted.Served.Load()
		var pods []*corev1.Pod
		for i := range 3 {
			p := csiPod("team-a", fmt.Sprintf("cold-%d", i), "csi-cold", dep)
			if err := e.c.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			pods = append(pods, p)
		}
		cold := e.kubelet("csi-cold")
		var wg sync.WaitGroup
		errs := make([]error, len(pods))
		answers := make([][]codes.Code, len(pods))
		for i, p := range pods {
			wg.Go(func() { answers[i], errs[i] = cold.mount(p) })
		}
		wg.Wait()
		for i, p := range pods {
			if errs[i] != nil {
				t.Fatalf("%s: %v (answers %v)", p.Name, errs[i], answers[i])
			}
			assertTree(t, cold.target(p), model)
		}
		got := counted.Served.Load() - before
		if got < total || float64(got) > 1.05*float64(total) {
			t.Errorf("S3 served %d bytes for three pods; want one model's %d", got, total)
		}
		t.Logf("three pods on csi-cold: %d bytes from S3 for a %d-byte model; answers %v", got, total, answers)
		e.eventually(30*time.Second, "csi-cold labelled warm", func() (bool, string) {
			got := e.labelled(inferencev1.WeightsCacheReadyLabel(uid))
			return slices.Contains(got, "csi-cold"), fmt.Sprintf("label on %v", got)
		})
		e.waitEvent("team-a", "cold-0", "CacheMounted")

		// The pods go: the node was a target only for them. cold-0's object goes while its
		// volume is still mounted (what the agent's pod list says lags what the node has):
		// the cache stays until the volume is unmounted.
		for _, p := range pods[1:] {
			if err := cold.unmount(p); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range pods {
			if err := e.c.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		agentLog := e.agents["csi-cold"]
		e.eventually(60*time.Second, "csi-cold keeping the cache its unlisted pod mounts", func() (bool, string) {
			_, err := os.Stat(e.cacheDir("csi-cold", uid))
			return strings.Contains(agentLog.LogTail(20000), "still mounted"), fmt.Sprintf("no such line in the agent's log; the cache's directory: %v", err)
		})
		if _, err := os.Stat(e.cacheDir("csi-cold", uid)); err != nil {
			t.Errorf("the cache a mounted volume uses was removed: %v", err)
		}
		if err := cold.unmount(pods[0]); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "the cache gone from csi-cold", func() (bool, string) {
			_, err := os.Stat(e.cacheDir("csi-cold", uid))
			return os.IsNotExist(err), fmt.Sprint(err)
		})
	})
}

// waitEvent waits for an event of this reason about the pod.
func (e *weightsEnv) waitEvent(ns, pod, reason string) {
	e.t.Helper()
	e.eventually(30*time.Second, reason+" event on "+ns+"/"+pod, func() (bool, string) {
		got := e.events(ns, "Pod", pod)
		return slices.Contains(got, reason), fmt.Sprint(got)
	})
}

// csiPod is a pod of the parent's template, in namespace ns, on node.
func csiPod(ns, name, node string, dep *appsv1.Deployment) *corev1.Pod {
	tmpl := dep.Spec.Template.DeepCopy()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: tmpl.Spec.Containers, Volumes: tmpl.Spec.Volumes},
	}
}

// waitCacheIn waits until the cache in namespace ns has n Ready nodes.
func (e *weightsEnv) waitCacheIn(ns, name string, n int32) *inferencev1.ModelDataCacheConfig {
	e.t.Helper()
	m := &inferencev1.ModelDataCacheConfig{}
	e.eventually(2*time.Minute, "cache "+name+" Ready", func() (bool, string) {
		if err := e.c.Get(e.ctx, types.NamespacedName{Namespace: ns, Name: name}, m); err != nil {
			return false, err.Error()
		}
		return m.Status.ReadyNodes == n, fmt.Sprintf("%+v", m.Status)
	})
	return m
}
