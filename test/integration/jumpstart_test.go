package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// The JumpStartModel reconciler, called directly against the real API server: a model not in
// the catalog and a gated model without the EULA say so and make nothing; a catalog model gets
// its weights cache (the catalog's source, the JumpStartModel as its parent) and, once the gate
// opens, a Deployment running the catalog's image.
func TestJumpStartModelReconcile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "jsm-operator", "jsm")
	// The catalog's model is a Hugging Face one: prewarm may read it anonymously or with the
	// parent's token, so no source rule is needed.
	const repo, commit = "meta-llama/Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659"
	if err := c.Create(ctx, builders.JumpStartCatalog(rc.cfg.OperatorNamespace, repo, commit)); err != nil {
		t.Fatal(err)
	}
	jr := &serving.JumpStartReconciler{Reconciler: rc.ep, CatalogName: "prewarm-jumpstart-catalog"}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "jsm", Name: "hf-token"},
		Data: map[string][]byte{"token": []byte("hf_jsm")}}); err != nil {
		t.Fatal(err)
	}

	reconcile := func(j *inferencev1.JumpStartModel) *inferencev1.JumpStartModel {
		t.Helper()
		key := client.ObjectKeyFromObject(j)
		rc.settle(t, ctx, "jsm", func() error {
			_, err := jr.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			return err
		})
		got := &inferencev1.JumpStartModel{}
		if err := c.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	nothingMade := func(name string) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKey{Namespace: "jsm", Name: name}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a Deployment was made: %v", name, err)
		}
	}

	unknown := builders.MakeJumpStartModel("jsm", "unknown").Obj()
	unknown.Spec.Model.ModelID = "huggingface-llm-nothing-like-it"
	if err := c.Create(ctx, unknown); err != nil {
		t.Fatal(err)
	}
	got := reconcile(unknown)
	if cond := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady); cond == nil || cond.Reason != inferencev1.ReasonModelNotInCatalog {
		t.Errorf("a model not in the catalog: %+v; want ModelNotInCatalog", cond)
	}
	nothingMade("unknown")

	noEULA := builders.MakeJumpStartModel("jsm", "no-eula").Obj()
	noEULA.Spec.Model.AcceptEula = false
	if err := c.Create(ctx, noEULA); err != nil {
		t.Fatal(err)
	}
	got = reconcile(noEULA)
	if cond := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady); cond == nil || cond.Reason != inferencev1.ReasonEULANotAccepted {
		t.Errorf("a gated model without the EULA: %+v; want EULANotAccepted", cond)
	}
	nothingMade("no-eula")

	served := builders.MakeJumpStartModel("jsm", "served").Obj()
	served.Spec.Server.InstanceType = "ml.g5.48xlarge" // no node of the API server: the gate opens
	if err := c.Create(ctx, served); err != nil {
		t.Fatal(err)
	}
	got = reconcile(served)
	caches := &inferencev1.ModelDataCacheConfigList{}
	if err := c.List(ctx, caches, client.InNamespace("jsm"), client.MatchingLabels{controller.ParentUIDLabel: string(served.UID)}); err != nil {
		t.Fatal(err)
	}
	if len(caches.Items) != 1 {
		t.Fatalf("%d weights caches; want 1", len(caches.Items))
	}
	m := caches.Items[0]
	// The JumpStartModel as its parent; the catalog's pinned source and the token Secret the
	// catalog names (in the JumpStartModel's namespace); its instance type.
	if diff := cmp.Diff(inferencev1.ModelDataCacheConfigSpec{
		ParentReference: inferencev1.ParentReference{Kind: "JumpStartModel", Namespace: "jsm", Name: "served", UID: string(served.UID)},
		ModelSourceConfig: inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceHuggingFace,
			HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: repo, CommitSHA: commit, TokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}},
			PrefetchEnabled:  ptr.To(false)},
		HostPath:  inferencev1.DefaultWeightsCacheHostPath,
		Placement: inferencev1.Placement{InstanceTypes: []string{"ml.g5.48xlarge"}},
	}, m.Spec); diff != "" {
		t.Errorf("the JumpStartModel's weights cache (-want +got):\n%s", diff)
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(served), dep); err != nil {
		t.Fatalf("no Deployment once the gate opened: %v (status %+v)", err, got.Status)
	}
	if img := dep.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "vllm/vllm-openai") || !metav1.IsControlledBy(dep, served) {
		t.Errorf("Deployment image %s, owners %+v; want the catalog's image, owned by the JumpStartModel", img, dep.OwnerReferences)
	}
}
