package witness

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// URL is the witness's address (scheme://host:port).
	URL string
	// Model names the model to the witness (its Open decides what it is).
	Model string
	// Origin is the model's source: it lists the model, and is read directly while the witness
	// cannot be reached.
	Origin source.Source
	// HTTP defaults to a client without a timeout (reads are long; the context ends them).
	HTTP *http.Client
	// Token, when set, gives the bearer token for each request.
	Token func() (string, error)
	// Retry is how long the witness is left alone after it failed to answer (30 s when zero).
	Retry time.Duration
	Log   *slog.Logger
}

// Client is a source.Source that reads a model through a witness, and an engine.PartDigests
// that knows what the witness vouches for (while Run runs). When the witness cannot be reached,
// it reads from the origin itself: those parts are vouched for to no one, so its peers read
// them themselves too.
type Client struct {
	o ClientOptions

	rev      atomic.Pointer[string]          // the revision the origin last listed
	vouched  atomic.Pointer[map[string]bool] // files the origin lists a digest for
	listed   chan struct{}                   // closed once it has
	listOnce sync.Once

	mu        sync.Mutex
	known     map[rangeKey][sha256.Size]byte // under *rev
	knownRev  string
	seq       int
	downUntil time.Time

	viaWitness, direct atomic.Int64
}

// NewClient returns a Client.
func NewClient(o ClientOptions) *Client {
	if o.HTTP == nil {
		o.HTTP = &http.Client{}
	}
	if o.Retry <= 0 {
		o.Retry = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{o: o, listed: make(chan struct{}), known: map[rangeKey][sha256.Size]byte{}}
}

// List lists the model at its origin; its revision is what the witness is asked about.
func (c *Client) List(ctx context.Context) (source.Listing, error) {
	l, err := c.o.Origin.List(ctx)
	if err == nil {
		rev := l.Revision
		if rev == "" {
			rev = source.ContentRevision(l.Files) // as the engine names it
		}
		c.rev.Store(&rev)
		vouched := map[string]bool{}
		for _, f := range l.Files {
			if f.Checksums.Cryptographic() {
				vouched[f.Path] = true
			}
		}
		c.vouched.Store(&vouched)
		c.listOnce.Do(func() { close(c.listed) })
	}
	return l, err
}

// String names the origin.
func (c *Client) String() string { return c.o.Origin.String() }

// Read is how many bytes of files without a digest of their own were read through the witness,
// and how many from the origin directly (while the witness could not be reached).
func (c *Client) Read() (viaWitness, direct int64) { return c.viaWitness.Load(), c.direct.Load() }

// OpenRange reads the range through the witness, or from the origin while the witness cannot be
// reached. A file the origin lists a digest for is read from the origin: its parts are checked
// against that.
func (c *Client) OpenRange(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	rev := c.rev.Load()
	if v := c.vouched.Load(); v != nil && (*v)[path] {
		return c.o.Origin.OpenRange(ctx, path, off, n)
	}
	if rev == nil || c.down() {
		return c.fromOrigin(ctx, path, off, n)
	}
	q := url.Values{"revision": {*rev}, "path": {path}, "off": {strconv.FormatInt(off, 10)}, "n": {strconv.FormatInt(n, 10)}}
	resp, err := c.get(ctx, "read", q) //nolint:bodyclose // the caller closes the body it is given
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c.failed(err)
		return c.fromOrigin(ctx, path, off, n)
	}
	return countBody(resp.Body, &c.viaWitness), nil
}

func (c *Client) fromOrigin(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	body, err := c.o.Origin.OpenRange(ctx, path, off, n)
	if err != nil {
		return nil, err
	}
	return countBody(body, &c.direct), nil
}

// down reports whether the witness failed within Retry.
func (c *Client) down() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.downUntil)
}

func (c *Client) failed(err error) {
	c.mu.Lock()
	c.downUntil = time.Now().Add(c.o.Retry)
	c.mu.Unlock()
	c.o.Log.Warn("the witness did not answer; reading the origin directly for a while", "witness", c.o.URL, "err", err)
}

// get asks the witness for op with q; an answer other than 200 is an error.
func (c *Client) get(ctx context.Context, op string, q url.Values) (*http.Response, error) {
	u := c.o.URL + Prefix + url.PathEscape(c.o.Model) + "/" + op + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if c.o.Token != nil {
		tok, err := c.o.Token()
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("witness %s: %s: %s", op, resp.Status, msg)
	}
	return resp, nil
}

// PartSHA256 is the SHA-256 the witness vouches for the n bytes at off of file with, under rev,
// once Run has learnt it.
func (c *Client) PartSHA256(rev string, file source.File, off, n int64) ([sha256.Size]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev != c.knownRev {
		return [sha256.Size]byte{}, false
	}
	sum, ok := c.known[rangeKey{file.Path, off, n}]
	return sum, ok
}

// Run learns what the witness vouches for under the revision the origin lists, as it vouches
// for it, until ctx ends.
func (c *Client) Run(ctx context.Context) {
	select {
	case <-c.listed:
	case <-ctx.Done():
		return
	}
	wait := time.Second
	for ctx.Err() == nil {
		rev := *c.rev.Load()
		c.mu.Lock()
		if rev != c.knownRev {
			c.known, c.knownRev, c.seq = map[rangeKey][sha256.Size]byte{}, rev, 0
		}
		after := c.seq
		c.mu.Unlock()
		d, err := c.digests(ctx, rev, after)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.o.Log.Debug("asking the witness what it vouches for", "err", err)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			wait = min(2*wait, c.o.Retry)
			continue
		}
		wait = time.Second
		c.learn(rev, after, d)
	}
}

func (c *Client) digests(ctx context.Context, rev string, after int) (Digests, error) {
	resp, err := c.get(ctx, "digests", url.Values{"revision": {rev}, "after": {strconv.Itoa(after)}})
	if err != nil {
		return Digests{}, err
	}
	defer resp.Body.Close()
	var d Digests
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&d); err != nil {
		return Digests{}, fmt.Errorf("reading the witness's digests: %w", err)
	}
	return d, nil
}

// learn adds what the witness answered for rev past after. An answer whose sequence went back
// (the witness restarted and forgot) is learnt from the start again.
func (c *Client) learn(rev string, after int, d Digests) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev != c.knownRev || after != c.seq {
		return
	}
	if d.Seq < after {
		c.seq = 0
		return
	}
	for _, p := range d.Parts {
		sum, err := sumOf(p.SHA256)
		if err != nil {
			c.o.Log.Warn("the witness sent a malformed digest", "path", p.Path, "err", err)
			continue
		}
		c.known[rangeKey{p.Path, p.Off, p.N}] = sum
	}
	c.seq = d.Seq
}

// countBody returns body, adding what is read from it to n.
func countBody(body io.ReadCloser, n *atomic.Int64) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{&counting{r: body, n: n}, body}
}
