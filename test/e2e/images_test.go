package e2e

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

const opNS = "hyperpod-inference-system"

// pullDelay is how long kwok takes to make a pod ready in the image cache test: it stands in for
// an image pull, so the image cache is still pulling when the Deployment appears.
const pullDelay = 6 * time.Second

func delayPodReady(stages string) string {
	return strings.Replace(stages, "name: pod-ready\nspec:\n",
		fmt.Sprintf("name: pod-ready\nspec:\n  delay:\n    durationMilliseconds: %d\n", pullDelay.Milliseconds()), 1)
}

func (e *weightsEnv) imageCaches() []inferencev1.InferenceImageCache {
	list := &inferencev1.InferenceImageCacheList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(opNS)); err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

func (e *weightsEnv) imageCache(name string) (*inferencev1.InferenceImageCache, error) {
	c := &inferencev1.InferenceImageCache{}
	return c, e.c.Get(e.ctx, types.NamespacedName{Namespace: opNS, Name: name}, c)
}

// podNodes lists the nodes of an image cache's pods.
func (e *weightsEnv) podNodes(cache string) []string {
	pods := &corev1.PodList{}
	if err := e.c.List(e.ctx, pods, client.InNamespace(opNS), client.MatchingLabels{"prewarm.io/image-cache": cache}); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp.IsZero() {
			out = append(out, p.Spec.NodeName)
		}
	}
	slices.Sort(out)
	return out
}

func (e *weightsEnv) waitImageCache(name string, phase inferencev1.ImageCachePhase, cached, target int32) *inferencev1.InferenceImageCache {
	e.t.Helper()
	var c *inferencev1.InferenceImageCache
	e.eventually(90*time.Second, "image cache "+name+" "+string(phase), func() (bool, string) {
		var err error
		if c, err = e.imageCache(name); err != nil {
			return false, err.Error()
		}
		st := c.Status
		return st.Phase == phase && st.CachedNodes == cached && st.TargetNodes == target,
			fmt.Sprintf("%s %d/%d %+v", st.Phase, st.CachedNodes, st.TargetNodes, st.Nodes)
	})
	return c
}

