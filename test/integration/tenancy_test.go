package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// prewarm reads a source with its own identity only where the operator configuration allows
// it for the parent's namespace; any other S3 source is read with the namespace's own
// credentials, sealed to each node's agent so that no other agent can open them, or not at all,
// saying why. Reconciled against the real API server.
func TestSourcesAreReadWithTheNamespacesOwnRights(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "tenancy-operator", "tenant-a", "tenant-b")
	rc.wc.Config.SourceAccess = []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: "shared-models"}}}
	rc.wc.Config.S3.CredentialsSecret = "prewarm-s3"
	const node = "tenancy-node"
	upNode(t, ctx, node, "ml.g6.48xlarge")

	// The node's agent has published its key.
	key, err := credentials.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	publish := func(k *credentials.Key) {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			nc = &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}
			if err := c.Create(ctx, nc); err != nil {
				t.Fatal(err)
			}
		}
		nc.Status.CredentialsKey = k.Public()
		if err := c.Status().Update(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	publish(key)

	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "prewarm-s3"},
		Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIATENANTB"), "AWS_SECRET_ACCESS_KEY": []byte("tenant-b-secret")}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "hf-token"},
		Data: map[string][]byte{"token": []byte("hf_tenant_a")}}); err != nil {
		t.Fatal(err)
	}

	cache := func(ns, name string, src inferencev1.ModelSourceConfig) *inferencev1.ModelDataCacheConfig {
		t.Helper()
		parent := builders.MakeInferenceEndpointConfig(ns, name).Obj()
		parent.Spec.InstanceType = "ml.g6.48xlarge"
		parent.Spec.ModelSourceConfig = src
		if err := c.Create(ctx, parent); err != nil {
			t.Fatal(err)
		}
		m := builders.MakeModelDataCacheConfig(ns, name+"-cache")
		m.Spec.ModelSourceConfig = src
		m.Spec.Placement = inferencev1.Placement{InstanceTypes: []string{"ml.g6.48xlarge"}}
		madeBy(m, parent)
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	reconcile := func(m *inferencev1.ModelDataCacheConfig) *inferencev1.ModelDataCacheConfig {
		t.Helper()
		return rc.cache(t, ctx, m)
	}
	request := func(m *inferencev1.ModelDataCacheConfig) *prewarmv1alpha1.CacheRequest {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		for _, e := range nc.Spec.Caches {
			if e.UID == string(m.UID) {
				return &e
			}
		}
		return nil
	}
	s3 := func(bucket string) inferencev1.ModelSourceConfig {
		return inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceS3,
			S3Storage: &inferencev1.S3Storage{BucketName: bucket, Region: "us-west-2"}, ModelLocation: "models/m"}
	}

	shared := reconcile(cache("tenant-a", "shared", s3("shared-models")))
	if r := request(shared); r == nil || r.Credentials != nil {
		t.Errorf("an allowed source: request %+v; want it asked, read with the agents' identity", r)
	}

	// Once a node holds it, the cache is pinned to that content revision: every node's request
	// names it.
	shared.Status.ResolvedRevision = "sha256:held-by-the-first-node"
	if err := c.Status().Update(ctx, shared); err != nil {
		t.Fatal(err)
	}
	shared = reconcile(shared)
	if r := request(shared); r == nil || r.Source.Revision != "sha256:held-by-the-first-node" || shared.Status.ResolvedRevision != "sha256:held-by-the-first-node" {
		t.Errorf("a pinned cache: request %+v, resolved %q; want the request pinned to the revision", r, shared.Status.ResolvedRevision)
	}

	private := reconcile(cache("tenant-a", "private", s3("tenant-b-models")))
	cond := meta.FindStatusCondition(private.Status.Conditions, inferencev1.ConditionReady)
	if r := request(private); r != nil || private.Status.State != inferencev1.CacheFailed || cond == nil ||
		cond.Reason != inferencev1.ReasonSourceNotAllowed || !strings.Contains(cond.Message, "namespace tenant-a has no Secret prewarm-s3") {
		t.Errorf("a source prewarm may not read for tenant-a, which has no credentials: request %+v, state %s, condition %+v; want not asked, SourceNotAllowed saying why",
			r, private.Status.State, cond)
	}

	own := reconcile(cache("tenant-b", "own", s3("tenant-b-models")))
	r := request(own)
	if r == nil || r.Credentials == nil {
		t.Fatalf("a source read with tenant-b's own credentials: request %+v; want it asked with sealed credentials", r)
	}
	got, err := key.Open(node, string(own.UID), r.Credentials)
	if err != nil || got.AWSAccessKeyID != "AKIATENANTB" || got.AWSSecretAccessKey != "tenant-b-secret" {
		t.Errorf("the node's agent opens %+v, %v; want tenant-b's credentials", got, err)
	}
	other, _ := credentials.NewKey()
	if _, err := other.Open(node, string(own.UID), r.Credentials); err == nil {
		t.Error("another agent's key opened the credentials")
	}

	hf := reconcile(cache("tenant-a", "gated", inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceHuggingFace,
		HuggingFaceModel: &inferencev1.HuggingFaceModel{ModelID: "org/gated", CommitSHA: strings.Repeat("b", 40), TokenSecretRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf-token"}, Key: "token"}}}))
	r = request(hf)
	if r == nil || r.Credentials == nil {
		t.Fatalf("a gated model: request %+v; want the token sealed to the node", r)
	}
	if got, err := key.Open(node, string(hf.UID), r.Credentials); err != nil || got.HFToken != "hf_tenant_a" {
		t.Errorf("the node's agent opens %+v, %v; want tenant-a's token", got, err)
	}
	secrets := &corev1.SecretList{}
	if err := c.List(ctx, secrets, client.InNamespace(rc.cfg.OperatorNamespace)); err != nil || len(secrets.Items) != 0 {
		t.Errorf("the operator namespace holds %d Secrets (%v); want no copy of any tenant's credentials", len(secrets.Items), err)
	}

	// The agent restarts with a new key: the credentials are sealed to it; untouched otherwise.
	before := request(own).Credentials.Sealed
	reconcile(own)
	if request(own).Credentials.Sealed != before {
		t.Error("unchanged credentials were sealed again: every reconcile would rewrite the NodeCache")
	}
	newKey, _ := credentials.NewKey()
	publish(newKey)
	reconcile(own)
	if got, err := newKey.Open(node, string(own.UID), request(own).Credentials); err != nil || got.AWSAccessKeyID != "AKIATENANTB" {
		t.Errorf("after the agent's new key: %+v, %v; want the credentials sealed to it", got, err)
	}
}
