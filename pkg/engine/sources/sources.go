// Package sources opens a source from a typed address (Spec). People may also write the address
// as a URI: s3://bucket/prefix, hf://org/name[@revision], or a local directory (a path, or
// file:///path). Parse reads that form literally: a key prefix or a path is bytes, and nothing
// in it (%xx, ?, #) is URI syntax.
package sources

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
	"github.com/prewarm/prewarm/pkg/engine/source/hf"
	"github.com/prewarm/prewarm/pkg/engine/source/s3"
)

// Kind is the kind of a source.
type Kind string

// The kinds of source.
const (
	S3          Kind = "s3"
	HuggingFace Kind = "huggingface"
	Dir         Kind = "dir"
)

// Spec is a source's address.
type Spec struct {
	Kind Kind
	// Bucket and Prefix address S3 objects; Region is the bucket's region.
	Bucket, Prefix, Region string
	// Repo and Revision address a Hugging Face repository.
	Repo, Revision string
	// Path is a local or mounted directory.
	Path string
}

// String writes the address as Parse reads it.
func (s Spec) String() string {
	switch s.Kind {
	case S3:
		return "s3://" + s.Bucket + "/" + s.Prefix
	case HuggingFace:
		if s.Revision != "" {
			return "hf://" + s.Repo + "@" + s.Revision
		}
		return "hf://" + s.Repo
	}
	return s.Path
}

// Validate says what is wrong with the address, if anything.
func (s Spec) Validate() error {
	switch s.Kind {
	case S3:
		if s.Bucket == "" || strings.Contains(s.Bucket, "/") {
			return fmt.Errorf("S3 source: want a bucket name, got %q", s.Bucket)
		}
	case HuggingFace:
		org, name, ok := strings.Cut(s.Repo, "/")
		if !ok || org == "" || name == "" || strings.ContainsAny(s.Repo, "@") || strings.Contains(name, "/") {
			return fmt.Errorf("a Hugging Face source wants a repository org/name, got %q", s.Repo)
		}
	case Dir:
		if s.Path == "" {
			return fmt.Errorf("directory source: want a path")
		}
	default:
		return fmt.Errorf("unknown source kind %q; want s3, huggingface or dir", s.Kind)
	}
	return nil
}

// Parse reads an address that a person wrote: s3://bucket/prefix, hf://org/name[@revision],
// file:///path or a path. Everything after the bucket is the key prefix, byte for byte.
func Parse(uri string) (Spec, error) {
	var s Spec
	switch {
	case strings.HasPrefix(uri, "s3://"):
		s.Kind = S3
		s.Bucket, s.Prefix, _ = strings.Cut(strings.TrimPrefix(uri, "s3://"), "/")
	case strings.HasPrefix(uri, "hf://"):
		s.Kind = HuggingFace
		s.Repo, s.Revision, _ = strings.Cut(strings.TrimPrefix(uri, "hf://"), "@")
	case strings.HasPrefix(uri, "file://"):
		s.Kind, s.Path = Dir, strings.TrimPrefix(uri, "file://")
	case strings.Contains(uri, "://"):
		return Spec{}, fmt.Errorf("%q: unknown scheme; want s3://, hf://, file:// or a path", uri)
	default:
		s.Kind, s.Path = Dir, uri
	}
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("%q: %w", uri, err)
	}
	return s, nil
}

// DefaultPathStyle is how S3 at endpoint is addressed unless asked otherwise: in the path
// whenever an endpoint is set (S3-compatible stores want it), by virtual-hosted names at AWS's
// own (no endpoint).
func DefaultPathStyle(endpoint string) bool { return endpoint != "" }

// Options apply to the sources that use them.
type Options struct {
	// Endpoint overrides the S3 endpoint or the Hugging Face Hub endpoint.
	Endpoint string
	// PathStyle addresses S3 buckets in the path (most S3-compatible stores want it; see
	// DefaultPathStyle).
	PathStyle bool
	// Token is the Hugging Face token.
	Token string
	// AccessKeyID, SecretAccessKey and SessionToken, when set, are the S3 credentials, instead
	// of the standard AWS chain.
	AccessKeyID, SecretAccessKey, SessionToken string
	// Connections sizes the S3 connection pool.
	Connections int
	// MaxFiles is the most files a listing may hold (default source.DefaultMaxFiles): more
	// fail it with a *source.TooManyFilesError.
	MaxFiles int
}

// Open returns the source s names.
func Open(ctx context.Context, s Spec, o Options) (source.Source, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	switch s.Kind {
	case S3:
		return s3.New(ctx, s3.Options{
			Bucket: s.Bucket, Prefix: s.Prefix, Region: s.Region,
			Endpoint: o.Endpoint, PathStyle: o.PathStyle, MaxConnections: o.Connections,
			AccessKeyID: o.AccessKeyID, SecretAccessKey: o.SecretAccessKey, SessionToken: o.SessionToken,
			MaxFiles: o.MaxFiles,
		})
	case HuggingFace:
		return hf.New(hf.Options{RepoID: s.Repo, Revision: s.Revision, Endpoint: o.Endpoint, Token: o.Token, MaxFiles: o.MaxFiles})
	}
	src, err := fs.New(filepath.Clean(s.Path))
	if err != nil {
		return nil, err
	}
	src.MaxFiles = o.MaxFiles
	return src, nil
}
