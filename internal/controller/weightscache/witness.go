package weightscache

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/cache"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// The controller is the nodes' witness (pkg/engine/witness): a node reads the parts of an S3
// file that has no SHA-256 of its own through it, so that its peers can check what it relays.
// The witness reads a cache's source for a node only while the node is asked for the cache, and
// with what the node would read with: the cache's namespace's credentials, or prewarm's own
// identity where the configuration allows it for that namespace (sourceAccess).

// witnessTTL is how long an opened source, and the access decision it was opened under, serve a
// cache's reads: a namespace whose credentials are withdrawn is read for it at most this long.
// maxWitnessSources bounds how many are kept.
const (
	witnessTTL        = time.Minute
	maxWitnessSources = 1024
)

// witnessSources keeps the sources the witness opened, by cache UID.
type witnessSources struct {
	once sync.Once
	by   *cache.LRUExpireCache
}

// WitnessSource is the source of cache uid, for node's reads through the witness: refused
// (witness.ErrForbidden) unless node's NodeCache, which only the controller writes, asks it for
// the cache, and for any source but S3 (a Hugging Face file has a SHA-256 or git blob id of its
// own; an FSx file system is mounted on the nodes only).
func (r *Reconciler) WitnessSource(ctx context.Context, node, uid string) (source.Source, error) {
	nc := &prewarmv1alpha1.NodeCache{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Name: node}, nc); {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: node %s is asked for no cache", witness.ErrForbidden, node)
	case err != nil:
		return nil, err
	}
	var req *prewarmv1alpha1.CacheRequest
	for i := range nc.Spec.Caches {
		if nc.Spec.Caches[i].UID == uid {
			req = &nc.Spec.Caches[i]
		}
	}
	switch {
	case req == nil:
		return nil, fmt.Errorf("%w: node %s is not asked for cache %s", witness.ErrForbidden, node, uid)
	case req.Source.Type != inferencev1.ModelSourceS3:
		return nil, fmt.Errorf("%w: cache %s reads %s, which is not read through the witness", witness.ErrForbidden, uid, req.Source.Type)
	}
	r.witness.once.Do(func() { r.witness.by = cache.NewLRUExpireCache(maxWitnessSources) })
	if kept, ok := r.witness.by.Get(uid); ok {
		return kept.(source.Source), nil
	}
	m := &inferencev1.ModelDataCacheConfig{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, m); {
	case apierrors.IsNotFound(err) || err == nil && string(m.UID) != uid:
		return nil, fmt.Errorf("%w: cache %s is gone", source.ErrNotFound, uid)
	case err != nil:
		return nil, err
	}
	a, err := r.sourceAccess(ctx, m, req.Source)
	switch {
	case err != nil:
		return nil, err
	case a.refused != "":
		return nil, fmt.Errorf("%w: %s", witness.ErrForbidden, a.refused)
	}
	src, err := openSource(ctx, r.Config.OperatorConfiguration, req.Source, a.creds)
	if err != nil {
		return nil, err
	}
	l := &listedSource{Source: src}
	r.witness.by.Add(uid, l, witnessTTL)
	return l, nil
}

// listedSource is a witness.Listed: it lists its source once, and then reads each file only
// while S3 still holds the object it listed (If-Match on its ETag).
type listedSource struct {
	source.Source
	once  sync.Once
	rev   string
	sizes map[string]int64
	err   error
}

// listTimeout bounds the one listing of a listedSource.
const listTimeout = 30 * time.Second

// Revision lists the source the first time, as the agents name what they list.
func (l *listedSource) Revision(ctx context.Context) (string, error) {
	l.once.Do(func() {
		// Shared by every request after it: the first one leaving does not end it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), listTimeout)
		defer cancel()
		listing, err := l.List(ctx)
		l.rev, l.err = revisionOf(listing), err
		l.sizes = make(map[string]int64, len(listing.Files))
		for _, f := range listing.Files {
			l.sizes[f.Path] = f.Size
		}
	})
	return l.rev, l.err
}

// Size is the listed size of the file at path.
func (l *listedSource) Size(path string) (int64, bool) {
	if l.err != nil || l.sizes == nil {
		return 0, false
	}
	n, ok := l.sizes[path]
	return n, ok
}
