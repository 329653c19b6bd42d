package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// The install manifests (config/default) are accepted by the API server as they are: RBAC,
// the controller Deployment and the agent DaemonSet (server-side dry run), and the
// kustomization lists every CRD.
func TestInstallManifestsAreValid(t *testing.T) {
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join(server.Root, "config", "default", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	crds, err := filepath.Glob(filepath.Join(server.Root, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if !slices.Contains(k.Resources, "../crd/bases/"+filepath.Base(crd)) {
			t.Errorf("config/default/kustomization.yaml does not list %s", filepath.Base(crd))
		}
	}
	kinds := map[string]int{}
	var objs []*unstructured.Unstructured
	for _, res := range k.Resources {
		if strings.HasPrefix(res, "../crd/") {
			continue // installed by the test harness already
		}
		raw, err := os.ReadFile(filepath.Join(server.Root, "config", "default", res))
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range decodeManifests(raw) {
			u.SetAnnotations(map[string]string{"source": res})
			objs = append(objs, u)
		}
	}
	// Namespaces first, as kustomize orders them: the namespaced objects need them to exist,
	// even in a dry run.
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return cmpBool(b.GetKind() == "Namespace", a.GetKind() == "Namespace")
	})
	for _, u := range objs {
		kinds[u.GetKind()]++
		opts := []client.CreateOption{client.FieldValidation("Strict")}
		if u.GetKind() != "Namespace" {
			opts = append(opts, client.DryRunAll)
		}
		if err := server.Client.Create(ctx, u, opts...); err != nil {
			t.Errorf("%s: %s %s: %v", u.GetAnnotations()["source"], u.GetKind(), u.GetName(), err)
		}
	}
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Deployment", "DaemonSet", "Namespace"} {
		if kinds[kind] == 0 {
			t.Errorf("the install manifests have no %s", kind)
		}
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// decodeManifests splits a multi-document YAML file into its (non-empty) objects.
func decodeManifests(raw []byte) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			return out
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}
