package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/controller/secrets"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/harness"
)

// registryCredential is the docker config of namespace ns's Secret name: each its own.
func registryCredential(ns, name string) string {
	return `{"auths":{"registry.example":{"auth":"` + base64.StdEncoding.EncodeToString([]byte(ns+"/"+name+":p")) + `"}}}`
}

// pullSecret is a docker config Secret of namespace ns.
func pullSecret(ns, name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(registryCredential(ns, name))}}
}

// pullWith creates the Secrets in namespace ns and makes its default service account pull with
// the Secrets named (the test API server has no service account controller: it is made here).
func pullWith(t *testing.T, ctx context.Context, ns string, create []*corev1.Secret, names ...string) {
	t.Helper()
	c := server.Client
	for _, s := range create {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	sa := &corev1.ServiceAccount{}
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "default"}, sa)
	if apierrors.IsNotFound(err) {
		sa = &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
		err = c.Create(ctx, sa)
	}
	if err != nil {
		t.Fatal(err)
	}
	sa.ImagePullSecrets = nil
	for _, n := range names {
		sa.ImagePullSecrets = append(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
	}
	if err := c.Update(ctx, sa); err != nil {
		t.Fatal(err)
	}
}

// imageParent creates an InferenceEndpointConfig ns/name serving image with an image cache and
// no weights cache, and reconciles it twice (the finalizer, then the image cache).
func (rc *reconcilers) imageParent(t *testing.T, ctx context.Context, ns, name, image string) *inferencev1.InferenceEndpointConfig {
	t.Helper()
	p := builders.MakeInferenceEndpointConfig(ns, name).InstanceType("ml.iso-suite.xlarge").Obj()
	p.Spec.Worker.Image = image
	p.Spec.ModelCacheConfig.WeightsCache.Enabled = false
	if err := server.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	rc.reconcileParent(t, ctx, p)
	return p
}

// reconcileParent reconciles parent p twice and reads it back.
func (rc *reconcilers) reconcileParent(t *testing.T, ctx context.Context, p *inferencev1.InferenceEndpointConfig) {
	t.Helper()
	for range 2 {
		if _, err := rc.ep.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
}

// imageCachesOf returns the image caches that reference parent p.
func (rc *reconcilers) imageCachesOf(t *testing.T, ctx context.Context, p client.Object) []inferencev1.InferenceImageCache {
	t.Helper()
	list := &inferencev1.InferenceImageCacheList{}
	if err := server.Client.List(ctx, list, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil {
		t.Fatal(err)
	}
	var out []inferencev1.InferenceImageCache
	for _, c := range list.Items {
		if slices.ContainsFunc(c.Spec.ParentReferences, func(r inferencev1.ParentReference) bool { return r.UID == string(p.GetUID()) }) {
			out = append(out, c)
		}
	}
	return out
}

// imageCacheOf returns the one image cache that references parent p.
func (rc *reconcilers) imageCacheOf(t *testing.T, ctx context.Context, p client.Object) *inferencev1.InferenceImageCache {
	t.Helper()
	caches := rc.imageCachesOf(t, ctx, p)
	if len(caches) != 1 {
		t.Fatalf("%s/%s is in %d image caches, want 1", p.GetNamespace(), p.GetName(), len(caches))
	}
	return &caches[0]
}

// pullCredentials are the credentials image cache c pulls with: the content of each copy its
// spec names, by the namespace the copy says it came from.
func (rc *reconcilers) pullCredentials(t *testing.T, ctx context.Context, c *inferencev1.InferenceImageCache) []string {
	t.Helper()
	var out []string
	for _, ref := range c.Spec.ImagePullSecrets {
		s := &corev1.Secret{}
		if err := server.Client.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: ref.Name}, s); err != nil {
			t.Fatalf("image cache %s pulls with %s: %v", c.Name, ref.Name, err)
		}
		out = append(out, s.Labels[controller.SourceNamespaceLabel]+" "+string(s.Data[corev1.DockerConfigJsonKey]))
	}
	return out
}

