package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prewarm/prewarm/pkg/engine"
)

// Peer is another node of a cache's swarm.
type Peer struct {
	// Name is the peer's node name.
	Name string
	// URL is where its Server answers, e.g. http://10.0.3.7:9444.
	URL string
	// Upstream marks a peer of the group this node's group takes its parts from (a node that
	// already holds the cache, or an earlier group of the same warm-up). The others are this
	// node's group: each part of the model is read from the source (or the upstream) by one of
	// the group, and from that node by the rest.
	Upstream bool
}

// SwarmOptions configure a Swarm.
type SwarmOptions struct {
	// Self is this node's name.
	Self string
	// Key names the cache on every node's Server (its UID).
	Key string
	// Peers are the nodes to exchange parts with.
	Peers []Peer
	// Server, when set, offers this node's parts from Join on.
	Server *Server
	// Client sends the requests (default: a client with no overall timeout).
	Client *http.Client
	// Token returns the credentials sent as Authorization: Bearer.
	Token func() (string, error)
	// Wait is the most time a part waits for a peer to hold it before it is read from the
	// source (default 30 s).
	Wait time.Duration
	// SlowPart is the most time one part may take from a peer: a slower peer is dropped
	// (default 2 min).
	SlowPart time.Duration
	// Streams is how many parts this node takes from peers at once (default 4): the rest of its
	// link stays for the parts it reads from the source, which the others wait for.
	Streams int
	// JoinWait is the most time Join waits for the peers to answer, so that nodes starting
	// together split the parts between them from the first one (default 2 s).
	JoinWait time.Duration
	// Refresh, when set, is asked every RefreshInterval (1 s) for the peers as they are now (the
	// controller may list them after the download started); the swarm follows new ones and
	// drops those no longer listed.
	Refresh         func() []Peer
	RefreshInterval time.Duration
	// Log receives what the swarm decides (default: discarded).
	Log *slog.Logger
	// Metrics, when set, counts dropped peers and waits (NewMetrics).
	Metrics *Metrics
}

// Metrics are a node's swarm counters, shared by its Swarms.
type Metrics struct {
	dropped *prometheus.CounterVec
	waits   *prometheus.CounterVec
}

// NewMetrics registers the prewarm_peer_* client metrics with reg (which may be nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prewarm_peer_dropped_total",
			Help: "Peers a download stopped asking, by reason (mismatch, transfer, slow)."}, []string{"reason"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prewarm_peer_waits_total",
			Help: "Parts that waited for a peer, by outcome (peer, source)."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.dropped, m.waits)
	}
	return m
}

// Swarm is an engine.Swarm over HTTP: it follows what each peer holds (a long poll of its
// /have), and asks a holder for each part, the one this Swarm has the fewest parts in flight
// with. A part no peer holds is read from the source by one node of the group (the owner, by
// rendezvous hashing of the part over the group's live members); the others wait for it, up to
// Wait.
type Swarm struct {
	opts  SwarmOptions
	plan  *engine.Plan
	peers atomic.Pointer[[]*peerState] // replaced whole when Refresh changes them

	ctx    context.Context
	cancel context.CancelFunc
	joined time.Time
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed when a peer's holdings or liveness change
	streams chan struct{} // parts being taken from peers
}

type peerState struct {
	Peer
	inflight atomic.Int32

	mu       sync.Mutex
	held     []byte
	live     bool // answers /have for the revision
	dropped  string
	busyTill time.Time
}

