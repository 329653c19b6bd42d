package peer

import (
	"hash/fnv"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// peerState is what this node knows of one peer: what it holds and reads from the source, when
// it last gained a part, whether it answers, whether it was dropped, and how many parts are in
// flight from it.
type peerState struct {
	Peer
	inflight atomic.Int32

	mu       sync.Mutex
	held     []byte
	reading  []byte
	grewAt   time.Time
	live     bool // answers /have for the revision
	dropped  string
	busyTill time.Time
}

// setLive records whether p answers and, when it does, what it holds and reads at now.
func (p *peerState) setLive(live bool, held, reading []byte, now time.Time) (changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.live != live
	p.live = live
	if live {
		if p.grewAt.IsZero() || gained(p.held, held) {
			p.grewAt = now
		}
		p.held, p.reading = held, reading
	}
	return changed
}

// gained reports whether bitmap now has a bit set that was does not have.
func gained(was, now []byte) bool {
	for k, b := range now {
		if k >= len(was) || b&^was[k] != 0 {
			return true
		}
	}
	return false
}

// busy reports whether p, live, gained a part within the last quiet, or is reading one from the
// source and gained a part within the last stall: a part waited for from p may still come. A
// peer that says it reads but gains nothing for stall (a stuck source, or a node that only
// claims to read) is not waited for. A stall under quiet is quiet: the longer of the two holds.
func (p *peerState) busy(now time.Time, quiet, stall time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped != "" || !p.live {
		return false
	}
	since := now.Sub(p.grewAt)
	if since < quiet {
		return true
	}
	for _, b := range p.reading {
		if b != 0 {
			return since < stall
		}
	}
	return false
}

func (p *peerState) droppedFor() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// usable reports whether p may be asked for part i at now (holds: it says it holds it).
func (p *peerState) usable(i int, now time.Time) (live, holds bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped != "" || !p.live {
		return false, false
	}
	holds = i/8 < len(p.held) && p.held[i/8]&(1<<(i%8)) != 0 && now.After(p.busyTill)
	return true, holds
}

// refusal is why a holder did not send a part.
type refusal int

const (
	// refusedBusy: it sends too many parts at once (429); others are asked for a second.
	refusedBusy refusal = iota
	// refusedGone: it no longer holds the part (404).
	refusedGone
	// refusedUnreachable: it did not answer; not live until its /have answers again.
	refusedUnreachable
)

// refused notes that p did not send part i at now.
func (p *peerState) refused(i int, why refusal, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch why {
	case refusedBusy:
		p.busyTill = now.Add(time.Second)
	case refusedGone:
		if i/8 < len(p.held) {
			p.held[i/8] &^= 1 << (i % 8)
		}
	default:
		p.live = false
	}
}

// selector decides, from what the peers are known to hold, who this node takes each part from
// and which parts it reads for its group. It does no I/O (the transport and the membership
// feed the peers' states) and reads the time only through now.
type selector struct {
	self string
	now  func() time.Time
}

// holder picks, among the live peers holding part i, the one with the fewest parts in flight
// from this node; ties go to the highest rendezvous score, which spreads the parts.
func (sel selector) holder(peers []*peerState, i int) *peerState {
	now := sel.now()
	var best *peerState
	var bestScore uint64
	for _, p := range peers {
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

// ownerPeer is the live peer of this node's group (not upstream) that reads part i for the
// group: the highest rendezvous score among this node and those peers; nil when this node does.
func (sel selector) ownerPeer(peers []*peerState, i int) *peerState {
	now := sel.now()
	var owner *peerState
	best := rendezvous(sel.self, i)
	for _, p := range peers {
		if p.Upstream {
			continue
		}
		if live, _ := p.usable(i, now); live && rendezvous(p.Name, i) > best {
			owner, best = p, rendezvous(p.Name, i)
		}
	}
	return owner
}

// owner reports whether this node reads part i for its group.
func (sel selector) owner(peers []*peerState, i int) bool {
	return sel.ownerPeer(peers, i) == nil
}

// providerBusy reports whether a peer that part i is waited for is busy (peerState.busy): the
// part's owner among the group's live peers, or, when the group has an upstream, any of its
// live peers.
func (sel selector) providerBusy(peers []*peerState, i int, quiet, stall time.Duration) bool {
	now := sel.now()
	if !sel.hasUpstream(peers) {
		owner := sel.ownerPeer(peers, i)
		return owner != nil && owner.busy(now, quiet, stall)
	}
	for _, p := range peers {
		if live, _ := p.usable(i, now); live && p.Upstream && p.busy(now, quiet, stall) {
			return true
		}
	}
	return false
}

// hasUpstream reports whether a peer of the upstream group is live.
func (sel selector) hasUpstream(peers []*peerState) bool {
	now := sel.now()
	for _, p := range peers {
		if live, _ := p.usable(0, now); live && p.Upstream {
			return true
		}
	}
	return false
}

// leads reports whether this node owns part i with no upstream to take it from: it reads it
// from the source for its group.
func (sel selector) leads(peers []*peerState, i int) bool {
	return sel.owner(peers, i) && !sel.hasUpstream(peers)
}

// live counts the live peers.
func (sel selector) live(peers []*peerState) int {
	n, now := 0, sel.now()
	for _, p := range peers {
		if live, _ := p.usable(0, now); live {
			n++
		}
	}
	return n
}

// allLive reports whether every peer not dropped is live.
func (sel selector) allLive(peers []*peerState) bool {
	now := sel.now()
	for _, p := range peers {
		if live, _ := p.usable(0, now); !live && p.droppedFor() == "" {
			return false
		}
	}
	return true
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
