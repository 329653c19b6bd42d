package tokenreview

import (
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
)

// maxRemembered is how many answers a remembered keeps; the least recently used go first.
const maxRemembered = 4096

// remembered keeps the answers of a costly check of what peers present (a TokenReview, a read
// of a NodeCache) for a while, in a bounded LRU, and runs one check per key at a time. A
// check's error is not kept: the next request checks again.
type remembered[V any] struct {
	once     sync.Once
	answers  *cache.LRUExpireCache
	inflight singleflight.Group
}

// get returns key's kept answer, or check's, which is kept for the time check returns.
func (m *remembered[V]) get(key string, check func() (V, time.Duration, error)) (V, error) {
	m.once.Do(func() { m.answers = cache.NewLRUExpireCache(maxRemembered) })
	if v, ok := m.answers.Get(key); ok {
		return v.(V), nil
	}
	v, err, _ := m.inflight.Do(key, func() (any, error) {
		if v, ok := m.answers.Get(key); ok {
			return v, nil
		}
		v, ttl, err := check()
		if err != nil {
			return nil, err
		}
		m.answers.Add(key, v, ttl)
		return v, nil
	})
	if err != nil {
		var zero V
		return zero, err
	}
	return v.(V), nil
}
