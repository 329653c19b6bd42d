package controller_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil"
)

// Five caches' reconciles label the same three nodes at once, one of them also removing a
// label: each node gets one patch with all of them, against a real API server, and every
// Apply returns once its own changes are on the nodes. A node that does not exist is no error;
// a refused patch is the error of every Apply that waited for it.
func TestLabellerWritesOnePatchPerNode(t *testing.T) {
	api := testutil.APIServerFor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes := []string{"n1", "n2", "n3"}
	old := inferencev1.WeightsCacheReadyLabel("00000000-0000-4000-8000-000000000000")
	for _, n := range nodes {
		if err := api.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{old: inferencev1.LabelTrue}}}); err != nil {
			t.Fatal(err)
		}
	}
	var patches atomic.Int64
	var refuse atomic.Bool
	direct, err := client.NewWithWatch(api.Config, client.Options{Scheme: testutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(direct, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches.Add(1)
			if refuse.Load() {
				return fmt.Errorf("refused")
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	l := &controller.Labeller{Window: 200 * time.Millisecond}
	var keys []string
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 5 {
		key := inferencev1.WeightsCacheReadyLabel(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i+1))
		keys = append(keys, key)
		var changes []controller.LabelChange
		for _, n := range nodes {
			changes = append(changes, controller.LabelChange{Node: n, Want: true})
		}
		wg.Go(func() { errs <- l.Apply(ctx, c, key, changes) })
	}
	wg.Go(func() {
		errs <- l.Apply(ctx, c, old, []controller.LabelChange{{Node: "n2", Want: false}, {Node: "gone", Want: false}})
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Apply: %v", err)
		}
	}
	// Three nodes and one that does not exist: four patches for sixteen changes.
	if got := patches.Load(); got != 4 {
		t.Errorf("%d patches, want 4 (one per node)", got)
	}
	for _, name := range nodes {
		n := &corev1.Node{}
		if err := api.Client.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		for _, key := range keys {
			if n.Labels[key] != inferencev1.LabelTrue {
				t.Errorf("node %s lacks %s: %v", name, key, n.Labels)
			}
		}
		if _, has := n.Labels[old]; has == (name == "n2") {
			t.Errorf("node %s: label %s present %v", name, old, has)
		}
	}

	refuse.Store(true)
	err = l.Apply(ctx, c, keys[0], []controller.LabelChange{{Node: "n1", Want: false}})
	if err == nil || err.Error() != "labelling node n1: refused" {
		t.Errorf("a refused patch: %v", err)
	}
}
