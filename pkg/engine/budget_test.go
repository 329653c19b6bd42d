package engine_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

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