// NewSwarm returns a Swarm; it starts following its peers at Join.
func NewSwarm(o SwarmOptions) *Swarm {
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Wait <= 0 {
		o.Wait = 30 * time.Second
	}
	if o.SlowPart <= 0 {
		o.SlowPart = 2 * time.Minute
	}
	if o.JoinWait <= 0 {
		o.JoinWait = 2 * time.Second
	}
	if o.Streams <= 0 {
		o.Streams = 4
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Token == nil {
		o.Token = func() (string, error) { return "", nil }
	}
	s := &Swarm{opts: o, changed: make(chan struct{}), streams: make(chan struct{}, o.Streams)}
	var peers []*peerState
	for _, p := range o.Peers {
		if p.Name != o.Self && p.URL != "" {
			peers = append(peers, &peerState{Peer: p})
		}
	}
	s.peers.Store(&peers)
	return s
}

// list is the current peers.
func (s *Swarm) list() []*peerState { return *s.peers.Load() }

// refresh takes on the peers Refresh returns now: new ones are followed, those no longer listed
// are dropped (reason "left").
func (s *Swarm) refresh() {
	want := map[string]Peer{}
	for _, p := range s.opts.Refresh() {
		if p.Name != s.opts.Self && p.URL != "" {
			want[p.Name] = p
		}
	}
	cur := s.list()
	var next []*peerState
	changed := false
	for _, p := range cur {
		if w, ok := want[p.Name]; ok && w == p.Peer {
			next = append(next, p)
			delete(want, p.Name)
			continue
		}
		s.drop(p, "left", errors.New("no longer listed as a peer"))
		changed = true
	}
	for _, p := range want {
		ps := &peerState{Peer: p}
		next = append(next, ps)
		changed = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.follow(ps)
		}()
	}
	if changed {
		s.peers.Store(&next)
		s.opts.Log.Info("peers changed", "peers", len(next))
		s.notify()
	}
}

// Join starts offering plan and following the peers' holdings.
func (s *Swarm) Join(plan *engine.Plan) {
	s.plan = plan
	if s.opts.Server != nil {
		s.opts.Server.Offer(s.opts.Key, plan)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.joined = time.Now()
	for _, p := range s.list() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.follow(p)
		}()
	}
	if s.opts.Refresh != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			t := time.NewTicker(s.opts.RefreshInterval)
			defer t.Stop()
			for {
				select {
				case <-s.ctx.Done():
					return
				case <-t.C:
					s.refresh()
				}
			}
		}()
	}
	deadline := time.NewTimer(s.opts.JoinWait)
	defer deadline.Stop()
	defer func() {
		s.opts.Log.Info("sharing parts", "peers", len(s.list()), "live", s.live(), "parts", plan.Parts())
	}()
	for {
		changed := s.changes()
		if s.allLive() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			return
		}
	}
}

func (s *Swarm) live() int {
	n := 0
	for _, p := range s.list() {
		if live, _ := p.usable(0, time.Now()); live {
			n++
		}
	}
	return n
}

func (s *Swarm) allLive() bool {
	for _, p := range s.list() {
		if live, _ := p.usable(0, time.Now()); !live && p.droppedFor() == "" {
			return false
		}
	}
	return true
}

// Leave stops following the peers. What this node holds stays offered (the Server's Withdraw
// ends that).
func (s *Swarm) Leave() {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
	}
}

func (s *Swarm) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *Swarm) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// follow keeps p's holdings current until the swarm is left or p is dropped.
func (s *Swarm) follow(p *peerState) {
	var version uint64
	after := ""
	backoff := 100 * time.Millisecond
	for s.ctx.Err() == nil && p.droppedFor() == "" {
		h, err := s.have(p, after)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			if p.setLive(false, nil) {
				s.notify()
			}
			var inc *incompatibleError
			if errors.As(err, &inc) {
				s.drop(p, "incompatible", err)
				return
			}
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return
			}
			if time.Since(s.joined) > s.opts.JoinWait {
				backoff = min(2*backoff, 5*time.Second)
			}
			after = ""
			continue
		}
		backoff = 100 * time.Millisecond
		p.setLive(true, h.Held)
		s.notify()
		version = h.Version
		after = strconv.FormatUint(version, 10)
	}
}

type incompatibleError struct{ msg string }

func (e *incompatibleError) Error() string { return e.msg }

