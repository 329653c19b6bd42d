// Package integration tests prewarm's API against a real kube-apiserver and etcd, built by
// hack/testbin.sh.
package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/test/compat/hyperpodstatus"
)

var server *testutil.APIServer

func TestMain(m *testing.M) { os.Exit(testutil.RunWithAPIServer(statusChecked{m}, &server)) }

// statusChecked runs the package's tests while watching every parent they make: each status
// the controller writes, of every parent in every test, must be one HyperPod's clients read
// (hyperpodstatus.Check). A status they would drop fails the package.
type statusChecked struct{ m *testing.M }

func (r statusChecked) Run() int {
	ctx, cancel := context.WithCancel(context.Background())
	w := &statusWatch{}
	var wg sync.WaitGroup
	for _, kind := range hyperpodstatus.Kinds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.watch(ctx, kind)
		}()
	}
	code := r.m.Run()
	// What the tests left is read once more, so the last statuses are checked whatever the
	// watch had delivered.
	for _, kind := range hyperpodstatus.Kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(inferencev1.GroupVersion.WithKind(kind + "List"))
		if err := server.Client.List(context.Background(), list); err != nil {
			w.problem(fmt.Sprintf("listing %s: %v", kind, err))
			continue
		}
		for i := range list.Items {
			w.check(kind, &list.Items[i])
		}
	}
	cancel()
	wg.Wait()
	if testing.Short() {
		return code
	}
	if len(w.problems) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: statuses HyperPod's clients would not read:\n")
		for _, p := range w.problems {
			fmt.Fprintln(os.Stderr, "  "+p)
		}
		return 1
	}
	if code != 0 {
		return code
	}
	if w.checked == 0 {
		fmt.Fprintln(os.Stderr, "FAIL: no parent status was seen: the status check checked nothing")
		return 1
	}
	fmt.Printf("checked %d parent statuses against HyperPod's clients\n", w.checked)
	return 0
}

// statusWatch gathers what the watches see.
type statusWatch struct {
	mu       sync.Mutex
	checked  int
	problems []string
}

func (w *statusWatch) problem(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Contains(w.problems, p) {
		w.problems = append(w.problems, p)
	}
}

func (w *statusWatch) check(kind string, o *unstructured.Unstructured) {
	st, ok := o.Object["status"].(map[string]any)
	if !ok {
		return
	}
	found, err := hyperpodstatus.Check(kind, st)
	if err != nil {
		w.problem(err.Error())
		return
	}
	w.mu.Lock()
	w.checked++
	w.mu.Unlock()
	for _, p := range found {
		w.problem(fmt.Sprintf("%s %s/%s: %s", kind, o.GetNamespace(), o.GetName(), p))
	}
}

// watch checks every version of kind's objects until ctx ends, watching again from the last
// version it saw when the server ends a watch.
func (w *statusWatch) watch(ctx context.Context, kind string) {
	c, err := client.NewWithWatch(server.Config, client.Options{Scheme: server.Client.Scheme()})
	if err != nil {
		w.problem(err.Error())
		return
	}
	rv := ""
	for ctx.Err() == nil {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(inferencev1.GroupVersion.WithKind(kind + "List"))
		wi, err := c.Watch(ctx, list, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if ctx.Err() == nil {
				w.problem(fmt.Sprintf("watching %s: %v", kind, err))
			}
			return
		}
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				// Too old a version (410): read the present state again.
				rv = ""
				break
			}
			o, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			rv = o.GetResourceVersion()
			w.check(kind, o)
		}
		wi.Stop()
	}
}
