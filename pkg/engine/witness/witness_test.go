package witness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// bytesSource is one file in memory; cut, when set, ends every read after that many bytes;
// digest lists the file with its SHA-256.
type bytesSource struct {
	data   []byte
	cut    int64
	digest bool
}

func (b *bytesSource) List(context.Context) (source.Listing, error) {
	f := source.File{Path: "f", Size: int64(len(b.data))}
	if b.digest {
		sum := sha256.Sum256(b.data)
		f.Checksums.SHA256 = hex.EncodeToString(sum[:])
	}
	return source.Listing{Files: []source.File{f}}, nil
}

func (b *bytesSource) OpenRange(_ context.Context, path string, off, n int64) (io.ReadCloser, error) {
	if path != "f" {
		return nil, &source.NotFoundError{Err: errors.New("no such file")}
	}
	if b.cut > 0 {
		n = min(n, b.cut)
	}
	return io.NopCloser(bytes.NewReader(b.data[off : off+n])), nil
}

func (b *bytesSource) String() string { return "mem://f" }

func open(src source.Source) func(*http.Request, string) (source.Source, error) {
	return func(*http.Request, string) (source.Source, error) { return src, nil }
}

// serve starts a witness of src, and a client of it that has listed src.
func serve(t *testing.T, src *bytesSource) (*Server, *Client, source.Listing, string) {
	t.Helper()
	s := &Server{Open: open(src)}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := NewClient(ClientOptions{URL: srv.URL, Model: "m", Origin: src})
	l, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s, c, l, source.ContentRevision(l.Files)
}

// learnAll runs the client until it has learnt what the witness vouches for now.
func learnAll(t *testing.T, s *Server, c *Client, rev string) {
	t.Helper()
	want, _ := s.since("m", rev, "", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		c.mu.Lock()
		seq := c.seq
		c.mu.Unlock()
		if seq >= want.Seq && c.knownRev == rev {
			return
		}
		d, err := c.digests(ctx, rev, c.epoch, seq)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		if c.knownRev != rev {
			c.known, c.knownRev, c.seq = map[rangeKey][sha256.Size]byte{}, rev, 0
		}
		c.mu.Unlock()
		c.learn(rev, seq, d)
	}
}

// A range read whole is vouched for with the SHA-256 of its bytes; a range the source ended
// early is not; a client learns the first and knows nothing of the second.
func TestOnlyARangeReadWholeIsVouchedFor(t *testing.T) {
	data := bytes.Repeat([]byte("weights!"), 1<<12)
	src := &bytesSource{data: data}
	s, c, l, rev := serve(t, src)
	read := func(off, n int64) []byte { return readRange(t, c, off, n) }
	if got := read(100, 1000); !bytes.Equal(got, data[100:1100]) {
		t.Fatal("the witness sent other bytes than the source holds")
	}
	src.cut = 10
	if got := read(2000, 1000); len(got) != 10 {
		t.Fatalf("a cut read gave %d bytes, want the 10 the source gave", len(got))
	}
	learnAll(t, s, c, rev)
	f := l.Files[0]
	sum, ok := c.PartSHA256(rev, f, 100, 1000)
	if !ok || sum != sha256.Sum256(data[100:1100]) {
		t.Errorf("range 100+1000: vouched %v with %x; want the SHA-256 of its bytes", ok, sum)
	}
	if _, ok := c.PartSHA256(rev, f, 2000, 1000); ok {
		t.Error("a range the source cut short is vouched for")
	}
	if _, ok := c.PartSHA256("another revision", f, 100, 1000); ok {
		t.Error("a range is vouched for under a revision it was not read for")
	}
	if got := s.BytesRead(); got != 1010 {
		t.Errorf("the witness counts %d bytes read, want 1010", got)
	}
}

