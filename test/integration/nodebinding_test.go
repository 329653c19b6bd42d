package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/cacheref"
	"github.com/prewarm/prewarm/internal/testutil"
)

// createManifests creates, for real, the objects of the given config/ files whose kinds are
// listed (the rest, e.g. the DaemonSet, is skipped).
func createManifests(t *testing.T, ctx context.Context, kinds map[string]bool, files ...string) {
	t.Helper()
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join(server.Root, "config", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range decodeManifests(raw) {
			if !kinds[u.GetKind()] {
				continue
			}
			if err := server.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s/%s from %s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), f, err)
			}
		}
	}
}

// An agent may write the status of its own node's NodeCache only: checked with real service
// account tokens that the API server binds to a pod on a node (the kubelet's projected token),
// the shipped RBAC and the shipped ValidatingAdmissionPolicy.
func TestAgentWritesOnlyItsOwnNodeCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := server.Client
	ns := inferencev1.DefaultOperatorNamespace
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	createManifests(t, ctx, map[string]bool{
		"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
		"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	}, "agent/daemonset.yaml", "rbac/agent/role.yaml", "agent/node-binding.yaml")

	for _, n := range []string{"binding-a", "binding-b", "binding-probe"} {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's pod on binding-a, as the DaemonSet would make it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prewarm-agent-binding-a"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "prewarm-agent", NodeName: "binding-a",
			Containers: []corev1.Container{{Name: "agent", Image: "prewarm/agent:test"}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(server.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(bound *authenticationv1.BoundObjectReference) client.Client {
		t.Helper()
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "prewarm-agent", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound, ExpirationSeconds: ptr.To[int64](600)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg := rest.AnonymousClientConfig(server.Config)
		cfg.BearerToken = tr.Status.Token
		agent, err := client.New(cfg, client.Options{Scheme: testutil.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return agent
	}
	onA := token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	unbound := token(nil)

	writeStatus := func(as client.Client, node string) error {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := as.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
			return err
		}
		patch := client.MergeFrom(nc.DeepCopy())
		nc.Status.AgentVersion = "test"
		nc.Status.Caches = []prewarmv1alpha1.CacheStatus{{UID: "11111111-1111-4111-8111-111111111111", CopyStatus: inferencev1.CopyStatus{State: inferencev1.CacheReady, Reason: prewarmv1alpha1.ReasonVerified}}}
		return as.Status().Patch(ctx, nc, patch)
	}
	// The policy takes effect once the API server has loaded it: wait for the first denial, on
	// a NodeCache of its own, so that writes admitted before that leave binding-b untouched.
	if err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		err := writeStatus(onA, "binding-probe")
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	}); err != nil {
		t.Fatalf("the policy never refused the agent of binding-a a write to another node's NodeCache: %v", err)
	}
	err2 := writeStatus(onA, "binding-b")
	if !apierrors.IsForbidden(err2) && !apierrors.IsInvalid(err2) {
		t.Fatalf("the agent of binding-a wrote binding-b's status: %v", err2)
	}
	if !strings.Contains(err2.Error(), "the prewarm agent of node binding-a may not write the NodeCache of node binding-b") {
		t.Errorf("denial = %v; want it to name both nodes", err2)
	}
	if err := writeStatus(onA, "binding-a"); err != nil {
		t.Errorf("the agent of binding-a could not write its own status: %v", err)
	}
	if err := writeStatus(unbound, "binding-a"); err == nil || !strings.Contains(err.Error(), "names no node") {
		t.Errorf("a token bound to no pod wrote a status: %v; want it refused", err)
	}
	// Its Lease likewise: its own node's only, in prewarm's namespace only (RBAC).
	lease := func(namespace, node string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("prewarm-agent-binding-a"), LeaseDurationSeconds: ptr.To[int32](180)}}
	}
	if err := onA.Create(ctx, lease(ns, "binding-a")); err != nil {
		t.Errorf("the agent of binding-a could not create its own Lease: %v", err)
	}
	if err := onA.Create(ctx, lease(ns, "binding-b")); err == nil || !strings.Contains(err.Error(), "the prewarm agent of node binding-a may not write the Lease of node binding-b") {
		t.Errorf("the agent of binding-a created binding-b's Lease: %v; want it refused, naming both nodes", err)
	}
	if err := onA.Create(ctx, lease("default", "binding-a")); !apierrors.IsForbidden(err) {
		t.Errorf("the agent of binding-a created a Lease outside prewarm's namespace: %v; want forbidden", err)
	}
	// RBAC: the agents read no Secret, not even in prewarm's own namespace (credentials reach
	// them sealed to each node's key, in the NodeCache).
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "some-credentials"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := onA.Get(ctx, client.ObjectKey{Namespace: ns, Name: "some-credentials"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("an agent read a Secret in %s: %v; want forbidden", ns, err)
	}
	// RBAC: the agents cannot change what a node is asked to hold.
	nc := &prewarmv1alpha1.NodeCache{}
	if err := onA.Get(ctx, client.ObjectKey{Name: "binding-a"}, nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.Spec.Caches = []prewarmv1alpha1.CacheRequest{{UID: "11111111-1111-4111-8111-111111111111", Namespace: "x", Name: "y", Root: "/etc", Source: prewarmv1alpha1.CacheSource{Type: "s3", Bucket: "b", Prefix: "p"}}}
	if err := onA.Patch(ctx, nc, patch); !apierrors.IsForbidden(err) {
		t.Errorf("an agent changed its NodeCache's spec: %v; want forbidden", err)
	}
	// Nor ask for caches by creating its NodeCache with them (peers serve the agents of the
	// nodes asked): created bare, it is admitted.
	if err := c.Delete(ctx, &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "binding-a"}}); err != nil {
		t.Fatal(err)
	}
	forged := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "binding-a"}, Spec: *nc.Spec.DeepCopy()}
	if err := onA.Create(ctx, forged); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || err != nil && !strings.Contains(err.Error(), "only the controller asks nodes for caches") {
		t.Errorf("an agent created its NodeCache asking for a cache: %v; want it refused", err)
	}
	if err := onA.Create(ctx, &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "binding-a"}}); err != nil {
		t.Errorf("an agent could not create its own NodeCache: %v", err)
	}
	// The status that was refused is not there.
	got := &prewarmv1alpha1.NodeCache{}
	if err := c.Get(ctx, client.ObjectKey{Name: "binding-b"}, got); err != nil || len(got.Status.Caches) != 0 {
		t.Errorf("binding-b's status = %+v (%v); want untouched", got.Status, err)
	}

	// Events: an agent records them only about pods, signed as its own pod (no posing as the
	// kubelet or the controller, no notes on other objects).
	n := 0
	event := func(as client.Client, kind, controller, instance string) error {
		n++
		ev := &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("agent-event-%d", n)},
			EventTime:  metav1.NowMicro(), Action: "Mount", Reason: "CacheMounted", Type: corev1.EventTypeNormal, Note: "test",
			ReportingController: controller, ReportingInstance: instance,
			Regarding: corev1.ObjectReference{Kind: kind, APIVersion: "v1", Namespace: "default", Name: "some-pod"},
		}
		if kind == "Node" {
			ev.Regarding.Namespace = ""
		}
		return as.Create(ctx, ev)
	}
	own := "prewarm-agent-" + pod.Name
	if err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		err := event(onA, "Node", "prewarm-agent", own)
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	}); err != nil {
		t.Fatalf("the events policy never refused an agent's event about a Node: %v", err)
	}
	if err := event(onA, "Pod", "prewarm-agent", own); err != nil {
		t.Errorf("the agent of binding-a could not record an event about a pod as itself: %v", err)
	}
	if err := event(onA, "Pod", "kubelet", "kubelet-binding-b"); err == nil || !strings.Contains(err.Error(), "must name it") {
		t.Errorf("an agent recorded an event as the kubelet: %v; want it refused", err)
	}
	if err := event(onA, "Pod", "prewarm-agent", "prewarm-agent-prewarm-agent-binding-b"); err == nil {
		t.Error("an agent recorded an event as another node's agent; want it refused")
	}
	if err := event(unbound, "Pod", "prewarm-agent", own); err == nil || !strings.Contains(err.Error(), "names none") {
		t.Errorf("a token bound to no pod recorded an event: %v; want it refused", err)
	}

	// The cache a pod's volume names by name: the agent's identity reads the two cache objects
	// it resolves the name through, one by one, and may not list or change them.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "binding-tenant"}}); err != nil {
		t.Fatal(err)
	}
	mw := &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "binding-tenant", Name: "binding-named"},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{ModelSourceConfig: inferencev1.ModelSourceConfig{
			ModelSourceType: inferencev1.ModelSourceS3, S3Storage: &inferencev1.S3Storage{BucketName: "example-bucket"}, ModelLocation: "m",
		}},
	}
	if err := c.Create(ctx, mw); err != nil {
		t.Fatal(err)
	}
	mw.Status.CacheName = "binding-named-cache"
	if err := c.Status().Update(ctx, mw); err != nil {
		t.Fatal(err)
	}
	// Read as far as the ModelDataCacheConfig, which is not there: no refusal of the reads.
	if _, _, err := cacheref.Resolve(ctx, onA, "binding-tenant", "binding-named"); err != nil && !errors.Is(err, cacheref.ErrNotReady) {
		t.Errorf("the agent resolving a cache by name: %v, want both objects read (the cache not there yet)", err)
	}
	if err := onA.List(ctx, &inferencev1.ModelWeightsCacheConfigList{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent listed ModelWeightsCacheConfigs: %v, want forbidden", err)
	}
	if err := onA.Delete(ctx, mw); !apierrors.IsForbidden(err) {
		t.Errorf("the agent deleted a ModelWeightsCacheConfig: %v, want forbidden", err)
	}
}
