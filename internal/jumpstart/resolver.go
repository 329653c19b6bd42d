package jumpstart

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"golang.org/x/sync/singleflight"

	"github.com/prewarm/prewarm/internal/catalog"
)

// Bounds of the resolver's reads and of what it keeps. JumpStart's manifest holds one short
// header (about 150 bytes) per model version and a spec file describes one version; the bounds
// leave room for many times what JumpStart publishes, and keep a broken or hostile endpoint from
// holding a reconcile, or the controller's memory, without end.
const (
	// DefaultReadTimeout bounds one read of the manifest or of a spec file, its body included.
	DefaultReadTimeout = 30 * time.Second
	// MaxManifestBytes bounds the manifest.
	MaxManifestBytes = 64 << 20
	// MaxSpecBytes bounds one spec file.
	MaxSpecBytes = 4 << 20
	// MaxCachedSpecs and MaxCachedSpecBytes bound the spec files kept (the least recently used
	// go first); SpecTTL is how long one is kept, so that a spec JumpStart republishes in place
	// is read again.
	MaxCachedSpecs     = 256
	MaxCachedSpecBytes = 32 << 20
	SpecTTL            = time.Hour
)

// Options say where a region's JumpStart content is and how it is read.
type Options struct {
	Where
	// Endpoint is an S3-compatible endpoint (empty: AWS S3); PathStyle addresses buckets in the
	// path.
	Endpoint  string
	PathStyle bool
	// Refresh is how long the manifest is used before it is revalidated (a conditional GET
	// with its ETag: a 304 costs no body).
	Refresh time.Duration
}

// limits are the bounds a resolver applies (the constants above; tests lower them).
type limits struct {
	readTimeout              time.Duration
	manifestBytes, specBytes int64
	cachedSpecs              int
	cachedSpecBytes          int64
	specTTL                  time.Duration
}

var defaultLimits = limits{
	readTimeout: DefaultReadTimeout, manifestBytes: MaxManifestBytes, specBytes: MaxSpecBytes,
	cachedSpecs: MaxCachedSpecs, cachedSpecBytes: MaxCachedSpecBytes, specTTL: SpecTTL,
}

// Resolver reads JumpStart's manifest and spec files from S3, keeping the manifest (revalidated
// every Refresh) and the spec files it read last (a spec key names one version). No lock is
// held while S3 is read: each object is read by one flight at a time, which every caller that
// wants it joins, and each caller waits for it no longer than its own context allows.
type Resolver struct {
	opts    Options
	client  *s3.Client
	now     func() time.Time
	limits  limits
	flights singleflight.Group

	mu       sync.Mutex
	manifest []Header
	etag     string
	checked  time.Time
	specs    map[string]*cachedSpec
	// specBytes is the size of the spec files in specs; uses counts their uses, to find the
	// least recently used.
	specBytes int64
	uses      uint64
	// Stats count the reads, for tests and metrics.
	stats Stats
}

// cachedSpec is a spec file kept, with its size as read, when it was read, and its last use
// (Resolver.uses then).
type cachedSpec struct {
	specs   *Specs
	size    int64
	read    time.Time
	lastUse uint64
}

// Stats count a resolver's reads.
type Stats struct {
	// ManifestGets are full reads; ManifestNotModified revalidations answered 304.
	ManifestGets, ManifestNotModified int
	// SpecGets are reads of spec files.
	SpecGets int
}

// New returns a resolver for opts. The controller's AWS identity reads the buckets (the
// content buckets are public: with no identity, it reads anonymously).
func New(ctx context.Context, opts Options) (*Resolver, error) {
	if opts.Region == "" {
		return nil, errors.New("jumpstart: no region")
	}
	if opts.Bucket == "" {
		opts.Bucket = "jumpstart-cache-prod-" + opts.Region
	}
	if opts.GatedBucket == "" {
		opts.GatedBucket = "jumpstart-private-cache-prod-" + opts.Region
	}
	if opts.Refresh <= 0 {
		opts.Refresh = 5 * time.Minute
	}
	// The resolver bounds and parses what it reads; the SDK's own validation of response
	// checksums, which JumpStart's objects mostly lack, would only log that for every read.
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(opts.Region),
		awsconfig.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired))
	if err != nil {
		return nil, fmt.Errorf("jumpstart: loading AWS configuration: %w", err)
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		cfg.Credentials = aws.AnonymousCredentials{}
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.UsePathStyle = opts.PathStyle
	})
	return &Resolver{opts: opts, client: client, now: time.Now, limits: defaultLimits, specs: map[string]*cachedSpec{}}, nil
}

