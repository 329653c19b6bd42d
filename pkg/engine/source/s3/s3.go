// Package s3 reads a model from an S3 bucket, or an S3-compatible store, under a key prefix.
package s3

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/errgroup"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Options say where the model is and how to reach it.
type Options struct {
	// Bucket and Prefix locate the model: every object under Prefix/ is a file.
	Bucket, Prefix string
	// Region is the bucket's region; default from the environment, else us-east-1.
	Region string
	// Endpoint overrides the S3 endpoint (an S3-compatible store), e.g. http://127.0.0.1:7070.
	Endpoint string
	// PathStyle addresses the bucket in the path instead of the host name.
	PathStyle bool
	// AccessKeyID and SecretAccessKey (and SessionToken, for temporary credentials), when set,
	// replace the standard credential chain.
	AccessKeyID, SecretAccessKey, SessionToken string
	// Anonymous sends unsigned requests (public buckets).
	Anonymous bool
	// HTTPClient replaces the default transport, tuned for many parallel ranged reads.
	HTTPClient aws.HTTPClient
	// MaxConnections sizes the default transport's connection pool; default 64.
	MaxConnections int
	// ListPageSize is the number of keys asked for per ListObjectsV2 page; default the
	// server's (1000 on S3).
	ListPageSize int32
	// MaxFiles is the most objects List returns; more fail the listing with a
	// *source.TooManyFilesError, before any is asked for its checksums. Default
	// source.DefaultMaxFiles.
	MaxFiles int
}

// Source is a prefix of a bucket.
type Source struct {
	client   *s3.Client
	pageSize int32
	maxFiles int
	bucket   string
	prefix   string   // "" or ending in "/"
	etags    sync.Map // relative path -> ETag seen by List
}

// NewTransport returns an HTTP client tuned for many parallel ranged GETs to one endpoint:
// every connection kept for reuse, no compression, large buffers. It honours the SDK's own
// settings (a custom CA bundle from AWS_CA_BUNDLE, proxies from the environment).
func NewTransport(maxConns int) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout, d.KeepAlive = 10*time.Second, 30*time.Second }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConns = 2 * maxConns
			tr.MaxIdleConnsPerHost = 2 * maxConns
			tr.IdleConnTimeout = 90 * time.Second
			tr.ResponseHeaderTimeout = 60 * time.Second
			tr.DisableCompression = true
			tr.ReadBufferSize = 256 << 10
			tr.WriteBufferSize = 64 << 10
		})
}

// New returns a source for opts.
func New(ctx context.Context, opts Options) (*Source, error) {
	if opts.Bucket == "" {
		return nil, errors.New("s3: no bucket")
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = 64
	}
	var hc aws.HTTPClient = NewTransport(opts.MaxConnections)
	if opts.HTTPClient != nil {
		hc = opts.HTTPClient
	}
	loads := []func(*config.LoadOptions) error{
		config.WithHTTPClient(hc),
		// The engine verifies every file itself and retries ranged reads from the byte reached.
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if opts.Region != "" {
		loads = append(loads, config.WithRegion(opts.Region))
	}
	switch {
	case opts.Anonymous:
		loads = append(loads, config.WithCredentialsProvider(aws.AnonymousCredentials{}))
	case opts.AccessKeyID != "":
		loads = append(loads, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(opts.AccessKeyID, opts.SecretAccessKey, opts.SessionToken)))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("s3: loading AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if opts.Endpoint != "" {
			o.BaseEndpoint = aws.String(opts.Endpoint)
		}
		o.UsePathStyle = opts.PathStyle
	})
	prefix := strings.TrimPrefix(opts.Prefix, "/")
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Source{client: client, bucket: opts.Bucket, prefix: prefix, pageSize: opts.ListPageSize, maxFiles: source.MaxFiles(opts.MaxFiles)}, nil
}

func (s *Source) String() string { return "s3://" + s.bucket + "/" + s.prefix }

var md5ETag = regexp.MustCompile(`^[0-9a-f]{32}$`)