// A client whose witness restarted (and forgot), or was replaced by another, learns what it
// vouches for from the start of its new table, even when that table has grown past where the
// client had got to in the old one; a witness that names no epoch and counts back is asked
// from the start again.
func TestAClientLearnsAgainFromAWitnessThatForgot(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 4096)
	s, c, l, rev := serve(t, &bytesSource{data: data})
	for off := int64(0); off < 4096; off += 1024 {
		body, err := c.OpenRange(context.Background(), "f", off, 1024)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, body)
		body.Close()
	}
	learnAll(t, s, c, rev)
	if c.seq != 4 || c.epoch == "" {
		t.Fatalf("learnt up to %d in epoch %q, want 4 in the witness's", c.seq, c.epoch)
	}
	s.mu.Lock()
	s.tables = nil // a restart, or a new leader
	s.mu.Unlock()
	for k := range int64(6) { // more than the client had learnt of the old table
		s.vouch("m", rev, rangeKey{"f", 512 * k, 512}, make([]byte, sha256.Size))
	}
	d, err := c.digests(context.Background(), rev, c.epoch, c.seq)
	if err != nil {
		t.Fatal(err)
	}
	c.learn(rev, 4, d)
	for k := range int64(6) {
		if _, ok := c.PartSHA256(rev, l.Files[0], 512*k, 512); !ok {
			t.Errorf("range %d+512, vouched for by the new table, is not learnt", 512*k)
		}
	}
	if _, ok := c.PartSHA256(rev, l.Files[0], 0, 1024); !ok {
		t.Error("what the old table vouched for was forgotten")
	}
	if c.seq != 6 {
		t.Errorf("the client asks past %d in the new table, want 6", c.seq)
	}
	// Another restart to a table exactly as long: asked past 6 in the old epoch, it answers
	// from its start rather than waiting for a seventh.
	s.mu.Lock()
	s.tables = nil
	s.mu.Unlock()
	for k := range int64(6) {
		s.vouch("m", rev, rangeKey{"f", 1024 + 512*k, 512}, make([]byte, sha256.Size))
	}
	ctx, cancel := context.WithTimeout(context.Background(), longPoll/2)
	defer cancel()
	if d, err = c.digests(ctx, rev, c.epoch, c.seq); err != nil || len(d.Parts) != 6 {
		t.Fatalf("asked in an old epoch past a table as long: %d parts, %v; want its 6 at once", len(d.Parts), err)
	}

	// A witness that names no epoch (an older one) and counts from another start.
	c.learn(rev, 6, Digests{Seq: 7, Parts: []Part{{Path: "f", Off: 0, N: 100, SHA256: hex.EncodeToString(make([]byte, sha256.Size))}}})
	if c.seq != 0 {
		t.Errorf("after an answer from a table it did not name, the client asks past %d, not from the start", c.seq)
	}
}

// Bad requests are refused before the source is read.
func TestAWitnessRefusesBadRequests(t *testing.T) {
	src := &bytesSource{data: make([]byte, 100)}
	s := &Server{Open: open(src)}
	srv := httptest.NewServer(s)
	defer srv.Close()
	for _, q := range []string{
		"m/read?path=f&off=0&n=10",                 // no revision
		"m/read?revision=r&path=f&off=-1&n=10",     // negative offset
		"m/read?revision=r&path=f&off=0&n=0",       // nothing to read
		"m/read?revision=r&off=0&n=10",             // no path
		"m/digests?revision=r&after=-2",            // a negative sequence
		"m/digests?revision=r&after=x",             // not a number
		"m/elsewhere?revision=r",                   // no such operation
		"/read?revision=r&path=f&off=0&n=10",       // no model
		"m/read?revision=r&path=g&off=0&n=10&x=no", // no such file: the source says so
	} {
		resp, err := http.Get(srv.URL + Prefix + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("%s: %s, want a 4xx", q, resp.Status)
		}
	}
	if got := s.BytesRead(); got != 0 {
		t.Errorf("the witness read %d bytes for bad requests", got)
	}
}

// A file the origin lists a SHA-256 for is read from the origin, not through the witness: its
// parts are checked against its own digest.
func TestAFileWithADigestIsNotReadThroughTheWitness(t *testing.T) {
	src := &bytesSource{data: bytes.Repeat([]byte{1}, 4096), digest: true}
	s, c, _, _ := serve(t, src)
	if got := readRange(t, c, 0, 4096); !bytes.Equal(got, src.data) {
		t.Fatal("read other bytes than the source holds")
	}
	via, direct := c.Read()
	if s.BytesRead() != 0 || via != 0 || direct != 0 {
		t.Errorf("the witness read %d bytes (the client counts %d through it, %d directly); want none of a file with a digest", s.BytesRead(), via, direct)
	}
}