// A namespace that pulls an image with its pull secrets gets an image cache of its own, pulling
// with exactly its secrets: another namespace (with no pull rights, or with its own) never joins
// it, never has the image pulled with the first's credentials, and never sees its status or
// digest. Namespaces without pull secrets share one cache, which pulls with no tenant's
// credentials. The caches' pods pull Always, from / as working directory; a cache of one
// namespace keeps no other namespace's reference.
func TestAPrivateImageCacheIsItsNamespacesOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "iso-operator", "iso-a", "iso-b", "iso-c", "iso-d")
	const image = "registry.example/private/model-server:1"
	pullWith(t, ctx, "iso-a", []*corev1.Secret{pullSecret("iso-a", "regcred")}, "regcred")
	pullWith(t, ctx, "iso-c", []*corev1.Secret{pullSecret("iso-c", "regcred")}, "regcred")

	a := rc.imageParent(t, ctx, "iso-a", "served", image)
	b := rc.imageParent(t, ctx, "iso-b", "borrower", image) // no pull rights
	cp := rc.imageParent(t, ctx, "iso-c", "other", image)   // its own rights
	d := rc.imageParent(t, ctx, "iso-d", "public", image)   // no pull rights either
	ca, cb, cc, cd := rc.imageCacheOf(t, ctx, a), rc.imageCacheOf(t, ctx, b), rc.imageCacheOf(t, ctx, cp), rc.imageCacheOf(t, ctx, d)

	if ca.Name == cb.Name || ca.Name == cc.Name || cb.Name == cc.Name {
		t.Fatalf("iso-a's image cache %s, iso-b's %s, iso-c's %s: a namespace with pull secrets shares its cache", ca.Name, cb.Name, cc.Name)
	}
	if cb.Name != cd.Name {
		t.Errorf("iso-b's image cache %s and iso-d's %s: namespaces without pull secrets do not share", cb.Name, cd.Name)
	}
	for _, tc := range []struct {
		cache      *inferencev1.InferenceImageCache
		owner      string
		namespaces []string
		pulls      []string
	}{
		{ca, "iso-a", []string{"iso-a"}, []string{"iso-a " + registryCredential("iso-a", "regcred")}},
		{cc, "iso-c", []string{"iso-c"}, []string{"iso-c " + registryCredential("iso-c", "regcred")}},
		{cb, "", []string{"iso-b", "iso-d"}, nil},
	} {
		var namespaces []string
		for _, r := range tc.cache.Spec.ParentReferences {
			namespaces = append(namespaces, r.Namespace)
		}
		slices.Sort(namespaces)
		if diff := cmp.Diff(tc.namespaces, namespaces); diff != "" {
			t.Errorf("image cache %s: its parents' namespaces (-want +got):\n%s", tc.cache.Name, diff)
		}
		if got := tc.cache.Labels[controller.SourceNamespaceLabel]; got != tc.owner {
			t.Errorf("image cache %s is labelled the cache of namespace %q, want %q", tc.cache.Name, got, tc.owner)
		}
		if diff := cmp.Diff(tc.pulls, rc.pullCredentials(t, ctx, tc.cache)); diff != "" {
			t.Errorf("image cache %s pulls with (-want +got):\n%s", tc.cache.Name, diff)
		}
	}
	// Each parent is told of its own cache, not another's.
	for p, cache := range map[*inferencev1.InferenceEndpointConfig]*inferencev1.InferenceImageCache{a: ca, b: cb, cp: cc} {
		cond := meta.FindStatusCondition(p.Status.Conditions, inferencev1.ConditionImageCacheReady)
		if cond == nil || !strings.HasPrefix(cond.Message, "image cache "+rc.cfg.OperatorNamespace+"/"+cache.Name+" ") {
			t.Errorf("%s's ImageCacheReady = %+v; want it to name %s", p.Namespace, cond, cache.Name)
		}
	}

	// The image cache reconciler: a pod template the API server takes, pulling Always, from /;
	// a reference of another namespace put into iso-a's cache is dropped.
	ir := &imagecache.Reconciler{Client: harness.IndexedClient(c, controller.NodeIndexes...), Config: rc.cfg, Now: time.Now}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ca), ca); err != nil {
		t.Fatal(err)
	}
	ca.Spec.ParentReferences = append(ca.Spec.ParentReferences, inferencev1.ParentReference{Kind: "InferenceEndpointConfig", Namespace: "iso-b", Name: b.Name, UID: string(b.UID)})
	if err := c.Update(ctx, ca); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ir.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ca)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ca), ca); err != nil {
		t.Fatal(err)
	}
	if len(ca.Spec.ParentReferences) != 1 || ca.Spec.ParentReferences[0].Namespace != "iso-a" {
		t.Errorf("iso-a's image cache keeps the references %+v; want only iso-a's", ca.Spec.ParentReferences)
	}
	ds := daemonSetTemplate(t, ctx, ca)
	for _, ctr := range ds.Spec.Containers {
		if ctr.Name == imagecache.ImageContainerName && (ctr.ImagePullPolicy != corev1.PullAlways || ctr.WorkingDir != "/") {
			t.Errorf("the image container pulls %s from working directory %q; want Always, /", ctr.ImagePullPolicy, ctr.WorkingDir)
		}
	}
	if sc := ds.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || !ptr.Deref(sc.RunAsNonRoot, false) {
		t.Errorf("the image cache's pods run with %+v; want non-root and the runtime's default seccomp profile", sc)
	}
}

