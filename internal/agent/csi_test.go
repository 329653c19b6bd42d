package agent_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
)

// What the node plugin may mount, decided by the agent against a real API server: a Ready cache
// for pods of its namespace, never for another namespace's; a cache the node was not asked for
// is refused while the agent reports the pods' demand; a cache the node keeps without
// downloading (not a target) is downloaded at once when a pod waits for it, and mounted once
// verified; refusals and waits are events on the pod.
func TestModelToMount(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	writeFiles(t, filepath.Join(host, "fsx", "model"), map[string][]byte{"config.json": []byte(`{}`), "w.bin": gen.Bytes(3, 1<<20)})
	const (
		uidA        = "aaaaaaaa-1111-4111-8111-111111111111"
		uidRetained = "bbbbbbbb-2222-4222-8222-222222222222"
		uidElse     = "cccccccc-3333-4333-8333-333333333333"
	)
	if err := os.MkdirAll(filepath.Join(host, root), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"a", "b"} {
		if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	askNode(t, ctx, api, "node-1",
		prewarmv1alpha1.CacheRequest{UID: uidA, Namespace: "a", Name: "m-cache", Root: root, Source: fsxSource("model")},
		// Not a current target: nothing is downloaded until a pod asks.
		prewarmv1alpha1.CacheRequest{UID: uidRetained, Namespace: "a", Name: "r-cache", Root: root, Source: fsxSource("model"), RetainedSince: time.Now().UTC().Format(time.RFC3339)},
	)
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root), HostPrefix: host, MountWait: 300 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, EventInterval: time.Hour,
	})
	status_, wait := watchStatus(t, ctx, api, "node-1", uidA, uidRetained)
	wait("cache a Ready, the retained one not downloaded", func() bool {
		st := status_(uidRetained)
		return status_(uidA).State == inferencev1.CacheReady && st.Reason == prewarmv1alpha1.ReasonNotTarget
	})
	pod := func(ns, name string) agent.MountRequest {
		return agent.MountRequest{PodNamespace: ns, PodName: name, PodUID: types.UID("uid-" + ns + "-" + name)}
	}

	req := pod("a", "worker")
	req.CacheUID = uidA
	dir, err := a.ModelToMount(ctx, req)
	if want := filepath.Join(host, root, "prewarm", uidA, "model"); err != nil || dir != want {
		t.Fatalf("pod of namespace a: %q %v, want %s", dir, err, want)
	}

	other := pod("b", "intruder")
	other.CacheUID = uidA
	if _, err := a.ModelToMount(ctx, other); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not a cache of namespace b") || strings.Contains(err.Error(), "namespace a") {
		t.Errorf("pod of namespace b: %v, want PermissionDenied that does not name the cache's namespace", err)
	}
	unknown := pod("a", "lost")
	unknown.CacheUID = uidElse
	if _, err := a.ModelToMount(ctx, unknown); status.Code(err) != codes.NotFound {
		t.Errorf("a cache the node was not asked for: %v, want NotFound", err)
	}
	bad := pod("a", "bad")
	bad.CacheUID = "../../etc"
	if _, err := a.ModelToMount(ctx, bad); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a volume attribute that is not a UID: %v, want InvalidArgument", err)
	}

	// Fill on a miss: the retained cache, which the node would not download, is fetched because
	// a pod waits; the first answers say it is not ready, then the model is there.
	fill := pod("a", "cold")
	fill.CacheUID = uidRetained
	var answers []codes.Code
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		dir, err = a.ModelToMount(ctx, fill)
		answers = append(answers, status.Code(err))
		if err != nil && status.Code(err) != codes.Unavailable {
			return false, err
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("fill on a miss: %v (answers %v)", err, answers)
	}
	if _, err := os.Stat(filepath.Join(dir, "w.bin")); err != nil {
		t.Errorf("filled model: %v", err)
	}
	if st := status_(uidRetained); st.State != inferencev1.CacheReady {
		wait("the filled cache Ready in the status", func() bool { return status_(uidRetained).State == inferencev1.CacheReady })
	}

	// The pods' demand: pods on the node naming a cache through prewarm's volume, by namespace.
	for _, p := range []struct{ ns, name, uid string }{{"a", "p1", uidElse}, {"a", "p2", uidElse}, {"b", "p3", uidA}} {
		if err := api.Client.Create(ctx, csiPod(p.ns, p.name, "node-1", p.uid)); err != nil {
			t.Fatal(err)
		}
	}
	want := []prewarmv1alpha1.CacheDemand{{UID: uidA, Namespace: "b", Pods: 1}, {UID: uidElse, Namespace: "a", Pods: 2}}
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		got := &prewarmv1alpha1.NodeCache{}
		if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
			return false, err
		}
		return slices.Equal(got.Status.Demands, want), nil
	})
	if err != nil {
		t.Errorf("demands: %v, want %+v", err, want)
	}

	// Events on the pods say why.
	for _, x := range []struct{ ns, pod, reason, contains string }{
		{"b", "intruder", agent.EventCacheRefused, "is not a cache of namespace b"},
		{"a", "lost", agent.EventCacheWaiting, "has not been asked"},
		{"a", "cold", agent.EventCacheFilling, "waiting for node node-1 to hold cache"},
	} {
		err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
			list := &eventsv1.EventList{}
			if err := api.Client.List(ctx, list, client.InNamespace(x.ns)); err != nil {
				return false, err
			}
			return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
				return e.Regarding.Name == x.pod && e.Reason == x.reason && strings.Contains(e.Note, x.contains)
			}), nil
		})
		if err != nil {
			t.Errorf("event %s on %s/%s: %v", x.reason, x.ns, x.pod, err)
		}
	}
}

