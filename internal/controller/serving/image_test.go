package serving

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/internal/scheme"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestImageCacheName(t *testing.T) {
	g5 := placement.FromParent("ml.g5.24xlarge", nil, nil, nil)
	tests := []struct {
		image string
		p     inferencev1.Placement
		want  string // a regexp
	}{
		{"vllm/vllm-openai:latest", g5, `^iic-vllm-openai-ml-g5-24xlarge-[0-9a-f]{16}$`},
		{"public.ecr.aws/deep-learning-containers/vllm:0.8.5-gpu-py312", g5, `^iic-vllm-ml-g5-24xlarge-[0-9a-f]{16}$`},
		{"registry.example:5000/team/tgi@sha256:" + strings.Repeat("a", 64), g5, `^iic-tgi-ml-g5-24xlarge-[0-9a-f]{16}$`},
		{"Registry/UPPER_case.Image:1", placement.FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), `^iic-upper-case-image-multi-[0-9a-f]{16}$`},
		{"x/" + strings.Repeat("very-long-image-name-", 20) + ":1", g5, `^iic-very-long-image-name-.*-ml-g5-24xlarge-[0-9a-f]{16}$`},
		{"busybox", inferencev1.Placement{}, `^iic-busybox-any-[0-9a-f]{16}$`},
	}
	for _, tt := range tests {
		got := ImageCacheName(tt.image, tt.p, "")
		if !regexp.MustCompile(tt.want).MatchString(got) || len(got) > 63 || !dnsLabel.MatchString(got) {
			t.Errorf("ImageCacheName(%q) = %q (%d chars), want %s and a DNS label", tt.image, got, len(got), tt.want)
		}
	}
	// Same image, same placement: one name. Another placement or tag: another name.
	a := ImageCacheName("vllm/vllm-openai:latest", g5, "")
	if a != ImageCacheName("vllm/vllm-openai:latest", placement.FromParent("ml.g5.24xlarge", nil, nil, nil), "") {
		t.Error("the name is not stable")
	}
	if a == ImageCacheName("vllm/vllm-openai:v0.6.3", g5, "") || a == ImageCacheName("vllm/vllm-openai:latest", placement.FromParent("ml.g5.48xlarge", nil, nil, nil), "") {
		t.Error("different images or placements share a name")
	}
	// A namespace's own cache (it pulls with its pull secrets) is another cache than the
	// shared one, and than another namespace's.
	if mine, theirs := ImageCacheName("vllm/vllm-openai:latest", g5, "team-a"), ImageCacheName("vllm/vllm-openai:latest", g5, "team-b"); mine == a || mine == theirs {
		t.Errorf("team-a's cache %s, team-b's %s, the shared one %s: want three names", mine, theirs, a)
	}
	// The names earlier versions gave (4 hex digits) are still found, to be adopted: this one
	// is what they named the seed's cache.
	if got := LegacyImageCacheName("vllm/vllm-openai:latest", g5); got != "iic-vllm-openai-ml-g5-24xlarge-6198" {
		t.Errorf("legacy name %s, want the earlier version's iic-vllm-openai-ml-g5-24xlarge-6198", got)
	}
}

// Parents that share an image cache add themselves to it at once. A parent whose informer
// still shows the cache as it was before another parent's update must not fail on the conflict
// (the reconcile's backoff doubles with every failure), nor drop the other's reference.
func TestAParentJoinsASharedImageCacheItsInformerShowsStale(t *testing.T) {
	ctx := context.Background()
	const ns = "hyperpod-inference-system"
	g5 := placement.FromParent("ml.g5.24xlarge", nil, nil, nil)
	image := "vllm/vllm-openai:latest"
	ref := func(name string) inferencev1.ParentReference {
		return inferencev1.ParentReference{Kind: "InferenceEndpointConfig", Namespace: "team", Name: name, UID: "uid-" + name}
	}
	ic := &inferencev1.InferenceImageCache{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ImageCacheName(image, g5, "")},
		Spec:       inferencev1.InferenceImageCacheSpec{Image: image, Placement: g5, ParentReferences: []inferencev1.ParentReference{ref("a")}},
	}
	live := fake.NewClientBuilder().WithScheme(scheme.New()).
		WithObjects(ic, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}).Build()
	stale := &inferencev1.InferenceImageCache{}
	if err := live.Get(ctx, client.ObjectKeyFromObject(ic), stale); err != nil {
		t.Fatal(err)
	}
	// Parent b joins; the informer has not seen it yet.
	joined := stale.DeepCopy()
	joined.Spec.ParentReferences = append(joined.Spec.ParentReferences, ref("b"))
	if err := live.Update(ctx, joined); err != nil {
		t.Fatal(err)
	}
	informer := interceptor.NewClient(live, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if into, ok := obj.(*inferencev1.InferenceImageCache); ok {
				stale.DeepCopyInto(into)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	r := &Reconciler{Client: informer, Live: live, Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{OperatorNamespace: ns}}}
	owner := &inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "c", UID: "uid-c"}}
	m := &model{owner: owner, kind: "InferenceEndpointConfig", placement: g5, worker: inferencev1.Worker{Image: image}}
	if _, _, err := r.ensureImageCache(ctx, m); err != nil {
		t.Fatalf("parent c could not join the image cache: %v", err)
	}
	got := &inferencev1.InferenceImageCache{}
	if err := live.Get(ctx, client.ObjectKeyFromObject(ic), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]inferencev1.ParentReference{ref("a"), ref("b"), ref("c")}, got.Spec.ParentReferences); diff != "" {
		t.Errorf("the image cache's parents (-want +got):\n%s", diff)
	}
}