// daemonSetTemplate returns the pod template of image cache c's DaemonSet.
func daemonSetTemplate(t *testing.T, ctx context.Context, c *inferencev1.InferenceImageCache) *corev1.PodTemplateSpec {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(c), ds); err != nil {
		t.Fatalf("image cache %s has no DaemonSet: %v", c.Name, err)
	}
	return &ds.Spec.Template
}

// Copies of two namespaces' pull secrets whose names, joined with dashes, are the same (team's
// a-foo, team-a's foo) do not overwrite one another: each namespace's cache pulls with its own
// credentials.
func TestPullSecretCopiesOfTwoNamespacesDoNotCollide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := newReconcilers(t, ctx, "coll-operator", "coll-team", "coll-team-a")
	const image = "registry.example/private/model-server:1"
	pullWith(t, ctx, "coll-team", []*corev1.Secret{pullSecret("coll-team", "a-foo")}, "a-foo")
	pullWith(t, ctx, "coll-team-a", []*corev1.Secret{pullSecret("coll-team-a", "foo")}, "foo")
	one := rc.imageParent(t, ctx, "coll-team", "one", image)
	two := rc.imageParent(t, ctx, "coll-team-a", "two", image)

	for p, want := range map[*inferencev1.InferenceEndpointConfig]string{
		one: "coll-team " + registryCredential("coll-team", "a-foo"),
		two: "coll-team-a " + registryCredential("coll-team-a", "foo"),
	} {
		// Every cache the parent is in pulls with its namespace's credential alone.
		for _, cache := range rc.imageCachesOf(t, ctx, p) {
			if diff := cmp.Diff([]string{want}, rc.pullCredentials(t, ctx, &cache)); diff != "" {
				t.Errorf("%s's image cache %s pulls with (-want +got):\n%s", p.Namespace, cache.Name, diff)
			}
		}
	}
	copies := &corev1.SecretList{}
	if err := server.Client.List(ctx, copies, client.InNamespace(rc.cfg.OperatorNamespace), client.HasLabels{controller.ImageCacheLabel}); err != nil {
		t.Fatal(err)
	}
	if len(copies.Items) != 2 {
		t.Errorf("%d copies of the two namespaces' pull secrets, want 2", len(copies.Items))
	}
}

