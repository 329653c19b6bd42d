package s3_test

import (
	"bytes"
	"context"
	"crypto/md5" //nolint:gosec // S3 ETags
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/google/go-cmp/cmp"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	s3src "github.com/prewarm/prewarm/pkg/engine/source/s3"
)

const (
	bucket = "example-bucket"
	prefix = "models/example-model"
)

var (
	server *s3fixture.Server
	model  map[string][]byte
)

func TestMain(m *testing.M) {
	if testutil.SkipPackageIfShort() {
		return
	}
	dir, err := os.MkdirTemp("", "s3-test-")
	if err != nil {
		panic(err)
	}
	server, err = s3fixture.Start(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	model = map[string][]byte{
		"config.json":                      []byte(`{"model_type":"llama"}`),
		"model-00001-of-00002.safetensors": gen.Bytes(1, 6<<20+777),
		"model-00002-of-00002.safetensors": gen.Bytes(2, 5<<20),
		"tokenizer/tokenizer.json":         gen.Bytes(3, 123456),
	}
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			server.Stop()
			os.Exit(1)
		}
	}
	must(server.CreateBucket(ctx, bucket))
	for p, data := range model {
		must(server.PutBytes(ctx, bucket, prefix+"/"+p, data))
	}
	// A sibling prefix that shares the first characters must not be listed.
	must(server.PutBytes(ctx, bucket, prefix+"-v2/other.bin", []byte("not this model")))
	code := m.Run()
	server.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newSource(t *testing.T, endpoint string, mutate ...func(*s3src.Options)) *s3src.Source {
	t.Helper()
	opts := s3src.Options{
		Bucket: bucket, Prefix: prefix, Region: s3fixture.Region, Endpoint: endpoint, PathStyle: true,
		AccessKeyID: s3fixture.AccessKey, SecretAccessKey: s3fixture.SecretKey,
	}
	for _, m := range mutate {
		m(&opts)
	}
	src, err := s3src.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func testEngine(opts ...engine.Option) *engine.Engine {
	return engine.New(append([]engine.Option{
		engine.WithConcurrency(8), engine.WithPartSize(1 << 20), engine.WithRetry(10, 20*time.Millisecond, 500*time.Millisecond),
	}, opts...)...)
}

func assertModel(t *testing.T, dest string) {
	t.Helper()
	for p, data := range model {
		got, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s differs from the object", p)
		}
	}
	var names []string
	entries, _ := os.ReadDir(dest)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{".prewarm-manifest.json", "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("entries of dest (-want +got):\n%s", diff)
	}
}

func TestListGivesSizesAndMD5(t *testing.T) {
	l, err := newSource(t, server.Endpoint).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]source.File{}
	for _, f := range l.Files {
		got[f.Path] = f
	}
	if len(got) != len(model) {
		t.Fatalf("listed %d files, want %d: %+v", len(got), len(model), l.Files)
	}
	for p, data := range model {
		sum := md5.Sum(data) //nolint:gosec // S3 ETag
		f := got[p]
		if f.Size != int64(len(data)) || f.Checksums.MD5 != hex.EncodeToString(sum[:]) || f.Version == "" {
			t.Errorf("%s: %+v; want size %d, md5 %x", p, f, len(data), sum)
		}
	}
}

// The CRC64NVME the AWS SDK computed on upload (the checksum S3 keeps and the engine verifies
// against) is the engine's, for every object of the model.
func TestEngineCRC64NVMEIsTheSDKs(t *testing.T) {
	for p, data := range model {
		out, err := server.Client.HeadObject(context.Background(), &s3.HeadObjectInput{
			Bucket: aws.String(bucket), Key: aws.String(prefix + "/" + p), ChecksumMode: types.ChecksumModeEnabled,
		})
		if err != nil {
			t.Fatal(err)
		}
		sdk := aws.ToString(out.ChecksumCRC64NVME)
		if sdk == "" {
			t.Fatalf("%s: no CRC64NVME stored; the SDK's default upload checksum is needed for this test", p)
		}
		if got := engine.CRC64NVME(data); got != sdk {
			t.Errorf("%s: engine %s, SDK %s", p, got, sdk)
		}
	}
}