// Where is where the resolver reads.
func (r *Resolver) Where() Where { return r.opts.Where }

// Stats returns the reads so far.
func (r *Resolver) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// NotFoundError says a model id, or a version of it, is not in the region's manifest.
type NotFoundError struct {
	ModelID, Version, Region string
	// Versions are the model's versions when the id is known; Closest the nearest id when not.
	Versions []string
	Closest  string
}

func (e *NotFoundError) Error() string {
	where := fmt.Sprintf("JumpStart's model manifest of region %s", e.Region)
	if len(e.Versions) > 0 {
		return fmt.Sprintf("%s has no version %q of %s; it has %s", where, e.Version, e.ModelID, strings.Join(e.Versions, ", "))
	}
	msg := fmt.Sprintf("%s has no model %s", where, e.ModelID)
	if e.Closest != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", e.Closest)
	}
	return msg
}

// Resolve finds the model's version and spec, and returns what serving it on instanceType needs
// (Specs.Entry).
func (r *Resolver) Resolve(ctx context.Context, modelID, version, instanceType string, needImage bool) (*catalog.Entry, error) {
	headers, err := r.headers(ctx)
	if err != nil {
		return nil, err
	}
	var versions []string
	for _, h := range headers {
		if h.ModelID == modelID {
			versions = append(versions, h.Version)
		}
	}
	if len(versions) == 0 {
		return nil, &NotFoundError{ModelID: modelID, Version: version, Region: r.opts.Region, Closest: closest(modelID, headers)}
	}
	picked, err := catalog.SelectVersion(versions, version)
	if err != nil {
		catalog.SortVersions(versions)
		return nil, &NotFoundError{ModelID: modelID, Version: version, Region: r.opts.Region, Versions: versions}
	}
	i := slices.IndexFunc(headers, func(h Header) bool { return h.ModelID == modelID && h.Version == picked })
	specs, err := r.spec(ctx, headers[i].SpecKey)
	if err != nil {
		return nil, err
	}
	return specs.Entry(r.opts.Where, instanceType, needImage)
}

// headers returns the manifest, read again (conditionally, with its ETag) once Refresh passed.
// The manifest read before stands while S3 cannot be reached (until the next Refresh).
func (r *Resolver) headers(ctx context.Context) ([]Header, error) {
	r.mu.Lock()
	headers, fresh := r.manifest, r.manifest != nil && r.now().Sub(r.checked) < r.opts.Refresh
	r.mu.Unlock()
	if fresh {
		return headers, nil
	}
	v, err := r.shared(ctx, "manifest", func(ctx context.Context) (any, error) { return r.readManifest(ctx) })
	if err != nil {
		return nil, err
	}
	return v.([]Header), nil
}

// readManifest reads the manifest (conditionally, when one was read before) and keeps it.
func (r *Resolver) readManifest(ctx context.Context) ([]Header, error) {
	r.mu.Lock()
	stale, etag := r.manifest, r.etag
	r.mu.Unlock()
	if stale == nil {
		etag = ""
	}
	data, newETag, err := r.read(ctx, "model manifest", ManifestKey, etag, r.limits.manifestBytes)
	var re *smithyhttp.ResponseError
	switch {
	case errors.As(err, &re) && re.HTTPStatusCode() == 304:
		r.mu.Lock()
		r.stats.ManifestNotModified++
		r.checked = r.now()
		r.mu.Unlock()
		return stale, nil
	case err != nil && stale != nil:
		r.mu.Lock()
		r.checked = r.now() // tried again after the next Refresh, not by every reconcile
		r.mu.Unlock()
		return stale, nil
	case err != nil:
		return nil, err
	}
	headers, err := ParseManifest(data)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.stats.ManifestGets++
	r.manifest, r.etag, r.checked = headers, newETag, r.now()
	r.mu.Unlock()
	return headers, nil
}