func (s *Swarm) have(p *peerState, after string) (*HaveResponse, error) {
	url := p.URL + Prefix + s.opts.Key + "/have?revision=" + s.plan.Revision
	if after != "" {
		url += "&after=" + after
	}
	ctx, cancel := context.WithTimeout(s.ctx, longPoll+10*time.Second)
	defer cancel()
	resp, err := s.get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	h := &HaveResponse{}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(h); err != nil {
		return nil, err
	}
	if h.PartSize != s.plan.PartSize || h.Parts != s.plan.Parts() || len(h.Held) != (h.Parts+7)/8 {
		return nil, &incompatibleError{fmt.Sprintf("%s cuts the model into %d parts of %d bytes, this node into %d of %d",
			p.Name, h.Parts, h.PartSize, s.plan.Parts(), s.plan.PartSize)}
	}
	return h, nil
}

func (s *Swarm) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	tok, err := s.opts.Token()
	if err != nil {
		return nil, fmt.Errorf("reading the peer token: %w", err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return s.opts.Client.Do(req)
}

func statusError(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return &StatusError{Code: resp.StatusCode, Message: string(msg)}
}

// StatusError is a peer's answer other than 200.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Message) }

func (p *peerState) setLive(live bool, held []byte) (changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.live != live
	p.live = live
	if live {
		p.held = held
	}
	return changed
}

func (p *peerState) droppedFor() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// usable reports whether p may be asked for part i (holds: it says it holds it).
func (p *peerState) usable(i int, now time.Time) (live, holds bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped != "" || !p.live {
		return false, false
	}
	holds = i/8 < len(p.held) && p.held[i/8]&(1<<(i%8)) != 0 && now.After(p.busyTill)
	return true, holds
}

// Part asks a holder of part i for it, waiting for one when this node is not the part's owner
// (or its group has an upstream).
func (s *Swarm) Part(ctx context.Context, i int) (engine.PeerPart, error) {
	deadline := time.Now().Add(s.opts.Wait)
	waited := false
	for {
		changed := s.changes()
		if p := s.holder(i); p != nil {
			select {
			case s.streams <- struct{}{}:
			case <-ctx.Done():
				return engine.PeerPart{}, ctx.Err()
			}
			pp, err := s.fetch(ctx, p, i)
			if err == nil {
				if waited {
					s.opts.Metrics.waits.WithLabelValues("peer").Inc()
				}
				return pp, nil
			}
			if ctx.Err() != nil {
				return engine.PeerPart{}, ctx.Err()
			}
			s.refused(p, i, err)
			continue
		}
		if s.owner(i) && !s.hasUpstream() {
			return engine.PeerPart{}, engine.ErrFromSource
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.opts.Metrics.waits.WithLabelValues("source").Inc()
			return engine.PeerPart{}, engine.ErrFromSource
		}
		waited = true
		t := time.NewTimer(min(left, time.Second)) // busy holders come back within a second
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return engine.PeerPart{}, ctx.Err()
		}
		t.Stop()
	}
}

// Leads reports whether this node owns part i with no upstream to take it from: it reads it
// from the source for its group.
func (s *Swarm) Leads(i int) bool { return s.owner(i) && !s.hasUpstream() }

// refused handles a holder that did not send part i: busy (try others for a second), no longer
// holding it, or unreachable (not live until its /have answers again).
func (s *Swarm) refused(p *peerState, i int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var se *StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusTooManyRequests:
		p.busyTill = time.Now().Add(time.Second)
	case errors.As(err, &se) && se.Code == http.StatusNotFound && i/8 < len(p.held):
		p.held[i/8] &^= 1 << (i % 8)
	default:
		p.live = false
		s.opts.Log.Info("peer unreachable", "peer", p.Name, "error", err.Error())
	}
}

