package integration

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// table fetches a list as the server's Table, the form `kubectl get` prints.
func table(t *testing.T, path string) *metav1.Table {
	t.Helper()
	tab, err := server.Table(path)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func headers(tab *metav1.Table) []string { return testutil.TableHeaders(tab) }

func TestModelDataCacheConfigTableMatchesSeed(t *testing.T) {
	ctx := context.Background()
	mdcc := builders.MakeModelDataCacheConfig("default", "example-model-cache")
	if err := server.Client.Create(ctx, mdcc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Client.Delete(ctx, mdcc) })
	mdcc.Status = inferencev1.ModelDataCacheConfigStatus{State: inferencev1.CacheReady, TargetNodes: 10, ReadyNodes: 10}
	if err := server.Client.Status().Update(ctx, mdcc); err != nil {
		t.Fatal(err)
	}

	tab := table(t, "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/default/modeldatacacheconfigs")
	if diff := cmp.Diff([]string{"NAME", "STATE", "TARGET", "READY", "AGE"}, headers(tab)); diff != "" {
		t.Errorf("columns (-want +got):\n%s", diff)
	}
	if len(tab.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(tab.Rows))
	}
	// Cells as JSON decodes them: strings and float64 numbers. AGE is checked for presence.
	cells := tab.Rows[0].Cells
	if diff := cmp.Diff([]any{"example-model-cache", "Ready", float64(10), float64(10)}, cells[:4]); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
	if age, _ := cells[4].(string); age == "" {
		t.Errorf("AGE cell = %#v, want a duration", cells[4])
	}
}

func TestInferenceImageCacheTableMatchesSeed(t *testing.T) {
	ctx := context.Background()
	iic := builders.MakeInferenceImageCache("default", "iic-vllm-openai-ml-g5-24xlarge-a1b2")
	if err := server.Client.Create(ctx, iic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Client.Delete(ctx, iic) })
	iic.Status = inferencev1.InferenceImageCacheStatus{Phase: inferencev1.ImageComplete, CachedNodes: 10, TargetNodes: 10}
	if err := server.Client.Status().Update(ctx, iic); err != nil {
		t.Fatal(err)
	}

	tab := table(t, "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/default/inferenceimagecaches")
	if diff := cmp.Diff([]string{"NAME", "PHASE", "CACHED", "TARGET", "AGE"}, headers(tab)); diff != "" {
		t.Errorf("columns (-want +got):\n%s", diff)
	}
	if len(tab.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(tab.Rows))
	}
	if diff := cmp.Diff([]any{"iic-vllm-openai-ml-g5-24xlarge-a1b2", "Complete", float64(10), float64(10)}, tab.Rows[0].Cells[:4]); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
}

// HyperPod's own cache kinds print HyperPod's columns.
func TestHyperPodCacheKindTables(t *testing.T) {
	ctx := context.Background()
	mw := &inferencev1.ModelWeightsCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "llama-warm"},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceS3,
			S3Storage: &inferencev1.S3Storage{BucketName: "b", Region: "us-west-2"}}}}
	mic := &inferencev1.ModelImageCache{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-image"},
		Spec: inferencev1.ModelImageCacheSpec{Image: "vllm/vllm-openai:v0.6.3"}}
	for _, o := range []client.Object{mw, mic} {
		if err := server.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = server.Client.Delete(ctx, o) })
	}
	mw.Status = inferencev1.ModelWeightsCacheConfigStatus{State: "Ready", TargetNodes: 10, ReadyNodes: 9}
	mic.Status = inferencev1.ModelImageCacheStatus{State: inferencev1.ModelImagePartiallyReady, TargetNodes: 10, ReadyNodes: 8}
	for _, o := range []client.Object{mw, mic} {
		if err := server.Client.Status().Update(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		plural string
		want   []string
		cells  []any
	}{
		{"modelweightscacheconfigs", []string{"NAME", "STATE", "READY", "TARGET", "AGE"}, []any{"llama-warm", "Ready", float64(9), float64(10)}},
		{"modelimagecaches", []string{"NAME", "IMAGE", "STATE", "READY", "TARGET", "AGE"}, []any{"vllm-image", "vllm/vllm-openai:v0.6.3", "PartiallyReady", float64(8), float64(10)}},
	} {
		tab := table(t, "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/default/"+tc.plural)
		if diff := cmp.Diff(tc.want, headers(tab)); diff != "" {
			t.Errorf("%s columns (-want +got):\n%s", tc.plural, diff)
		}
		if len(tab.Rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", tc.plural, len(tab.Rows))
		}
		if diff := cmp.Diff(tc.cells, tab.Rows[0].Cells[:len(tc.cells)]); diff != "" {
			t.Errorf("%s row (-want +got):\n%s", tc.plural, diff)
		}
	}
}

