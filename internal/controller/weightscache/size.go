package weightscache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/credentials"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Before any node downloads a cache, the controller lists its source to learn the model's size:
// what its target nodes' disks and its namespace's quota are checked against (capacity.go,
// quota.go). It lists with what the nodes would read with: the namespace's own credentials, a
// Hugging Face token, or the controller's own identity for a source the configuration lets
// prewarm read itself. An FSx source is mounted on the nodes only, and a source the controller
// cannot list (no identity of its own) is sized by the first node that lists it.

// Sizer lists a cache's source.
type Sizer interface {
	// Size lists src, read with creds (empty: the controller's own identity, or anonymously).
	Size(ctx context.Context, src prewarmv1alpha1.CacheSource, creds credentials.Credentials) (ModelSize, error)
}

// ModelSize is what a listing found.
type ModelSize struct {
	Bytes int64
	Files int
	// Revision names what was listed as the agents name it: a Hugging Face commit, or the
	// content revision of an S3 listing (source.ContentRevision).
	Revision string
}

// errNotListable says the controller cannot list a kind of source.
var errNotListable = errors.New("the controller cannot list this kind of source")

// SourceSizer lists S3 and Hugging Face sources as the agents do, from the controller.
type SourceSizer struct {
	Config config.OperatorConfiguration
}

// Size lists src.
func (z SourceSizer) Size(ctx context.Context, src prewarmv1alpha1.CacheSource, creds credentials.Credentials) (ModelSize, error) {
	s, err := openSource(ctx, z.Config, src, creds)
	if err != nil {
		return ModelSize{}, err
	}
	l, err := s.List(ctx)
	if err != nil {
		return ModelSize{}, err
	}
	size := ModelSize{Files: len(l.Files), Revision: revisionOf(l)}
	for _, f := range l.Files {
		size.Bytes += f.Size
	}
	return size, nil
}

// revisionOf names a listing as the agents do: the source's revision, or its content's.
func revisionOf(l source.Listing) string {
	if l.Revision != "" {
		return l.Revision
	}
	return source.ContentRevision(l.Files)
}

// openSource opens src from the controller, as the agents do, read with creds (empty: the
// controller's own identity, or anonymously).
func openSource(ctx context.Context, cfg config.OperatorConfiguration, src prewarmv1alpha1.CacheSource, creds credentials.Credentials) (source.Source, error) {
	var spec sources.Spec
	var opts sources.Options
	switch src.Type {
	case inferencev1.ModelSourceS3:
		spec = sources.Spec{Kind: sources.S3, Bucket: src.Bucket, Prefix: src.Prefix, Region: src.Region}
		opts.Endpoint, opts.PathStyle = cfg.S3.Endpoint, cfg.S3.UsePathStyle()
		opts.AccessKeyID, opts.SecretAccessKey, opts.SessionToken = creds.AWSAccessKeyID, creds.AWSSecretAccessKey, creds.AWSSessionToken
	case inferencev1.ModelSourceHuggingFace:
		spec = sources.Spec{Kind: sources.HuggingFace, Repo: src.RepoID, Revision: src.Revision}
		opts.Endpoint, opts.Token = cfg.HuggingFace.Endpoint, creds.HFToken
	default:
		return nil, fmt.Errorf("%s: an FSx file system is mounted on the nodes only: %w", src, errNotListable)
	}
	return sources.Open(ctx, spec, opts)
}

// sizeTimeout bounds one listing (it holds one of the reconcile's workers); sizeRetry is how
// long a failed one stands before the next try, while no node has listed the source either.
const (
	sizeTimeout = 15 * time.Second
	sizeRetry   = 5 * time.Minute
)

// sizes remembers the listings made, by cache UID, so that a cache's source is listed once.
type sizes struct {
	mu sync.Mutex
	by map[string]sizeResult
}

type sizeResult struct {
	size ModelSize
	err  error
	at   time.Time
}

