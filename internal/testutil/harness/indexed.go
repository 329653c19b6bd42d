package harness

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/controller"
)

// IndexedClient makes a client that reads the API server directly answer lists by the
// reconcilers' informer indexes, as a manager's cached client does: a list whose field selector
// names one of indexes lists everything of the kind and keeps the objects the index maps to the
// value. Tests that call reconcilers without a manager (and so read what they just wrote) use it.
func IndexedClient(c client.Client, indexes ...controller.Index) client.Client {
	return &indexedClient{Client: c, indexes: indexes}
}

type indexedClient struct {
	client.Client
	indexes []controller.Index
}

func (c *indexedClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	if lo.FieldSelector == nil {
		return c.Client.List(ctx, list, opts...)
	}
	for _, ix := range c.indexes {
		value, ok := lo.FieldSelector.RequiresExactMatch(ix.Field)
		if !ok || !sameKind(c.Client, ix.Object, list) {
			continue
		}
		plain := *lo
		plain.FieldSelector = nil
		if err := c.Client.List(ctx, list, &plain); err != nil {
			return err
		}
		return keep(list, func(o client.Object) bool { return slices.Contains(ix.Func(o), value) })
	}
	return c.Client.List(ctx, list, opts...)
}

// sameKind reports whether list is a list of obj's kind.
func sameKind(c client.Client, obj client.Object, list client.ObjectList) bool {
	a, err1 := c.GroupVersionKindFor(obj)
	b, err2 := c.GroupVersionKindFor(list)
	return err1 == nil && err2 == nil && a.GroupVersion() == b.GroupVersion() && a.Kind+"List" == b.Kind
}

// keep filters list's items in place.
func keep(list client.ObjectList, pred func(client.Object) bool) error {
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	var out []runtime.Object
	for _, it := range items {
		o, ok := it.(client.Object)
		if !ok {
			return fmt.Errorf("list item %s is not an object", reflect.TypeOf(it))
		}
		if pred(o) {
			out = append(out, it)
		}
	}
	return meta.SetList(list, out)
}
