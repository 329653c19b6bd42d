package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// byNamePod is a pod as a user, or a serving stack other than prewarm, writes one: its own
// container, and prewarm's CSI volume naming the cache by the ModelWeightsCacheConfig's name.
func byNamePod(ns, name, node, cache string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "llama-server"}},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "server", Image: "vllm/vllm-openai:v0.6.3",
				Args:         []string{"--model", "/models/llama"},
				VolumeMounts: []corev1.VolumeMount{{Name: "model-weights", MountPath: "/models/llama", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "model-weights", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCache: cache},
			}}}},
		},
	}
}

// eventNote is the note of the newest event of this reason about the pod ("": none).
func (e *weightsEnv) eventNote(ns, pod, reason string) string {
	list := &eventsv1.EventList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(ns)); err != nil {
		e.t.Fatal(err)
	}
	note := ""
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == pod && ev.Reason == reason {
			note = ev.Note
		}
	}
	return note
}

// A pod written by hand, not by prewarm, mounts the model a standalone ModelWeightsCacheConfig
// warms by the cache's name alone (volumeAttributes {cache: llama-warm}), with the same answers
// as a pod of prewarm's own that names the cache's UID: on a node the cache warmed, at once; on a
// node its nodeSelector leaves out, once the node's agent has reported the pod's demand and the
// controller (seeing the pod there itself) has made the node a target: the node downloads the
// model, is labelled warm, and lets it go when the pod goes. A pod of another namespace naming
// the cache is refused, with a Warning saying its namespace has no cache of that name; the name
// is looked up only in the namespace the kubelet gives as the pod's.
func TestMountByName(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the node plugin mounts: root only")
	}
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	e.addNode("named-warm", "g5.24xlarge", s3srv.Endpoint, e.csiArgs("named-warm")...)
	e.addNode("named-cold", "m5.xlarge", s3srv.Endpoint, e.csiArgs("named-cold")...)
	e.startTeamController()
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}}); err != nil {
		t.Fatal(err)
	}
	e.kubectl(llamaWarm, "apply", "-f", "-")
	e.kubectl("", "wait", "-n", "team-a", "--for=jsonpath={.status.state}=Ready", "--timeout=4m", "modelweightscacheconfig/llama-warm")
	mw := &inferencev1.ModelWeightsCacheConfig{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "llama-warm"}, mw); err != nil {
		t.Fatal(err)
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: mw.Status.CacheName}, cache); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	if got := e.entries("named-cold"); len(got) != 0 {
		t.Fatalf("named-cold, which the nodeSelector leaves out, holds %v before any pod asks", got)
	}
	create := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		if err := e.c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("on a warm node, at once", func(t *testing.T) {
		warm := e.kubelet("named-warm")
		p := create(byNamePod("team-a", "server-warm", "named-warm", "llama-warm"))
		answers, err := warm.mount(p)
		if err != nil || !slices.Equal(answers, []codes.Code{codes.OK}) {
			t.Fatalf("mount by name on the warm node: %v (answers %v), want the first answer OK", err, answers)
		}
		target := warm.target(p)
		assertTree(t, target, model)
		if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("writing into the volume: %v, want EROFS", err)
		}
		e.waitEvent("team-a", p.Name, "CacheMounted")
		if note := e.eventNote("team-a", p.Name, "CacheMounted"); !strings.Contains(note, "llama-warm ("+uid+")") {
			t.Errorf("CacheMounted says %q, want the cache's name and UID", note)
		}
		if err := warm.unmount(p); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a pod of another namespace naming the cache is refused", func(t *testing.T) {
		warm := e.kubelet("named-warm")
		p := create(byNamePod("team-b", "intruder", "named-warm", "llama-warm"))
		err := warm.publish(p)
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "namespace team-b has no ModelWeightsCacheConfig llama-warm") {
			t.Errorf("publish for team-b: %v, want NotFound saying team-b has no such cache", err)
		}
		if entries, _ := os.ReadDir(warm.target(p)); len(entries) != 0 {
			t.Errorf("the refused pod's target shows %v", entries)
		}
		e.waitEvent("team-b", "intruder", "CacheRefused")
		if note := e.eventNote("team-b", "intruder", "CacheRefused"); !strings.Contains(note, "mounts a cache by name only from its own namespace") {
			t.Errorf("CacheRefused says %q", note)
		}
	})

	t.Run("on a node the cache does not select, the pod's demand makes it a target", func(t *testing.T) {
		cold := e.kubelet("named-cold")
		p := create(byNamePod("team-a", "server-cold", "named-cold", "llama-warm"))
		answers, err := cold.mount(p)
		if err != nil {
			t.Fatalf("mount by name on the cold node: %v (answers %v)", err, answers)
		}
		assertTree(t, cold.target(p), model)
		// It waited: the node had not been asked for the cache when the pod first asked (the
		// agent's wait within one call may hide it from the answers, not from the events).
		e.waitEvent("team-a", p.Name, "CacheWaiting")
		e.eventually(30*time.Second, "named-cold labelled warm", func() (bool, string) {
			got := e.labelled(inferencev1.WeightsCacheReadyLabel(uid))
			return slices.Contains(got, "named-cold"), fmt.Sprintf("label on %v", got)
		})
		// The pod goes: the node was a target only for it, and lets the cache go.
		if err := cold.unmount(p); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "the cache gone from named-cold", func() (bool, string) {
			_, err := os.Stat(e.cacheDir("named-cold", uid))
			return os.IsNotExist(err), fmt.Sprint(err)
		})
		if _, err := os.Stat(e.cacheDir("named-warm", uid)); err != nil {
			t.Errorf("the selected node's copy: %v", err)
		}
	})
}
