package engine_test

import (
	"bytes"
	"context"
	"crypto/md5" //nolint:gosec // test data checksums
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// memSource is an in-memory source with fault injection, for unit tests of the engine's logic.
type memSource struct {
	files    map[string][]byte
	sums     map[string]source.Checksums
	revision string

	mu      sync.Mutex
	fault   func(path string, off, n int64) (int64, error) // cut the read after k bytes with err
	fetched atomic.Int64
	opens   atomic.Int64
}

func newMemSource(files map[string][]byte) *memSource {
	return &memSource{files: files, sums: map[string]source.Checksums{}}
}

func (s *memSource) String() string { return "mem://test" }

func (s *memSource) List(context.Context) (source.Listing, error) {
	var l source.Listing
	for p, data := range s.files {
		l.Files = append(l.Files, source.File{Path: p, Size: int64(len(data)), Checksums: s.sums[p], Version: fmt.Sprintf("%x", md5.Sum(data))}) //nolint:gosec // test
	}
	sort.Slice(l.Files, func(i, j int) bool { return l.Files[i].Path < l.Files[j].Path })
	l.Revision = s.revision
	return l, nil
}

func (s *memSource) OpenRange(_ context.Context, path string, off, n int64) (io.ReadCloser, error) {
	s.opens.Add(1)
	data, ok := s.files[path]
	if !ok {
		return nil, &source.NotFoundError{Err: fmt.Errorf("%s: no such file", path)}
	}
	s.mu.Lock()
	fault := s.fault
	s.mu.Unlock()
	body := data[off : off+n]
	var err error
	if fault != nil {
		var k int64
		if k, err = fault(path, off, n); err != nil {
			if k < 0 {
				return nil, err
			}
			body = body[:k]
		}
	}
	return io.NopCloser(&countingReader{r: bytes.NewReader(body), n: &s.fetched, err: err}), nil
}

type countingReader struct {
	r   io.Reader
	n   *atomic.Int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	if err == io.EOF && c.err != nil {
		err = c.err
	}
	return n, err
}

func modelFiles() map[string][]byte {
	return map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"model-00001-of-00002.safetensors": gen.Bytes(1, 3<<20+12345),
		"model-00002-of-00002.safetensors": gen.Bytes(2, 2<<20),
		"tokenizer/tokenizer.json":         gen.Bytes(3, 70000),
		"empty.txt":                        {},
	}
}

func testEngine(opts ...engine.Option) *engine.Engine {
	base := []engine.Option{
		engine.WithConcurrency(4),
		engine.WithPartSize(256 << 10),
		engine.WithRetry(5, time.Millisecond, 5*time.Millisecond),
	}
	return engine.New(append(base, opts...)...)
}

// assertTree checks that dir holds exactly files (plus prewarm's manifest), byte for byte.
func assertTree(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	got := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		got[filepath.ToSlash(rel)] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{".prewarm-manifest.json": true}
	for p := range files {
		want[p] = true
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("files in %s (-want +got):\n%s", dir, diff)
	}
	for p, data := range files {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, data) {
			t.Errorf("%s: content differs from the source", p)
		}
	}
}

func assertNoLeftovers(t *testing.T, parent string) {
	t.Helper()
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".prewarm-") {
			t.Errorf("left behind in %s: %s", parent, e.Name())
		}
	}
}

func TestFetchWritesExactTreeAndIsIdempotent(t *testing.T) {
	src := newMemSource(modelFiles())
	dest := filepath.Join(t.TempDir(), "models", "m")
	var last engine.Progress
	e := testEngine(engine.WithProgress(func(p engine.Progress) { last = p }, time.Millisecond))

	res, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, src.files)
	assertNoLeftovers(t, filepath.Dir(dest))
	var total int64
	for _, d := range src.files {
		total += int64(len(d))
	}
	if res.Bytes != total || res.Fetched != total || res.Files != 5 || res.UpToDate {
		t.Errorf("result = %+v; want %d bytes, all fetched, 5 files", res, total)
	}
	if last.Phase != engine.PhaseDone || last.BytesDone != total || last.FilesDone != 5 {
		t.Errorf("last progress = %+v", last)
	}

	src.fetched.Store(0)
	res, err = e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	if !res.UpToDate || res.Fetched != 0 || src.fetched.Load() != 0 {
		t.Errorf("second fetch = %+v, %d bytes read; want up to date, nothing read", res, src.fetched.Load())
	}
}

