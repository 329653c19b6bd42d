package controller

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// Large objects count by their size: the bytes remembered stay within MaxBytes, and an object
// larger than all of it is read through each time, never kept.
func TestRecentReaderBoundsBytes(t *testing.T) {
	ctx := context.Background()
	var objs []client.Object
	for i := range 5 {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: fmt.Sprintf("big-%d", i)},
			Data: map[string][]byte{"x": bytes.Repeat([]byte{'x'}, 1<<20)}})
	}
	objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "huge"},
		Data: map[string][]byte{"x": bytes.Repeat([]byte{'x'}, 4<<20)}})
	counted := &countingReader{Reader: fake.NewClientBuilder().WithObjects(objs...).Build()}
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	r := &RecentReader{Reader: counted, TTL: time.Minute, MaxBytes: 3 << 20, Now: func() time.Time { return now }}
	for i := range 5 {
		if err := r.Get(ctx, client.ObjectKey{Namespace: "tenant", Name: fmt.Sprintf("big-%d", i)}, &corev1.Secret{}); err != nil {
			t.Fatal(err)
		}
	}
	if r.bytes > 3<<20 || len(r.seen) != 2 {
		t.Errorf("five 1 MiB Secrets within 3 MiB: %d bytes in %d answers remembered, want at most 3 MiB in 2", r.bytes, len(r.seen))
	}
	for range 2 {
		s := &corev1.Secret{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: "tenant", Name: "huge"}, s); err != nil || len(s.Data["x"]) != 4<<20 {
			t.Fatalf("the 4 MiB Secret: %v", err)
		}
	}
	if counted.gets != 7 {
		t.Errorf("%d reads of the API, want 7: the Secret larger than MaxBytes is read each time", counted.gets)
	}
	if _, ok := r.seen[fmt.Sprintf("%T %s", &corev1.Secret{}, client.ObjectKey{Namespace: "tenant", Name: "huge"})]; ok {
		t.Error("the Secret larger than MaxBytes is remembered")
	}
}
