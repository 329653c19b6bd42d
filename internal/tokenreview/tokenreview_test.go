package tokenreview

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

const testAgentSA = "system:serviceaccount:prewarm-system:prewarm-agent"

// apiServer answers TokenReviews: tokens "good-<node>" are the agents' of <node>, any other is
// refused. down makes every review fail. reviews counts them.
type apiServer struct {
	reviews atomic.Int64
	down    atomic.Bool
}

func (a *apiServer) reviewer() *Reviewer {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			tr, ok := obj.(*authenticationv1.TokenReview)
			if !ok {
				return fmt.Errorf("unexpected %T", obj)
			}
			a.reviews.Add(1)
			if a.down.Load() {
				return errors.New("connection refused")
			}
			if node, ok := strings.CutPrefix(tr.Spec.Token, "good-"); ok {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
					User: authenticationv1.UserInfo{Username: testAgentSA,
						Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/node-name": {node}}}}
			} else {
				tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
			}
			return nil
		},
	}).Build()
	return &Reviewer{Client: c, Audience: "prewarm-peers", ServiceAccount: testAgentSA}
}

func request(from, token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/prewarm/peer/v1/k/have", nil)
	r.RemoteAddr = from + ":40000"
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func TestTokenReviewerAnswers(t *testing.T) {
	a := &apiServer{}
	tr := a.reviewer()
	if who, err := tr.Authorize(request("10.0.0.1", "good-node-a")); err != nil || who != "node-a" {
		t.Errorf("an agent's token: %q, %v; want node-a", who, err)
	}
	if _, err := tr.Authorize(request("10.0.0.1", "stolen")); !errors.Is(err, peer.ErrUnauthenticated) {
		t.Errorf("a bad token: %v, want ErrUnauthenticated", err)
	}
	if _, err := tr.Authorize(request("10.0.0.1", strings.Repeat("x", maxTokenBytes+1))); !errors.Is(err, peer.ErrUnauthenticated) {
		t.Errorf("an oversized token: %v, want ErrUnauthenticated", err)
	}
	for range 10 { // answers, refusals too, are kept
		if who, err := tr.Authorize(request("10.0.0.1", "good-node-a")); err != nil || who != "node-a" {
			t.Fatalf("an agent's token asked again: %q, %v", who, err)
		}
		if _, err := tr.Authorize(request("10.0.0.1", "stolen")); !errors.Is(err, peer.ErrUnauthenticated) {
			t.Fatalf("a bad token asked again: %v", err)
		}
	}
	if n := a.reviews.Load(); n != 2 {
		t.Errorf("%d reviews for one good and one bad token asked 11 times each (and one oversized); want 2", n)
	}
}

func TestTokenReviewerDoesNotKeepAnAPIServerError(t *testing.T) {
	a := &apiServer{}
	tr := a.reviewer()
	a.down.Store(true)
	if _, err := tr.Authorize(request("10.0.0.1", "good-node-a")); err == nil || errors.Is(err, peer.ErrUnauthenticated) {
		t.Fatalf("with the API server down: %v; want its error", err)
	}
	a.down.Store(false)
	if who, err := tr.Authorize(request("10.0.0.1", "good-node-a")); err != nil || who != "node-a" {
		t.Errorf("once the API server is back: %q, %v; want node-a", who, err)
	}
}

// One review per token however many requests present it at once.
func TestTokenReviewerReviewsATokenOnceAtATime(t *testing.T) {
	a := &apiServer{}
	tr := a.reviewer()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 32 {
		wg.Go(func() {
			if who, err := tr.Authorize(request("10.0.0.1", "good-node-a")); err != nil || who != "node-a" {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := a.reviews.Load(); n != 1 || failed.Load() != 0 {
		t.Errorf("32 requests at once with one token: %d reviews, %d refused; want 1 and 0", n, failed.Load())
	}
}

// A flood of made-up tokens from one address costs the API server a few reviews, and leaves
// the budget of other addresses alone.
func TestTokenReviewerBoundsAFlood(t *testing.T) {
	a := &apiServer{}
	tr := a.reviewer()
	start := time.Now()
	limited := 0
	for i := range 500 {
		_, err := tr.Authorize(request("10.0.0.66", fmt.Sprintf("made-up-%d", i)))
		switch {
		case errors.Is(err, peer.ErrTooManyRequests):
			limited++
		case !errors.Is(err, peer.ErrUnauthenticated):
			t.Fatalf("made-up token %d: %v", i, err)
		}
	}
	took := time.Since(start).Seconds()
	if n, most := a.reviews.Load(), int64(addressBurst+reviewsPerAddress*took+1); n > most || limited < 400 {
		t.Errorf("500 made-up tokens from one address in %.2fs: %d reviews (want at most %d), %d answered 429", took, n, most, limited)
	}
	if who, err := tr.Authorize(request("10.0.0.2", "good-node-b")); err != nil || who != "node-b" {
		t.Errorf("an agent on another address during the flood: %q, %v; want node-b", who, err)
	}

	// From many addresses, the reviews of all together are capped.
	b := &apiServer{}
	tr = b.reviewer()
	start = time.Now()
	for i := range 1000 {
		if _, err := tr.Authorize(request(fmt.Sprintf("10.1.%d.%d", i/250, i%250), fmt.Sprintf("made-up-%d", i))); err == nil {
			t.Fatalf("made-up token %d accepted", i)
		}
	}
	took = time.Since(start).Seconds()
	if n, most := b.reviews.Load(), int64(reviewBurst+reviewsPerSecond*took+1); n > most {
		t.Errorf("1000 made-up tokens from 1000 addresses in %.2fs: %d reviews; want at most %d", took, n, most)
	}
}
