package jumpstart

import (
	"context"
	"crypto/md5" //nolint:gosec // S3 ETags
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/testutil/jsfixture"
	"github.com/prewarm/prewarm/internal/testutil/stall"
)

// fakeBucket serves the content bucket's objects path-style, as S3 answers GetObject (an ETag;
// 304 to If-None-Match on it; NoSuchKey), counting the GETs of each key. A GET of a stalled key
// is held until its client gives up or the key is released; a chunked key is sent without a
// Content-Length.
type fakeBucket struct {
	URL string

	mu      sync.Mutex
	objects map[string][]byte
	stalled map[string]chan struct{}
	chunked map[string]bool
	gets    map[string]int
}

func startBucket(t *testing.T, objects map[string][]byte) *fakeBucket {
	t.Helper()
	b := &fakeBucket{objects: objects, stalled: map[string]chan struct{}{}, chunked: map[string]bool{}, gets: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(func() {
		b.mu.Lock()
		for key, release := range b.stalled {
			close(release)
			delete(b.stalled, key)
		}
		b.mu.Unlock()
		srv.Close()
	})
	b.URL = srv.URL
	return b
}

func (b *fakeBucket) stall(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stalled[key] = make(chan struct{})
}

func (b *fakeBucket) release(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.stalled[key])
	delete(b.stalled, key)
}

func (b *fakeBucket) getsOf(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gets[key]
}

