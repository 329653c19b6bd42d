package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// inflight is a source that counts its open reads.
type inflight struct {
	*memSource
	now, most atomic.Int64
}

func (s *inflight) OpenRange(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	body, err := s.memSource.OpenRange(ctx, path, off, n)
	if err != nil {
		return nil, err
	}
	cur := s.now.Add(1)
	for {
		most := s.most.Load()
		if cur <= most || s.most.CompareAndSwap(most, cur) {
			break
		}
	}
	return closer{body, func() { s.now.Add(-1) }}, nil
}

type closer struct {
	io.ReadCloser
	done func()
}

func (c closer) Close() error { c.done(); return c.ReadCloser.Close() }

func TestBudgetCapsConcurrencyAndPausesOnSlowDown(t *testing.T) {
	files := modelFiles()
	mem := newMemSource(files)
	var refused atomic.Int64
	mem.fault = func(path string, off, n int64) (int64, error) {
		if refused.Add(1) == 1 {
			return -1, &source.StatusError{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown", Message: "slow down", RetryAfter: "1"}
		}
		return 0, nil
	}
	src := &inflight{memSource: mem}
	budget := engine.NewBudget(2, 0)
	dest := filepath.Join(t.TempDir(), "model")
	e := testEngine(engine.WithConcurrency(8), engine.WithBudget(budget))
	if _, err := e.Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
	if got := src.most.Load(); got > 2 {
		t.Errorf("%d reads were in flight at once; the budget allows 2", got)
	}
	if got := budget.Throttled(); got != 1 {
		t.Errorf("the budget counted %d refusals, want 1", got)
	}
	// Eight workers for two slots, and a pause of a second: reads waited for the budget.
	if budget.Waited() <= 0 {
		t.Errorf("the budget says no read waited for it")
	}
}

// sourceOnly is a Swarm with no peers: its source workers read the parts in file order, and it
// keeps the plan for the test to watch.
type sourceOnly struct {
	joined chan *engine.Plan
}

func (s *sourceOnly) Join(_ context.Context, p *engine.Plan) { s.joined <- p }
func (s *sourceOnly) Pick(pending []int, lane engine.Lane) int {
	if lane == engine.LanePeers || len(pending) == 0 {
		return -1
	}
	return pending[0]
}
func (s *sourceOnly) Changed() <-chan struct{} { return nil }
func (s *sourceOnly) Part(context.Context, int) (engine.PeerPart, error) {
	return engine.PeerPart{}, engine.ErrFromSource
}
func (s *sourceOnly) Bad(string, int, error) {}
func (s *sourceOnly) Leave()                 {}

// A part read for the peers that waits on the origin (a pause after SlowDown) says so: its
// progress reads -1, which peers count as moving, and the plan keeps changing meanwhile so
// that they hear it; they do not claim it and ask the origin for more while it asks for less.
func TestAPartWaitingOnTheOriginIsNotStalled(t *testing.T) {
	files := map[string][]byte{"model.safetensors": make([]byte, 256<<10)}
	mem := newMemSource(files)
	sum := sha256.Sum256(files["model.safetensors"])
	mem.sums["model.safetensors"] = source.Checksums{SHA256: hex.EncodeToString(sum[:])} // shared with peers
	var refused atomic.Int64
	mem.fault = func(string, int64, int64) (int64, error) {
		if refused.Add(1) == 1 {
			return -1, &source.StatusError{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown", Message: "slow down", RetryAfter: "3"}
		}
		return 0, nil
	}
	sw := &sourceOnly{joined: make(chan *engine.Plan, 1)}
	e := testEngine(engine.WithConcurrency(2), engine.WithBudget(engine.NewBudget(0, 0)))
	done := make(chan error, 1)
	go func() {
		_, err := e.Fetch(context.Background(), engine.Request{Source: mem, Dest: filepath.Join(t.TempDir(), "model"), Swarm: sw})
		done <- err
	}()
	plan := <-sw.joined
	var version uint64
	changes, sawWaiting := 0, false
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if !sawWaiting {
				t.Fatalf("the part never said it waits on the origin during a 3 s pause (%d changes)", changes)
			}
			// Over a 3 s pause the plan changes about every half second (6), not just for the
			// read's start, refusal and end.
			if changes < 4 {
				t.Errorf("the plan changed %d times over the pause; peers would not hear the part waits", changes)
			}
			return
		case <-plan.Changed(version):
			_, _, version = plan.Activity()
			changes++
			if plan.ReadProgress(0) == -1 {
				sawWaiting = true
			}
		}
	}
}

// sharedSource is a sourceOnly Swarm that gives this node reads of its own of the source
// workers (engine.SourceSharer).
type sharedSource struct {
	sourceOnly
	reads int
}

func (s *sharedSource) SourceReads(int) int { return s.reads }

// A download reads parts for its group with as many source workers at once as its Swarm's
// SourceReads allows; a Swarm without it gets them all.
func TestTheSwarmSetsHowManyPartsAreReadAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		sw   engine.Swarm
		want func(most int64) bool
		says string
	}{
		{"all workers", &sourceOnly{joined: make(chan *engine.Plan, 1)}, func(most int64) bool { return most > 1 }, "more than 1"},
		{"a share of one", &sharedSource{sourceOnly: sourceOnly{joined: make(chan *engine.Plan, 1)}, reads: 1}, func(most int64) bool { return most == 1 }, "1"},
		{"a share of two", &sharedSource{sourceOnly: sourceOnly{joined: make(chan *engine.Plan, 1)}, reads: 2}, func(most int64) bool { return most == 2 }, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string][]byte{"model.safetensors": gen.Bytes(7, 2<<20)}
			mem := newMemSource(files)
			sum := sha256.Sum256(files["model.safetensors"])
			mem.sums["model.safetensors"] = source.Checksums{SHA256: hex.EncodeToString(sum[:])} // shared with peers
			var mu sync.Mutex
			var inFlight, most int64
			mem.fault = func(string, int64, int64) (int64, error) {
				mu.Lock()
				inFlight++
				most = max(most, inFlight)
				mu.Unlock()
				time.Sleep(50 * time.Millisecond) // the read is open this long
				mu.Lock()
				inFlight--
				mu.Unlock()
				return 0, nil
			}
			// 8 workers take from peers, 4 read the source; 8 parts of 256 KiB.
			e := testEngine(engine.WithConcurrency(8), engine.WithPartSize(256<<10))
			dest := filepath.Join(t.TempDir(), "model")
			if _, err := e.Fetch(context.Background(), engine.Request{Source: mem, Dest: dest, Swarm: tc.sw}); err != nil {
				t.Fatal(err)
			}
			assertTree(t, dest, files)
			if got := most; !tc.want(got) {
				t.Errorf("%d parts were read from the source at once; want %s", got, tc.says)
			}
		})
	}
}
