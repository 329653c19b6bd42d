package hyperpodstatus

import (
	"context"
	"fmt"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// group is the API group of the parents.
var group = schema.GroupVersion{Group: "inference.sagemaker.aws.amazon.com", Version: "v1"}

// Watch checks every version of every parent's status an API server holds, from StartWatch to
// Stop: each status a controller writes, not only the last.
type Watch struct {
	c      client.WithWatch
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	checked  int
	problems []string
}

// StartWatch starts watching the parents of the API server cfg reaches.
func StartWatch(cfg *rest.Config) (*Watch, error) {
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watch{c: c, cancel: cancel}
	for _, kind := range Kinds {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.watch(ctx, kind)
		}()
	}
	return w, nil
}

// Stop reads what is there once more (so the last statuses are checked whatever the watches had
// delivered), stops watching, and returns how many statuses were checked and every problem
// found, each naming its object.
func (w *Watch) Stop(ctx context.Context) (int, []string) {
	for _, kind := range Kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(group.WithKind(kind + "List"))
		if err := w.c.List(ctx, list); err != nil {
			w.problem(fmt.Sprintf("listing %s: %v", kind, err))
			continue
		}
		for i := range list.Items {
			w.check(kind, &list.Items[i])
		}
	}
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checked, slices.Clone(w.problems)
}

func (w *Watch) problem(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Contains(w.problems, p) {
		w.problems = append(w.problems, p)
	}
}

func (w *Watch) check(kind string, o *unstructured.Unstructured) {
	st, ok := o.Object["status"].(map[string]any)
	if !ok {
		return
	}
	found, err := Check(kind, st)
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
func (w *Watch) watch(ctx context.Context, kind string) {
	rv := ""
	for ctx.Err() == nil {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(group.WithKind(kind + "List"))
		wi, err := w.c.Watch(ctx, list, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
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
