package hub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/controller/hub"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/internal/testutil/stall"
)

type answer struct {
	commit string
	err    error
}

// resolve runs h.Resolve, failing the test if it has not returned a minute later.
func resolve(t *testing.T, ctx context.Context, h *hub.Checker, repo string) answer {
	t.Helper()
	ch := make(chan answer, 1)
	go func() {
		commit, err := h.Resolve(ctx, repo, "", "")
		ch <- answer{commit, err}
	}()
	select {
	case a := <-ch:
		return a
	case <-time.After(time.Minute):
		t.Fatalf("Resolve(%s) has not returned after a minute", repo)
		return answer{}
	}
}

// A Hub that accepts the connection and never answers holds a reconcile no longer than the
// Checker's timeout, whatever the caller's context; the failure is remembered, so the next
// reconciles do not wait for it again at once. A caller that gives up first is not remembered.
func TestAStalledHubIsAskedWithADeadline(t *testing.T) {
	srv, err := stall.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	h := &hub.Checker{Endpoint: srv.URL, Timeout: 300 * time.Millisecond}

	a := resolve(t, context.Background(), h, "org/model")
	if !errors.Is(a.err, context.DeadlineExceeded) || !strings.Contains(a.err.Error(), "did not list org/model at main within 300ms") {
		t.Fatalf("a stalled Hub: %v; want the deadline, naming the repository", a.err)
	}
	if a := resolve(t, context.Background(), h, "org/model"); a.err == nil || srv.Accepted.Load() != 1 {
		t.Errorf("asked again: %v after %d connections; want the remembered failure, no new connection", a.err, srv.Accepted.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if a := resolve(t, ctx, h, "org/other"); !errors.Is(a.err, context.Canceled) {
		t.Errorf("a caller that gave up: %v", a.err)
	}
	before := srv.Accepted.Load()
	_ = resolve(t, context.Background(), h, "org/other")
	if srv.Accepted.Load() == before {
		t.Error("the Hub was not asked again after a caller gave up: its giving up was remembered")
	}
}

// A Hub that answers within the timeout resolves the branch to its commit.
func TestResolveAnsweredInTime(t *testing.T) {
	fixture := hubfixture.Start()
	defer fixture.Close()
	commit := fixture.AddCommit("org/model", "main", map[string][]byte{"config.json": []byte(`{}`)})
	h := &hub.Checker{Endpoint: fixture.URL, Timeout: time.Minute}
	if a := resolve(t, context.Background(), h, "org/model"); a.err != nil || a.commit != commit {
		t.Errorf("Resolve: %q %v; want %q", a.commit, a.err, commit)
	}
}

// An answer is remembered for its time and no longer, and the answers kept are bounded: past
// Remember the least recently used is forgotten and the Hub is asked again.
func TestAnswersAreRememberedForAWhileAndBounded(t *testing.T) {
	fixture := hubfixture.Start()
	defer fixture.Close()
	first := fixture.AddCommit("org/a", "main", map[string][]byte{"config.json": []byte(`{}`)})
	fixture.AddCommit("org/b", "main", map[string][]byte{"config.json": []byte(`{}`)})
	fixture.AddCommit("org/c", "main", map[string][]byte{"config.json": []byte(`{}`)})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &hub.Checker{Endpoint: fixture.URL, Timeout: time.Minute, Remember: 2, Now: func() time.Time { return now }}

	if a := resolve(t, context.Background(), h, "org/a"); a.err != nil || a.commit != first {
		t.Fatalf("Resolve(org/a): %q %v; want %q", a.commit, a.err, first)
	}
	second := fixture.AddCommit("org/a", "main", map[string][]byte{"config.json": []byte(`{"v":2}`)})
	now = now.Add(9 * time.Minute)
	if a := resolve(t, context.Background(), h, "org/a"); a.commit != first {
		t.Errorf("Resolve(org/a) 9 minutes later: %q; want the remembered %q", a.commit, first)
	}
	now = now.Add(2 * time.Minute)
	if a := resolve(t, context.Background(), h, "org/a"); a.commit != second {
		t.Errorf("Resolve(org/a) 11 minutes later: %q; want the Hub's new %q", a.commit, second)
	}

	third := fixture.AddCommit("org/a", "main", map[string][]byte{"config.json": []byte(`{"v":3}`)})
	resolve(t, context.Background(), h, "org/b")
	resolve(t, context.Background(), h, "org/c") // org/a is now the least recently used of three
	if a := resolve(t, context.Background(), h, "org/a"); a.commit != third {
		t.Errorf("Resolve(org/a) after two others with room for two: %q; want it forgotten and asked again (%q)", a.commit, third)
	}
}