func csiPod(ns, name, node, uid string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "x"}},
			Volumes: []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: uid},
			}}}},
		},
	}
}

// A gated source's cache is mounted only while the origin accepts the namespace's own token:
// with the granted token, the cache is downloaded and mounted; once the namespace's token is
// replaced by one the Hub refuses, the bytes stay on the node but no new mount is allowed.
func TestMountNeedsTheNamespacesOwnValidToken(t *testing.T) {
	ctx, api := startAPI(t)
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	if err := os.MkdirAll(filepath.Join(host, root), 0o755); err != nil {
		t.Fatal(err)
	}
	hub := hubfixture.Start()
	t.Cleanup(hub.Close)
	const repo, uid = "org/gated", "dddddddd-4444-4444-8444-444444444444"
	commit := hub.AddCommit(repo, "main", map[string][]byte{"config.json": []byte(`{}`), "model.safetensors": gen.Bytes(5, 1<<20)})
	hub.SetGated(repo, "hf_granted")
	cfg := testConfig(root)
	cfg.HuggingFace.Endpoint = hub.URL
	nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if err := api.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: cfg, HostPrefix: host, MountWait: 300 * time.Millisecond, EventInterval: time.Hour,
		StatusInterval: 100 * time.Millisecond, RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	// The agent publishes its key; the controller's part (sealing the namespace's token to it)
	// is played here. A new token is a new version of the Secret (the digest the agent keys its
	// checks by is the Secret's version).
	ask := func(token string) {
		var sealed *prewarmv1alpha1.SealedCredentials
		t.Helper()
		err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
			got := &prewarmv1alpha1.NodeCache{}
			if err := api.Client.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
				return false, err
			}
			if got.Status.CredentialsKey == "" {
				return false, nil
			}
			if token != "" {
				var err error
				if sealed, err = credentials.Seal(got.Status.CredentialsKey, "node-1", uid, credentials.Credentials{HFToken: token}, "secret-version-of-"+token, nil); err != nil {
					return false, err
				}
			}
			got.Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: uid, Namespace: "a", Name: "gated-cache", Root: root, Credentials: sealed,
				Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceHuggingFace, RepoID: repo, Revision: commit}}}
			return true, api.Client.Update(ctx, got)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ask("hf_granted")
	status_, wait := watchStatus(t, ctx, api, "node-1", uid)
	wait("the gated cache Ready with the granted token", func() bool { return status_(uid).State == inferencev1.CacheReady })
	req := agent.MountRequest{CacheUID: uid, PodNamespace: "a", PodName: "worker", PodUID: "w-1"}
	if _, err := a.ModelToMount(ctx, req); err != nil {
		t.Fatalf("mount with the granted token: %v", err)
	}

	ask("hf_revoked")
	err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		_, err := a.ModelToMount(ctx, req)
		return status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "refused namespace a's own credentials"), nil
	})
	if err != nil {
		_, last := a.ModelToMount(ctx, req)
		t.Fatalf("mount after the namespace's token was replaced by one the Hub refuses: %v; want PermissionDenied", last)
	}
	if _, err := os.Stat(filepath.Join(host, root, "prewarm", uid, "model", "model.safetensors")); err != nil {
		t.Errorf("the cache's files: %v; want them kept (only the mount is refused)", err)
	}
	// No token at all (the controller sends none while the namespace's Secret does not work):
	// the gated repository refuses anonymous reads, so no mount either.
	ask("")
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		_, err := a.ModelToMount(ctx, req)
		return status.Code(err) == codes.PermissionDenied, nil
	})
	if err != nil {
		_, last := a.ModelToMount(ctx, req)
		t.Fatalf("mount of a gated cache without any token: %v; want PermissionDenied", last)
	}
}