// List pages through the prefix, then asks each object for its full-object checksums. A
// prefix of more than MaxFiles objects fails as soon as a page passes the bound.
func (s *Source) List(ctx context.Context) (source.Listing, error) {
	var files []source.File
	in := &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &s.prefix}
	if s.pageSize > 0 {
		in.MaxKeys = aws.Int32(s.pageSize)
	}
	p := s3.NewListObjectsV2Paginator(s.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return source.Listing{}, s.wrap(err, "listing")
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			rel := strings.TrimPrefix(key, s.prefix)
			if rel == "" || strings.HasSuffix(key, "/") {
				continue // the prefix itself, or a "directory" marker
			}
			if len(files) == s.maxFiles {
				return source.Listing{}, &source.TooManyFilesError{Source: s.String(), Max: s.maxFiles,
					Hint: "narrow the prefix (modelLocation) to the model's own files"}
			}
			files = append(files, source.File{Path: rel, Size: aws.ToInt64(o.Size), Version: strings.Trim(aws.ToString(o.ETag), `"`)})
		}
	}
	if len(files) == 0 {
		return source.Listing{}, &source.NotFoundError{Err: fmt.Errorf("no objects under %s", s.String())}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range files {
		g.Go(func() error { return s.checksums(gctx, &files[i]) })
	}
	return source.Listing{Files: files}, g.Wait()
}

// checksums fills f's checksums from a HEAD: the full-object CRC, SHA-256 or SHA-1 the object was
// uploaded with, and the ETag when it is the MD5 of the bytes (single-part, not KMS-encrypted).
func (s *Source) checksums(ctx context.Context, f *source.File) error {
	key := s.prefix + f.Path
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key, ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		return s.wrap(err, "reading the checksums of "+key)
	}
	etag := strings.Trim(aws.ToString(out.ETag), `"`)
	s.etags.Store(f.Path, aws.ToString(out.ETag))
	f.Version = etag
	if v := aws.ToString(out.VersionId); v != "" && v != "null" {
		f.Version += "@" + v
	}
	full := out.ChecksumType == "" || out.ChecksumType == types.ChecksumTypeFullObject
	if full && !strings.Contains(aws.ToString(out.ChecksumSHA256), "-") {
		f.Checksums.SHA256 = b64ToHex(aws.ToString(out.ChecksumSHA256))
	}
	if full && !strings.Contains(aws.ToString(out.ChecksumSHA1), "-") {
		f.Checksums.SHA1 = b64ToHex(aws.ToString(out.ChecksumSHA1))
	}
	if full && !strings.Contains(aws.ToString(out.ChecksumCRC32C), "-") {
		f.Checksums.CRC32C = aws.ToString(out.ChecksumCRC32C)
	}
	f.Checksums.CRC64NVME = aws.ToString(out.ChecksumCRC64NVME) // always full-object
	kms := out.ServerSideEncryption == types.ServerSideEncryptionAwsKms || out.ServerSideEncryption == types.ServerSideEncryptionAwsKmsDsse
	if md5ETag.MatchString(etag) && !kms && out.SSECustomerAlgorithm == nil {
		f.Checksums.MD5 = etag
	}
	return nil
}

// OpenRange GETs a byte range. If-Match on the listed ETag makes a change of the object during
// the download an error instead of a silent mix of two versions.
func (s *Source) OpenRange(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	key := s.prefix + path
	in := &s3.GetObjectInput{
		Bucket: &s.bucket,
		Key:    &key,
		Range:  aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
	}
	if etag, ok := s.etags.Load(path); ok {
		in.IfMatch = aws.String(etag.(string))
	}
	out, err := s.client.GetObject(ctx, in, func(o *s3.Options) { o.Retryer = aws.NopRetryer{} })
	if err != nil {
		return nil, s.wrap(err, "reading "+key)
	}
	return out.Body, nil
}

// wrap maps SDK errors onto the engine's classes: access, not found, or an HTTP status.
func (s *Source) wrap(err error, what string) error {
	var apiErr smithy.APIError
	code := ""
	if errors.As(err, &apiErr) {
		code = apiErr.ErrorCode()
	}
	status, retryAfter := 0, ""
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
		if re.Response != nil {
			retryAfter = re.Response.Header.Get("Retry-After")
		}
	}
	switch {
	case code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
		code == "ExpiredToken" || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return &source.AccessError{Err: fmt.Errorf("%s: %w", what, err), Hint: "check the credentials and the bucket policy"}
	case code == "NoSuchBucket" || code == "NoSuchKey" || status == http.StatusNotFound:
		return &source.NotFoundError{Err: fmt.Errorf("%s: %w", what, err)}
	case status == http.StatusPreconditionFailed:
		return fmt.Errorf("%s: the object changed during the download: %w", what, err)
	case status != 0:
		return &source.StatusError{StatusCode: status, Code: code, Message: fmt.Sprintf("%s: %v", what, err), RetryAfter: retryAfter}
	}
	return fmt.Errorf("%s: %w", what, err)
}

func b64ToHex(b64 string) string {
	if b64 == "" {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%x", raw)
}