// Only docker config Secrets within the bounds are copied for a namespace's image cache; each
// one that is not is named, with the rule, on the parent (its ImageCacheReady condition and a
// Warning event) and never on the shared objects. A secret the namespace no longer names goes
// from its cache, which then pulls with those left.
func TestOnlyPullSecretsWithinBoundsAreCopied(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "bounds-operator", "bounds")
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "bounds", Name: "api-key"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": []byte("k")}}
	huge := pullSecret("bounds", "huge")
	huge.Data[corev1.DockerConfigJsonKey] = []byte(`{"auths":{"registry.example":{"auth":"` + strings.Repeat("QUFB", secrets.MaxPullSecretBytes/4) + `"}}}`)
	create := []*corev1.Secret{opaque, huge}
	names := []string{"api-key", "huge"}
	for i := range 8 {
		s := pullSecret("bounds", fmt.Sprintf("reg-%d", i))
		create, names = append(create, s), append(names, s.Name)
	}
	pullWith(t, ctx, "bounds", create, names...)

	p := rc.imageParent(t, ctx, "bounds", "served", "registry.example/private/model-server:1")
	cache := rc.imageCacheOf(t, ctx, p)
	var want []string
	for i := range 6 { // the first 8 names, less api-key and huge
		want = append(want, "bounds "+registryCredential("bounds", fmt.Sprintf("reg-%d", i)))
	}
	if diff := cmp.Diff(want, rc.pullCredentials(t, ctx, cache)); diff != "" {
		t.Errorf("the image cache pulls with (-want +got):\n%s", diff)
	}
	copies := &corev1.SecretList{}
	if err := c.List(ctx, copies, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil {
		t.Fatal(err)
	}
	if len(copies.Items) != 6 {
		t.Errorf("%d Secrets in the operator namespace, want the 6 copies", len(copies.Items))
	}
	cond := meta.FindStatusCondition(p.Status.Conditions, inferencev1.ConditionImageCacheReady)
	for _, w := range []string{
		"Secret bounds/api-key: its type is Opaque, and only kubernetes.io/dockerconfigjson and kubernetes.io/dockercfg Secrets are pull secrets",
		"Secret bounds/huge: it holds ",
		"more than the 32768 a pull secret copied for image caches may",
		"Secret bounds/reg-6, bounds/reg-7: the service account names 10 pull secrets, and only the first 8 are copied",
	} {
		if cond == nil || !strings.Contains(cond.Message, w) {
			t.Errorf("ImageCacheReady = %+v; want it to say %q", cond, w)
		}
	}
	if cond := meta.FindStatusCondition(cache.Status.Conditions, inferencev1.ConditionReady); cond != nil && strings.Contains(cond.Message, "api-key") {
		t.Errorf("the image cache's own status names the namespace's Secrets: %+v", cond)
	}

	// reg-0 leaves the service account: its copy goes, and the cache pulls with the rest.
	pullWith(t, ctx, "bounds", nil, names[3:]...)
	rc.reconcileParent(t, ctx, p)
	if err := c.Get(ctx, client.ObjectKeyFromObject(cache), cache); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	want = append(want, "bounds "+registryCredential("bounds", "reg-6"), "bounds "+registryCredential("bounds", "reg-7"))
	if diff := cmp.Diff(want, rc.pullCredentials(t, ctx, cache)); diff != "" {
		t.Errorf("after reg-0 left, the image cache pulls with (-want +got):\n%s", diff)
	}
	if err := c.List(ctx, copies, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil {
		t.Fatal(err)
	}
	if len(copies.Items) != 7 {
		t.Errorf("%d Secrets in the operator namespace, want the 7 copies", len(copies.Items))
	}
}

// The operator configuration's registries rule: an image from a registry it does not list gets
// no image cache, and its parent says why, naming the field; the Deployment is made anyway. A
// ModelImageCache of such an image fails, saying the same.
func TestImageCachesPullOnlyFromAllowedRegistries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "reg-operator", "reg").with(func(cfg *controller.Config) {
		cfg.ImageCaches.AllowedRegistries = []string{"public.ecr.aws", "docker.io/vllm"}
	})
	allowed := rc.imageParent(t, ctx, "reg", "allowed", "vllm/vllm-openai:latest")
	refused := rc.imageParent(t, ctx, "reg", "refused", "ghcr.io/someone/miner:latest")
	if len(rc.imageCachesOf(t, ctx, allowed)) != 1 {
		t.Error("an image of an allowed registry has no image cache")
	}
	if got := rc.imageCachesOf(t, ctx, refused); len(got) != 0 {
		t.Errorf("an image of another registry has image caches %v", got)
	}
	list := &inferencev1.InferenceImageCacheList{}
	if err := c.List(ctx, list, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil || len(list.Items) != 1 {
		t.Errorf("%d image caches, want 1 (%v)", len(list.Items), err)
	}
	cond := meta.FindStatusCondition(refused.Status.Conditions, inferencev1.ConditionImageCacheReady)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != inferencev1.ReasonRegistryNotAllowed ||
		!strings.Contains(cond.Message, "ghcr.io/someone/miner:latest") || !strings.Contains(cond.Message, "imageCaches.allowedRegistries: public.ecr.aws, docker.io/vllm") {
		t.Errorf("ImageCacheReady = %+v; want False, RegistryNotAllowed, naming the image and the field", cond)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(refused), &appsv1.Deployment{}); err != nil {
		t.Errorf("the refused image cache holds the Deployment back: %v", err)
	}

	mic := &inferencev1.ModelImageCache{ObjectMeta: metav1.ObjectMeta{Namespace: "reg", Name: "miner"},
		Spec: inferencev1.ModelImageCacheSpec{Image: "ghcr.io/someone/miner:latest"}}
	if err := c.Create(ctx, mic); err != nil {
		t.Fatal(err)
	}
	r := &serving.ModelImageCacheReconciler{Reconciler: rc.ep}
	for range 2 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(mic)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(mic), mic); err != nil {
		t.Fatal(err)
	}
	ready := meta.FindStatusCondition(mic.Status.Conditions, inferencev1.ConditionReady)
	if mic.Status.State != inferencev1.ModelImageFailed || ready == nil || ready.Reason != inferencev1.ReasonRegistryNotAllowed {
		t.Errorf("the ModelImageCache of a refused registry: %+v; want Failed, RegistryNotAllowed", mic.Status)
	}
}

