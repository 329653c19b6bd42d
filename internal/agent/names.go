package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/cacheref"
)

// NameTTL is how long the agent takes a cache name's resolution for its pods' demands and uses
// before it reads the ModelWeightsCacheConfig again (a mount always reads it afresh).
const NameTTL = time.Minute

// names remembers which cache the names its node's pods give resolved to, by namespace and name,
// so that reporting the pods' demands and keeping the caches they use costs the API server at
// most one read per name and NameTTL. Only names of pods on the node are kept, and each for
// NameTTL at most.
type names struct {
	mu sync.Mutex
	m  map[nameKey]resolved
}

type nameKey struct{ ns, name string }

type resolved struct {
	uid string // "": the name resolved to no cache
	at  time.Time
}

// resolve reads which cache name means in namespace ns now, and remembers it.
func (n *names) resolve(ctx context.Context, r client.Reader, ns, name string, now time.Time) (string, error) {
	_, uid, err := cacheref.Resolve(ctx, r, ns, name)
	if err != nil && !errors.Is(err, cacheref.ErrNotFound) && !errors.Is(err, cacheref.ErrNotReady) && !errors.Is(err, cacheref.ErrInvalid) {
		return "", err // the API server did not answer: nothing learnt
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[nameKey]resolved{}
	}
	for k, v := range n.m {
		if now.Sub(v.at) > NameTTL {
			delete(n.m, k)
		}
	}
	n.m[nameKey{ns, name}] = resolved{uid: string(uid), at: now}
	return string(uid), err
}

// uid is the cache name means in namespace ns, as remembered within NameTTL or read now ("":
// none).
func (n *names) uid(ctx context.Context, r client.Reader, ns, name string, now time.Time) string {
	n.mu.Lock()
	v, ok := n.m[nameKey{ns, name}]
	n.mu.Unlock()
	if ok && now.Sub(v.at) <= NameTTL {
		return v.uid
	}
	uid, _ := n.resolve(ctx, r, ns, name, now)
	return uid
}

// volumeCache is the cache a volume of pod p mounts through prewarm's CSI volume: the UID it
// names, or the cache the name it gives means in the pod's namespace ("": none).
func (a *Agent) volumeCache(ctx context.Context, p *corev1.Pod, v corev1.Volume) string {
	if uid := prewarmv1alpha1.VolumeCacheUID(v); uid != "" {
		return uid
	}
	if name := prewarmv1alpha1.VolumeCacheByName(v); name != "" {
		return a.names.uid(ctx, a.client, p.Namespace, name, a.opts.Now())
	}
	return ""
}
