package engine

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Budget is what a node may ask of one origin, shared by every Fetch that reads it: at most
// MaxConcurrent ranged reads in flight, at most BytesPerSecond, and, when the origin answers 429
// or 503 (S3's SlowDown, the Hub's rate limit), a pause of every reader before the next request,
// doubling from a second up to 30 s while the origin keeps refusing (or as long as its
// Retry-After says).
type Budget struct {
	slots   chan struct{} // nil: no cap on concurrency
	limiter *rate.Limiter // nil: no cap on rate

	mu         sync.Mutex
	pauseUntil time.Time
	pause      time.Duration
	throttled  int64
	// waited is how long reads have waited for the budget: a slot, the end of a pause, or
	// bytes of the rate cap (summed over readers).
	waited time.Duration
}

// NewBudget returns a budget; zero values mean no cap.
func NewBudget(maxConcurrent int, bytesPerSecond int64) *Budget {
	b := &Budget{}
	if maxConcurrent > 0 {
		b.slots = make(chan struct{}, maxConcurrent)
	}
	if bytesPerSecond > 0 {
		b.limiter = rate.NewLimiter(rate.Limit(bytesPerSecond), int(min(bytesPerSecond, chunkSize)))
	}
	return b
}

// WithBudget makes the engine's reads from the source count against b.
func WithBudget(b *Budget) Option { return func(e *Engine) { e.budget = b } }

// Throttled is how many times the origin refused with 429 or 503.
func (b *Budget) Throttled() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.throttled
}

// Waited is how long reads have waited for the budget, summed over readers: a slot, the end of
// a pause, or bytes of the rate cap.
func (b *Budget) Waited() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waited
}

// count adds the time since start to what reads have waited.
func (b *Budget) count(start time.Time) {
	d := time.Since(start)
	b.mu.Lock()
	b.waited += d
	b.mu.Unlock()
}

// mayWait reports whether acquire may have to wait: for a slot, or for the end of a pause.
func (b *Budget) mayWait() bool {
	if b == nil {
		return false
	}
	if b.slots != nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Now().Before(b.pauseUntil)
}

// acquire waits for a slot and for the end of any pause.
func (b *Budget) acquire(ctx context.Context) (func(), error) {
	if b == nil {
		return func() {}, nil
	}
	defer b.count(time.Now())
	for {
		b.mu.Lock()
		wait := time.Until(b.pauseUntil)
		b.mu.Unlock()
		if wait <= 0 {
			break
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	if b.slots == nil {
		return func() {}, nil
	}
	select {
	case b.slots <- struct{}{}:
		return func() { <-b.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// wait takes n bytes from the rate cap.
func (b *Budget) wait(ctx context.Context, n int) error {
	if b == nil || b.limiter == nil {
		return nil
	}
	defer b.count(time.Now())
	return b.limiter.WaitN(ctx, n)
}

// observe learns from a read's outcome: a refusal pauses every reader, a success ends the
// doubling.
func (b *Budget) observe(err error) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var se *source.StatusError
	if !errors.As(err, &se) || (se.StatusCode != http.StatusTooManyRequests && se.StatusCode != http.StatusServiceUnavailable) {
		if err == nil {
			b.pause = 0
		}
		return
	}
	b.throttled++
	b.pause = min(max(2*b.pause, time.Second), 30*time.Second)
	d := b.pause
	if ra, ok := retryAfter(se); ok {
		d = min(max(ra, d), 5*time.Minute)
	}
	if until := time.Now().Add(d); until.After(b.pauseUntil) {
		b.pauseUntil = until
	}
}

// retryAfter is a refusal's Retry-After, when the source passed it on (as "retry after N").
func retryAfter(se *source.StatusError) (time.Duration, bool) {
	if se.RetryAfter == "" {
		return 0, false
	}
	s, err := strconv.Atoi(se.RetryAfter)
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}
