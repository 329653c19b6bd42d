package peer

import (
	"context"
	"errors"
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
	// Stall is how long a part may go without progress (its reader's bytes from the source, or a
	// peer's bytes to this node) before it is taken elsewhere (default 3 s): the node ranked
	// first after a stalled reader claims the part at Stall, the next at twice that, and so on;
	// a peer that sends nothing for 2 × Stall is asked no more until its /have answers again.
	Stall time.Duration
	// Wait is the last-resort guard (default 30 s): with an upstream group, a part no peer holds
	// or reads for Wait is read from the source.
	Wait time.Duration
	// SlowPart is the most time one part may take from a peer: a slower peer is dropped
	// (default 2 min).
	SlowPart time.Duration
	// Streams is how many parts this node takes from peers at once (default 8).
	Streams int
	// Window is how many of the first parts this node still wants are taken from peers rarest
	// first (default 64); past it, parts are taken in file order.
	Window int
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
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Metrics are a node's swarm counters, shared by its Swarms.
type Metrics struct {
	dropped *prometheus.CounterVec
	claims  prometheus.Counter
}

// NewMetrics registers the prewarm_peer_* client metrics with reg (which may be nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prewarm_peer_dropped_total",
			Help: "Peers a download stopped asking, by reason (mismatch, transfer, slow)."}, []string{"reason"}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "prewarm_peer_claims_total",
			Help: "Parts this node read from the source for its group although another member owned them: the owner stalled, was idle, or had not started them while this node had nothing else to read."}),
	}
	if reg != nil {
		reg.MustRegister(m.dropped, m.claims)
	}
	return m
}

// Swarm is an engine.Swarm over HTTP: it follows what each peer holds and reads, and how far
// (a long poll of its /have), and picks the parts this node takes: from peers, any part a live
// peer holds, rarest first; from the source, the parts this node owns (by rendezvous hashing
// of the part over the group's live members), then parts whose reader stalled, ranked so that
// one backup claims each, then parts other members own but are not reading (work stealing).
type Swarm struct {
	opts  SwarmOptions
	sel   selector
	plan  *engine.Plan
	peers atomic.Pointer[[]*peerState] // replaced whole when Refresh changes them

	ctx    context.Context
	cancel context.CancelFunc
	joined time.Time
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed when a peer's holdings or liveness change
	streams chan struct{} // parts being taken from peers

	pickMu sync.Mutex
	picks  pickState // selector.pickSource's
}

// NewSwarm returns a Swarm; it starts following its peers at Join.
func NewSwarm(o SwarmOptions) *Swarm {
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Stall <= 0 {
		o.Stall = 3 * time.Second
	}
	if o.Wait <= 0 {
		o.Wait = 30 * time.Second
	}
	if o.Window <= 0 {
		o.Window = 64
	}
	if o.SlowPart <= 0 {
		o.SlowPart = 2 * time.Minute
	}
	if o.JoinWait <= 0 {
		o.JoinWait = 2 * time.Second
	}
	if o.Streams <= 0 {
		o.Streams = 8
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
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Token == nil {
		o.Token = func() (string, error) { return "", nil }
	}
	s := &Swarm{opts: o, sel: selector{self: o.Self, now: o.Now, stall: o.Stall, wait: o.Wait, window: o.Window},
		changed: make(chan struct{}), streams: make(chan struct{}, o.Streams)}
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

// Join starts offering plan and following the peers' holdings, for as long as ctx (the fetch's)
// lasts or until Leave.
func (s *Swarm) Join(ctx context.Context, plan *engine.Plan) {
	s.plan = plan
	s.sel.checkable = plan.Checkable
	if s.opts.Server != nil {
		s.opts.Server.Offer(s.opts.Key, plan)
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.joined = s.opts.Now()
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
		s.plan.SetFromUpstream(s.sel.hasUpstream(s.list()))
		s.opts.Log.Info("sharing parts", "peers", len(s.list()), "live", s.sel.live(s.list()), "parts", plan.Parts(),
			"fromUpstream", s.plan.FromUpstream())
	}()
	for {
		changed := s.changes()
		if s.sel.allLive(s.list()) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			return
		}
	}
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
			if p.setLive(false, nil, nil, nil, s.opts.Now()) {
				// Its parts go to the next owner until it answers again.
				s.opts.Log.Info("peer not answering", "peer", p.Name, "error", err.Error())
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
			if s.opts.Now().Sub(s.joined) > s.opts.JoinWait {
				backoff = min(2*backoff, 5*time.Second)
			}
			after = ""
			continue
		}
		backoff = 100 * time.Millisecond
		p.setLive(true, h.Held, h.Reading, h.Progress, s.opts.Now())
		p.mu.Lock()
		p.fromUp = h.FromUpstream
		p.mu.Unlock()
		s.notify()
		version = h.Version
		after = strconv.FormatUint(version, 10)
	}
}

