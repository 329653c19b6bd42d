// Package hub asks the Hugging Face Hub, for the controller, what a revision resolves to and
// whether a token can read a repository, remembering the answers for a while.
package hub

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/prewarm/prewarm/pkg/engine/source/hf"
)

// Checker resolves Hugging Face revisions to commits and checks that a token can read a
// repository, remembering answers for a while so reconciles do not call the Hub each time.
type Checker struct {
	// Endpoint is the Hub (or a mirror); empty means huggingface.co.
	Endpoint string
	// Now is the clock.
	Now func() time.Time
	// Timeout bounds one question to the Hub (resolving the revision and listing its file
	// tree); default DefaultTimeout.
	Timeout time.Duration
	// Remember bounds the answers kept; default DefaultRemember.
	Remember int

	once    sync.Once
	answers *cache.LRUExpireCache // key → hubAnswer
}

type hubAnswer struct {
	commit string
	err    error
}

// clockFunc lets the Checker's Now drive the answers' expiry.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// DefaultRemember bounds the answers remembered: one per repository, revision and token asked
// about. Past it the least recently used is forgotten (and asked again when next needed), so
// however many names and tokens the cluster's objects carry, the controller's memory holds.
const DefaultRemember = 4096

// How long answers are kept: a success long, a failure briefly (the user is fixing it).
const (
	hubSuccessTTL = 10 * time.Minute
	hubFailureTTL = 20 * time.Second
)

// DefaultTimeout bounds one question to the Hub: a reconcile that asks holds one of the
// controller's workers until the Hub answers. The Hub lists a repository's tree in pages of a
// thousand files, each in well under a second.
const DefaultTimeout = 30 * time.Second

// Resolve returns the commit that revision (a branch, tag or commit; empty means main) of repo
// is at, reading the repository's file tree with token: an error says the token (or its
// absence) cannot read it, or that the repository or revision does not exist.
func (h *Checker) Resolve(ctx context.Context, repo, revision, token string) (string, error) {
	if revision == "" {
		revision = "main"
	}
	sum := sha256.Sum256([]byte(token))
	key := repo + "@" + revision + "#" + hex.EncodeToString(sum[:8])
	h.once.Do(func() {
		now := time.Now
		if h.Now != nil {
			now = h.Now
		}
		h.answers = cache.NewLRUExpireCacheWithClock(cmp.Or(h.Remember, DefaultRemember), clockFunc(now))
	})
	if a, ok := h.answers.Get(key); ok {
		a := a.(hubAnswer)
		return a.commit, a.err
	}

	timeout := cmp.Or(h.Timeout, DefaultTimeout)
	askCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	src, err := hf.New(hf.Options{RepoID: repo, Revision: revision, Endpoint: h.Endpoint, Token: token})
	var commit string
	if err == nil {
		listing, lerr := src.List(askCtx)
		commit, err = listing.Revision, lerr
	}
	switch {
	case ctx.Err() != nil:
		return "", ctx.Err() // not remembered: the caller gave up, not the Hub
	case err != nil && errors.Is(askCtx.Err(), context.DeadlineExceeded):
		// Remembered as any failure: the next reconciles do not wait for the Hub again at once.
		err = fmt.Errorf("the Hugging Face Hub did not list %s at %s within %s: %w", repo, revision, timeout, err)
	}
	ttl := hubSuccessTTL
	if err != nil {
		ttl = hubFailureTTL
	}
	h.answers.Add(key, hubAnswer{commit: commit, err: err}, ttl)
	return commit, err
}