// A namespace uses at most imageCaches.maxPerNamespace image caches: a parent past it gets none
// and says why, naming the field; another namespace is not held back; a parent that moves to
// another image does not count the cache it leaves.
func TestImageCachesPerNamespaceAreBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "imgquota-operator", "imgquota", "imgquota-other").with(func(cfg *controller.Config) {
		cfg.ImageCaches.MaxPerNamespace = 2
	})
	one := rc.imageParent(t, ctx, "imgquota", "one", "registry.example/model-server:1")
	two := rc.imageParent(t, ctx, "imgquota", "two", "registry.example/model-server:2")
	again := rc.imageParent(t, ctx, "imgquota", "again", "registry.example/model-server:2") // a cache the namespace already uses
	three := rc.imageParent(t, ctx, "imgquota", "three", "registry.example/model-server:3")
	other := rc.imageParent(t, ctx, "imgquota-other", "three", "registry.example/model-server:3")
	for _, p := range []*inferencev1.InferenceEndpointConfig{one, two, again, other} {
		if len(rc.imageCachesOf(t, ctx, p)) != 1 {
			t.Errorf("%s/%s has no image cache", p.Namespace, p.Name)
		}
	}
	if got := rc.imageCachesOf(t, ctx, three); len(got) != 0 {
		t.Errorf("the namespace's third image got a cache: %v", got)
	}
	cond := meta.FindStatusCondition(three.Status.Conditions, inferencev1.ConditionImageCacheReady)
	if cond == nil || cond.Reason != inferencev1.ReasonImageCacheQuotaExceeded || !strings.Contains(cond.Message, "imageCaches.maxPerNamespace: 2") ||
		!strings.Contains(cond.Message, "namespace imgquota already uses 2 image caches") {
		t.Errorf("ImageCacheReady = %+v; want ImageCacheQuotaExceeded naming the field and the count", cond)
	}

	// one moves to image 4: it leaves its cache for the new one, within the quota.
	patch := client.MergeFrom(one.DeepCopy())
	one.Spec.Worker.Image = "registry.example/model-server:4"
	if err := c.Patch(ctx, one, patch); err != nil {
		t.Fatal(err)
	}
	rc.reconcileParent(t, ctx, one)
	if got := rc.imageCachesOf(t, ctx, one); len(got) != 1 || got[0].Spec.Image != "registry.example/model-server:4" {
		t.Errorf("a parent moving to another image at the quota: its caches %v; want the new image's", got)
	}
}

