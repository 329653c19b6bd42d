package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

const (
	restrictedNS = "tenant-restricted"
	otherNS      = "tenant-other"
	gatedNS      = "tenant-gated"
)

// restrictedTenant serves the seed's model to a namespace that enforces the restricted Pod
// Security level: its parent reaches DeploymentComplete, its pods' model servers verify the
// model through the read-only CSI volume and see nothing else. It returns the parent.
func (e *env) restrictedTenant(t *testing.T, ctx context.Context) *inferencev1.InferenceEndpointConfig {
	t.Helper()
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: restrictedNS, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: otherNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: gatedNS}},
	} {
		if err := e.C.Client.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	iec := e.seedCopy(t, ctx, restrictedNS, "tenant-model")
	if err := e.C.Client.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	e.waitComplete(t, ctx, client.ObjectKeyFromObject(iec), iec, e.Model)
	return iec
}

// intruderRefused asks, from a pod of another namespace, for the restricted tenant's cache on a
// node that holds it: the agent refuses, saying why, and the pod never starts.
func (e *env) intruderRefused(t *testing.T, ctx context.Context, cache *inferencev1.ModelDataCacheConfig) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: "intruder"},
		Spec: corev1.PodSpec{
			NodeName: warm1, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "c", Image: serverImage, Command: []string{"/modelserver", "--idle"},
				VolumeMounts: []corev1.VolumeMount{{Name: "model", MountPath: "/opt/ml/model", ReadOnly: true}}}},
			Volumes: []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: string(cache.UID)},
			}}}},
		},
	}
	if err := e.C.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	note := e.waitEvent(t, ctx, p, agent.EventCacheRefused, "is not a cache of namespace "+otherNS)
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	if realseed.ContainerRunning(p) {
		t.Errorf("%s/%s runs with another namespace's cache", p.Namespace, p.Name)
	}
	if strings.Contains(note, restrictedNS) {
		t.Errorf("the refusal names the cache's namespace to the intruder: %s", note)
	}
	t.Logf("pod of %s asking for %s's cache on %s: %s", otherNS, restrictedNS, warm1, note)
	e.deletePod(t, ctx, p)
}

// gatedRevoked serves the gated model to a namespace with its own granted token, then replaces
// that token with one the Hub refuses: the cache stays on the nodes, but a new pod of the
// namespace is refused its model volume, saying why.
func (e *env) gatedRevoked(t *testing.T, ctx context.Context) {
	t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: gatedNS, Name: "hf-token"}, Data: map[string][]byte{"token": []byte(realseed.HubToken)}}
	if err := e.C.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	iec := e.seedCopy(t, ctx, gatedNS, "gated-model")
	iec.Spec.Worker.Image = realseed.CatalogImage
	iec.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{
		ModelSourceType: inferencev1.ModelSourceHuggingFace,
		HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: realseed.GatedRepo, CommitSHA: e.HubCommit,
			TokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}},
	}
	if err := e.C.Client.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(iec)
	e.waitComplete(t, ctx, key, iec, e.JSModel)
	cache := e.weightsCache(t, ctx, key)
	uid := string(cache.UID)
	sealed := func() string {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := e.C.Client.Get(ctx, client.ObjectKey{Name: warm1}, nc); err != nil {
			return err.Error()
		}
		for _, r := range nc.Spec.Caches {
			if r.UID == uid && r.Credentials != nil {
				return r.Credentials.Digest
			}
			if r.UID == uid {
				return "none"
			}
		}
		return "not asked"
	}
	granted := sealed()

	secret.Data["token"] = []byte("hf_revoked")
	if err := e.C.Client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	err := testutil.Until(ctx, 2*time.Minute, func() error {
		if now := sealed(); now == granted || now == "not asked" {
			return fmt.Errorf("%s's request for cache %s: credentials %s, want the controller to have taken in the new token", warm1, uid, now)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p := realseed.ProbePod(e.deployment(t, ctx, key), "after-revocation", warm1)
	if err := e.C.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	note := e.waitEvent(t, ctx, p, agent.EventCacheRefused, "token")
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	if realseed.ContainerRunning(p) {
		t.Errorf("%s/%s runs after its namespace's token was revoked", p.Namespace, p.Name)
	}
	if _, err := os.Stat(e.C.Node(warm1).HostPath(prewarmv1alpha1.ModelDir(cacheRoot, uid))); err != nil {
		t.Errorf("the cache's files on %s: %v; want them kept", warm1, err)
	}
	t.Logf("a new pod of %s after its token was revoked: %s", gatedNS, note)
	e.deletePod(t, ctx, p)
	if err := e.C.Client.Delete(ctx, iec); err != nil {
		t.Fatal(err)
	}
}

// agentKilledDuringFill starts a pod on the cold node and deletes the node's agent pod while it
// downloads the cache for it: the replacement resumes, the pod starts once the cache is
// verified, with the whole model, and nothing partial is left beside the cache.
func (e *env) agentKilledDuringFill(t *testing.T, ctx context.Context, key client.ObjectKey, cache *inferencev1.ModelDataCacheConfig) {
	t.Helper()
	if err := e.C.Node(cold).Throttle(32 << 20); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.C.Node(cold).Throttle(0) }()
	p := realseed.ProbePod(e.deployment(t, ctx, key), "fill-killed", cold)
	if err := e.C.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		st, err := e.nodeCache(ctx, cold, uid)
		if err != nil {
			return err
		}
		if st == nil || st.BytesTotal == 0 || st.BytesDone*4 < st.BytesTotal {
			return fmt.Errorf("%s: %+v, want a quarter downloaded", cold, st)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, key.Namespace))
	}
	old, err := e.agentPod(ctx, cold)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	if realseed.ContainerRunning(p) {
		t.Fatalf("%s runs before its cache is whole", p.Name)
	}
	if err := e.C.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent pod %s on %s deleted during the fill", old.Name, cold)
	err = testutil.Until(ctx, 5*time.Minute, func() error {
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		if !realseed.PodReady(p) {
			return fmt.Errorf("%s is not Ready", p.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, key.Namespace))
	}
	body := e.health(t, ctx, p)
	if !strings.Contains(body, fmt.Sprintf("%d files, %d bytes verified", len(e.Model), realseed.ModelBytes(e.Model))) || !strings.Contains(body, onlyTheModel) {
		t.Errorf("after the agent's replacement: /health %q; want the whole model verified, nothing else", body)
	}
	// The cache's directory holds the published model and nothing partial.
	entries, err := os.ReadDir(e.C.Node(cold).HostPath(prewarmv1alpha1.CacheDir(cacheRoot, uid)))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != prewarmv1alpha1.ModelSubdir {
		t.Errorf("the cache's directory holds %v, want only %s", entries, prewarmv1alpha1.ModelSubdir)
	}
	t.Logf("after the agent's replacement: %s", strings.TrimSpace(body))
	e.deletePod(t, ctx, p)
	if err := e.WaitCacheGone(ctx, cold, uid); err != nil {
		t.Fatal(err)
	}
}