func TestFetchVerifiesChecksums(t *testing.T) {
	files := modelFiles()
	src := newMemSource(files)
	for p, data := range files {
		switch {
		case strings.HasSuffix(p, ".safetensors"):
			sum := sha256.Sum256(data)
			src.sums[p] = source.Checksums{SHA256: hex.EncodeToString(sum[:])}
		case strings.HasSuffix(p, ".json"):
			sum := md5.Sum(data) //nolint:gosec // test
			src.sums[p] = source.Checksums{MD5: hex.EncodeToString(sum[:])}
		}
	}
	src.sums["tokenizer/tokenizer.json"] = source.Checksums{CRC64NVME: engine.CRC64NVME(files["tokenizer/tokenizer.json"])}
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
}

// CRC-64/NVME's check value, as S3 computes it.
func TestCRC64NVMECheckValue(t *testing.T) {
	// 0xae8b14860a799888 big-endian, base64.
	if got, want := engine.CRC64NVME([]byte("123456789")), "rosUhgp5mIg="; got != want {
		t.Errorf("CRC64NVME(123456789) = %s, want %s", got, want)
	}
}

func TestCorruptSourceIsNotPublished(t *testing.T) {
	files := modelFiles()
	src := newMemSource(modelFiles())
	good := sha256.Sum256(files["model-00002-of-00002.safetensors"])
	src.sums["model-00002-of-00002.safetensors"] = source.Checksums{SHA256: hex.EncodeToString(good[:])}
	// One byte flipped at the source after the checksum was taken.
	corrupt := bytes.Clone(files["model-00002-of-00002.safetensors"])
	corrupt[12345] ^= 0x01
	src.files["model-00002-of-00002.safetensors"] = corrupt
	dest := filepath.Join(t.TempDir(), "m")

	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest})
	var verr *engine.VerificationError
	if !errors.As(err, &verr) || verr.Path != "model-00002-of-00002.safetensors" || verr.Kind != "sha256" {
		t.Fatalf("err = %v; want a sha256 VerificationError for the corrupted shard", err)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dest exists after a failed verification: %v", err)
	}

	// Fixed at the source: the rerun fetches the bad file again and publishes.
	src.files["model-00002-of-00002.safetensors"] = files["model-00002-of-00002.safetensors"]
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
}

// A listing that cannot be stored as it is (paths that leave the destination, prewarm's own
// names, names longer than a file system takes) is refused before anything is written, as an
// invalid model: fetching again will not help.
func TestEscapingPathsRefused(t *testing.T) {
	for _, bad := range []string{
		"../escape", "/etc/passwd", "a/../../b", "a/./b", "a//b", "dir/", ".prewarm-manifest.json", "x\x00y",
		strings.Repeat("n", 256), "shards/" + strings.Repeat("n", 250) + ".safetensors",
	} {
		t.Run(bad[:min(len(bad), 32)], func(t *testing.T) {
			parent := t.TempDir()
			src := newMemSource(map[string][]byte{"ok.bin": []byte("ok"), bad: []byte("evil")})
			_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(parent, "m")})
			if err == nil || !strings.Contains(err.Error(), "refusing") || !errors.Is(err, engine.ErrInvalidModel) {
				t.Fatalf("err = %v; want the path refused as an invalid model", err)
			}
			entries, _ := os.ReadDir(parent)
			if len(entries) != 0 {
				t.Errorf("wrote %d entries under the parent", len(entries))
			}
		})
	}
	t.Run("file and directory", func(t *testing.T) {
		src := newMemSource(map[string][]byte{"a": []byte("1"), "a/b": []byte("2")})
		_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
		if err == nil || !strings.Contains(err.Error(), "both as a file and as the directory") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestInsufficientSpaceFailsBeforeWriting(t *testing.T) {
	parent := t.TempDir()
	src := newMemSource(map[string][]byte{"big.bin": gen.Bytes(9, 1<<20)})
	e := testEngine(engine.WithFreeSpace(func(string) (int64, error) { return 250_000, nil }))
	_, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(parent, "m")})
	var serr *engine.InsufficientSpaceError
	if !errors.As(err, &serr) {
		t.Fatalf("err = %v; want InsufficientSpaceError", err)
	}
	if want := fmt.Sprintf("needs 1.0 MB, 250.0 kB free under %s", parent); err.Error() != want {
		t.Errorf("message = %q, want %q", err.Error(), want)
	}
	if src.opens.Load() != 0 {
		t.Errorf("%d reads from the source before the space check failed", src.opens.Load())
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("wrote %d entries under the parent", len(entries))
	}
}

