package witness

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
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
	// Counted, when set, is told of the bytes of files without a digest of their own as they
	// are read: through the witness, or from the origin directly while it is away.
	Counted func(viaWitness bool, n int)
	// Busy is how long a read waits, in all, on a witness that answers it is busy (429 or 503,
	// each wait as its Retry-After says, a second when it says nothing, at least 100 ms)
	// before it reads the origin instead (2 s when zero: under peers.stall, after which a part
	// that does not move is claimed by another node, which would ask the witness again). A
	// whole fleet asking at once is slowed down, not sent to the origin: what a node reads
	// around the witness, its peers read too.
	Busy time.Duration
	Log  *slog.Logger
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
	epoch     string // the witness's table the sequence numbers count in
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
	if o.Busy <= 0 {
		o.Busy = 2 * time.Second
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
	var waited time.Duration
	for {
		resp, err := c.get(ctx, "read", q) //nolint:bodyclose // the caller closes the body it is given
		if err == nil {
			return c.countBody(resp.Body, true), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var busy *busyError
		if errors.As(err, &busy) && waited < c.o.Busy {
			wait := min(max(busy.after, minBusyWait), c.o.Busy-waited)
			waited += wait
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		c.failed(err)
		return c.fromOrigin(ctx, path, off, n)
	}
}

// busyError is a witness's answer that it is busy: ask again after.
type busyError struct {
	status string
	after  time.Duration
}

func (e *busyError) Error() string { return fmt.Sprintf("the witness is busy (%s)", e.status) }

// minBusyWait is the shortest wait on a busy witness, whatever its Retry-After says.
const minBusyWait = 100 * time.Millisecond

// retryAfter is how long a busy answer asks to wait: its Retry-After in seconds, a second when
// it says nothing usable, and never more than a minute.
func retryAfter(h http.Header) time.Duration {
	if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs >= 0 {
		return min(time.Duration(secs)*time.Second, time.Minute)
	}
	return time.Second
}

func (c *Client) fromOrigin(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	body, err := c.o.Origin.OpenRange(ctx, path, off, n)
	if err != nil {
		return nil, err
	}
	return c.countBody(body, false), nil
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
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			return nil, &busyError{status: resp.Status, after: retryAfter(resp.Header)}
		}
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
		after, epoch := c.seq, c.epoch
		c.mu.Unlock()
		d, err := c.digests(ctx, rev, epoch, after)
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

func (c *Client) digests(ctx context.Context, rev, epoch string, after int) (Digests, error) {
	q := url.Values{"revision": {rev}, "after": {strconv.Itoa(after)}}
	if epoch != "" {
		q.Set("epoch", epoch)
	}
	resp, err := c.get(ctx, "digests", q)
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

// learn adds what the witness answered for rev past after. An answer from another table of the
// witness's (another epoch: a new leader, or the witness restarted and forgot) counts from its
// start, as the witness answers it; one whose sequence went back without saying so (a witness
// that names no epoch) is asked from the start again. What was learnt stays known: the old
// table's digests are as true as the new one's.
func (c *Client) learn(rev string, after int, d Digests) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev != c.knownRev || after != c.seq {
		return
	}
	if d.Epoch != c.epoch {
		asked := c.epoch // the epoch the request named
		c.epoch = d.Epoch
		if after > 0 && (asked == "" || d.Epoch == "") { // counted from after in a table it did not name
			c.seq = 0
			return
		}
	} else if d.Seq < after {
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

// countBody returns body, counting what is read from it as read through the witness or not.
func (c *Client) countBody(body io.ReadCloser, viaWitness bool) io.ReadCloser {
	n := &c.direct
	if viaWitness {
		n = &c.viaWitness
	}
	count := func(k int) {
		n.Add(int64(k))
		if c.o.Counted != nil {
			c.o.Counted(viaWitness, k)
		}
	}
	return struct {
		io.Reader
		io.Closer
	}{&counting{r: body, add: count}, body}
}