// estimate is what the reconcile knows of the model's size.
type estimate struct {
	bytes int64
	// revision is the revision the controller's own listing found ("": it has listed none).
	revision string
	// from says where the figure comes from, for people ("listed from the source: 12 files").
	from string
	// problem says why the size is not known ("" when it is).
	problem string
}

// known reports whether the size is known.
func (e estimate) known() bool { return e.bytes > 0 }

// sizeOf returns what is known of m's size: the cache's status (a listing or a node's report
// before), a node's report now, or the controller's own listing of the source. Only the nodes
// asked to hold the cache are heard: a node that reports on a cache it was never asked for
// (a compromised one) cannot set its size, and so another namespace's quota or capacity check.
func (r *Reconciler) sizeOf(ctx context.Context, m *inferencev1.ModelDataCacheConfig, src prewarmv1alpha1.CacheSource, a access, f *fleet) estimate {
	uid := string(m.UID)
	r.sizes.mu.Lock()
	res, listed := r.sizes.by[uid]
	r.sizes.mu.Unlock()
	listedRevision := ""
	if listed && res.err == nil {
		listedRevision = res.size.Revision
	}
	// A report of another revision than the one the cache holds (pinned, or listed by the
	// controller) is not of the cache's content.
	want := cmp.Or(src.Revision, listedRevision)
	reported := int64(0)
	for _, nc := range f.named {
		if req := requestFor(nc, f.uid); req == nil || req.Refused != nil {
			continue
		}
		if rep := reportFor(nc, f.uid); rep != nil && rep.BytesTotal > 0 && (want == "" || rep.Revision == "" || rep.Revision == want) {
			reported = max(reported, rep.BytesTotal)
		}
	}
	switch {
	case reported > 0:
		return estimate{bytes: reported, revision: listedRevision, from: "as the nodes listed it"}
	case listed && res.err == nil && res.size.Bytes > 0:
		return estimate{bytes: res.size.Bytes, revision: listedRevision, from: fmt.Sprintf("listed from the source: %d files", res.size.Files)}
	case m.Status.TotalBytes > 0:
		return estimate{bytes: m.Status.TotalBytes, from: "as listed before"}
	case r.Sizer == nil:
		return estimate{problem: "the controller does not list sources; the size is known once a node lists it"}
	case a.refused != "":
		return estimate{problem: a.refused}
	}
	if !listed || (res.err != nil && r.Now().Sub(res.at) >= sizeRetry) {
		lctx, cancel := context.WithTimeout(ctx, sizeTimeout)
		size, err := r.Sizer.Size(lctx, src, a.creds)
		cancel()
		res = sizeResult{size: size, err: err, at: r.Now()}
		r.sizes.mu.Lock()
		if r.sizes.by == nil {
			r.sizes.by = map[string]sizeResult{}
		}
		r.sizes.by[uid] = res
		r.sizes.mu.Unlock()
		if err != nil && !errors.Is(err, errNotListable) {
			ctrl.LoggerFrom(ctx).Info("could not list the cache's source to learn its size", "source", src.String(), "error", err.Error())
		}
	}
	switch {
	case errors.Is(res.err, errNotListable):
		return estimate{problem: res.err.Error() + "; the size is known once a node lists it"}
	case res.err != nil:
		return estimate{problem: fmt.Sprintf("listing %s from the controller: %v; the size is known once a node lists it", src, res.err)}
	case res.size.Bytes == 0:
		return estimate{problem: fmt.Sprintf("%s lists no bytes", src)}
	}
	return estimate{bytes: res.size.Bytes, revision: res.size.Revision, from: fmt.Sprintf("listed from the source: %d files", res.size.Files)}
}

// forget drops what is remembered of a deleted cache.
func (z *sizes) forget(uid string) {
	z.mu.Lock()
	delete(z.by, uid)
	z.mu.Unlock()
}

// human is n bytes for people.
func human(n int64) string { return engine.HumanBytes(n) }