func (e *weightsEnv) waitGone(what string, obj client.Object) {
	e.t.Helper()
	e.eventually(60*time.Second, what+" gone", func() (bool, string) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func (e *weightsEnv) setImageStatus(cache, node string, status corev1.ContainerStatus) {
	e.t.Helper()
	pods := &corev1.PodList{}
	if err := e.c.List(e.ctx, pods, client.InNamespace(opNS), client.MatchingLabels{"prewarm.io/image-cache": cache}); err != nil {
		e.t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node {
			continue
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Status.ContainerStatuses = []corev1.ContainerStatus{status}
		if err := e.c.Status().Patch(e.ctx, p, patch); err != nil {
			e.t.Fatal(err)
		}
		return
	}
	e.t.Fatalf("no pod of %s on %s", cache, node)
}

var seedCacheName = regexp.MustCompile(`^iic-vllm-openai-ml-g5-24xlarge-[0-9a-f]{16}$`)

func TestImageCacheEndToEnd(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{KwokStages: delayPodReady})
	ctx, c := e.ctx, e.c
	for _, n := range []string{"g5-a", "g5-b", "g5-c"} {
		e.addNode(n, "ml.g5.24xlarge", s3srv.Endpoint)
	}
	e.addNode("small-a", "ml.g5.xlarge", s3srv.Endpoint)
	e.startController(
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")

	// The inference pods' namespace pulls with a secret; the image cache must pull with it too.
	pullWith(t, e, "default", "regcred")

	applySeed(t, c)
	var seedCache, cacheNS string
	t.Run("the seed gets an image cache named in the seed's style; the Deployment does not wait for it", func(t *testing.T) {
		dep := &appsv1.Deployment{}
		// The Deployment waits for the weights cache (not the image's): its nodes download the
		// model first, together (4 s on a quiet machine; a minute leaves room for a loaded
		// one, not for a part waiting on a silent owner, as the 30 s peer wait once did).
		began := time.Now()
		e.eventually(time.Minute, "Deployment created", func() (bool, string) {
			err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, dep)
			return err == nil, fmt.Sprint(err)
		})
		t.Logf("the Deployment appeared after %s", time.Since(began).Round(time.Second))
		caches := e.imageCaches()
		if len(caches) != 1 || !seedCacheName.MatchString(caches[0].Name) {
			t.Fatalf("image caches %v, want one named like iic-vllm-openai-ml-g5-24xlarge-0123456789abcdef", caches)
		}
		if caches[0].Status.Phase == inferencev1.ImageComplete {
			t.Errorf("the image cache was already Complete when the Deployment appeared: the test shows nothing")
		}
		seedCache, cacheNS = caches[0].Name, caches[0].Namespace
		ic := e.waitImageCache(seedCache, inferencev1.ImageComplete, 3, 3)
		if got := e.podNodes(seedCache); !slices.Equal(got, []string{"g5-a", "g5-b", "g5-c"}) {
			t.Errorf("image cache pods on %v, want the three ml.g5.24xlarge nodes", got)
		}
		label := inferencev1.ImageCacheReadyLabel(string(ic.UID))
		if got := e.labelled(label); !slices.Equal(got, []string{"g5-a", "g5-b", "g5-c"}) {
			t.Errorf("label %s on %v", label, got)
		}
		if refs := ic.Spec.ParentReferences; len(refs) != 1 || refs[0].Name != "example-model" || refs[0].Kind != "InferenceEndpointConfig" {
			t.Errorf("parent references %+v", refs)
		}
		tab, err := e.cluster.Table("/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/" + opNS + "/inferenceimagecaches")
		if err != nil {
			t.Fatal(err)
		}
		if got := testutil.TableHeaders(tab); !slices.Equal(got, []string{"NAME", "PHASE", "CACHED", "TARGET", "AGE"}) {
			t.Errorf("kubectl get inferenceimagecache prints %v", got)
		}
		if len(tab.Rows) != 1 || fmt.Sprint(tab.Rows[0].Cells[:4]) != fmt.Sprintf("[%s Complete 3 3]", seedCache) {
			t.Errorf("row %v", tab.Rows)
		}

		// The DaemonSet: the target image run by the sleeper, minimal requests, no GPU, the
		// low non-preempting priority class, the pull secret copied into the operator namespace.
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: opNS, Name: seedCache}, ds); err != nil {
			t.Fatal(err)
		}
		spec := ds.Spec.Template.Spec
		main := spec.Containers[0]
		if main.Image != "vllm/vllm-openai:latest" || !slices.Equal(main.Command, []string{"/prewarm-bin/sleeper"}) ||
			main.Resources.Requests.Cpu().MilliValue() > 10 || len(main.Resources.Limits) != 1 {
			t.Errorf("image container %+v", main)
		}
		if len(spec.InitContainers) != 1 || spec.InitContainers[0].Image != "prewarm/agent:e2e" {
			t.Errorf("init containers %+v, want prewarm's image installing the sleeper", spec.InitContainers)
		}
		pc := &schedulingv1.PriorityClass{}
		if err := c.Get(ctx, types.NamespacedName{Name: spec.PriorityClassName}, pc); err != nil || pc.Value >= 0 ||
			pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptNever {
			t.Errorf("priority class %q: %v %+v", spec.PriorityClassName, err, pc)
		}
		if len(spec.ImagePullSecrets) != 1 {
			t.Fatalf("pull secrets %+v, want the copy of default/regcred", spec.ImagePullSecrets)
		}
		copied := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: opNS, Name: spec.ImagePullSecrets[0].Name}, copied); err != nil ||
			string(copied.Data[corev1.DockerConfigJsonKey]) != dockerConfig("default") {
			t.Errorf("copied pull secret: %v", err)
		}

		// The inference pods prefer nodes with the image, below the weights.
		e.eventually(30*time.Second, "pod template prefers the image label", func() (bool, string) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
				return false, err.Error()
			}
			for _, p := range dep.Spec.Template.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				if p.Preference.MatchExpressions[0].Key == label && p.Weight < 100 {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", dep.Spec.Template.Spec.Affinity)
		})
		iec := &inferencev1.InferenceEndpointConfig{}
		// The parent's ImageCacheReady condition names the image cache with its counts (the
		// status holds only HyperPod's fields).
		e.eventually(30*time.Second, "parent's ImageCacheReady", func() (bool, string) {
			if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, iec); err != nil {
				return false, err.Error()
			}
			r := condition(iec.Status.Conditions, inferencev1.ConditionImageCacheReady)
			want := fmt.Sprintf("image cache %s/%s %s: all 3 target nodes hold", cacheNS, seedCache, inferencev1.ImageComplete)
			return r.Status == metav1.ConditionTrue && strings.HasPrefix(r.Message, want), fmt.Sprintf("%+v; want it to begin %q", r, want)
		})
	})
	if t.Failed() {
		return
	}

	t.Run("a node that cannot pull says so; the others stay Complete", func(t *testing.T) {
		e.setImageStatus(seedCache, "g5-c", corev1.ContainerStatus{Name: "image", Image: "vllm/vllm-openai:latest",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull",
				Message: `failed to pull and unpack image "docker.io/vllm/vllm-openai:latest": 429 Too Many Requests`}}})
		ic := e.waitImageCache(seedCache, inferencev1.ImageFailed, 2, 3)
		for _, n := range ic.Status.Nodes {
			want := inferencev1.ImageComplete
			if n.Name == "g5-c" {
				want = inferencev1.ImageFailed
				if n.Reason != "ErrImagePull" || !strings.Contains(n.Message, "429 Too Many Requests") {
					t.Errorf("g5-c entry %+v, want ErrImagePull with the pull's message", n)
				}
			}
			if n.Phase != want {
				t.Errorf("%s: %s, want %s", n.Name, n.Phase, want)
			}
		}
		label := inferencev1.ImageCacheReadyLabel(string(ic.UID))
		if got := e.labelled(label); !slices.Equal(got, []string{"g5-a", "g5-b"}) {
			t.Errorf("label on %v, want the two nodes with the image", got)
		}
		// The pull succeeds; the digest comes from imageID.
		e.setImageStatus(seedCache, "g5-c", corev1.ContainerStatus{Name: "image", Image: "vllm/vllm-openai:latest", Ready: true,
			ImageID: "docker.io/vllm/vllm-openai@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			State:   corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
		ic = e.waitImageCache(seedCache, inferencev1.ImageComplete, 3, 3)
		if ic.Status.ImageDigest != "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
			t.Errorf("imageDigest = %q", ic.Status.ImageDigest)
		}
	})

	// second is another tenant's, pulling with its own secret; borrower's namespace has no pull
	// secrets; third shares the seed's namespace.
	second := builders.MakeInferenceEndpointConfig("team-x", "second").Location(prefix).Obj()
	second.Spec.ModelCacheConfig.WeightsCache.Enabled = false
	borrower := builders.MakeInferenceEndpointConfig("team-y", "borrower").Location(prefix).Obj()
	borrower.Spec.ModelCacheConfig.WeightsCache.Enabled = false
	third := builders.MakeInferenceEndpointConfig("default", "third").Location(prefix).Obj()
	third.Spec.ModelCacheConfig.WeightsCache.Enabled = false
	var newCache string
	t.Run("a namespace that pulls with its own secrets has its own cache; parents of one namespace share it while one uses it", func(t *testing.T) {
		copies := func(cache string) []string {
			list := &corev1.SecretList{}
			if err := c.List(ctx, list, client.InNamespace(opNS), client.MatchingLabels{"prewarm.io/image-cache": cache}); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range list.Items {
				names = append(names, s.Labels["prewarm.io/source-namespace"]+"/"+s.Name)
			}
			return names
		}
		cacheOf := func(parent string) (*inferencev1.InferenceImageCache, string) {
			var names []string
			for _, ic := range e.imageCaches() {
				names = append(names, fmt.Sprintf("%s%v", ic.Name, ic.Spec.ParentReferences))
				for _, r := range ic.Spec.ParentReferences {
					if r.Name == parent {
						return &ic, ""
					}
				}
			}
			return nil, fmt.Sprint(names)
		}
		for _, ns := range []string{"team-x", "team-y"} {
			if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
		}
		pullWith(t, e, "team-x", "regcred-x")
		for _, p := range []*inferencev1.InferenceEndpointConfig{second, borrower} {
			if err := c.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		// team-x's parent does not join default's cache: it has its own, pulling with its copy
		// alone; team-y, with no pull rights, has a cache that pulls with no tenant's secret.
		var xCache, yCache string
		e.eventually(30*time.Second, "team-x's and team-y's own image caches", func() (bool, string) {
			x, why := cacheOf("second")
			y, why2 := cacheOf("borrower")
			if x == nil || y == nil {
				return false, why + why2
			}
			xCache, yCache = x.Name, y.Name
			return len(x.Spec.ImagePullSecrets) == 1 && len(copies(xCache)) == 1, fmt.Sprint(x.Spec.ImagePullSecrets, copies(xCache))
		})
		if xCache == seedCache || yCache == seedCache || xCache == yCache {
			t.Fatalf("default's image cache %s, team-x's %s, team-y's %s: want three", seedCache, xCache, yCache)
		}
		if got := copies(xCache); !strings.HasPrefix(got[0], "team-x/") {
			t.Errorf("team-x's cache pulls with %v, want team-x's copy alone", got)
		}
		y, err := e.imageCache(yCache)
		if err != nil || len(y.Spec.ImagePullSecrets) != 0 || len(copies(yCache)) != 0 {
			t.Errorf("team-y's cache %v pulls with %v; want no tenant's secret", err, copies(yCache))
		}
		if ic, err := e.imageCache(seedCache); err != nil || len(ic.Spec.ParentReferences) != 1 || len(copies(seedCache)) != 1 {
			t.Errorf("default's cache: %v, parents %+v, copies %v; want the seed alone, with default's copy", err, ic.Spec.ParentReferences, copies(seedCache))
		}
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: opNS, Name: yCache}, ds); err != nil {
			t.Fatal(err)
		}
		if ctr := ds.Spec.Template.Spec.Containers[0]; ctr.ImagePullPolicy != corev1.PullAlways || ctr.WorkingDir != "/" {
			t.Errorf("the image container pulls %s from %q; want Always, /", ctr.ImagePullPolicy, ctr.WorkingDir)
		}

		// third, of the seed's namespace, shares the seed's cache; the seed goes and the cache
		// stays, with default's copy, while third uses it.
		if err := c.Create(ctx, third); err != nil {
			t.Fatal(err)
		}
		e.eventually(30*time.Second, "third shares", func() (bool, string) {
			ic, err := e.imageCache(seedCache)
			return err == nil && len(ic.Spec.ParentReferences) == 2, fmt.Sprint(err)
		})
		seed := &inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "example-model"}}
		if err := c.Delete(ctx, seed); err != nil {
			t.Fatal(err)
		}
		e.waitGone("the seed parent", seed)
		old, err := e.imageCache(seedCache)
		if err != nil {
			t.Fatalf("the image cache went with one of its two parents: %v", err)
		}
		if refs := old.Spec.ParentReferences; len(refs) != 1 || refs[0].Name != "third" {
			t.Errorf("references %+v, want only third", refs)
		}
		if got := copies(seedCache); len(got) != 1 {
			t.Errorf("pull secret copies %v, want default's, which third still uses", got)
		}

		// third moves to another image: a new cache for that image, and the first cache, its last
		// parent gone, goes with its DaemonSet, its labels and default's copy.
		if err := c.Get(ctx, client.ObjectKeyFromObject(third), third); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(third.DeepCopy())
		third.Spec.Worker.Image = "vllm/vllm-openai:v0.6.3"
		if err := c.Patch(ctx, third, patch); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "third moved to a new cache", func() (bool, string) {
			ic, why := cacheOf("third")
			if ic == nil || ic.Spec.Image != "vllm/vllm-openai:v0.6.3" {
				return false, why
			}
			newCache = ic.Name
			return true, ""
		})
		e.waitImageCache(newCache, inferencev1.ImageComplete, 3, 3)
		e.waitGone("the first image cache", old)
		e.waitGone("its DaemonSet", &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: seedCache}})
		if got := e.labelled(inferencev1.ImageCacheReadyLabel(string(old.UID))); len(got) != 0 {
			t.Errorf("its label is still on %v", got)
		}
		e.eventually(30*time.Second, "default's copy for the first cache gone", func() (bool, string) {
			got := copies(seedCache)
			return len(got) == 0, fmt.Sprint(got)
		})

		// team-x's and team-y's parents go, and their caches with them.
		for _, p := range []*inferencev1.InferenceEndpointConfig{second, borrower} {
			if err := c.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{xCache, yCache} {
			e.waitGone("image cache "+name, &inferencev1.InferenceImageCache{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: name}})
		}
		e.eventually(30*time.Second, "team-x's copy gone", func() (bool, string) {
			got := copies(xCache)
			return len(got) == 0, fmt.Sprint(got)
		})
	})

	t.Run("a node that joins gets the pod and the label", func(t *testing.T) {
		e.addNode("g5-d", "ml.g5.24xlarge", s3srv.Endpoint)
		ic := e.waitImageCache(newCache, inferencev1.ImageComplete, 4, 4)
		if got := e.labelled(inferencev1.ImageCacheReadyLabel(string(ic.UID))); !slices.Equal(got, []string{"g5-a", "g5-b", "g5-c", "g5-d"}) {
			t.Errorf("label on %v", got)
		}
	})

	t.Run("turning the image cache off releases the parent's reference", func(t *testing.T) {
		ic, err := e.imageCache(newCache)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(third), third); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(third.DeepCopy())
		third.Spec.ModelCacheConfig.ImageCache.Enabled = false
		if err := c.Patch(ctx, third, patch); err != nil {
			t.Fatal(err)
		}
		e.waitGone("the image cache", ic)
		e.eventually(30*time.Second, "labels and DaemonSet gone", func() (bool, string) {
			err := c.Get(ctx, types.NamespacedName{Namespace: opNS, Name: newCache}, &appsv1.DaemonSet{})
			got := e.labelled(inferencev1.ImageCacheReadyLabel(string(ic.UID)))
			return apierrors.IsNotFound(err) && len(got) == 0, fmt.Sprintf("%v; labels on %v", err, got)
		})
		if err := c.Delete(ctx, third); err != nil {
			t.Fatal(err)
		}
		e.waitGone("the third parent", third)
	})
	e.check()
}

// dockerConfig is the registry credential namespace ns pulls with.
func dockerConfig(ns string) string {
	return `{"auths":{"registry.example":{"auth":"` + base64.StdEncoding.EncodeToString([]byte(ns+":p")) + `"}}}`
}

// pullWith makes namespace ns's pods pull with a secret of that name (its default service
// account's imagePullSecrets), as a tenant sets it up.
func pullWith(t *testing.T, e *weightsEnv, ns, name string) {
	t.Helper()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(dockerConfig(ns))}}
	if err := e.c.Create(e.ctx, secret); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, ns+" service account", func() (bool, string) {
		sa := &corev1.ServiceAccount{}
		if err := e.c.Get(e.ctx, types.NamespacedName{Namespace: ns, Name: "default"}, sa); err != nil {
			if apierrors.IsNotFound(err) { // no service account controller here: make it
				sa = &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
				err = e.c.Create(e.ctx, sa)
			}
			if err != nil {
				return false, err.Error()
			}
		}
		sa.ImagePullSecrets = []corev1.LocalObjectReference{{Name: name}}
		err := e.c.Update(e.ctx, sa)
		return err == nil, fmt.Sprint(err)
	})
}
