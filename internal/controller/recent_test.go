package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

type countingReader struct {
	client.Reader
	gets int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets++
	return c.Reader.Get(ctx, key, obj, opts...)
}

func TestRecentReader(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tok"}, Data: map[string][]byte{"token": []byte("a")}}
	backing := fake.NewClientBuilder().WithObjects(secret).Build()
	counted := &countingReader{Reader: backing}
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	r := &RecentReader{Reader: counted, TTL: 30 * time.Second, Now: func() time.Time { return now }}

	get := func(name string) (*corev1.Secret, error) {
		s := &corev1.Secret{}
		return s, r.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, s)
	}
	for range 3 {
		s, err := get("tok")
		if err != nil || string(s.Data["token"]) != "a" {
			t.Fatalf("Get = %+v, %v", s, err)
		}
		s.Data["token"] = []byte("changed by the caller") // must not leak into the memory
	}
	if counted.gets != 1 {
		t.Errorf("%d reads of the API for three Gets within the TTL, want 1", counted.gets)
	}
	for range 2 {
		if _, err := get("missing"); !apierrors.IsNotFound(err) {
			t.Fatalf("missing: %v, want not found", err)
		}
	}
	if counted.gets != 2 {
		t.Errorf("a missing Secret was read %d times in all, want once more", counted.gets)
	}

	// After the TTL, a change is seen.
	secret.Data["token"] = []byte("b")
	if err := backing.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	now = now.Add(31 * time.Second)
	if s, err := get("tok"); err != nil || string(s.Data["token"]) != "b" {
		t.Errorf("after the TTL: %+v, %v; want the new token", s, err)
	}
}

// A tenant can make the controller read as many objects as it can name (a Secret of every name,
// missing or not): what the reader remembers stays bounded, and what is older than the TTL goes.
func TestRecentReaderIsBounded(t *testing.T) {
	ctx := context.Background()
	backing := fake.NewClientBuilder().Build()
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	r := &RecentReader{Reader: backing, TTL: 30 * time.Second, Now: func() time.Time { return now }}
	for i := range 10_000 {
		if err := r.Get(ctx, client.ObjectKey{Namespace: "tenant", Name: fmt.Sprintf("s-%d", i)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Fatalf("Get: %v, want not found", err)
		}
		if i%1000 == 0 {
			now = now.Add(time.Second) // the reads take some time
		}
	}
	if n := len(r.seen); n > DefaultRecentEntries {
		t.Errorf("10,000 distinct keys: %d answers remembered, want at most %d", n, DefaultRecentEntries)
	}
	now = now.Add(31 * time.Second)
	if err := r.Get(ctx, client.ObjectKey{Namespace: "tenant", Name: "after"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if n := len(r.seen); n != 1 {
		t.Errorf("after the TTL, %d answers remembered, want only the last one", n)
	}
}
