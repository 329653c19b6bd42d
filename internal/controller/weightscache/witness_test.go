package weightscache

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// The witness reads a cache's source only for a node the controller asks for it, only an S3
// source, and with the cache's namespace's own credentials (read once a minute, not per read).
func TestTheWitnessReadsOnlyWhatANodeIsAskedFor(t *testing.T) {
	const (
		s3UID  = "11111111-1111-4111-8111-111111111111"
		fsxUID = "22222222-2222-4222-8222-222222222222"
		noKeys = "33333333-3333-4333-8333-333333333333"
	)
	cache := func(ns, name, uid string) *inferencev1.ModelDataCacheConfig {
		return &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	}
	s3 := prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "models", Prefix: "llama", Region: "us-east-1"}
	asked := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{
		{UID: s3UID, Namespace: "team-a", Name: "llama", Source: s3},
		{UID: fsxUID, Namespace: "team-a", Name: "fsx", Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx}},
		{UID: noKeys, Namespace: "team-b", Name: "llama", Source: s3},
	}}}
	other := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "gpu-2"}}
	keys := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "s3-credentials"},
		Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIA"), "AWS_SECRET_ACCESS_KEY": []byte("secret")}}
	var secretReads atomic.Int64
	users := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(keys).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				secretReads.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	op := config.Default()
	op.S3.CredentialsSecret = "s3-credentials"
	op.S3.Endpoint = "http://127.0.0.1:1" // opened, never read here
	r := &Reconciler{
		Client: fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(asked, other,
			cache("team-a", "llama", s3UID), cache("team-a", "fsx", fsxUID), cache("team-b", "llama", noKeys)).Build(),
		APIReader: users,
		Config:    controller.Config{OperatorConfiguration: op},
	}
	ctx := context.Background()

	for range 3 {
		src, err := r.WitnessSource(ctx, "gpu-1", s3UID)
		if err != nil || src == nil || !strings.Contains(src.String(), "models") {
			t.Fatalf("the asked node's S3 cache: %v, %v; want its source", src, err)
		}
	}
	if n := secretReads.Load(); n != 1 {
		t.Errorf("the namespace's credentials were read %d times for 3 reads; want once (kept for %s)", n, witnessTTL)
	}
	for _, tc := range []struct {
		node, uid, why string
		want           error
	}{
		{"gpu-2", s3UID, "is not asked for cache", witness.ErrForbidden},
		{"gpu-3", s3UID, "is asked for no cache", witness.ErrForbidden},
		{"gpu-1", "44444444-4444-4444-8444-444444444444", "is not asked for cache", witness.ErrForbidden},
		{"gpu-1", fsxUID, "not read through the witness", witness.ErrForbidden},
		{"gpu-1", noKeys, "team-b has no Secret s3-credentials", witness.ErrForbidden},
	} {
		src, err := r.WitnessSource(ctx, tc.node, tc.uid)
		if src != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s reading %s: %v, %v; want %v saying %q", tc.node, tc.uid, src, err, tc.want, tc.why)
		}
	}
	// A cache deleted and made again under its name is another cache: the request for the old
	// UID does not reach the new one's source.
	if err := r.Client.Delete(ctx, cache("team-a", "llama", s3UID)); err != nil {
		t.Fatal(err)
	}
	if err := r.Client.Create(ctx, cache("team-a", "llama", "55555555-5555-4555-8555-555555555555")); err != nil {
		t.Fatal(err)
	}
	r.witness.by.Remove(s3UID) // as after witnessTTL
	if src, err := r.WitnessSource(ctx, "gpu-1", s3UID); src != nil || !errors.Is(err, source.ErrNotFound) {
		t.Errorf("the old UID of a cache made again: %v, %v; want not found", src, err)
	}
}