// A listing longer than one page is followed to its end.
func TestListFollowsPages(t *testing.T) {
	var listCalls atomic.Int64
	proxy, err := shaper.Start(server.Endpoint, shaper.Options{Fault: func(r *http.Request, _ int64) (int, int64) {
		if r.URL.Query().Has("list-type") {
			listCalls.Add(1)
		}
		return 0, -1
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l, err := newSource(t, proxy.URL, func(o *s3src.Options) { o.ListPageSize = 1 }).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Files) != len(model) {
		t.Errorf("listed %d files one per page, want %d", len(l.Files), len(model))
	}
	if listCalls.Load() < int64(len(model)) {
		t.Errorf("%d ListObjectsV2 calls for %d keys one per page: paging not exercised", listCalls.Load(), len(model))
	}
}

// A prefix with more objects than MaxFiles fails the listing at the page that passes the bound,
// before any object is asked for its checksums, and the engine writes nothing; a prefix of
// exactly MaxFiles objects is fetched.
func TestListStopsAtMaxFiles(t *testing.T) {
	var listCalls, heads atomic.Int64
	proxy, err := shaper.Start(server.Endpoint, shaper.Options{Fault: func(r *http.Request, _ int64) (int, int64) {
		switch {
		case r.URL.Query().Has("list-type"):
			listCalls.Add(1)
		case r.Method == http.MethodHead:
			heads.Add(1)
		}
		return 0, -1
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	_, err = newSource(t, proxy.URL, func(o *s3src.Options) { o.ListPageSize, o.MaxFiles = 1, 2 }).List(context.Background())
	var tooMany *source.TooManyFilesError
	if !errors.As(err, &tooMany) || !errors.Is(err, source.ErrTooManyFiles) || source.Retryable(err) {
		t.Fatalf("List: %v; want a TooManyFilesError, not retryable", err)
	}
	if !strings.Contains(err.Error(), "s3://"+bucket+"/"+prefix+"/ holds more than 2 files") || !strings.Contains(err.Error(), "modelLocation") {
		t.Errorf("message %q does not name the prefix, the bound and the field to narrow", err)
	}
	if n, h := listCalls.Load(), heads.Load(); n != 3 || h != 0 {
		t.Errorf("%d pages listed and %d HEADs; want 3 pages of one key (the third passes the bound) and no HEAD", n, h)
	}

	dest := filepath.Join(t.TempDir(), "m")
	_, err = testEngine().Fetch(context.Background(), engine.Request{Source: newSource(t, server.Endpoint, func(o *s3src.Options) { o.MaxFiles = len(model) - 1 }), Dest: dest})
	if !errors.Is(err, source.ErrTooManyFiles) {
		t.Fatalf("Fetch: %v; want ErrTooManyFiles", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(dest)); len(entries) != 0 {
		t.Errorf("Fetch left %v; want nothing written", entries)
	}
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: newSource(t, server.Endpoint, func(o *s3src.Options) { o.MaxFiles = len(model) }), Dest: dest}); err != nil {
		t.Errorf("exactly MaxFiles objects: %v", err)
	}
}

func TestFetchFromS3(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "m")
	res, err := testEngine().Fetch(context.Background(), engine.Request{Source: newSource(t, server.Endpoint), Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	assertModel(t, dest)
	var total int64
	for _, d := range model {
		total += int64(len(d))
	}
	l, err := newSource(t, server.Endpoint).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rev := source.ContentRevision(l.Files)
	if diff := cmp.Diff(engine.Result{Files: 4, Bytes: total, Fetched: total, Revision: rev}, res, cmpIgnoreDuration); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

// Objects rewritten under the same prefix give another content revision: a fetch pinned to the
// first one refuses the new content and downloads nothing, so two nodes (or a cold pod) never
// hold different weights under one cache.
func TestFetchPinnedToARevisionRefusesARewrite(t *testing.T) {
	ctx := context.Background()
	const rewritten = "models/rewritten"
	for p, data := range model {
		if err := server.PutBytes(ctx, bucket, rewritten+"/"+p, data); err != nil {
			t.Fatal(err)
		}
	}
	src := newSource(t, server.Endpoint, func(o *s3src.Options) { o.Prefix = rewritten })
	first := filepath.Join(t.TempDir(), "first")
	res, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: first})
	if err != nil {
		t.Fatal(err)
	}
	pinned := res.Revision
	if again, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "same"), Revision: pinned}); err != nil || again.Revision != pinned {
		t.Fatalf("the same content, pinned: %+v, %v", again, err)
	}
	if err := server.PutBytes(ctx, bucket, rewritten+"/config.json", []byte(`{"model_type":"mistral"}`)); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(t.TempDir(), "second")
	_, err = testEngine().Fetch(ctx, engine.Request{Source: src, Dest: second, Revision: pinned})
	if !errors.Is(err, engine.ErrSourceChanged) || !strings.Contains(err.Error(), pinned) {
		t.Errorf("a rewritten source, pinned: %v; want ErrSourceChanged naming the pinned revision", err)
	}
	if _, err := os.Stat(second); !os.IsNotExist(err) {
		t.Errorf("something was written for a source that changed: %v", err)
	}
	if res, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "new")}); err != nil || res.Revision == pinned {
		t.Errorf("unpinned, the new content is fetched under a new revision: %+v, %v", res, err)
	}
}

