package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// checksummed is the test model with a checksum for every file, as S3 (CRC64NVME) and the Hub
// (sha256) give them.
func checksummed() *memSource {
	src := newMemSource(modelFiles())
	for p, data := range src.files {
		if strings.HasSuffix(p, ".safetensors") {
			sum := sha256.Sum256(data)
			src.sums[p] = source.Checksums{SHA256: hex.EncodeToString(sum[:])}
		} else {
			src.sums[p] = source.Checksums{CRC64NVME: engine.CRC64NVME(data)}
		}
	}
	return src
}

func damagedPaths(d []engine.Damage) []string {
	var out []string
	for _, x := range d {
		out = append(out, x.Path)
	}
	slices.Sort(out)
	return out
}

// A byte flipped in a published file passes the size check and is caught by reading the
// content back; a missing and a truncated file are caught by both. Repair fetches only those
// files and leaves the others untouched.
func TestCheckFindsDamageAndRepairFetchesOnlyIt(t *testing.T) {
	ctx := context.Background()
	src := checksummed()
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if _, d, err := engine.Check(ctx, dest, engine.CheckOptions{Content: true}); err != nil || len(d) != 0 {
		t.Fatalf("a fresh download: damage %v, err %v; want none", d, err)
	}

	flip := filepath.Join(dest, "model-00001-of-00002.safetensors")
	data, _ := os.ReadFile(flip)
	data[1<<20] ^= 0x40
	if err := os.WriteFile(flip, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dest, "tokenizer", "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dest, "config.json"), 3); err != nil {
		t.Fatal(err)
	}
	untouched, _ := os.Stat(filepath.Join(dest, "model-00002-of-00002.safetensors"))

	_, sizeOnly, err := engine.Check(ctx, dest, engine.CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := damagedPaths(sizeOnly), []string{"config.json", "tokenizer/tokenizer.json"}; !slices.Equal(got, want) {
		t.Errorf("size check found %v, want %v (a flipped byte keeps the size)", got, want)
	}
	var read int64
	_, full, err := engine.Check(ctx, dest, engine.CheckOptions{Content: true, Read: func(n int64) { read = n }})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"config.json", "model-00001-of-00002.safetensors", "tokenizer/tokenizer.json"}
	if got := damagedPaths(full); !slices.Equal(got, want) {
		t.Errorf("content check found %v, want %v", got, want)
	}
	for _, d := range full {
		if d.Path == "model-00001-of-00002.safetensors" && !strings.Contains(d.Problem, "sha256 mismatch") {
			t.Errorf("flipped byte reported as %q, want a sha256 mismatch", d.Problem)
		}
	}
	if read == 0 {
		t.Error("the content check reported no bytes read")
	}

	before := src.fetched.Load()
	res, err := testEngine().Repair(ctx, src, dest, damagedPaths(full))
	if err != nil {
		t.Fatal(err)
	}
	fetched := src.fetched.Load() - before
	var need int64
	for _, p := range want {
		need += int64(len(src.files[p]))
	}
	if fetched != need || res.Fetched != need {
		t.Errorf("repair read %d bytes (result says %d); want exactly the damaged files' %d", fetched, res.Fetched, need)
	}
	assertTree(t, dest, src.files)
	if after, _ := os.Stat(filepath.Join(dest, "model-00002-of-00002.safetensors")); !os.SameFile(untouched, after) {
		t.Error("repair replaced a file that was not damaged")
	}
	if _, d, err := engine.Check(ctx, dest, engine.CheckOptions{Content: true}); err != nil || len(d) != 0 {
		t.Errorf("after the repair: damage %v, err %v", d, err)
	}
	assertNoLeftovers(t, filepath.Dir(dest))
}

// A source rewritten since the download is not mixed in: Repair refuses, naming the change.
func TestRepairRefusesAChangedSource(t *testing.T) {
	ctx := context.Background()
	src := checksummed()
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	src.files["config.json"] = []byte(`{"architectures":["Other"]}`)
	delete(src.sums, "config.json")
	if _, err := testEngine().Repair(ctx, src, dest, []string{"config.json"}); !errors.Is(err, engine.ErrSourceChanged) {
		t.Fatalf("Repair = %v; want ErrSourceChanged", err)
	}
}

// The content check reads at most the given rate: a limiter with too small a budget for the
// model stops it at the deadline rather than reading on.
func TestCheckHonoursTheRateLimit(t *testing.T) {
	src := checksummed()
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	// 64 KiB/s with a 64 KiB burst: the 5 MiB model needs over a minute; a rate.Limiter knows
	// at once that it cannot finish before the context's deadline and says so.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var read int64
	_, _, err := engine.Check(ctx, dest, engine.CheckOptions{Content: true, Limiter: rate.NewLimiter(64<<10, 64<<10), Read: func(n int64) { read = n }})
	if err == nil {
		t.Fatalf("Check with 64 KiB/s finished a 5 MiB model in under 200ms (read %d)", read)
	}
	if read > 1<<20 {
		t.Errorf("read %d bytes at 64 KiB/s within 200ms", read)
	}
}

// A listing the engine cannot store (a reserved or escaping name) is ErrInvalidModel: the agent
// reports it as terminal instead of retrying.
func TestInvalidListingIsErrInvalidModel(t *testing.T) {
	src := newMemSource(map[string][]byte{"ok.bin": []byte("ok"), ".prewarm-manifest.json": []byte("evil")})
	_, err := testEngine().Fetch(context.Background(), engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if !errors.Is(err, engine.ErrInvalidModel) || !strings.Contains(err.Error(), ".prewarm-manifest.json") {
		t.Fatalf("err = %v; want ErrInvalidModel naming the file", err)
	}
}

// A source that vouches only for sizes (a file system, S3 objects uploaded without checksums):
// the engine records a CRC of what it wrote, so a byte flipped later is still caught — also
// for files verified by an earlier, interrupted run.
func TestRecordedChecksumsCatchDamageWithoutSourceChecksums(t *testing.T) {
	ctx := context.Background()
	src := newMemSource(modelFiles()) // no checksums at all
	dest := filepath.Join(t.TempDir(), "m")
	// Interrupt once after some files are verified, so the publish has to record their CRCs
	// from a resumed run.
	var n atomic.Int64
	src.fault = func(path string, off, k int64) (int64, error) {
		if path == "model-00002-of-00002.safetensors" && n.Add(1) == 3 {
			return -1, &source.NotFoundError{Err: errors.New("gone for now")}
		}
		return 0, nil
	}
	if _, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest}); err == nil {
		t.Fatal("the interrupted fetch succeeded")
	}
	src.fault = nil
	if _, err := testEngine().Fetch(ctx, engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	m, err := engine.ReadManifest(dest)
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range src.files {
		if got := m.Recorded[p]; got != engine.CRC64NVME(data) {
			t.Errorf("recorded checksum of %s = %q, want %q", p, got, engine.CRC64NVME(data))
		}
	}
	path := filepath.Join(dest, "tokenizer", "tokenizer.json")
	data, _ := os.ReadFile(path)
	data[100] ^= 1
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, d, err := engine.Check(ctx, dest, engine.CheckOptions{Content: true}); err != nil || !slices.Equal(damagedPaths(d), []string{"tokenizer/tokenizer.json"}) {
		t.Errorf("Check = %v, %v; want tokenizer/tokenizer.json damaged", d, err)
	}
}
