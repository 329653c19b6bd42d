package peer

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The swarm's choices simulated on a clock of 100 ms ticks: nodes with a few slots to read
// parts from the source (a part takes readTicks) and to take parts from peers (one tick each),
// seeing each other through the same peerState and selector the Swarm uses, with what each
// holds, reads and how far, as /have would say it. No network, no goroutines: deterministic.

const (
	tick     = 100 * time.Millisecond
	simParts = 64 // in every simulation
	simNodes = 4
	// simReadTicks is one part's read from the source: 1 s.
	simReadTicks = 10
	// serveSlots is how many parts a node sends at once: a holder asked for more answers 429.
	serveSlots = 2
)

type simNode struct {
	name       string
	sel        selector
	view       []*peerState // the others as this node sees them
	held       []bool
	reading    map[int]int      // part → ticks read so far
	taking     map[int]*simXfer // part → transfer from a peer
	srcSlots   int              // parts read from the source at once
	peerSlots  int              // parts taken from peers at once
	joinAt     int              // tick it starts
	pausedFrom int              // from this tick ...
	pausedTill int              // ... to this one it is paused: stops everything, answers nothing
	hidden     map[string]bool  // nodes it does not see, nor they it
	doneAt     int              // tick it held every part (0: not yet)
	picks      pickState
	sourced    map[int]int // part → times read from the source
	moved      map[int]int // part → last tick its read moved
	stallTicks map[int]int // part → longest stretch it waited on a paused reader
	serving    int         // parts it sends now (at most serveSlots; more are refused, 429)
}

type simXfer struct {
	from  *simNode
	ticks int // without progress
}

type sim struct {
	t         *testing.T
	parts     int
	readTicks int
	now       time.Time
	tick      int
	nodes     []*simNode
}