// spec returns the spec file at key, read once while it stays cached.
func (r *Resolver) spec(ctx context.Context, key string) (*Specs, error) {
	if s := r.cachedSpec(key); s != nil {
		return s, nil
	}
	v, err := r.shared(ctx, "spec "+key, func(ctx context.Context) (any, error) {
		data, _, err := r.read(ctx, "spec", key, "", r.limits.specBytes)
		if err != nil {
			return nil, err
		}
		s, err := ParseSpecs(data)
		if err != nil {
			return nil, fmt.Errorf("s3://%s/%s: %w", r.opts.Bucket, key, err)
		}
		r.keepSpec(key, s, int64(len(data)))
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Specs), nil
}

// cachedSpec returns the spec kept for key, or nil (an entry older than the TTL is dropped).
func (r *Resolver) cachedSpec(key string) *Specs {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.specs[key]
	if !ok {
		return nil
	}
	if r.now().Sub(c.read) >= r.limits.specTTL {
		r.dropSpec(key)
		return nil
	}
	r.uses++
	c.lastUse = r.uses
	return c.specs
}

// keepSpec keeps a spec file read, dropping the least recently used ones past the bounds.
func (r *Resolver) keepSpec(key string, s *Specs, size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.SpecGets++
	r.dropSpec(key)
	r.uses++
	r.specs[key] = &cachedSpec{specs: s, size: size, read: r.now(), lastUse: r.uses}
	r.specBytes += size
	for len(r.specs) > r.limits.cachedSpecs || (r.specBytes > r.limits.cachedSpecBytes && len(r.specs) > 1) {
		oldest := ""
		for k, c := range r.specs {
			if k != key && (oldest == "" || c.lastUse < r.specs[oldest].lastUse) {
				oldest = k
			}
		}
		r.dropSpec(oldest)
	}
}

// dropSpec forgets the spec kept for key, if any. r.mu is held.
func (r *Resolver) dropSpec(key string) {
	if c, ok := r.specs[key]; ok {
		r.specBytes -= c.size
		delete(r.specs, key)
	}
}

// shared runs read as the one flight for key, or joins the flight under way, and waits for its
// answer no longer than ctx allows. The read is the flight's, not the first caller's: it runs
// in a context of its own that keeps ctx's values, not its cancellation, and ends at the read
// timeout whoever stops waiting, so the flight's goroutine never outlives it.
func (r *Resolver) shared(ctx context.Context, key string, read func(context.Context) (any, error)) (any, error) {
	ch := r.flights.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.limits.readTimeout)
		defer cancel()
		return read(rctx)
	})
	select {
	case res := <-ch:
		return res.Val, res.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for JumpStart's %s from s3://%s: %w", key, r.opts.Bucket, ctx.Err())
	}
}

// read GETs key from the content bucket (if its ETag is no longer etag, when set): at most
// limit bytes, within the read timeout that ctx carries. It returns the body and its ETag.
func (r *Resolver) read(ctx context.Context, what, key, etag string, limit int64) ([]byte, string, error) {
	where := fmt.Sprintf("JumpStart's %s s3://%s/%s", what, r.opts.Bucket, key)
	fail := func(err error) ([]byte, string, error) {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, "", fmt.Errorf("reading %s: no answer within %s: %w", where, r.limits.readTimeout, err)
		}
		return nil, "", fmt.Errorf("reading %s: %w", where, err)
	}
	in := &s3.GetObjectInput{Bucket: aws.String(r.opts.Bucket), Key: aws.String(key)}
	if etag != "" {
		in.IfNoneMatch = aws.String(etag)
	}
	out, err := r.client.GetObject(ctx, in)
	if err != nil {
		return fail(err)
	}
	defer out.Body.Close()
	tooLarge := fmt.Errorf("%s is larger than %d MiB, the most prewarm reads of it", where, limit>>20)
	if aws.ToInt64(out.ContentLength) > limit {
		return nil, "", tooLarge
	}
	data, err := io.ReadAll(io.LimitReader(out.Body, limit+1))
	switch {
	case err != nil:
		return fail(err)
	case int64(len(data)) > limit:
		return nil, "", tooLarge
	}
	return data, aws.ToString(out.ETag), nil
}

// closest is the manifest's model id nearest to id (the longest common prefix, then the
// shortest), to suggest.
func closest(id string, headers []Header) string {
	best, bestLen := "", -1
	for _, h := range headers {
		n := 0
		for n < len(id) && n < len(h.ModelID) && id[n] == h.ModelID[n] {
			n++
		}
		if n > bestLen || (n == bestLen && len(h.ModelID) < len(best)) {
			best, bestLen = h.ModelID, n
		}
	}
	if bestLen < 4 {
		return ""
	}
	return best
}