var cmpIgnoreDuration = cmp.Transformer("noDuration", func(r engine.Result) engine.Result { r.Duration = 0; return r })

func TestWrongCredentialsGiveAccessError(t *testing.T) {
	src := newSource(t, server.Endpoint, func(o *s3src.Options) { o.SecretAccessKey = "wrong" })
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if !errors.Is(err, source.ErrAccessDenied) {
		t.Fatalf("err = %v; want access denied", err)
	}
}

func TestMissingPrefixGivesNotFound(t *testing.T) {
	src := newSource(t, server.Endpoint, func(o *s3src.Options) { o.Prefix = "models/nothing-here" })
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if !errors.Is(err, source.ErrNotFound) {
		t.Fatalf("err = %v; want not found", err)
	}
}

// Injected 503s and connections cut mid-body are retried until every byte is right.
func TestInjectedFailuresRetriedToSuccess(t *testing.T) {
	proxy, err := shaper.Start(server.Endpoint, shaper.Options{Fault: func(r *http.Request, n int64) (int, int64) {
		if r.Method != http.MethodGet || r.URL.Query().Has("list-type") {
			return 0, -1
		}
		switch n % 4 {
		case 1:
			return http.StatusServiceUnavailable, -1
		case 2:
			return 0, 100_000 // reset after 100 kB
		}
		return 0, -1
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: newSource(t, proxy.URL), Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertModel(t, dest)
}

// A byte flipped in the stored object (its ETag unchanged) fails verification; nothing is
// published.
func TestCorruptObjectFailsVerification(t *testing.T) {
	ctx := context.Background()
	data := gen.Bytes(9, 3<<20)
	key := "corrupt/model.safetensors"
	if err := server.PutBytes(ctx, bucket, key, data); err != nil {
		t.Fatal(err)
	}
	onDisk := filepath.Join(server.Dir, bucket, key)
	f, err := os.OpenFile(onDisk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{data[2<<20] ^ 0xff}, 2<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dest := filepath.Join(t.TempDir(), "m")
	src := newSource(t, server.Endpoint, func(o *s3src.Options) { o.Prefix = "corrupt" })
	_, err = testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest})
	var verr *engine.VerificationError
	// The SDK uploads with a full-object CRC64NVME, which the engine prefers to the MD5 ETag.
	if !errors.As(err, &verr) || verr.Path != "model.safetensors" || verr.Kind != "crc64nvme" {
		t.Fatalf("err = %v; want a crc64nvme VerificationError for model.safetensors", err)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dest published: %v", err)
	}
}

// The S3 server is killed part way and started again: the download resumes and verifies.
func TestServerRestartMidDownload(t *testing.T) {
	proxy, err := shaper.Start(server.Endpoint, shaper.Options{BytesPerSecond: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var restarted atomic.Bool
	restartErr := make(chan error, 1)
	e := testEngine(engine.WithRetry(30, 50*time.Millisecond, 500*time.Millisecond), engine.WithProgress(func(p engine.Progress) {
		if p.BytesDone > 2<<20 && restarted.CompareAndSwap(false, true) {
			go func() { restartErr <- server.Restart() }()
		}
	}, 20*time.Millisecond))
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := e.Fetch(context.Background(), engine.Request{Source: newSource(t, proxy.URL), Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if !restarted.Load() {
		t.Fatal("the server was never restarted")
	}
	if err := <-restartErr; err != nil {
		t.Fatal(err)
	}
	assertModel(t, dest)
}

// Which uploads give a shard a digest that lets nodes share it (source.Checksums.Cryptographic):
// one part with a SHA-256 checksum does, the object's full-object SHA-256 (what the README tells
// users to upload large shards with); parts do not, with CRCs (aws s3 cp's default for a large
// file) or with SHA-256 checksums (S3 keeps a checksum of the parts' checksums then, not of the
// bytes).
func TestDigestsOfEachUploadShape(t *testing.T) {
	ctx := context.Background()
	const pfx = "models/upload-shapes"
	data := gen.Bytes(7, 11<<20)
	sum := sha256.Sum256(data)
	put := func(key string, in *s3.PutObjectInput) {
		in.Bucket, in.Key, in.Body, in.ContentLength = aws.String(bucket), aws.String(pfx+"/"+key), bytes.NewReader(data), aws.Int64(int64(len(data)))
		if _, err := server.Client.PutObject(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	put("one-part-sha256.safetensors", &s3.PutObjectInput{ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
	if err := server.PutMultipart(ctx, bucket, pfx+"/parts-crc.safetensors", data, 5<<20); err != nil {
		t.Fatal(err)
	}
	key := pfx + "/parts-sha256.safetensors"
	up, err := server.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: &key, ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
	if err != nil {
		t.Fatal(err)
	}
	var parts []types.CompletedPart
	for n, off := int32(1), 0; off < len(data); n, off = n+1, off+5<<20 {
		body := data[off:min(off+5<<20, len(data))]
		out, err := server.Client.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: &key, UploadId: up.UploadId, PartNumber: aws.Int32(n),
			Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))), ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: out.ETag, ChecksumSHA256: out.ChecksumSHA256})
	}
	if _, err := server.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket), Key: &key, UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}

	l, err := newSource(t, server.Endpoint, func(o *s3src.Options) { o.Prefix = pfx }).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]source.Checksums{}
	for _, f := range l.Files {
		got[f.Path] = f.Checksums
	}
	if c := got["one-part-sha256.safetensors"]; c.SHA256 != hex.EncodeToString(sum[:]) || !c.Cryptographic() {
		t.Errorf("one part with a SHA-256 checksum: %+v; want the SHA-256 of its bytes, %x, a digest", c, sum)
	}
	for _, name := range []string{"parts-crc.safetensors", "parts-sha256.safetensors"} {
		if c, ok := got[name]; !ok || c.Cryptographic() {
			t.Errorf("%s: listed %t, checksums %+v; want no digest", name, ok, c)
		}
	}
}
