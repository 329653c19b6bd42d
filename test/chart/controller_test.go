package chart

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// The controller runs on the RBAC the chart gives it, in a release namespace of another name
// than the default: it passes its start-up checks, elects itself leader and renews its Lease,
// watches what it watches, and serves a tenant's endpoint (its credentials and pull secret
// read, its image cache's DaemonSet made in the release namespace, its Deployment and Service
// made and patched in the tenant's), and nothing it does is forbidden. The API server's own
// authorizer holds it to the release namespace for Leases and DaemonSets.
func TestControllerRunsOnTheChartsRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns, tenant = "ml-serving-ops", "rbac-team"
	c := server.Client
	// The sources' endpoint refuses at once: the controller sizes a model from its source, and
	// nothing of this test leaves the machine.
	objs := renderIn(t, ns, "--set", "config.s3.endpoint=http://127.0.0.1:1")
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}},
		// The default service accounts a cluster's controller-manager would make.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "default"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example.com":{"auth":"dTpw"}}}`)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "prewarm-s3"},
			Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIAEXAMPLE"), "AWS_SECRET_ACCESS_KEY": []byte("secret")}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	installed := 0
	for _, u := range objs {
		if !slices.Contains([]string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap"}, u.GetKind()) &&
			(u.GetKind() != "Service" || u.GetName() != "prewarm-witness") {
			continue
		}
		if err := c.Create(ctx, u.DeepCopy()); err != nil {
			t.Fatalf("%s: %v", key(u), err)
		}
		if u.GetNamespace() == "" {
			// Cluster-scoped: another test renders the chart's and dry-runs their creation.
			t.Cleanup(func() {
				if err := c.Delete(context.Background(), u.DeepCopy()); err != nil {
					t.Errorf("deleting %s: %v", key(u), err)
				}
			})
		}
		installed++
	}
	if installed < 8 {
		t.Fatalf("created %d RBAC objects and ConfigMaps of the chart; the render lacks some", installed)
	}

	// The controller's ServiceAccount's token, as its pod would have it.
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := c.SubResource("token").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controllerSA}}, tr); err != nil {
		t.Fatal(err)
	}
	asController := rest.AnonymousClientConfig(server.Config)
	asController.BearerToken = tr.Status.Token
	sa, err := client.New(asController, client.Options{Scheme: testutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the API server holds the controller to the release namespace", func(t *testing.T) {
		for _, tc := range []struct {
			attrs authorizationv1.ResourceAttributes
			want  bool
		}{
			{authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: controller.LeaderElectionID}, true},
			{authorizationv1.ResourceAttributes{Namespace: ns, Verb: "watch", Group: "coordination.k8s.io", Resource: "leases"}, true},
			{authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "apps", Resource: "daemonsets"}, true},
			{authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "create", Group: "apps", Resource: "deployments"}, true},
			{authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "get", Resource: "secrets", Name: "prewarm-s3"}, true},
			// An agent's Lease: watched, never written.
			{authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "node-a"}, false},
			{authorizationv1.ResourceAttributes{Namespace: "kube-node-lease", Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Name: "node-a"}, false},
			{authorizationv1.ResourceAttributes{Namespace: "kube-node-lease", Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "node-a"}, false},
			{authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "kube-controller-manager"}, false},
			{authorizationv1.ResourceAttributes{Verb: "list", Group: "coordination.k8s.io", Resource: "leases"}, false},
			{authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "create", Group: "apps", Resource: "daemonsets"}, false},
			{authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "patch", Group: "apps", Resource: "daemonsets"}, false},
			{authorizationv1.ResourceAttributes{Verb: "list", Group: "apps", Resource: "daemonsets"}, false},
			{authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "list", Resource: "configmaps"}, false},
			{authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "list", Resource: "secrets"}, false},
			{authorizationv1.ResourceAttributes{Namespace: tenant, Verb: "delete", Group: "apps", Resource: "deployments"}, false},
			{authorizationv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}, false},
		} {
			ssar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &tc.attrs}}
			if err := sa.Create(ctx, ssar); err != nil {
				t.Fatal(err)
			}
			if ssar.Status.Allowed != tc.want {
				t.Errorf("%+v: allowed %t, want %t (%s)", tc.attrs, ssar.Status.Allowed, tc.want, ssar.Status.Reason)
			}
		}
	})

	// The controller, with the release's configuration and the Deployment's arguments.
	dir := t.TempDir()
	bin := filepath.Join(dir, "controller")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/controller")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/controller: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, asController); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig=" + kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0"}
	witnessArg := false
	for _, u := range objs {
		switch {
		case u.GetKind() == "ConfigMap" && u.GetName() == "prewarm-config":
			conf, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
			if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
		case u.GetKind() == "Deployment" && u.GetName() == "prewarm-controller":
			ctrs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			rendered, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
			for _, a := range rendered {
				if strings.HasPrefix(a, "--config=") {
					a = "--config=" + filepath.Join(dir, "config.yaml")
				}
				if strings.HasPrefix(a, "--witness-bind-address=") {
					witnessArg = true
					a = "--witness-bind-address=" + freeLoopback(t) // the chart's port, on loopback, free
				}
				args = append(args, a)
			}
		}
	}
	if !slices.Contains(args, "--leader-elect") || !witnessArg {
		t.Fatalf("the rendered controller does not elect a leader, or serves no witness: %v", args)
	}
	// As the chart's downward API gives it: the leader publishes it as the witness's endpoint
	// (a pod's address: the API server refuses a loopback one there).
	proc, err := testutil.StartProcessEnv(dir, "controller", bin, []string{"POD_IP=10.1.2.3"}, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			proc.Stop(30 * time.Second)
			stopped = true
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("the controller's log:\n%s", proc.LogTail(8000))
		}
	})
	running := func(what string, cond func() error) {
		t.Helper()
		if err := testutil.Until(ctx, 3*time.Minute, func() error {
			if done, err := proc.Exited(); done {
				t.Fatalf("the controller exited (%v) waiting for %s", err, what)
			}
			return cond()
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	running("the controller to lead and renew its Lease in the release namespace", func() error {
		l := &coordinationv1.Lease{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.LeaderElectionID}, l); err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || l.Spec.AcquireTime == nil || l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
			return errString("not renewed since it was acquired")
		}
		return nil
	})

	running("the leader to publish itself as the witness's endpoint in the release namespace, owned by its Service", func() error {
		svc := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "prewarm-witness"}, svc); err != nil {
			return err
		}
		s := &discoveryv1.EndpointSlice{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "prewarm-witness"}, s); err != nil {
			return err
		}
		if len(s.Endpoints) != 1 || len(s.Endpoints[0].Addresses) != 1 || s.Endpoints[0].Addresses[0] != "10.1.2.3" {
			return fmt.Errorf("endpoints %+v", s.Endpoints)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != svc.UID {
			return fmt.Errorf("owners %+v, want the Service %s", s.OwnerReferences, svc.UID)
		}
		return nil
	})

	parent := builders.MakeInferenceEndpointConfig(tenant, "served").Obj()
	if err := c.Create(ctx, parent); err != nil {
		t.Fatal(err)
	}
	// An image cache a tenant writes in its own namespace gets no DaemonSet there.
	foreign := builders.MakeInferenceImageCache(tenant, "iic-own")
	foreign.Spec.ParentReferences = []inferencev1.ParentReference{{Kind: "InferenceEndpointConfig", Namespace: tenant, Name: "served", UID: string(parent.UID)}}
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}

	var cache inferencev1.InferenceImageCache
	running("the endpoint's image cache, with its DaemonSet and pull secret, in the release namespace", func() error {
		list := &inferencev1.InferenceImageCacheList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(list.Items) != 1 || len(list.Items[0].Spec.ImagePullSecrets) != 1 {
			return errString("no image cache with the tenant's pull secret yet")
		}
		cache = list.Items[0]
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cache.Spec.ImagePullSecrets[0].Name}, &corev1.Secret{}); err != nil {
			return err
		}
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cache.Name}, &appsv1.DaemonSet{})
	})
	running("the endpoint's Deployment and Service in the tenant's namespace", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(parent), &corev1.Service{}); err != nil {
			return err
		}
		return c.Get(ctx, client.ObjectKeyFromObject(parent), &appsv1.Deployment{})
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(parent), parent); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(parent.DeepCopy())
	parent.Spec.Replicas = ptr.To[int32](3)
	if err := c.Patch(ctx, parent, patch); err != nil {
		t.Fatal(err)
	}
	running("the Deployment patched to the endpoint's replicas", func() error {
		dep := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(parent), dep); err != nil {
			return err
		}
		if ptr.Deref(dep.Spec.Replicas, 1) != 3 {
			return errString("replicas not patched yet")
		}
		return nil
	})
	running("the tenant's own image cache refused, naming the release namespace", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
			return err
		}
		ready := apimeta.FindStatusCondition(foreign.Status.Conditions, inferencev1.ConditionReady)
		if ready == nil || ready.Reason != imagecache.ReasonNotInOperatorNamespace {
			return errString("not refused yet")
		}
		if !strings.Contains(ready.Message, ns) || foreign.Status.Phase != inferencev1.ImageFailed {
			t.Errorf("the refusal: phase %s, %q; want Failed, naming %s", foreign.Status.Phase, ready.Message, ns)
		}
		return nil
	})
	dsList := &appsv1.DaemonSetList{}
	if err := c.List(ctx, dsList, client.InNamespace(tenant)); err != nil {
		t.Fatal(err)
	}
	if len(dsList.Items) > 0 || len(foreign.Finalizers) > 0 {
		t.Errorf("the tenant's image cache got DaemonSets %v, finalizers %v; want none", dsList.Items, foreign.Finalizers)
	}

	stop()
	log, err := os.ReadFile(proc.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("the controller was refused something: %s", line)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// writeKubeconfig writes a kubeconfig for cfg's server, with its CA and bearer token.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["controller"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "controller"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// freeLoopback is a loopback address whose port was free a moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