// Image caches made under the names of an earlier version (a 16-bit hash) are not orphaned: one
// that can serve as the cache a parent's key now gives (only its namespace's parents and pull
// secrets, or no pull secrets at all for a shared one) is adopted, keeping its UID and so its
// nodes' labels; one that cannot (another namespace's pull secrets in it) is let go, and goes
// with its last parent.
func TestImageCachesOfEarlierNamesAreAdoptedOrLetGo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "up-operator", "up-a", "up-b", "up-c")
	opNS := rc.cfg.OperatorNamespace
	pl := placement.FromParent("ml.iso-suite.xlarge", nil, nil, nil)
	pullWith(t, ctx, "up-a", []*corev1.Secret{pullSecret("up-a", "regcred")}, "regcred")

	// What the earlier version left: for image 1, a cache of up-a's parent with its copy; for
	// image 2, a cache of up-a's and up-b's parents with up-a's copy; for image 3, a cache of
	// up-b's parent with no pull secrets.
	parent := func(ns, name, image string) *inferencev1.InferenceEndpointConfig {
		p := builders.MakeInferenceEndpointConfig(ns, name).InstanceType("ml.iso-suite.xlarge").Obj()
		p.Spec.Worker.Image = image
		p.Spec.ModelCacheConfig.WeightsCache.Enabled = false
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	legacy := func(image string, copyFrom string, parents ...*inferencev1.InferenceEndpointConfig) *inferencev1.InferenceImageCache {
		ic := builders.MakeInferenceImageCache(opNS, serving.LegacyImageCacheName(image, pl))
		ic.Spec.Image, ic.Spec.Placement = image, pl
		for _, p := range parents {
			ic.Spec.ParentReferences = append(ic.Spec.ParentReferences, inferencev1.ParentReference{Kind: "InferenceEndpointConfig", Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)})
		}
		if copyFrom != "" {
			ic.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: ic.Name + "-" + copyFrom + "-regcred"}}
		}
		if err := c.Create(ctx, ic); err != nil {
			t.Fatal(err)
		}
		if copyFrom != "" {
			cp := pullSecret(opNS, ic.Name+"-"+copyFrom+"-regcred")
			cp.Labels = map[string]string{controller.ManagedByLabel: controller.ManagedBy, controller.ImageCacheLabel: ic.Name, controller.SourceNamespaceLabel: copyFrom}
			if err := c.Create(ctx, cp); err != nil {
				t.Fatal(err)
			}
		}
		return ic
	}
	a1 := parent("up-a", "one", "registry.example/model-server:1")
	old1 := legacy("registry.example/model-server:1", "up-a", a1)
	a2, b2 := parent("up-a", "two", "registry.example/model-server:2"), parent("up-b", "two", "registry.example/model-server:2")
	old2 := legacy("registry.example/model-server:2", "up-a", a2, b2)
	b3, c3 := parent("up-b", "three", "registry.example/model-server:3"), parent("up-c", "three", "registry.example/model-server:3")
	old3 := legacy("registry.example/model-server:3", "", b3)

	for _, p := range []*inferencev1.InferenceEndpointConfig{a1, b2, b3, c3} {
		rc.reconcileParent(t, ctx, p)
	}
	// Image 1: up-a's own, adopted: same object, labelled up-a, pulling with a copy named anew.
	if got := rc.imageCacheOf(t, ctx, a1); got.UID != old1.UID || got.Labels[controller.SourceNamespaceLabel] != "up-a" {
		t.Errorf("up-a's parent of image 1 uses %s (labels %v); want the earlier cache %s adopted as up-a's", got.Name, got.Labels, old1.Name)
	} else if diff := cmp.Diff([]string{"up-a " + registryCredential("up-a", "regcred")}, rc.pullCredentials(t, ctx, got)); diff != "" {
		t.Errorf("the adopted cache pulls with (-want +got):\n%s", diff)
	}
	// Image 3: no pull secrets, adopted as the shared cache by up-b and up-c.
	if got := rc.imageCacheOf(t, ctx, b3); got.UID != old3.UID || got.Labels[controller.SourceNamespaceLabel] != "" {
		t.Errorf("up-b's parent of image 3 uses %s; want the earlier cache %s, shared", got.Name, old3.Name)
	}
	if got := rc.imageCacheOf(t, ctx, c3); got.UID != old3.UID {
		t.Errorf("up-c's parent of image 3 uses %s; want the earlier shared cache %s", got.Name, old3.Name)
	}
	// Image 2: up-a's credentials are in it, so up-b's parent does not stay: it has a shared
	// cache of its own; up-a's parent then has the earlier cache to itself and adopts it.
	if got := rc.imageCacheOf(t, ctx, b2); got.UID == old2.UID || len(got.Spec.ImagePullSecrets) != 0 {
		t.Errorf("up-b's parent of image 2 uses %s pulling with %v; want a new cache with no pull secrets", got.Name, got.Spec.ImagePullSecrets)
	}
	rc.reconcileParent(t, ctx, a2)
	if got := rc.imageCacheOf(t, ctx, a2); got.UID != old2.UID || got.Labels[controller.SourceNamespaceLabel] != "up-a" {
		t.Errorf("up-a's parent of image 2 uses %s (labels %v); want the earlier cache adopted once it is up-a's alone", got.Name, got.Labels)
	}
	// The copies made under the earlier names are gone; each adopted cache has one, named anew.
	copies := &corev1.SecretList{}
	if err := c.List(ctx, copies, client.InNamespace(opNS)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range copies.Items {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	want := []string{secrets.CopyName(old1.Name, "up-a", "regcred"), secrets.CopyName(old2.Name, "up-a", "regcred")}
	slices.Sort(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("pull secret copies (-want +got):\n%s", diff)
	}
}