// Part asks a holder of part i for it: the one this node has the fewest parts in flight with.
// ErrFromSource when no live peer holds it (any more): the Fetch picks again.
func (s *Swarm) Part(ctx context.Context, i int) (engine.PeerPart, error) {
	for range len(s.list()) + 1 {
		p := s.sel.holder(s.list(), i)
		if p == nil {
			break
		}
		select {
		case s.streams <- struct{}{}:
		case <-ctx.Done():
			return engine.PeerPart{}, ctx.Err()
		}
		pp, err := s.fetch(ctx, p, i)
		if err == nil {
			return pp, nil
		}
		if ctx.Err() != nil {
			return engine.PeerPart{}, ctx.Err()
		}
		s.refused(p, i, err)
	}
	return engine.PeerPart{}, engine.ErrFromSource
}

// Pick chooses the part a worker of lane takes next, among pending (selector.pickPeer and
// pickSource).
func (s *Swarm) Pick(pending []int, lane engine.Lane) int {
	if lane == engine.LanePeers {
		return s.sel.pickPeer(s.list(), pending)
	}
	s.pickMu.Lock()
	i, how := s.sel.pickSource(s.list(), pending, &s.picks)
	s.pickMu.Unlock()
	// The peers count on this node for parts only while it has no upstream.
	s.plan.SetFromUpstream(how.upstream)
	if how.claimed {
		s.opts.Metrics.claims.Inc()
		s.opts.Log.Debug("claiming a part", "part", i)
	}
	return i
}

// SourceReads is how many of workers this node reads parts with from the source at once: its
// share of them, the group's live members (itself included; upstream peers, stalled members and
// members taking their parts from an upstream group left out) splitting workers between them.
// The group then keeps about as many reads in flight at the origin as one node alone would, and
// each part read, at about one node's share of the origin's rate, lands sooner: its peers can
// take a part only once it is whole, so four reads at a quarter of the rate each delay the first
// part, and leave the last four to pass on at once at the end (engine.SourceSharer).
func (s *Swarm) SourceReads(workers int) int {
	now := s.opts.Now()
	vs := snapshot(s.list(), now)
	markStalled(vs, now, s.sel.stall)
	members := 1
	for _, v := range vs {
		if v.live && !v.upstream && !v.stalled && !v.fromUp {
			members++
		}
	}
	return max(1, (workers+members-1)/members)
}

// Changed is closed when a peer's holdings, reading or liveness change.
func (s *Swarm) Changed() <-chan struct{} { return s.changes() }

// refused handles a holder that did not send part i: busy (try others for a second), no longer
// holding it, or unreachable (not live until its /have answers again).
func (s *Swarm) refused(p *peerState, i int, err error) {
	var se *StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusTooManyRequests:
		p.refused(i, refusedBusy, s.opts.Now())
	case errors.As(err, &se) && se.Code == http.StatusNotFound:
		p.refused(i, refusedGone, s.opts.Now())
	default:
		p.refused(i, refusedUnreachable, s.opts.Now())
		s.opts.Log.Info("peer unreachable", "peer", p.Name, "error", err.Error())
	}
}

// Bad drops peer for the rest of this Fetch.
func (s *Swarm) Bad(peer string, i int, err error) {
	reason := "transfer"
	var mm *engine.PeerMismatchError
	switch {
	case errors.As(err, &mm):
		reason = "mismatch"
	case errors.Is(err, errSlow):
		reason = "slow"
	case errors.Is(err, errStalled):
		// Stopped sending (paused, or cut off): asked no more until its /have answers again.
		for _, p := range s.list() {
			if p.Name == peer {
				p.refused(i, refusedUnreachable, s.opts.Now())
				s.opts.Log.Info("peer stalled", "peer", peer, "part", i)
				s.notify()
			}
		}
		return
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