func newSim(t *testing.T, names ...string) *sim {
	const parts, readTicks = simParts, simReadTicks
	s := &sim{t: t, parts: parts, readTicks: readTicks, now: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	for _, name := range names {
		n := &simNode{name: name, held: make([]bool, parts), reading: map[int]int{}, taking: map[int]*simXfer{},
			srcSlots: 2, peerSlots: 4, hidden: map[string]bool{}, sourced: map[int]int{},
			moved: map[int]int{}, stallTicks: map[int]int{}}
		n.sel = selector{self: name, now: func() time.Time { return s.now }, stall: 3 * time.Second, wait: 30 * time.Second, window: 16}
		s.nodes = append(s.nodes, n)
	}
	return s
}

func (s *sim) node(name string) *simNode {
	for _, n := range s.nodes {
		if n.name == name {
			return n
		}
	}
	s.t.Fatalf("no node %s", name)
	return nil
}

func (n *simNode) up(tick int) bool {
	return tick >= n.joinAt && (tick < n.pausedFrom || tick >= n.pausedTill)
}

func (n *simNode) pending() []int {
	var out []int
	for i := range n.held {
		_, r := n.reading[i]
		_, x := n.taking[i]
		if !n.held[i] && !r && !x {
			out = append(out, i)
		}
	}
	return out
}

// have is what n's /have says: held, reading, progress (in bytes: ticks × 1 MiB).
func (n *simNode) have() (held, reading []byte, progress []int64) {
	held, reading = make([]byte, (len(n.held)+7)/8), make([]byte, (len(n.held)+7)/8)
	for i, h := range n.held {
		if h {
			held[i/8] |= 1 << (i % 8)
		}
		if k, ok := n.reading[i]; ok {
			reading[i/8] |= 1 << (i % 8)
			progress = append(progress, int64(k)<<20)
		}
	}
	return held, reading, progress
}

// step advances the simulation one tick.
func (s *sim) step() {
	s.tick++
	s.now = s.now.Add(tick)
	// Reads and transfers move.
	for _, n := range s.nodes {
		if !n.up(s.tick) {
			continue
		}
		for i, k := range n.reading {
			if k+1 >= s.readTicks {
				delete(n.reading, i)
				n.held[i] = true
				continue
			}
			n.reading[i] = k + 1
			n.moved[i] = s.tick
		}
		for i, x := range n.taking {
			if x.from.up(s.tick) {
				delete(n.taking, i)
				x.from.inflightFor(n).inflight.Add(-1)
				x.from.serving--
				n.held[i] = true
				continue
			}
			if x.ticks++; time.Duration(x.ticks)*tick >= 2*n.sel.stall { // errStalled
				delete(n.taking, i)
				x.from.serving--
				ps := x.from.inflightFor(n)
				ps.inflight.Add(-1)
				ps.refused(i, refusedUnreachable, s.now)
			}
		}
	}
	// Each node hears the others it sees that answer.
	for _, n := range s.nodes {
		if !n.up(s.tick) {
			continue
		}
		for _, p := range n.view {
			o := s.node(p.Name)
			if o.up(s.tick) && !n.hidden[o.name] && !o.hidden[n.name] {
				held, reading, progress := o.have()
				p.setLive(true, held, reading, progress, s.now)
			}
		}
	}
	// Each node picks.
	for _, n := range s.nodes {
		if !n.up(s.tick) {
			continue
		}
		for len(n.reading) < n.srcSlots {
			i, _ := n.sel.pickSource(n.view, n.pending(), &n.picks)
			if i < 0 {
				break
			}
			n.reading[i] = 0
			n.sourced[i]++
			n.moved[i] = s.tick
		}
		for tries := 0; len(n.taking) < n.peerSlots && tries < 4*n.peerSlots; tries++ {
			i := n.sel.pickPeer(n.view, n.pending())
			if i < 0 {
				break
			}
			h := n.sel.holder(n.view, i)
			from := s.node(h.Name)
			if from.serving >= serveSlots {
				h.refused(i, refusedBusy, s.now) // 429: Part tries another holder, the part stays wanted
				continue
			}
			from.serving++
			h.inflight.Add(1)
			n.taking[i] = &simXfer{from: from}
		}
		if n.doneAt == 0 && !slices.Contains(n.held, false) {
			n.doneAt = s.tick
		}
	}
	// How long each part waited on a stalled read: a part some node still wants, read by a node
	// that is paused, or not moving.
	for _, r := range s.nodes {
		for i := range r.reading {
			if r.up(s.tick) {
				continue
			}
			waited := s.tick - r.moved[i]
			for _, n := range s.nodes {
				if n != r && n.up(s.tick) && !n.held[i] {
					if _, own := n.reading[i]; !own && waited > n.stallTicks[i] {
						n.stallTicks[i] = waited
					}
				}
			}
		}
	}
}

// inflightFor is n's peerState in the view of asker.
func (n *simNode) inflightFor(asker *simNode) *peerState { return peerIn(asker.view, n.name) }

// run steps until every node holds every part, or limit ticks; it returns the tick the last
// node finished.
func (s *sim) run(limit int) int {
	for _, n := range s.nodes {
		for _, o := range s.nodes {
			if o != n {
				n.view = append(n.view, &peerState{Peer: Peer{Name: o.name}})
			}
		}
	}
	for s.tick < limit {
		s.step()
		last := 0
		for _, n := range s.nodes {
			if n.doneAt == 0 {
				last = -1
				break
			}
			last = max(last, n.doneAt)
		}
		if last > 0 {
			return last
		}
	}
	for _, n := range s.nodes {
		if n.doneAt == 0 {
			s.t.Fatalf("after %d ticks %s holds %d of %d parts", limit, n.name, s.parts-len(n.pending())-len(n.reading)-len(n.taking), s.parts)
		}
	}
	return 0
}

// sourced is how many parts the nodes read from the source in all.
func (s *sim) sourced() int {
	total := 0
	for _, n := range s.nodes {
		for _, k := range n.sourced {
			total += k
		}
	}
	return total
}

func names() []string {
	var out []string
	for k := range simNodes {
		out = append(out, fmt.Sprintf("node-%d", k))
	}
	return out
}

func TestSimulatedSwarms(t *testing.T) {
	const parts = simParts // 1 s per part from the source, two at a time per node
	base := newSim(t, names()...)
	baseT := base.run(2000)
	t.Logf("4 nodes together: all done at %.1f s, %d parts read from the source", float64(baseT)*tick.Seconds(), base.sourced())
	// The origin's goal is 1.1× the model: a backup taking an owner's part from the end can meet
	// the owner on its last one.
	if base.sourced() > parts*11/10 {
		t.Errorf("4 nodes starting together read %d parts from the source for %d", base.sourced(), parts)
	}

	t.Run("late joiner", func(t *testing.T) {
		s := newSim(t, names()...)
		s.node("node-3").joinAt = 30
		s.run(2000)
		t.Logf("read %d parts from the source", s.sourced())
		if s.sourced() > parts*11/10 {
			t.Errorf("with a node joining at 3 s, %d parts read from the source for %d", s.sourced(), parts)
		}
	})

	t.Run("views differ", func(t *testing.T) {
		s := newSim(t, names()...)
		s.node("node-0").hidden["node-3"] = true // node-0 and node-3 do not see each other
		s.run(2000)
		t.Logf("read %d parts from the source", s.sourced())
		if s.sourced() > parts*3/2 {
			t.Errorf("with two nodes not seeing each other, %d parts read from the source for %d", s.sourced(), parts)
		}
	})

	t.Run("owner stalls mid-part", func(t *testing.T) {
		s := newSim(t, names()...)
		paused := s.node("node-1")
		paused.pausedFrom, paused.pausedTill = 25, 25+600 // 60 s, from 2.5 s on
		s.run(4000)
		others := 0
		for _, n := range s.nodes {
			if n != paused {
				others = max(others, n.doneAt)
			}
		}
		longest := 0
		for _, n := range s.nodes {
			for _, k := range n.stallTicks {
				longest = max(longest, k)
			}
		}
		t.Logf("the others done at %.1f s (%.2f× the run without a pause); %d parts read from the source; a part waited at most %.1f s on the paused node",
			float64(others)*tick.Seconds(), float64(others)/float64(baseT), s.sourced(), float64(longest)*tick.Seconds())
		if others > baseT*13/10 {
			t.Errorf("with an owner paused for 60 s the others took %d ticks, over 1.3× the %d without", others, baseT)
		}
		if time.Duration(longest)*tick > 5*time.Second {
			t.Errorf("a part went %s without progress while others could read it", time.Duration(longest)*tick)
		}
	})

	t.Run("idle owner", func(t *testing.T) {
		s := newSim(t, names()...)
		s.node("node-2").srcSlots = 0 // answers and serves, never reads the source
		s.run(2000)
		t.Logf("read %d parts from the source", s.sourced())
		if s.sourced() > parts*11/10 {
			t.Errorf("with an idle owner, %d parts read from the source for %d", s.sourced(), parts)
		}
	})
}