// A witness that answers it is busy (429, 503) is waited for as its answer asks (never less
// than minBusyWait), within the client's Busy; past that it is left alone for a while: the node
// reads the origin itself, and gets the source's bytes.
func TestABusyWitnessIsReadAround(t *testing.T) {
	src := &bytesSource{data: bytes.Repeat([]byte{2}, 4096)}
	var asked atomic.Int32
	var busyFor atomic.Int32
	s := &Server{Open: func(*http.Request, string) (source.Source, error) {
		if asked.Add(1) <= busyFor.Load() {
			return nil, ErrTooManyRequests
		}
		return src, nil
	}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	read := func(c *Client) {
		t.Helper()
		if got := readRange(t, c, 0, 4096); !bytes.Equal(got, src.data) {
			t.Fatal("read other bytes than the source holds")
		}
	}

	// Busy once: the read waits the second its answer asks for, and goes through the witness.
	busyFor.Store(1)
	c := NewClient(ClientOptions{URL: srv.URL, Model: "m", Origin: src})
	if _, err := c.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	read(c)
	if via, direct := c.Read(); via != 4096 || direct != 0 || asked.Load() != 2 {
		t.Errorf("busy once: asked the witness %d times, read %d bytes through it and %d directly; want twice, 4096 and 0", asked.Load(), via, direct)
	}

	// Busy for longer than the read waits: it reads the origin, and so does the next read,
	// without asking, for Retry.
	asked.Store(0)
	busyFor.Store(1 << 30)
	c = NewClient(ClientOptions{URL: srv.URL, Model: "m", Origin: src, Busy: 200 * time.Millisecond})
	if _, err := c.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	read(c)
	read(c)
	if via, direct := c.Read(); via != 0 || direct != 2*4096 || asked.Load() != 2 {
		t.Errorf("busy: asked the witness %d times, read %d bytes through it and %d directly; want twice (once after waiting), 0 and %d", asked.Load(), via, direct, 2*4096)
	}

	// A busy answer that asks for no wait at all is still waited on, at least minBusyWait.
	var zero atomic.Int32
	rude := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		zero.Add(1)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer rude.Close()
	c = NewClient(ClientOptions{URL: rude.URL, Model: "m", Origin: src, Busy: 3 * minBusyWait})
	if _, err := c.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	read(c)
	if n := zero.Load(); n > 4 {
		t.Errorf("a witness answering 503 with Retry-After: 0 was asked %d times within %s; want at most 4", n, 3*minBusyWait)
	}
}

// readRange reads n bytes of file f at off through c.
func readRange(t *testing.T, c *Client, off, n int64) []byte {
	t.Helper()
	body, err := c.OpenRange(context.Background(), "f", off, n)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	got, _ := io.ReadAll(body)
	return got
}

// listedBytes is a bytesSource that lists itself under rev.
type listedBytes struct {
	*bytesSource
	rev string
}

func (l listedBytes) Revision(context.Context) (string, error) { return l.rev, nil }

func (l listedBytes) Size(path string) (int64, bool) { return int64(len(l.data)), path == "f" }

// A source that lists its own revision is read, and vouched for, only under that revision: a
// node whose listing is of another version of the model (it changed since) is answered 409, and
// asking about made-up revisions makes the witness remember nothing.
func TestAWitnessReadsOnlyTheRevisionItsSourceLists(t *testing.T) {
	src := listedBytes{bytesSource: &bytesSource{data: bytes.Repeat([]byte{3}, 4096)}, rev: "r1"}
	s := &Server{Open: func(*http.Request, string) (source.Source, error) { return src, nil }}
	srv := httptest.NewServer(s)
	defer srv.Close()
	for q, want := range map[string]int{
		"m/read?revision=r0&path=f&off=0&n=1024":    http.StatusConflict,
		"m/digests?revision=r0&after=0":             http.StatusConflict,
		"m/digests?revision=made-up":                http.StatusConflict,
		"m/read?revision=r1&path=../f&off=0&n=1024": http.StatusNotFound, // not a listed file
		"m/read?revision=r1&path=f&off=4000&n=1024": http.StatusNotFound, // past its end
		"m/read?revision=r1&path=f&off=0&n=1024":    http.StatusOK,
		"m/read?revision=r1&path=f&off=3072&n=1024": http.StatusOK, // the file's last range
	} {
		resp, err := http.Get(srv.URL + Prefix + q)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %s, want %d", q, resp.Status, want)
		}
	}
	if got := s.BytesRead(); got != 2048 {
		t.Errorf("the witness read %d bytes, want only the 2048 asked under the listed revision, within the file", got)
	}
	d, _ := s.since("m", "r1", "", 0)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tables) != 1 {
		t.Errorf("the witness keeps %d tables, want only the listed revision's", len(s.tables))
	}
	// Of the two ranges read, only the file's last is vouched for: the other is shorter than
	// minVouched.
	if len(d.Parts) != 1 || d.Parts[0].Off != 3072 {
		t.Errorf("vouched for %+v, want only the file's last range", d.Parts)
	}
}
