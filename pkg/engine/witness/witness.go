// Package witness lets nodes share the parts of files their source gives no digest for (S3
// objects uploaded in parts, with only a CRC; filesystem and FSx files, with none) without
// trusting one another.
//
// A witness runs in prewarm's own trust domain, never on a tenant's node. Nodes read such parts
// from the source through it: it reads each range from the source, streams it on, and records the
// SHA-256 of the bytes it read. A node that takes a part from a peer checks it against the
// witness's digest (engine.Request.Digests), so a node that lies about a part is caught whatever
// CRC it keeps. Every byte a peer relays was first read from the source by the witness, so the
// origin is still read about once for the whole fleet.
//
// The protocol is plain HTTP, read-only:
//
//	GET /prewarm/witness/v1/<model>/read?revision=<rev>&path=<path>&off=<off>&n=<n>
//	    200 with the n bytes of path at off, read from the source now; once they are all sent,
//	    their SHA-256 is vouched for under rev
//	GET /prewarm/witness/v1/<model>/digests?revision=<rev>&after=<seq>
//	    200 {"seq","parts":[{"path","off","n","sha256"}]}: what is vouched for under rev past
//	    seq; with after, the answer waits (up to 15 s) until there is some
//
// Who may ask for which model is the Open function's to decide (it authenticates the request);
// a refusal is answered 401, 403 or 404 as its error says. A source that is a Listed one is read
// and vouched for only under the revision it lists itself: a request for another is answered 409
// (the node's listing and the witness's disagree: the model changed), so bytes of one version
// are never vouched for under another.
package witness

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Prefix is the path under which a Server answers.
const Prefix = "/prewarm/witness/v1/"

// ErrUnauthenticated, returned by Open, is answered 401; ErrForbidden 403; a
// source.ErrNotFound 404; ErrTooManyRequests 429. Other errors are answered 500.
var (
	ErrUnauthenticated = errors.New("no valid token")
	ErrForbidden       = errors.New("not allowed to read this model")
	ErrTooManyRequests = errors.New("too many requests")
)

// longPoll is how long a digests request with after waits for news.
const longPoll = 15 * time.Second

// Limits on what a Server remembers: digests of at most maxRevisions model revisions (the least
// recently asked about are forgotten first: their nodes then read the source themselves), and
// at most maxParts parts of each (64 TiB in parts of 64 MiB).
const (
	maxRevisions = 256
	maxParts     = 1 << 20
)

// Listed is a source that knows the revision it reads: it lists the model (once) and reads
// each file only while the source still holds what it listed (S3: If-Match on the listed ETag).
// A Server reads from it only ranges within the files it listed.
type Listed interface {
	source.Source
	// Revision lists the model the first time; its revision, as the engine names it.
	Revision(ctx context.Context) (string, error)
	// Size is the listed size of the file at path, once Revision has listed it.
	Size(path string) (int64, bool)
}

// minVouched is the smallest range vouched for but a file's last: no engine reads parts smaller
// than a MiB, and a node asking for many tiny ranges fills no table.
const minVouched = 64 << 10

// Server reads ranges from their source for the nodes and vouches for what it read.
type Server struct {
	// Open authenticates r and returns model's source, or why not (see ErrForbidden).
	Open func(r *http.Request, model string) (source.Source, error)
	// Log, when set, gets a line for each range the source failed to give.
	Log *slog.Logger

	read atomic.Int64 // bytes read from sources

	mu     sync.Mutex
	tables map[string]*table // by model and revision
	tick   uint64            // for least recently used
}

// BytesRead is how many bytes the Server has read from sources.
func (s *Server) BytesRead() int64 { return s.read.Load() }

// table is what a Server vouches for under one model revision.
type table struct {
	epoch   string // names this table among all a witness ever made
	used    uint64 // Server.tick when last asked about
	parts   []Part
	index   map[rangeKey]int
	changed chan struct{}
}

type rangeKey struct {
	path   string
	off, n int64
}

// Part is a range a witness vouches for.
type Part struct {
	Path   string `json:"path"`
	Off    int64  `json:"off"`
	N      int64  `json:"n"`
	SHA256 string `json:"sha256"`
}

// Digests is the answer to a digests request: parts vouched for, and the sequence number past
// which to ask next, counted in the table named by Epoch. A witness answers a request naming
// another epoch (its table was made again: a new leader, a restart, a revision forgotten and
// asked about again) from the start of its own table.
type Digests struct {
	Epoch string `json:"epoch,omitempty"`
	Seq   int    `json:"seq"`
	Parts []Part `json:"parts"`
}

// table returns the table of model at rev, creating it (and forgetting the least recently used
// one past maxRevisions). Called with s.mu held.
func (s *Server) table(model, rev string) *table {
	if s.tables == nil {
		s.tables = map[string]*table{}
	}
	key := model + "\x00" + rev
	s.tick++
	t, ok := s.tables[key]
	if !ok {
		if len(s.tables) >= maxRevisions {
			oldest := ""
			for k, o := range s.tables {
				if oldest == "" || o.used < s.tables[oldest].used {
					oldest = k
				}
			}
			delete(s.tables, oldest)
		}
		t = &table{epoch: newEpoch(), index: map[rangeKey]int{}, changed: make(chan struct{})}
		s.tables[key] = t
	}
	t.used = s.tick
	return t
}