func (b *fakeBucket) serve(w http.ResponseWriter, r *http.Request) {
	key, inBucket := strings.CutPrefix(r.URL.Path, "/"+jsfixture.Bucket+"/")
	b.mu.Lock()
	b.gets[key]++
	release, stalled := b.stalled[key]
	b.mu.Unlock()
	if stalled {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
	}
	b.mu.Lock()
	data, found := b.objects[key]
	chunked := b.chunked[key]
	b.mu.Unlock()
	if !inBucket || !found {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>%s</Key></Error>`, key)
		return
	}
	etag := fmt.Sprintf(`"%x"`, md5.Sum(data)) //nolint:gosec // S3 ETags
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("ETag", etag)
	if chunked {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	}
	_, _ = w.Write(data)
}

// newResolver is a resolver of the fixture's region reading endpoint, with a clock that moves
// only when the test moves it.
func newResolver(t *testing.T, endpoint string) (*Resolver, *time.Time) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	r, err := New(context.Background(), Options{Where: where, Endpoint: endpoint, PathStyle: true, Refresh: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.now = func() time.Time { return now }
	return r, &now
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type answer struct {
	id  string
	err error
}

// resolveAsync resolves id (its latest version) in the background.
func resolveAsync(ctx context.Context, r *Resolver, id string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		_, err := r.Resolve(ctx, id, "", "ml.g5.8xlarge", true)
		ch <- answer{id, err}
	}()
	return ch
}

// A manifest read that S3 accepts and never answers holds no one but those who wait for it,
// and no longer than their deadlines: a second resolve, of the same model and of another,
// returns at its own deadline while the first read is still under way; the first, whose caller
// set no deadline, ends at the read's.
func TestAStalledManifestReadHoldsNoOtherResolve(t *testing.T) {
	srv, err := stall.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	r, _ := newResolver(t, srv.URL)
	r.limits.readTimeout = 5 * time.Second

	first := resolveAsync(context.Background(), r, "huggingface-llm-mistral-7b-instruct")
	waitFor(t, "connection of the first read", func() bool { return srv.Accepted.Load() >= 1 })
	for _, id := range []string{"huggingface-llm-mistral-7b-instruct", "deepseek-llm-r1-distill-qwen-1-5b"} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		select {
		case a := <-resolveAsync(ctx, r, id):
			if !errors.Is(a.err, context.DeadlineExceeded) || !strings.Contains(a.err.Error(), "waiting for JumpStart's manifest") {
				t.Errorf("%s: %v; want its own deadline, waiting for the manifest", id, a.err)
			}
		case a := <-first:
			t.Fatalf("the resolve of %s waited for the first read to end (%v)", id, a.err)
		case <-time.After(time.Minute):
			t.Fatalf("the resolve of %s was still waiting a minute after its 200 ms deadline", id)
		}
		cancel()
	}
	if n := srv.Accepted.Load(); n != 1 {
		t.Errorf("%d connections to S3; want 1: the later resolves join the read under way", n)
	}
	select {
	case a := <-first:
		if !errors.Is(a.err, context.DeadlineExceeded) || !strings.Contains(a.err.Error(), "no answer within 5s") {
			t.Errorf("first resolve: %v; want the read's deadline", a.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the first read was still under way a minute after its 5 s deadline")
	}
}

// Each spec file has its flight: a stalled spec read holds no other model's resolve, and a
// second resolve of the stalled model joins the read under way instead of starting another.
func TestAStalledSpecReadHoldsOnlyItsModel(t *testing.T) {
	objects, err := jsfixture.Objects(jsfixture.Versions)
	if err != nil {
		t.Fatal(err)
	}
	bucket := startBucket(t, objects)
	r, _ := newResolver(t, bucket.URL)
	stalledKey := jsfixture.SpecKey(jsfixture.Find("huggingface-llm-mistral-7b-instruct", "3.20.1"))
	bucket.stall(stalledKey)

	first := resolveAsync(context.Background(), r, "huggingface-llm-mistral-7b-instruct")
	waitFor(t, "GET of the stalled spec", func() bool { return bucket.getsOf(stalledKey) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	select {
	case a := <-resolveAsync(ctx, r, "deepseek-llm-r1-distill-qwen-1-5b"):
		if a.err != nil {
			t.Errorf("another model: %v", a.err)
		}
	case a := <-first:
		t.Fatalf("another model's resolve waited for the stalled spec read (%v)", a.err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	if a := <-resolveAsync(short, r, "huggingface-llm-mistral-7b-instruct"); !errors.Is(a.err, context.DeadlineExceeded) {
		t.Errorf("the stalled model again: %v; want its own deadline", a.err)
	}
	if n := bucket.getsOf(stalledKey); n != 1 {
		t.Errorf("%d GETs of the stalled spec; want 1: the second resolve joins the read under way", n)
	}
	bucket.release(stalledKey)
	if a := <-first; a.err != nil {
		t.Errorf("the first resolve, once S3 answered: %v", a.err)
	}
}

// A manifest or spec file larger than its bound is not read past it, whether S3 declares its
// length or not; the message names the object and the bound.
func TestReadsAreSizeBounded(t *testing.T) {
	objects, err := jsfixture.Objects(jsfixture.Versions)
	if err != nil {
		t.Fatal(err)
	}
	bucket := startBucket(t, objects)
	mistral := jsfixture.SpecKey(jsfixture.Find("huggingface-llm-mistral-7b-instruct", "3.20.1"))
	bucket.chunked[mistral] = true

	r, _ := newResolver(t, bucket.URL)
	r.limits.manifestBytes = int64(len(objects[ManifestKey]) - 1)
	_, err = r.Resolve(context.Background(), "huggingface-llm-mistral-7b-instruct", "", "ml.g5.8xlarge", true)
	if err == nil || !strings.Contains(err.Error(), "JumpStart's model manifest s3://"+jsfixture.Bucket+"/"+ManifestKey+" is larger than") {
		t.Errorf("a manifest past its bound (Content-Length declared): %v", err)
	}

	r, _ = newResolver(t, bucket.URL)
	r.limits.specBytes = 1 << 10
	if len(objects[mistral]) <= 1<<10 {
		t.Fatalf("the fixture's spec is %d bytes: not past the test's bound", len(objects[mistral]))
	}
	_, err = r.Resolve(context.Background(), "huggingface-llm-mistral-7b-instruct", "", "ml.g5.8xlarge", true)
	if err == nil || !strings.Contains(err.Error(), mistral+" is larger than") {
		t.Errorf("a spec past its bound (chunked): %v", err)
	}
}

// The spec files kept are bounded in number and in bytes (the least recently used go first),
// and one older than the TTL is read again.
func TestSpecCacheIsBounded(t *testing.T) {
	var versions []jsfixture.Version
	for i := range 40 {
		v := jsfixture.Versions[5] // a mistral version: prepacked, with its image
		v.ModelID = fmt.Sprintf("model-%02d", i)
		versions = append(versions, v)
	}
	objects, err := jsfixture.Objects(versions)
	if err != nil {
		t.Fatal(err)
	}
	bucket := startBucket(t, objects)
	r, now := newResolver(t, bucket.URL)
	r.limits.cachedSpecs = 8
	ctx := context.Background()
	resolve := func(id string) {
		t.Helper()
		if _, err := r.Resolve(ctx, id, "", "ml.g5.8xlarge", true); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	for _, v := range versions {
		resolve(v.ModelID)
		// model-00 is used after each other: the least recently used go, not it.
		resolve(versions[0].ModelID)
	}
	r.mu.Lock()
	kept, keptBytes := len(r.specs), r.specBytes
	_, first := r.specs[jsfixture.SpecKey(versions[0])]
	r.mu.Unlock()
	if kept != 8 || !first {
		t.Errorf("%d spec files kept (model-00 among them: %v) after 40; want 8, model-00 kept", kept, first)
	}
	if st := r.Stats(); st.SpecGets != 40 {
		t.Errorf("%d spec reads; want 40 (model-00 read once)", st.SpecGets)
	}

	// In bytes: room for three.
	size := int64(len(objects[jsfixture.SpecKey(versions[0])]))
	if keptBytes != 8*size {
		t.Errorf("kept %d bytes; want 8 × %d", keptBytes, size)
	}
	r.limits.cachedSpecBytes = 3*size + size/2
	resolve(versions[39].ModelID)
	resolve(versions[1].ModelID)
	r.mu.Lock()
	kept = len(r.specs)
	r.mu.Unlock()
	if kept != 3 {
		t.Errorf("%d spec files kept under a bound of 3.5 files' bytes; want 3", kept)
	}

	// Past the TTL, a spec is read again.
	gets := r.Stats().SpecGets
	*now = now.Add(SpecTTL - time.Second)
	resolve(versions[1].ModelID)
	if st := r.Stats(); st.SpecGets != gets {
		t.Errorf("within the TTL: %d spec reads, want %d", st.SpecGets, gets)
	}
	*now = now.Add(2 * time.Second)
	resolve(versions[1].ModelID)
	if st := r.Stats(); st.SpecGets != gets+1 {
		t.Errorf("past the TTL: %d spec reads, want %d", st.SpecGets, gets+1)
	}
}
