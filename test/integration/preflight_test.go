package integration

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/preflight"
)

// The controller refuses to start where another operator owns the API: beside the HyperPod
// inference operator's controller, or on CRDs prewarm did not install.
func TestControllerRefusesAnotherOperatorsAPI(t *testing.T) {
	ctx := context.Background()
	c := server.Client
	if err := preflight.CheckAPIOwnership(ctx, c); err != nil {
		t.Fatalf("on prewarm's own CRDs: %v", err)
	}

	// HyperPod's controller, as its chart deploys it.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hyperpod-inference"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"control-plane": "hyperpod-inference-operator-controller-manager", "app.kubernetes.io/name": "hyperpod-inference-operator"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "hyperpod-inference-operator-controller-manager", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"control-plane": labels["control-plane"]}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "hyperpod-inference-operator:latest"}}}},
		},
	}
	if err := c.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	err := preflight.CheckAPIOwnership(ctx, c)
	if err == nil || !strings.Contains(err.Error(), "hyperpod-inference/hyperpod-inference-operator-controller-manager") ||
		!strings.Contains(err.Error(), "Running beside HyperPod") {
		t.Errorf("beside HyperPod's controller: %v; want a refusal naming it and the docs", err)
	}
	if err := c.Delete(ctx, dep); err != nil {
		t.Fatal(err)
	}

	// A CRD of the group that another chart installed: no prewarm label, Helm's release
	// annotations and HyperPod's CA injection.
	crd := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}}
	name := "jumpstartmodels.inference.sagemaker.aws.amazon.com"
	if err := c.Get(ctx, types.NamespacedName{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	restore := crd.DeepCopy()
	patch := client.MergeFrom(crd.DeepCopy())
	delete(crd.Labels, inferencev1.APILabel)
	crd.Annotations["meta.helm.sh/release-name"] = "hyperpod"
	crd.Annotations["meta.helm.sh/release-namespace"] = "kube-system"
	crd.Annotations["cert-manager.io/inject-ca-from"] = "hyperpod-inference-system/serving-cert"
	if err := c.Patch(ctx, crd, patch); err != nil {
		t.Fatal(err)
	}
	defer func() {
		back := client.MergeFrom(crd.DeepCopy())
		crd.Labels, crd.Annotations = restore.Labels, restore.Annotations
		if err := c.Patch(ctx, crd, back); err != nil {
			t.Error(err)
		}
	}()
	err = preflight.CheckAPIOwnership(ctx, c)
	for _, want := range []string{name + " was not installed by prewarm", "Helm release kube-system/hyperpod", "hyperpod-inference-system/serving-cert"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("on another chart's CRD: %v; want it to say %q", err, want)
		}
	}
}

// placement.extendedResourceTolerations auto asks the API server: this one runs no
// ExtendedResourceToleration plugin (it is off by default), so the pods carry no such toleration;
// on and off are taken as they are.
func TestExtendedResourceTolerationsAreResolved(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		mode string
		want bool
	}{{config.ExtendedResourceTolerationsAuto, false}, {config.ExtendedResourceTolerationsOn, true}, {config.ExtendedResourceTolerationsOff, false}} {
		cfg := controller.Config{OperatorConfiguration: config.OperatorConfiguration{OperatorNamespace: "default"}}
		cfg.Placement.ExtendedResourceTolerations = tc.mode
		cfg.Defaults()
		decided, err := preflight.ResolveExtendedResourceTolerations(ctx, server.Client, &cfg)
		if err != nil || cfg.ExtendedResourceTolerations != tc.want {
			t.Errorf("%s: %v (%q), err %v; want %v", tc.mode, cfg.ExtendedResourceTolerations, decided, err, tc.want)
		}
	}
	// A namespace that does not exist: the dry run fails, and the pods carry the tolerations.
	cfg := controller.Config{OperatorConfiguration: config.OperatorConfiguration{OperatorNamespace: "no-such-namespace"}}
	cfg.Defaults()
	if _, err := preflight.ResolveExtendedResourceTolerations(ctx, server.Client, &cfg); err == nil || !cfg.ExtendedResourceTolerations {
		t.Errorf("with the dry run refused: %v, err %v; want on, and the reason", cfg.ExtendedResourceTolerations, err)
	}
}
