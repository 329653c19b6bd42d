// Package peer shares a model's parts between the nodes fetching it, so that the source is read
// about once for the whole cluster instead of once per node.
//
// Every node runs a Server, which offers the parts it holds (engine.Plan) of each cache it
// fetches or holds; a Fetch takes a Swarm (engine.Swarm), which asks the node's peers for parts
// before the source. The protocol is plain HTTP, read-only:
//
//	GET /prewarm/peer/v1/<key>/have?revision=<rev>&after=<version>
//	    200 {"revision","partSize","parts","version","held":<bitmap, base64>,"reading":<bitmap>,
//	    "progress":[bytes read of each part in reading]}: the parts it holds, those it is reading
//	    from the source now, and how far (-1: the read waits on the origin); with after, the answer waits (up to 15 s) until the
//	    holder is past that version (a part added, started or stopped being read, or, at most
//	    once a second, read further)
//	GET /prewarm/peer/v1/<key>/parts/<i>?revision=<rev>
//	    200 with the part's bytes and X-Prewarm-Crc32c: the CRC32C they had when written
//
// Both need Authorization: Bearer <token>, which the Server's Authorize checks (the agent asks
// the API server: a service account token of prewarm's agents, for prewarm's peer audience),
// and its Admit, when set, for the key; a key the Server does not offer is answered 404 before
// either is asked.
// A Server sends a part only when it holds it whole with its CRC32C, to at most MaxPeers peers
// at once, within its upload rate; a busy Server answers 429.
package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine"
)

// Prefix is the path under which a Server answers.
const Prefix = "/prewarm/peer/v1/"

// CRCHeader carries a part's CRC32C (8 hex digits).
const CRCHeader = "X-Prewarm-Crc32c"

// ErrUnauthenticated is returned by an Authorize that finds no valid credentials: the request
// is answered 401. Other errors are answered 403.
var ErrUnauthenticated = errors.New("no valid peer token")

// ErrTooManyRequests is returned by an Authorize or Admit that will not or cannot check now
// (too many to check, or what it asks cannot answer): the request is answered 429, to be
// retried after a second.
var ErrTooManyRequests = errors.New("cannot check the peer now; retry")

// ServerOptions configure a Server.
type ServerOptions struct {
	// Authorize says which peer a request comes from, or why it is refused. Required.
	Authorize func(r *http.Request) (peer string, err error)
	// Admit, when set, says whether peer may be sent anything of the cache named key (nil: it
	// may); a refusal is answered as Authorize's are. Neither is asked about a key the Server
	// does not offer: that is answered 404 first.
	Admit func(r *http.Request, peer, key string) error
	// MaxPeers is K: how many peers are sent parts at once (default 4).
	MaxPeers int
	// StreamsPerPeer is how many parts one peer is sent at once (default 4).
	StreamsPerPeer int
	// BytesPerSecond caps what the Server sends, all peers together (0: no cap).
	BytesPerSecond int64
	// Registerer, when set, receives the prewarm_peer_served_* metrics.
	Registerer prometheus.Registerer
}

// HaveResponse is a holder's answer to /have.
type HaveResponse struct {
	Revision string `json:"revision"`
	PartSize int64  `json:"partSize"`
	Parts    int    `json:"parts"`
	Version  uint64 `json:"version"`
	Held     []byte `json:"held"`
	// Reading is which parts the holder is reading from the source now (absent from holders
	// that do not say): its peers wait on for those.
	Reading []byte `json:"reading,omitempty"`
	// Progress is how many bytes the holder has read of each part in Reading, in order (absent
	// from holders that do not say): a part whose count stops moving has stalled, and another
	// node claims it. -1 says the read waits on the origin (its budget): moving, not stalled.
	Progress []int64 `json:"progress,omitempty"`
	// FromUpstream says the holder takes its parts from an upstream group and reads the source
	// only as a last resort: its peers count on it for no part (it owns none).
	FromUpstream bool `json:"fromUpstream,omitempty"`
}

// Server offers this node's parts to its peers.
type Server struct {
	opts    ServerOptions
	limiter *rate.Limiter

	mu     sync.Mutex
	offers map[string]*engine.Plan
	active map[string]int // parts being sent, by peer

	served  prometheus.Counter
	parts   prometheus.Counter
	refused *prometheus.CounterVec
}

// NewServer returns a Server offering nothing yet.
func NewServer(o ServerOptions) *Server {
	if o.MaxPeers <= 0 {
		o.MaxPeers = 4
	}
	if o.StreamsPerPeer <= 0 {
		o.StreamsPerPeer = 4
	}
	s := &Server{opts: o, offers: map[string]*engine.Plan{}, active: map[string]int{},
		served: prometheus.NewCounter(prometheus.CounterOpts{Name: "prewarm_peer_served_bytes_total",
			Help: "Bytes of parts this node sent to its peers."}),
		parts: prometheus.NewCounter(prometheus.CounterOpts{Name: "prewarm_peer_served_parts_total",
			Help: "Parts this node sent to its peers."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prewarm_peer_refused_total",
			Help: "Peer requests refused, by reason (unauthenticated, forbidden, not-asked: the asker's node is not asked for the cache, unchecked: too many to check or the check failed, answered 429, busy, missing: not offered, revision)."}, []string{"reason"}),
	}
	if o.BytesPerSecond > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(o.BytesPerSecond), int(min(o.BytesPerSecond, chunk)))
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.served, s.parts, s.refused)
	}
	return s
}

