package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// Labeller writes the caches' ready labels one merge patch per node: the changes that reach it
// for one node within Window — of every cache whose reconcile labels the node then, weights
// and image caches alike — go in one write. Apply returns once its own changes are written, so
// a reconcile sees the same errors, in the same order, as when it patched each node itself.
// The nil Labeller patches each change on its own (ApplyLabels).
type Labeller struct {
	// Window is how long a node's first change waits for others (250 ms when zero).
	Window time.Duration

	once    sync.Once
	mu      sync.Mutex
	batches map[string]*labelBatch
	// writes bounds the patches in flight (the client's QPS and burst pace them all).
	writes chan struct{}
}

// labelBatch is one node's next patch, and its outcome once written.
type labelBatch struct {
	labels map[string]*string // nil: remove
	done   chan struct{}
	err    error
}

// Apply makes the changes of label key, batched with other changes to the same nodes, and
// waits until they are written.
func (l *Labeller) Apply(ctx context.Context, c client.Client, key string, changes []LabelChange) error {
	if l == nil {
		return ApplyLabels(ctx, c, key, changes)
	}
	l.once.Do(func() {
		l.batches = map[string]*labelBatch{}
		l.writes = make(chan struct{}, SharedWrites)
		if l.Window == 0 {
			l.Window = 250 * time.Millisecond
		}
	})
	value := inferencev1.LabelTrue
	waits := make(map[string]*labelBatch, len(changes))
	l.mu.Lock()
	for _, ch := range changes {
		b := l.batches[ch.Node]
		if b == nil {
			b = &labelBatch{labels: map[string]*string{}, done: make(chan struct{})}
			l.batches[ch.Node] = b
			time.AfterFunc(l.Window, func() { l.flush(c, ch.Node, b) })
		}
		if ch.Want {
			b.labels[key] = &value
		} else {
			b.labels[key] = nil
		}
		waits[ch.Node] = b
	}
	l.mu.Unlock()
	for node, b := range waits {
		select {
		case <-b.done:
			if b.err != nil {
				return fmt.Errorf("labelling node %s: %w", node, b.err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// flush writes node's batch: from here on, changes to the node go into the next one.
func (l *Labeller) flush(c client.Client, node string, b *labelBatch) {
	l.mu.Lock()
	if l.batches[node] == b {
		delete(l.batches, node)
	}
	l.mu.Unlock()
	l.writes <- struct{}{}
	defer func() { <-l.writes }()
	defer close(b.done)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.err = patchNodeLabels(ctx, c, node, b.labels)
}