// vouch records that the n bytes at off of path, under model's revision rev, hash to sum.
func (s *Server) vouch(model, rev string, k rangeKey, sum []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.table(model, rev)
	if _, ok := t.index[k]; ok || len(t.parts) >= maxParts {
		return
	}
	t.index[k] = len(t.parts)
	t.parts = append(t.parts, Part{Path: k.path, Off: k.off, N: k.n, SHA256: hex.EncodeToString(sum)})
	close(t.changed)
	t.changed = make(chan struct{})
}

// since returns what is vouched for under model's rev past seq (from the start when epoch, when
// given, is not the table's), and a channel closed when there is more.
func (s *Server) since(model, rev, epoch string, seq int) (Digests, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.table(model, rev)
	if epoch != "" && epoch != t.epoch {
		seq = 0
	}
	seq = max(0, min(seq, len(t.parts)))
	return Digests{Epoch: t.epoch, Seq: len(t.parts), Parts: append([]Part(nil), t.parts[seq:]...)}, t.changed
}

// newEpoch names a new table: random, so that no two witnesses' tables share a name.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	model, op, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || model == "" || r.Method != http.MethodGet {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	rev := q.Get("revision")
	if rev == "" {
		http.Error(w, "want a revision", http.StatusBadRequest)
		return
	}
	switch op {
	case "read":
		s.serveRead(w, r, model, rev)
	case "digests":
		s.serveDigests(w, r, model, rev)
	default:
		http.NotFound(w, r)
	}
}

// open asks Open for model's source at rev, answering a refusal; nil when refused.
func (s *Server) open(w http.ResponseWriter, r *http.Request, model, rev string) source.Source {
	src, err := s.Open(r, model)
	if l, ok := src.(Listed); ok && err == nil {
		cur, lerr := l.Revision(r.Context())
		switch {
		case lerr != nil:
			http.Error(w, "listing the model: "+lerr.Error(), http.StatusBadGateway)
			return nil
		case cur != rev:
			http.Error(w, fmt.Sprintf("the source is at revision %s, not %s", cur, rev), http.StatusConflict)
			return nil
		}
	}
	switch {
	case err == nil:
		return src
	case errors.Is(err, ErrUnauthenticated):
		http.Error(w, err.Error(), http.StatusUnauthorized)
	case errors.Is(err, ErrForbidden):
		http.Error(w, err.Error(), http.StatusForbidden)
	case errors.Is(err, source.ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errors.Is(err, ErrTooManyRequests):
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusTooManyRequests)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
	return nil
}

func (s *Server) serveRead(w http.ResponseWriter, r *http.Request, model, rev string) {
	q := r.URL.Query()
	k := rangeKey{path: q.Get("path")}
	var err1, err2 error
	k.off, err1 = strconv.ParseInt(q.Get("off"), 10, 64)
	k.n, err2 = strconv.ParseInt(q.Get("n"), 10, 64)
	if k.path == "" || err1 != nil || err2 != nil || k.off < 0 || k.n <= 0 {
		http.Error(w, "want path, off ≥ 0 and n > 0", http.StatusBadRequest)
		return
	}
	src := s.open(w, r, model, rev)
	if src == nil {
		return
	}
	whole := true // the range ends the file: vouched for however short
	if l, ok := src.(Listed); ok {
		size, listed := l.Size(k.path)
		if !listed || k.off+k.n > size {
			http.Error(w, fmt.Sprintf("%s: no such file, or the range ends past it", k.path), http.StatusNotFound)
			return
		}
		whole = k.off+k.n == size
	}
	body, err := src.OpenRange(r.Context(), k.path, k.off, k.n)
	if err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, source.ErrNotFound) {
			status = http.StatusNotFound
		}
		http.Error(w, err.Error(), status)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Length", strconv.FormatInt(k.n, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	h := sha256.New()
	got, err := io.Copy(io.MultiWriter(w, h), &counting{r: io.LimitReader(body, k.n), add: func(n int) { s.read.Add(int64(n)) }})
	if err != nil || got != k.n {
		if s.Log != nil {
			s.Log.Warn("a range was not read whole", "model", model, "path", k.path, "off", k.off, "n", k.n, "read", got, "err", err)
		}
		return // the answer ends short: the node reads the rest again
	}
	if k.n >= minVouched || whole {
		s.vouch(model, rev, k, h.Sum(nil))
	}
}

// counting tells add how many bytes each read gave.
type counting struct {
	r   io.Reader
	add func(int)
}

func (c *counting) Read(b []byte) (int, error) {
	k, err := c.r.Read(b)
	c.add(k)
	return k, err
}

func (s *Server) serveDigests(w http.ResponseWriter, r *http.Request, model, rev string) {
	after := -1
	if a := r.URL.Query().Get("after"); a != "" {
		var err error
		if after, err = strconv.Atoi(a); err != nil || after < 0 {
			http.Error(w, "want after ≥ 0", http.StatusBadRequest)
			return
		}
	}
	if s.open(w, r, model, rev) == nil {
		return
	}
	epoch := r.URL.Query().Get("epoch")
	d, changed := s.since(model, rev, epoch, max(after, 0))
	if after >= 0 && len(d.Parts) == 0 && d.Seq == after && (epoch == "" || epoch == d.Epoch) { // (less, or another table: say so at once)
		t := time.NewTimer(longPoll)
		select {
		case <-changed:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
		d, _ = s.since(model, rev, epoch, after)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(d)
}

// sumOf is a SHA-256 digest as the protocol writes it.
func sumOf(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	raw, err := hex.DecodeString(s)
	if err != nil || len(raw) != sha256.Size {
		return sum, fmt.Errorf("not a SHA-256: %q", s)
	}
	copy(sum[:], raw)
	return sum, nil
}
