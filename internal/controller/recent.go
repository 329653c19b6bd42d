package controller

import (
	"container/list"
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Bounds of what a RecentReader remembers, unless it is given others. Every tenant can make the
// controller read objects of its own (the Secrets and service accounts its parents name), so
// what is remembered is bounded in count and in bytes, and forgotten after the TTL.
const (
	// DefaultRecentEntries is how many answers a RecentReader remembers at most.
	DefaultRecentEntries = 4096
	// DefaultRecentBytes is how many bytes of objects a RecentReader remembers at most (their
	// protobuf size): 4,096 pull Secrets of 16 KiB.
	DefaultRecentBytes = 64 << 20
)

// RecentReader reads through Reader, answering a Get again from memory for TTL: for objects the
// controller must not watch cluster-wide (Secrets, ServiceAccounts in users' namespaces) but reads
// on every reconcile. One API call per object per TTL; a change shows within TTL. Not-found
// answers are remembered too, so a missing Secret is not asked for on every reconcile.
//
// What it remembers is bounded: answers older than TTL are dropped whenever an answer is added,
// and past MaxEntries answers or MaxBytes bytes the oldest go first; an object larger than
// MaxBytes is not remembered at all.
type RecentReader struct {
	Reader client.Reader
	TTL    time.Duration
	// MaxEntries and MaxBytes bound what is remembered (0: DefaultRecentEntries,
	// DefaultRecentBytes).
	MaxEntries int
	MaxBytes   int64
	Now        func() time.Time

	mu sync.Mutex
	// seen holds each remembered answer's element of order, by key.
	seen map[string]*list.Element
	// order holds the answers (*recentAnswer), oldest first: all live for the same TTL, so the
	// front is the first to expire.
	order list.List
	bytes int64
}

type recentAnswer struct {
	key  string
	obj  client.Object
	err  error
	at   time.Time
	size int64
}

// NewRecentReader returns a RecentReader over r.
func NewRecentReader(r client.Reader, ttl time.Duration) *RecentReader {
	return &RecentReader{Reader: r, TTL: ttl, Now: time.Now}
}

// Get reads the object, or copies what was read less than TTL ago into obj.
func (r *RecentReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	k := fmt.Sprintf("%T %s", obj, key)
	now := r.Now()
	r.mu.Lock()
	var a *recentAnswer
	if e, ok := r.seen[k]; ok && now.Sub(e.Value.(*recentAnswer).at) < r.TTL {
		a = e.Value.(*recentAnswer)
	}
	r.mu.Unlock()
	if a != nil {
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
	a = &recentAnswer{key: k, err: err, at: now, size: notFoundSize}
	if err == nil {
		a.obj = obj.DeepCopyObject().(client.Object)
		a.size = sizeOf(obj)
	}
	r.remember(a)
	return err
}

// notFoundSize is what a not-found answer is counted as, in bytes.
const notFoundSize = 256

// sizeOf is obj's size in bytes: its protobuf size where it has one (the Kubernetes API's
// types), else an estimate.
func sizeOf(obj client.Object) int64 {
	if s, ok := obj.(interface{ Size() int }); ok {
		return int64(s.Size())
	}
	return 4 << 10
}

// remember adds a, after dropping what has expired and what no longer fits.
func (r *RecentReader) remember(a *recentAnswer) {
	maxEntries, maxBytes := r.MaxEntries, r.MaxBytes
	if maxEntries <= 0 {
		maxEntries = DefaultRecentEntries
	}
	if maxBytes <= 0 {
		maxBytes = DefaultRecentBytes
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]*list.Element{}
	}
	if e, ok := r.seen[a.key]; ok {
		r.forget(e)
	}
	for e := r.order.Front(); e != nil && a.at.Sub(e.Value.(*recentAnswer).at) >= r.TTL; e = r.order.Front() {
		r.forget(e)
	}
	if a.size > maxBytes {
		return
	}
	for r.order.Len() >= maxEntries || r.bytes+a.size > maxBytes {
		r.forget(r.order.Front())
	}
	r.seen[a.key] = r.order.PushBack(a)
	r.bytes += a.size
}

// forget drops one remembered answer; r.mu is held.
func (r *RecentReader) forget(e *list.Element) {
	a := r.order.Remove(e).(*recentAnswer)
	delete(r.seen, a.key)
	r.bytes -= a.size
}

// List reads through: lists are not remembered.
func (r *RecentReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.Reader.List(ctx, list, opts...)
}
