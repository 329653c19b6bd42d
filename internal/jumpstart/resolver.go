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

	"github.com/prewarm/prewarm/internal/catalog"
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

// Resolver reads JumpStart's manifest and spec files from S3, keeping the manifest (revalidated
// every Refresh) and every spec file it read (a spec key names one version: it never changes).
type Resolver struct {
	opts   Options
	client *s3.Client
	now    func() time.Time

	mu       sync.Mutex
	manifest []Header
	etag     string
	checked  time.Time
	specs    map[string]*Specs
	// Stats count the reads, for tests and metrics.
	stats Stats
}

// Stats count a resolver's reads of the manifest.
type Stats struct {
	// ManifestGets are full reads; ManifestNotModified revalidations answered 304.
	ManifestGets, ManifestNotModified int
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
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(opts.Region))
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
	return &Resolver{opts: opts, client: client, now: time.Now, specs: map[string]*Specs{}}, nil
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
func (r *Resolver) headers(ctx context.Context) ([]Header, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.manifest != nil && r.now().Sub(r.checked) < r.opts.Refresh {
		return r.manifest, nil
	}
	in := &s3.GetObjectInput{Bucket: aws.String(r.opts.Bucket), Key: aws.String(ManifestKey)}
	if r.etag != "" && r.manifest != nil {
		in.IfNoneMatch = aws.String(r.etag)
	}
	out, err := r.client.GetObject(ctx, in)
	var re *smithyhttp.ResponseError
	switch {
	case errors.As(err, &re) && re.HTTPStatusCode() == 304:
		r.stats.ManifestNotModified++
		r.checked = r.now()
		return r.manifest, nil
	case err != nil:
		if r.manifest != nil {
			// The manifest read before stands while S3 cannot be reached.
			return r.manifest, nil
		}
		return nil, fmt.Errorf("reading JumpStart's model manifest s3://%s/%s: %w", r.opts.Bucket, ManifestKey, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("reading JumpStart's model manifest s3://%s/%s: %w", r.opts.Bucket, ManifestKey, err)
	}
	headers, err := ParseManifest(data)
	if err != nil {
		return nil, err
	}
	r.stats.ManifestGets++
	r.manifest, r.etag, r.checked = headers, aws.ToString(out.ETag), r.now()
	return headers, nil
}

// spec returns the spec file at key, read once.
func (r *Resolver) spec(ctx context.Context, key string) (*Specs, error) {
	r.mu.Lock()
	s, ok := r.specs[key]
	r.mu.Unlock()
	if ok {
		return s, nil
	}
	out, err := r.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(r.opts.Bucket), Key: aws.String(key)})
	if err != nil {
		return nil, fmt.Errorf("reading JumpStart's spec s3://%s/%s: %w", r.opts.Bucket, key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("reading JumpStart's spec s3://%s/%s: %w", r.opts.Bucket, key, err)
	}
	s, err = ParseSpecs(data)
	if err != nil {
		return nil, fmt.Errorf("s3://%s/%s: %w", r.opts.Bucket, key, err)
	}
	r.mu.Lock()
	r.specs[key] = s
	r.mu.Unlock()
	return s, nil
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