// Every short name resolves, through the same discovery and shortcut expansion kubectl uses.
func TestShortNamesResolve(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(server.Config)
	if err != nil {
		t.Fatal(err)
	}
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(cached), cached, func(string) {})
	for short, want := range map[string]string{
		"mdcc":                          "modeldatacacheconfigs",
		"iic":                           "inferenceimagecaches",
		"modeldatacacheconfig":          "modeldatacacheconfigs",
		"inferenceimagecache":           "inferenceimagecaches",
		"inferenceendpointconfig":       "inferenceendpointconfigs",
		"jumpstartmodel":                "jumpstartmodels",
		"modelweightscacheconfig":       "modelweightscacheconfigs",
		"modelweightscacheconfigs":      "modelweightscacheconfigs",
		"mic":                           "modelimagecaches",
		"modelimagecache":               "modelimagecaches",
		"modelimagecaches":              "modelimagecaches",
		"sagemakerendpointregistration": "sagemakerendpointregistrations",
		"igwc":                          "inferencegatewayconfigs",
	} {
		gvr, err := mapper.ResourceFor(schema.GroupVersionResource{Resource: short})
		if err != nil {
			t.Errorf("%s: %v", short, err)
			continue
		}
		if gvr.Group != inferencev1.GroupVersion.Group || gvr.Resource != want {
			t.Errorf("%s resolves to %v, want %s.%s", short, gvr, want, inferencev1.GroupVersion.Group)
		}
	}

	list, err := dc.ServerResourcesForGroupVersion(inferencev1.GroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list.APIResources {
		if r.Name == "modeldatacacheconfigs" && !slices.Equal(r.ShortNames, []string{"mdcc"}) {
			t.Errorf("modeldatacacheconfigs short names = %v", r.ShortNames)
		}
		if r.Name == "inferenceimagecaches" && !slices.Equal(r.ShortNames, []string{"iic"}) {
			t.Errorf("inferenceimagecaches short names = %v", r.ShortNames)
		}
		if r.Name == "modelimagecaches" && !slices.Equal(r.ShortNames, []string{"mic"}) {
			t.Errorf("modelimagecaches short names = %v (HyperPod's: mic)", r.ShortNames)
		}
	}
}

// An HPA or `kubectl scale` drives spec.replicas through /scale, and reads status.replicas
// and the selector back.
func TestInferenceEndpointConfigScaleSubresource(t *testing.T) {
	ctx := context.Background()
	o := builders.MakeInferenceEndpointConfig("default", "scaled").Obj()
	if err := server.Client.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Client.Delete(ctx, o) })
	o.Status.Replicas = 1
	o.Status.Selector = "app.kubernetes.io/instance=scaled"
	if err := server.Client.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}

	scale := &autoscalingv1.Scale{}
	if err := server.Client.SubResource("scale").Get(ctx, o, scale); err != nil {
		t.Fatal(err)
	}
	if scale.Spec.Replicas != 1 || scale.Status.Replicas != 1 || scale.Status.Selector != "app.kubernetes.io/instance=scaled" {
		t.Errorf("scale = spec %d, status %d, selector %q; want 1, 1, app.kubernetes.io/instance=scaled",
			scale.Spec.Replicas, scale.Status.Replicas, scale.Status.Selector)
	}

	scale.Spec.Replicas = 5
	if err := server.Client.SubResource("scale").Update(ctx, o, client.WithSubResourceBody(scale)); err != nil {
		t.Fatal(err)
	}
	got := &inferencev1.InferenceEndpointConfig{}
	if err := server.Client.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ptr.To[int32](5), got.Spec.Replicas); diff != "" {
		t.Errorf("spec.replicas after scaling (-want +got):\n%s", diff)
	}

	// Scaling below zero is refused by the same validation as the spec.
	scale.Spec.Replicas = -1
	if err := server.Client.SubResource("scale").Update(ctx, o, client.WithSubResourceBody(scale)); err == nil {
		t.Error("scale to -1 accepted")
	}
}