func TestHumanBytesMatchesTheDocumentedMessage(t *testing.T) {
	err := &engine.InsufficientSpaceError{Need: 300e9, Free: 250e9, Dir: "/opt/dlami/nvme"}
	if got, want := err.Error(), "needs 300.0 GB, 250.0 GB free under /opt/dlami/nvme"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

func TestTransientFailuresAreRetried(t *testing.T) {
	files := modelFiles()
	src := newMemSource(files)
	var n atomic.Int64
	errs := []error{
		&source.StatusError{StatusCode: 503, Message: "slow down"},
		&source.StatusError{StatusCode: 500, Message: "internal"},
		syscall.ECONNRESET,
		io.ErrUnexpectedEOF,
	}
	src.fault = func(_ string, _, length int64) (int64, error) {
		i := n.Add(1)
		if i%3 != 0 {
			return length, nil
		}
		err := errs[int(i/3)%len(errs)]
		if i%2 == 0 {
			return -1, err // refused before any byte
		}
		return length / 2, err // cut half way
	}
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
}

func TestPermanentFailureIsNotRetried(t *testing.T) {
	src := newMemSource(modelFiles())
	src.fault = func(string, int64, int64) (int64, error) {
		return -1, &source.AccessError{Err: &source.StatusError{StatusCode: 403, Message: "denied"}}
	}
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if !errors.Is(err, source.ErrAccessDenied) {
		t.Fatalf("err = %v; want access denied", err)
	}
	// One try per part in flight at most, never the retry budget.
	if opens := src.opens.Load(); opens > 4 {
		t.Errorf("%d reads for a permanent failure; want no retries", opens)
	}
}

// A download that dies part way resumes: parts already written are not read again.
func TestInterruptedFetchResumesWithoutRefetching(t *testing.T) {
	files := map[string][]byte{"a.bin": gen.Bytes(5, 4<<20), "b.bin": gen.Bytes(6, 4<<20)}
	src := newMemSource(files)
	var total int64
	for _, d := range files {
		total += int64(len(d))
	}
	// Fail for good once 3 MiB have been served.
	var served atomic.Int64
	src.fault = func(_ string, _, length int64) (int64, error) {
		if served.Add(length) > 3<<20 {
			return -1, &source.AccessError{Err: errors.New("credentials expired")}
		}
		return length, nil
	}
	dest := filepath.Join(t.TempDir(), "m")
	e := testEngine(engine.WithConcurrency(2))
	if _, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err == nil {
		t.Fatal("first fetch succeeded; want the injected failure")
	}
	first := src.fetched.Load()
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dest published after a failed fetch: %v", err)
	}

	src.fault = nil
	src.fetched.Store(0)
	res, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
	assertNoLeftovers(t, filepath.Dir(dest))
	second := src.fetched.Load()
	if res.Fetched != second {
		t.Errorf("Result.Fetched = %d, source served %d", res.Fetched, second)
	}
	if first < 1<<20 || second > total-first+int64(4*(256<<10)) {
		// Parts in flight when the first run failed may be fetched again; nothing else.
		t.Errorf("first run fetched %d, second %d, total %d: the second run fetched what the first had", first, second, total)
	}
}

func TestCancelledFetchStopsAndResumes(t *testing.T) {
	files := map[string][]byte{"a.bin": gen.Bytes(7, 6<<20)}
	src := newMemSource(files)
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	src.fault = func(_ string, _, length int64) (int64, error) {
		if calls.Add(1) == 5 {
			cancel()
		}
		return length, nil
	}
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
	src.fault = nil
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
}

func TestDestinationThatIsNotOursIsRefused(t *testing.T) {
	dest := t.TempDir()
	if err := os.WriteFile(filepath.Join(dest, "precious.txt"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: newMemSource(modelFiles()), Dest: dest})
	if !errors.Is(err, engine.ErrDestNotOurs) {
		t.Fatalf("err = %v; want ErrDestNotOurs", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "precious.txt")); string(b) != "keep" {
		t.Error("the user's file was touched")
	}
}

