package peer

import (
	"hash/fnv"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// stale is how long a peer is taken as live after its last answer to /have: a holder answers a
// long poll at least every longPoll, and about every second while it reads from the source, so
// one that has not answered for longer is stopped or cut off even if its connection stays open.
const stale = longPoll + 5*time.Second

// peerState is what this node knows of one peer: what it holds, what it reads from the source
// and how far, when it last answered, whether it was dropped, and how many parts are in flight
// from it.
type peerState struct {
	Peer
	inflight atomic.Int32

	hash uint64 // of its name, for rendezvous scores (0: not yet computed)

	mu       sync.Mutex
	held     []byte
	progress map[int]int64     // bytes read of each part it reads, as it said last
	movedAt  map[int]time.Time // when each part it reads last moved (by this node's clock)
	answered time.Time         // its last answer to /have
	fromUp   bool              // it takes its parts from an upstream group: it owns none
	live     bool              // answers /have for the revision
	noAsk    bool              // did not send a part: not asked for one until it answers /have again
	dropped  string
	busyTill time.Time
}

// setLive records whether p answers and, when it does, what it holds and reads at now, and how
// far it has read each part it reads (progress: one entry per part in reading, in order; nil
// from a peer that does not say, whose parts then count as moving with every answer).
func (p *peerState) setLive(live bool, held, reading []byte, progress []int64, now time.Time) (changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = p.live != live
	p.live = live
	if !live {
		return changed
	}
	p.answered, p.noAsk = now, false
	p.held = held
	prog, moved := map[int]int64{}, map[int]time.Time{}
	k := 0
	for i := range 8 * len(reading) {
		if reading[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		at := int64(-1)
		if k < len(progress) {
			at = progress[k]
		}
		k++
		prog[i] = at
		// A holder that does not say how far it is (an older agent) is taken to be moving while
		// it answers: its long poll answers at least every 15 s.
		if was, ok := p.progress[i]; ok && was == at && at >= 0 {
			moved[i] = p.movedAt[i]
		} else {
			moved[i] = now
		}
	}
	p.progress, p.movedAt = prog, moved
	return changed
}

// isLive reports whether p answers, was not dropped, and answered within stale of now.
func (p *peerState) isLive(now time.Time) bool {
	return p.dropped == "" && p.live && now.Sub(p.answered) < stale
}

func (p *peerState) droppedFor() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// busyFor is how long a holder that answered 429 is not asked: about the time it takes to send a
// part to one of the peers it serves, so that the next free stream is taken soon after.
const busyFor = 250 * time.Millisecond

// refusal is why a holder did not send a part.
type refusal int

const (
	// refusedBusy: it sends too many parts at once (429); others are asked for busyFor.
	refusedBusy refusal = iota
	// refusedGone: it no longer holds the part (404).
	refusedGone
	// refusedUnreachable: it did not answer, or stopped sending; not asked for parts until its
	// /have answers again (what it reads and owns still counts: its /have says).
	refusedUnreachable
)

// refused notes that p did not send part i at now.
func (p *peerState) refused(i int, why refusal, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch why {
	case refusedBusy:
		p.busyTill = now.Add(busyFor)
	case refusedGone:
		if i/8 < len(p.held) { // a copy: snapshots share the bitmap
			p.held = slices.Clone(p.held)
			p.held[i/8] &^= 1 << (i % 8)
		}
	default:
		p.noAsk = true
	}
}

// view is one peer as a pick sees it: a snapshot, so that a pick over thousands of parts
// takes no lock per part.
type view struct {
	name     string
	hash     uint64 // of the name, for rendezvous scores
	upstream bool
	live     bool
	busy     bool              // refused a part with 429 within busyFor
	noAsk    bool              // did not send a part, and has not answered /have since
	held     []byte            // replaced whole, never written in place
	movedAt  map[int]time.Time // likewise
	inflight int32
	// stalled: it reads parts from the source and none has moved for stall (paused, cut off,
	// or its source stuck). It owns nothing: its parts go to the next of the group.
	stalled bool
	fromUp  bool // it takes its parts from an upstream group: it owns nothing either
}

// snapshot is the peers as of now.
func snapshot(peers []*peerState, now time.Time) []view {
	out := make([]view, len(peers))
	for k, p := range peers {
		p.mu.Lock()
		if p.hash == 0 {
			p.hash = nameHash(p.Name)
		}
		out[k] = view{name: p.Name, hash: p.hash, upstream: p.Upstream, live: p.isLive(now),
			busy: !now.After(p.busyTill), noAsk: p.noAsk, held: p.held, movedAt: p.movedAt, inflight: p.inflight.Load(), fromUp: p.fromUp}
		p.mu.Unlock()
	}
	return out
}

// markStalled sets stalled on the views whose reads have all not moved for stall.
func markStalled(vs []view, now time.Time, stall time.Duration) {
	for k := range vs {
		v := &vs[k]
		v.stalled = v.live && len(v.movedAt) > 0
		for _, at := range v.movedAt {
			if now.Sub(at) < stall {
				v.stalled = false
				break
			}
		}
	}
}

// has reports whether v, live and sending, says it holds part i (whether or not it may be asked
// this moment: a busy holder still has it).
func (v *view) has(i int) bool {
	return v.live && !v.noAsk && i/8 < len(v.held) && v.held[i/8]&(1<<(i%8)) != 0
}

// holds reports whether v may be asked for part i now.
func (v *view) holds(i int) bool { return v.has(i) && !v.busy }

// selector decides, from what the peers are known to hold and read, which part this node takes
// next and from whom. It does no I/O (the transport and the membership feed the peers' states)
// and reads the time only through now.
type selector struct {
	self string
	now  func() time.Time
	// stall is how long a part may go without progress before a backup claims it: the node
	// ranked first after its reader claims it at stall, the second at twice that, and so on.
	stall time.Duration
	// wait is the last-resort guard: with an upstream, a part no peer holds or reads for wait
	// is read from the source.
	wait time.Duration
	// window is how many of the first wanted parts are taken from peers rarest first; past it,
	// in file order.
	window int
	// checkable says whether this node can check a peer's copy of part i (engine.Plan's); a
	// peer holding a part it cannot is taken to hold nothing. nil: every part.
	checkable func(i int) bool
}

// canCheck reports whether a peer's copy of part i can be checked, and so taken.
func (sel selector) canCheck(i int) bool { return sel.checkable == nil || sel.checkable(i) }

// holder picks, among the live peers holding part i, the one with the fewest parts in flight
// from this node; ties go to the highest rendezvous score, which spreads the parts.
func (sel selector) holder(peers []*peerState, i int) *peerState {
	vs := snapshot(peers, sel.now())
	best := -1
	var bestScore uint64
	for k := range vs {
		v := &vs[k]
		if !v.holds(i) {
			continue
		}
		score := score(v.hash, i)
		if best < 0 || v.inflight < vs[best].inflight || v.inflight == vs[best].inflight && score > bestScore {
			best, bestScore = k, score
		}
	}
	if best < 0 {
		return nil
	}
	return peers[best]
}

// holders counts the peers that may be asked for part i.
func holders(vs []view, i int) int {
	n := 0
	for k := range vs {
		if vs[k].holds(i) {
			n++
		}
	}
	return n
}

// pickPeer is the part, among pending (in file order), to take from a peer next: within the
// window of the first pending parts, the one the fewest peers hold (rarest first, so that the
// nodes fetch different parts and exchange them), ties to this node's highest rendezvous score
// (so that nodes with the same view still pick differently); past the window, the first held.
// -1 when no live peer holds any.
func (sel selector) pickPeer(peers []*peerState, pending []int) int {
	vs, self := snapshot(peers, sel.now()), nameHash(sel.self)
	best, bestN := -1, 0
	var bestScore uint64
	for k, i := range pending {
		if k >= sel.window && best >= 0 {
			break
		}
		if !sel.canCheck(i) {
			continue
		}
		n := holders(vs, i)
		if n == 0 {
			continue
		}
		if k >= sel.window {
			return i
		}
		s := score(self, i)
		if best < 0 || n < bestN || n == bestN && s > bestScore {
			best, bestN, bestScore = i, n, s
		}
	}
	return best
}

// readers reports whether a live peer reads part i from the source and its progress moved
// within stall (fresh); otherwise, of the live peers reading it, when the last one moved and
// which they are.
func (sel selector) readers(vs []view, i int, now time.Time) (fresh bool, moved time.Time, stalled []int) {
	for k := range vs {
		if !vs[k].live {
			continue
		}
		at, ok := vs[k].movedAt[i]
		if !ok {
			continue
		}
		if now.Sub(at) < sel.stall {
			return true, at, nil
		}
		stalled = append(stalled, k)
		if at.After(moved) {
			moved = at
		}
	}
	return false, moved, stalled
}

// rank is this node's place, from 0, among the live members of its group (not upstream, not
// stalled, not taking their parts from an upstream of their own, not in skip) in the order of their rendezvous scores for part i: 0 owns the part, 1
// is its first backup, and so on. owner is the view that owns it (-1: this node).
func rank(vs []view, self uint64, i int, skip []int) (r, owner int) {
	mine, owner := score(self, i), -1
	for k := range vs {
		v := &vs[k]
		if !v.live || v.upstream || v.stalled || v.fromUp || slices.Contains(skip, k) || score(v.hash, i) <= mine {
			continue
		}
		r++
		if owner < 0 || score(v.hash, i) > score(vs[owner].hash, i) {
			owner = k
		}
	}
	return r, owner
}

// pickSource is the part, among pending (in file order), this node is to read from the source
// next, or -1. Parts a live peer holds are left to pickPeer, and parts a live peer reads with
// progress within stall are waited for. Of the rest, first a part whose reader stalled and
// that this node is to claim (its rank among the others, r, allows it once the part has not
// moved for (r+1) × stall); then the first part this node owns; then (work stealing) a part
// another member owns but no one reads, taken from the end (the owner reads from the start),
// the one this node ranks best for: ranked r after the owner, once this node has had nothing
// of its own to read for r × stall. An owner as fast as the others has read its parts by then
// (nothing is read twice); a slow or idle one loses its last parts, first to its first backup,
// and the backups do not all take the same part at once. With a live upstream peer, a part is read from the source only once no peer
// held or read it for wait. st keeps what the clock decides by. how says, from the same
// view, whether a part picked is claimed from its owner and whether an upstream peer is live.
func (sel selector) pickSource(peers []*peerState, pending []int, st *pickState) (part int, how sourcePick) {
	if st.quiet == nil {
		st.quiet = map[int]time.Time{}
	}
	quiet, now := st.quiet, sel.now()
	vs, self := snapshot(peers, now), nameHash(sel.self)
	markStalled(vs, now, sel.stall)
	upstream := hasUpstream(vs)
	how.upstream = upstream
	type stealable struct{ part, rank, owner int }
	var steals []stealable
	left := map[int]int{} // by owner, its parts here no one reads
	owned := -1
	for _, i := range pending {
		fresh, moved, stalled := sel.readers(vs, i, now)
		// A holder busy for the moment still holds the part: it is not read again. One whose
		// copy this node cannot check yet holds nothing for it.
		if fresh || sel.canCheck(i) && slices.ContainsFunc(vs, func(v view) bool { return v.has(i) }) {
			delete(quiet, i)
			continue
		}
		since, ok := quiet[i]
		if !ok {
			since, quiet[i] = now, now
		}
		if upstream {
			if len(stalled) > 0 && moved.After(since) {
				since = moved
			}
			if now.Sub(since) >= sel.wait {
				how.claimed = true // only after wait: no one owns it
				return i, how
			}
			continue
		}
		r, o := rank(vs, self, i, stalled)
		switch {
		case len(stalled) > 0:
			if now.Sub(moved) >= time.Duration(r+1)*sel.stall {
				how.claimed = true
				return i, how
			}
		case r == 0:
			if owned < 0 {
				owned = i
			}
		default:
			steals = append(steals, stealable{i, r, o})
			left[o]++
		}
	}
	if owned >= 0 {
		st.idle = time.Time{}
		return owned, how
	}
	if st.idle.IsZero() {
		st.idle = now
	}
	steal := -1
	for k := len(steals) - 1; k >= 0; k-- { // from the end: the owner reads from the start
		c := steals[k]
		// An owner that reads keeps its last part: it is about to read it.
		if left[c.owner] == 1 && len(vs[c.owner].movedAt) > 0 {
			continue
		}
		if now.Sub(st.idle) >= time.Duration(c.rank)*sel.stall && (steal < 0 || c.rank < steals[steal].rank) {
			steal = k
		}
	}
	if steal < 0 {
		return -1, how
	}
	how.claimed = true
	return steals[steal].part, how
}

// pickState is what pickSource remembers between picks.
type pickState struct {
	// quiet is, by part, since when this node has seen it neither held nor read.
	quiet map[int]time.Time
	// idle is since when this node has had no part of its own to read (zero: it has).
	idle time.Time
}

func hasUpstream(vs []view) bool {
	for k := range vs {
		if vs[k].live && vs[k].upstream {
			return true
		}
	}
	return false
}

// hasUpstream reports whether a peer of the upstream group is live.
func (sel selector) hasUpstream(peers []*peerState) bool {
	return hasUpstream(snapshot(peers, sel.now()))
}

// owns reports whether this node owns part i in its current view: it ranks first among its
// group's live members, and no upstream peer is live.
func (sel selector) owns(peers []*peerState, i int) bool {
	vs := snapshot(peers, sel.now())
	markStalled(vs, sel.now(), sel.stall)
	r, _ := rank(vs, nameHash(sel.self), i, nil)
	return !hasUpstream(vs) && r == 0
}

// sourcePick is what a pickSource saw: whether the part it picked is another's (a stalled
// part, a stolen one, or one read as a last resort beside an upstream group), and whether an
// upstream peer is live.
type sourcePick struct{ claimed, upstream bool }

// live counts the live peers.
func (sel selector) live(peers []*peerState) int {
	n := 0
	for _, v := range snapshot(peers, sel.now()) {
		if v.live {
			n++
		}
	}
	return n
}

// allLive reports whether every peer not dropped is live.
func (sel selector) allLive(peers []*peerState) bool {
	for k, v := range snapshot(peers, sel.now()) {
		if !v.live && peers[k].droppedFor() == "" {
			return false
		}
	}
	return true
}

// rendezvous is node's score for part i: the same on every node, and spread so that each of a
// group's nodes wins about as many parts (FNV alone is not: names that differ in one byte keep
// their order over every suffix, hence the splitmix64 finalizer).
func rendezvous(node string, i int) uint64 { return score(nameHash(node), i) }

func nameHash(node string) uint64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, node)
	return h.Sum64()
}

// score is rendezvous with the node's name hashed.
func score(node uint64, i int) uint64 {
	x := node ^ (uint64(i)+1)*0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