// holder picks, among the live peers holding part i, the one with the fewest parts in flight
// from this node; ties go to the highest rendezvous score, which spreads the parts.
func (s *Swarm) holder(i int) *peerState {
	now := time.Now()
	var best *peerState
	var bestScore uint64
	for _, p := range s.list() {
		if _, holds := p.usable(i, now); !holds {
			continue
		}
		score := rendezvous(p.Name, i)
		if best == nil || p.inflight.Load() < best.inflight.Load() ||
			(p.inflight.Load() == best.inflight.Load() && score > bestScore) {
			best, bestScore = p, score
		}
	}
	return best
}

// owner reports whether this node reads part i for its group: the highest rendezvous score
// among itself and the group's live peers.
func (s *Swarm) owner(i int) bool {
	mine := rendezvous(s.opts.Self, i)
	for _, p := range s.list() {
		if p.Upstream {
			continue
		}
		if live, _ := p.usable(i, time.Now()); live && rendezvous(p.Name, i) > mine {
			return false
		}
	}
	return true
}

func (s *Swarm) hasUpstream() bool {
	for _, p := range s.list() {
		if live, _ := p.usable(0, time.Now()); live && p.Upstream {
			return true
		}
	}
	return false
}

// rendezvous is node's score for part i: the same on every node, and spread so that each of a
// group's nodes wins about as many parts (FNV alone is not: names that differ in one byte keep
// their order over every suffix, hence the splitmix64 finalizer).
func rendezvous(node string, i int) uint64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, node)
	x := h.Sum64() ^ (uint64(i)+1)*0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fetch asks p for part i. The body must arrive within SlowPart.
func (s *Swarm) fetch(ctx context.Context, p *peerState, i int) (engine.PeerPart, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.SlowPart)
	p.inflight.Add(1)
	resp, err := s.get(ctx, fmt.Sprintf("%s%s%s/parts/%d?revision=%s", p.URL, Prefix, s.opts.Key, i, s.plan.Revision))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = statusError(resp)
		resp.Body.Close()
	}
	var crc uint64
	if err == nil {
		if crc, err = strconv.ParseUint(resp.Header.Get(CRCHeader), 16, 32); err != nil {
			resp.Body.Close()
			err = fmt.Errorf("%s sent part %d without its checksum", p.Name, i)
		}
	}
	if err != nil {
		p.inflight.Add(-1)
		cancel()
		<-s.streams
		return engine.PeerPart{}, err
	}
	body := &partBody{ReadCloser: resp.Body, done: func() { p.inflight.Add(-1); cancel(); <-s.streams }, ctx: ctx}
	return engine.PeerPart{Body: body, CRC32C: uint32(crc), Peer: p.Name}, nil
}

// partBody is a part's response body; closing it ends the request.
type partBody struct {
	io.ReadCloser
	ctx  context.Context
	done func()
	once sync.Once
}

func (b *partBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && errors.Is(b.ctx.Err(), context.DeadlineExceeded) {
		err = errSlow
	}
	return n, err
}

func (b *partBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

var errSlow = errors.New("the peer sent the part too slowly")

// Bad drops peer for the rest of this Fetch.
func (s *Swarm) Bad(peer string, i int, err error) {
	reason := "transfer"
	var mm *engine.PeerMismatchError
	switch {
	case errors.As(err, &mm):
		reason = "mismatch"
	case errors.Is(err, errSlow):
		reason = "slow"
	}
	for _, p := range s.list() {
		if p.Name == peer {
			s.drop(p, reason, err)
		}
	}
}

func (s *Swarm) drop(p *peerState, reason string, err error) {
	p.mu.Lock()
	already := p.dropped != ""
	if !already {
		p.dropped = reason
	}
	p.mu.Unlock()
	if already {
		return
	}
	s.opts.Metrics.dropped.WithLabelValues(reason).Inc()
	s.opts.Log.Info("peer dropped", "peer", p.Name, "reason", reason, "error", err.Error())
	s.notify()
}

// Dropped returns the peers this Swarm stopped asking, with why.
func (s *Swarm) Dropped() map[string]string {
	out := map[string]string{}
	for _, p := range s.list() {
		if why := p.droppedFor(); why != "" {
			out[p.Name] = why
		}
	}
	return out
}
