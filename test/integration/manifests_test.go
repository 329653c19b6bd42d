package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/config"
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
		if u.GetKind() == "PriorityClass" {
			// The test harness installs these, from the same file, as an install does: the API
			// server has taken them.
			if err := server.Client.Get(ctx, client.ObjectKeyFromObject(u), u.DeepCopy()); err != nil {
				t.Errorf("%s: PriorityClass %s: %v", u.GetAnnotations()["source"], u.GetName(), err)
			}
			continue
		}
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

// The install's operator configuration parses strictly, both binaries read it, and the agent
// DaemonSet mounts every host path it names (the cache roots read-write, the FSx mounts
// read-only): a configuration that names a path the agents cannot see would fail on every node.
func TestInstallConfigurationIsConsistent(t *testing.T) {
	var objs []*unstructured.Unstructured
	for _, f := range []string{"manager/config.yaml", "manager/controller.yaml", "agent/daemonset.yaml"} {
		raw, err := os.ReadFile(filepath.Join(server.Root, "config", f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeManifests(raw)...)
	}
	if err := installConsistent(objs); err != nil {
		t.Error(err)
	}

	// The check itself: an FSx file system the DaemonSet does not mount is caught.
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" && u.GetName() == "prewarm-config" {
			conf, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
			conf += "fsx:\n  - fileSystemId: fs-0123456789abcdef0\n    mountPath: /fsx/team-a\n"
			if err := unstructured.SetNestedField(u.Object, conf, "data", "config.yaml"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := installConsistent(objs); err == nil || !strings.Contains(err.Error(), "/fsx/team-a") {
		t.Errorf("an FSx mount the agents do not mount: %v; want it named", err)
	}
}

func installConsistent(objs []*unstructured.Unstructured) error {
	var (
		op      config.OperatorConfiguration
		haveCfg bool
		errs    []error
	)
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" && u.GetName() == "prewarm-config" {
			conf, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
			var err error
			if op, err = config.Parse([]byte(conf)); err != nil {
				return err
			}
			haveCfg = true
		}
	}
	if !haveCfg {
		return errors.New("no prewarm-config ConfigMap")
	}
	for _, u := range objs {
		if u.GetKind() != "Deployment" && u.GetKind() != "DaemonSet" {
			continue
		}
		var spec corev1.PodSpec
		raw, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
			return err
		}
		c := spec.Containers[0]
		if !slices.Contains(c.Args, "--config="+config.File) {
			errs = append(errs, fmt.Errorf("%s %s: does not pass --config=%s", u.GetKind(), u.GetName(), config.File))
		}
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range c.VolumeMounts {
			mounts[m.MountPath] = m
		}
		hostPaths := map[string]string{}
		for _, v := range spec.Volumes {
			switch {
			case v.ConfigMap != nil && v.ConfigMap.Name == "prewarm-config":
				hostPaths["configmap"] = v.Name
			case v.HostPath != nil:
				hostPaths[v.HostPath.Path] = v.Name
			}
		}
		if m, ok := mounts[filepath.Dir(config.File)]; !ok || m.Name != hostPaths["configmap"] {
			errs = append(errs, fmt.Errorf("%s %s: does not mount the prewarm-config ConfigMap at %s", u.GetKind(), u.GetName(), filepath.Dir(config.File)))
		}
		if u.GetKind() != "DaemonSet" {
			continue
		}
		for _, r := range op.Roots() {
			if m, ok := mounts[r]; !ok || m.Name != hostPaths[r] || m.ReadOnly {
				errs = append(errs, fmt.Errorf("the agent DaemonSet does not mount the cache root %s read-write at its own path", r))
			}
		}
		for _, f := range op.FSx {
			if m, ok := mounts[f.MountPath]; !ok || m.Name != hostPaths[f.MountPath] || !m.ReadOnly {
				errs = append(errs, fmt.Errorf("the agent DaemonSet does not mount FSx %s read-only at %s", f.FileSystemID, f.MountPath))
			}
		}
	}
	return errors.Join(errs...)
}