// deletedWhileInUse deletes the restricted tenant's parent while a pod of the tenant still runs
// on a node with its cache: the cache's files stay there, mounted, until that pod goes; then
// they, and the cache, go.
func (e *env) deletedWhileInUse(t *testing.T, ctx context.Context, iec *inferencev1.InferenceEndpointConfig, cache *inferencev1.ModelDataCacheConfig) {
	t.Helper()
	p := realseed.ProbePod(e.deployment(t, ctx, client.ObjectKeyFromObject(iec)), "still-serving", warm1)
	if _, err := e.TimePod(ctx, p, realseed.PodReady); err != nil {
		t.Fatal(err)
	}
	uid := string(cache.UID)
	dir := e.C.Node(warm1).HostPath(prewarmv1alpha1.ModelDir(cacheRoot, uid))
	if err := e.C.Client.Delete(ctx, iec); err != nil {
		t.Fatal(err)
	}
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		st, err := e.nodeCache(ctx, warm1, uid)
		if err != nil {
			return err
		}
		if st == nil || st.Reason != prewarmv1alpha1.ReasonInUse {
			return fmt.Errorf("%s reports %+v for the deleted cache, want InUse", warm1, st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Still there, and still served: the files on the disk, the pod Ready and reading them.
	if _, err := os.Stat(filepath.Join(dir, e.Model[0].Path)); err != nil {
		t.Errorf("the cache's files went while a pod uses them: %v", err)
	}
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil || !realseed.PodReady(p) {
		t.Errorf("the pod using the deleted cache: %v, Ready %v", err, realseed.PodReady(p))
	}
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(cache), &inferencev1.ModelDataCacheConfig{}); err != nil {
		t.Errorf("the cache object went while a node keeps its files: %v", err)
	}
	t.Logf("parent deleted; %s keeps cache %s while %s/%s uses it", warm1, uid, p.Namespace, p.Name)
	e.deletePod(t, ctx, p)
	err = testutil.Until(ctx, 3*time.Minute, func() error {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("%s still on %s's disk (%w)", dir, warm1, err)
		}
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(cache), &inferencev1.ModelDataCacheConfig{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the cache object is still there (%w)", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the pod gone, the cache's files and object went")
}

// seedCopy is the seed's InferenceEndpointConfig, as another parent ns/name with one replica.
func (e *env) seedCopy(t *testing.T, ctx context.Context, ns, name string) *inferencev1.InferenceEndpointConfig {
	t.Helper()
	seed := &inferencev1.InferenceEndpointConfig{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "example-model"}, seed); err != nil {
		t.Fatal(err)
	}
	iec := &inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *seed.Spec.DeepCopy()}
	iec.Spec.Replicas = ptr.To[int32](1)
	return iec
}

// waitEvent waits for an event of the agent on the pod, of this reason, whose note contains
// text, and returns the note.
func (e *env) waitEvent(t *testing.T, ctx context.Context, p *corev1.Pod, reason, text string) string {
	t.Helper()
	var note string
	err := testutil.Until(ctx, 4*time.Minute, func() error {
		var list eventsv1.EventList
		if err := e.C.Client.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
			return err
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.Name != p.Name {
				continue
			}
			if ev.Reason == reason && strings.Contains(ev.Note, text) {
				note = ev.Note
				return nil
			}
			seen = append(seen, ev.Reason+": "+ev.Note)
		}
		return fmt.Errorf("no %s event with %q on %s/%s; events: %v", reason, text, p.Namespace, p.Name, seen)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, p.Namespace))
	}
	return note
}

func (e *env) deletePod(t *testing.T, ctx context.Context, p *corev1.Pod) {
	t.Helper()
	if err := e.DeletePods(ctx, p.Namespace, p.Name); err != nil {
		t.Fatal(err)
	}
}
