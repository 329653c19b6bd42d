// Package sources opens a source from a URI: s3://bucket/prefix, hf://org/name[@revision], or
// a local directory (a path, or file:///path).
package sources

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
	"github.com/prewarm/prewarm/pkg/engine/source/hf"
	"github.com/prewarm/prewarm/pkg/engine/source/s3"
)

// Options apply to the sources that use them.
type Options struct {
	// Endpoint overrides the S3 endpoint or the Hugging Face Hub endpoint.
	Endpoint string
	// Region is the S3 bucket's region.
	Region string
	// PathStyle addresses S3 buckets in the path (most S3-compatible stores want it).
	PathStyle bool
	// Revision is the Hugging Face revision; it overrides an @revision in the URI.
	Revision string
	// Token is the Hugging Face token.
	Token string
	// Connections sizes the S3 connection pool.
	Connections int
}

// Open returns the source a URI names.
func Open(ctx context.Context, uri string, o Options) (source.Source, error) {
	switch {
	case strings.HasPrefix(uri, "s3://"):
		u, err := url.Parse(uri)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%q: want s3://bucket/prefix", uri)
		}
		return s3.New(ctx, s3.Options{
			Bucket: u.Host, Prefix: strings.TrimPrefix(u.Path, "/"), Region: o.Region,
			Endpoint: o.Endpoint, PathStyle: o.PathStyle, MaxConnections: o.Connections,
		})
	case strings.HasPrefix(uri, "hf://"):
		repo, rev, _ := strings.Cut(strings.TrimPrefix(uri, "hf://"), "@")
		if o.Revision != "" {
			rev = o.Revision
		}
		return hf.New(hf.Options{RepoID: repo, Revision: rev, Endpoint: o.Endpoint, Token: o.Token})
	case strings.HasPrefix(uri, "file://"):
		return fs.New(strings.TrimPrefix(uri, "file://"))
	case strings.Contains(uri, "://"):
		return nil, fmt.Errorf("%q: unknown scheme; want s3://, hf://, file:// or a path", uri)
	}
	return fs.New(uri)
}
