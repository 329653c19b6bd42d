package agent

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/cacheref"
)

// NameTTL is how long the agent takes a cache name's resolution for its pods' demands and uses
// before it reads the ModelWeightsCacheConfig again (a mount always reads it afresh).
const NameTTL = time.Minute

// maxNames bounds the names remembered (least recently used forgotten first).
const maxNames = 4096

// names remembers which cache the names its node's pods give resolved to, by namespace and name,
// so that reporting the pods' demands and keeping the caches they use costs the API server at
// most one read per name and NameTTL.
type names struct{ resolved *cache.LRUExpireCache } // nameKey → cache UID ("": none)

type nameKey struct{ ns, name string }

// clockFunc lets the agent's clock drive the names' expiry.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

func newNames(now func() time.Time) names {
	return names{cache.NewLRUExpireCacheWithClock(maxNames, clockFunc(now))}
}

// resolve reads which cache name means in namespace ns now, and remembers it.
func (n names) resolve(ctx context.Context, r client.Reader, ns, name string) (string, error) {
	_, uid, err := cacheref.Resolve(ctx, r, ns, name)
	if err != nil && !errors.Is(err, cacheref.ErrNotFound) && !errors.Is(err, cacheref.ErrNotReady) && !errors.Is(err, cacheref.ErrInvalid) {
		return "", err // the API server did not answer: nothing learnt
	}
	n.resolved.Add(nameKey{ns, name}, string(uid), NameTTL)
	return string(uid), err
}

// uid is the cache name means in namespace ns, as remembered within NameTTL or read now ("":
// none).
func (n names) uid(ctx context.Context, r client.Reader, ns, name string) string {
	if v, ok := n.resolved.Get(nameKey{ns, name}); ok {
		return v.(string)
	}
	uid, _ := n.resolve(ctx, r, ns, name)
	return uid
}

// volumeCache is the cache a volume of pod p mounts through prewarm's CSI volume: the UID it
// names, or the cache the name it gives means in the pod's namespace ("": none).
func (a *Agent) volumeCache(ctx context.Context, p *corev1.Pod, v corev1.Volume) string {
	if uid := prewarmv1alpha1.VolumeCacheUID(v); uid != "" {
		return uid
	}
	if name := prewarmv1alpha1.VolumeCacheByName(v); name != "" {
		return a.names.uid(ctx, a.client, p.Namespace, name)
	}
	return ""
}
