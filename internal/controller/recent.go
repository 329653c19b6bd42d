package controller

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RecentReader reads through Reader, answering a Get again from memory for TTL: for objects the
// controller must not watch cluster-wide (Secrets, ServiceAccounts in users' namespaces) but reads
// on every reconcile. One API call per object per TTL; a change shows within TTL. Not-found
// answers are remembered too, so a missing Secret is not asked for on every reconcile.
type RecentReader struct {
	Reader client.Reader
	TTL    time.Duration
	Now    func() time.Time

	mu   sync.Mutex
	seen map[string]recentAnswer
}

type recentAnswer struct {
	obj client.Object
	err error
	at  time.Time
}

// NewRecentReader returns a RecentReader over r.
func NewRecentReader(r client.Reader, ttl time.Duration) *RecentReader {
	return &RecentReader{Reader: r, TTL: ttl, Now: time.Now}
}

// Get reads the object, or copies what was read less than TTL ago into obj.
func (r *RecentReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	k := fmt.Sprintf("%T %s", obj, key)
	r.mu.Lock()
	a, ok := r.seen[k]
	r.mu.Unlock()
	if ok && r.Now().Sub(a.at) < r.TTL {
		if a.err != nil {
			return a.err
		}
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(a.obj.DeepCopyObject()).Elem())
		return nil
	}
	err := r.Reader.Get(ctx, key, obj, opts...)
	if err != nil && !apierrors.IsNotFound(err) {
		return err // not remembered: a transient failure
	}
	a = recentAnswer{err: err, at: r.Now()}
	if err == nil {
		a.obj = obj.DeepCopyObject().(client.Object)
	}
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[string]recentAnswer{}
	}
	r.seen[k] = a
	r.mu.Unlock()
	return err
}

// List reads through: lists are not remembered.
func (r *RecentReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.Reader.List(ctx, list, opts...)
}