// Offer makes plan's parts available under key (a cache's UID), replacing what was offered.
func (s *Server) Offer(key string, plan *engine.Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offers[key] = plan
}

// Withdraw stops offering key.
func (s *Server) Withdraw(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.offers, key)
}

// Offered reports what key offers, if anything.
func (s *Server) Offered(key string) *engine.Plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offers[key]
}

var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// refuse answers a request Authorize or Admit refused: 401 for ErrUnauthenticated, 429 for
// ErrTooManyRequests (retry in a second), otherwise 403, counted under reason.
func (s *Server) refuse(w http.ResponseWriter, err error, reason string) {
	code := http.StatusForbidden
	switch {
	case errors.Is(err, ErrUnauthenticated):
		code, reason = http.StatusUnauthorized, "unauthenticated"
	case errors.Is(err, ErrTooManyRequests):
		code, reason = http.StatusTooManyRequests, "unchecked"
		w.Header().Set("Retry-After", "1")
	}
	s.refused.WithLabelValues(reason).Inc()
	http.Error(w, err.Error(), code)
}

// longPoll is the most time a /have waits for a change.
const longPoll = 15 * time.Second

// chunk is the unit of one write to a peer.
const chunk = 256 << 10

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "read-only", http.StatusMethodNotAllowed)
		return
	}
	key, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, Prefix), "/")
	if !strings.HasPrefix(r.URL.Path, Prefix) || !keyPattern.MatchString(key) {
		http.NotFound(w, r)
		return
	}
	// What this node does not offer is answered first: a request for it costs no check of
	// the token or of the peer, so asking for keys at random costs the checks' API server
	// nothing.
	plan := s.Offered(key)
	if plan == nil {
		s.refused.WithLabelValues("missing").Inc()
		http.Error(w, "this node does not offer "+key, http.StatusNotFound)
		return
	}
	who, err := s.opts.Authorize(r)
	if err != nil {
		s.refuse(w, err, "forbidden")
		return
	}
	if s.opts.Admit != nil {
		if err := s.opts.Admit(r, who, key); err != nil {
			s.refuse(w, err, "not-asked")
			return
		}
	}
	if rev := r.URL.Query().Get("revision"); rev != plan.Revision {
		s.refused.WithLabelValues("revision").Inc()
		http.Error(w, fmt.Sprintf("this node holds revision %s, not %s", plan.Revision, rev), http.StatusConflict)
		return
	}
	switch {
	case rest == "have":
		s.have(w, r, plan)
	case strings.HasPrefix(rest, "parts/"):
		i, err := strconv.Atoi(strings.TrimPrefix(rest, "parts/"))
		if err != nil || i < 0 || i >= plan.Parts() {
			http.Error(w, "no such part", http.StatusNotFound)
			return
		}
		s.part(w, r, plan, who, i)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) have(w http.ResponseWriter, r *http.Request, plan *engine.Plan) {
	if after, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64); err == nil {
		t := time.NewTimer(longPoll)
		select {
		case <-plan.Changed(after):
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	held, reading, version := plan.Activity()
	var progress []int64
	for i := range 8 * len(reading) {
		if reading[i/8]&(1<<(i%8)) != 0 {
			progress = append(progress, plan.ReadProgress(i))
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(HaveResponse{Revision: plan.Revision, PartSize: plan.PartSize, Parts: plan.Parts(),
		Version: version, Held: held, Reading: reading, Progress: progress, FromUpstream: plan.FromUpstream()})
}

// admit takes one of who's streams, if K and the per-peer limit allow.
func (s *Server) admit(who string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.active[who]
	if n >= s.opts.StreamsPerPeer || (n == 0 && len(s.active) >= s.opts.MaxPeers) {
		return false
	}
	s.active[who] = n + 1
	return true
}

func (s *Server) release(who string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[who]--; s.active[who] <= 0 {
		delete(s.active, who)
	}
}

func (s *Server) part(w http.ResponseWriter, r *http.Request, plan *engine.Plan, who string, i int) {
	if !s.admit(who) {
		s.refused.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "serving as many peers as allowed", http.StatusTooManyRequests)
		return
	}
	defer s.release(who)
	body, crc, err := plan.OpenPart(i)
	if err != nil {
		s.refused.WithLabelValues("missing").Inc()
		http.Error(w, "part not held", http.StatusNotFound)
		return
	}
	defer body.Close()
	_, _, n := plan.Part(i)
	w.Header().Set(CRCHeader, fmt.Sprintf("%08x", crc))
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	sent, _ := s.copy(r.Context(), w, body)
	s.served.Add(float64(sent))
	if sent == n {
		s.parts.Inc()
	}
}

func (s *Server) copy(ctx context.Context, w io.Writer, body io.Reader) (int64, error) {
	size := chunk
	if s.limiter != nil {
		size = min(size, s.limiter.Burst())
	}
	buf := make([]byte, size)
	var sent int64
	for {
		n, err := io.ReadFull(body, buf)
		if n > 0 {
			if s.limiter != nil {
				if werr := s.limiter.WaitN(ctx, n); werr != nil {
					return sent, werr
				}
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return sent, werr
			}
			sent += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return sent, nil
		}
		if err != nil {
			return sent, err
		}
	}
}