func TestChangedSourceReplacesTheDestination(t *testing.T) {
	src := newMemSource(modelFiles())
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	v2 := map[string][]byte{"config.json": []byte(`{"v":2}`), "weights.bin": gen.Bytes(11, 1<<20)}
	src2 := newMemSource(v2)
	res, err := testEngine().Fetch(context.Background(), engine.Request{Source: src2, Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	if res.UpToDate {
		t.Error("changed source reported up to date")
	}
	assertTree(t, dest, v2)
	assertNoLeftovers(t, filepath.Dir(dest))
}

// The rate limit holds the download back: 3 MiB at 4 MB/s, with at most a 1 MiB burst, cannot
// finish in under half a second. (A lower bound: a slow machine only makes it longer.)
func TestRateLimitHoldsTheDownloadBack(t *testing.T) {
	src := newMemSource(map[string][]byte{"a.bin": gen.Bytes(21, 3<<20)})
	start := time.Now()
	_, err := testEngine(engine.WithRateLimit(4_000_000)).Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 500*time.Millisecond {
		t.Errorf("3 MiB at 4 MB/s took %s", d)
	}
}

// Files with a CRC are verified from their parts' CRCs as they stream in. A resume with another
// part size leaves parts that do not tile the file; it is then read back, and still verified.
func TestInlineCRCVerificationAcrossResumeWithAnotherPartSize(t *testing.T) {
	files := map[string][]byte{"a.bin": gen.Bytes(31, 5<<20+3), "b.bin": gen.Bytes(32, 3<<20)}
	src := newMemSource(files)
	for p, d := range files {
		src.sums[p] = source.Checksums{CRC64NVME: engine.CRC64NVME(d)}
	}
	var served atomic.Int64
	src.fault = func(_ string, _, length int64) (int64, error) {
		if served.Add(length) > 4<<20 {
			return -1, &source.AccessError{Err: errors.New("stop")}
		}
		return length, nil
	}
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine(engine.WithConcurrency(2)).Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err == nil {
		t.Fatal("first fetch succeeded")
	}
	src.fault = nil
	e := engine.New(engine.WithConcurrency(3), engine.WithPartSize(1<<20))
	if _, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)

	// And a byte changed in flight is caught by the inline CRC.
	bad := newMemSource(map[string][]byte{"c.bin": gen.Bytes(33, 2<<20)})
	bad.sums["c.bin"] = source.Checksums{CRC64NVME: engine.CRC64NVME(bad.files["c.bin"])}
	bad.files["c.bin"] = bytes.Clone(bad.files["c.bin"])
	bad.files["c.bin"][1<<20+5] ^= 1
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: bad, Dest: filepath.Join(t.TempDir(), "c")})
	var verr *engine.VerificationError
	if !errors.As(err, &verr) || verr.Kind != "crc64nvme" {
		t.Fatalf("err = %v; want a crc64nvme VerificationError", err)
	}
}

// A resume where the journal already holds verified files must finish: the verifiers have to
// know, before anything starts, how many files are left to check (an earlier version counted
// while the producer was still skipping verified files, and could wait forever).
func TestResumeWithVerifiedFilesFinishes(t *testing.T) {
	for i := range 20 {
		files := map[string][]byte{"a.json": []byte(`{"a":1}`), "b.json": []byte(`{"b":2}`), "c.bin": gen.Bytes(uint64(40+i), 3<<20)}
		src := newMemSource(files)
		src.fault = func(path string, off, _ int64) (int64, error) {
			if path == "c.bin" && off >= 1<<20 {
				return -1, &source.AccessError{Err: errors.New("stop")}
			}
			return 3 << 20, nil
		}
		dest := filepath.Join(t.TempDir(), "m")
		if _, err := testEngine(engine.WithConcurrency(1)).Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err == nil {
			t.Fatal("first fetch succeeded")
		}
		src.fault = nil
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest})
		cancel()
		if err != nil {
			t.Fatalf("run %d: resumed fetch: %v", i, err)
		}
		assertTree(t, dest, files)
	}
}

// CheckDest re-checks a finished destination from its manifest and file sizes alone.
func TestCheckDest(t *testing.T) {
	src := newMemSource(modelFiles())
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if m, err := engine.CheckDest(dest); err != nil || len(m.Files) != len(src.files) {
		t.Fatalf("CheckDest = %v, %v; want the manifest's %d files", m, err, len(src.files))
	}
	if err := os.Truncate(filepath.Join(dest, "model-00002-of-00002.safetensors"), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.CheckDest(dest); err == nil || !strings.Contains(err.Error(), "model-00002-of-00002.safetensors") {
		t.Errorf("CheckDest after truncation = %v; want the truncated file named", err)
	}
	if _, err := engine.CheckDest(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckDest of nothing = %v; want not exist", err)
	}
}
