package peer

import (
	"slices"
	"testing"
	"time"
)

// liveAt returns a peer that answered at now holding the parts given, of a plan of n parts.
func liveAt(name string, n int, now time.Time, parts ...int) *peerState {
	held := make([]byte, (n+7)/8)
	for _, i := range parts {
		held[i/8] |= 1 << (i % 8)
	}
	p := &peerState{Peer: Peer{Name: name}}
	p.setLive(true, held, make([]byte, len(held)), nil, now)
	return p
}

// reading is a bitmap of n parts with the parts given set.
func bitmap(n int, parts ...int) []byte {
	b := make([]byte, (n+7)/8)
	for _, i := range parts {
		b[i/8] |= 1 << (i % 8)
	}
	return b
}

func newSelector(self string, now *time.Time) selector {
	return selector{self: self, now: func() time.Time { return *now }, stall: 3 * time.Second, wait: 30 * time.Second, window: 64}
}

// The selector decides from the peers' states alone, on its own clock: a holder with fewer
// parts in flight wins, then the higher rendezvous score; a busy holder is passed over until
// its second is up; a dropped, silent or long-unheard peer holds nothing.
func TestSelectorPicksFromStateAndClock(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	sel := newSelector("self", &now)
	a, b := liveAt("a", 16, now, 3), liveAt("b", 16, now, 3)
	peers := []*peerState{a, b}

	want := a
	if rendezvous("b", 3) > rendezvous("a", 3) {
		want = b
	}
	if got := sel.holder(peers, 3); got != want {
		t.Fatalf("holder of part 3 = %v, want %s (the higher score on a tie)", got, want.Name)
	}
	other := a
	if want == a {
		other = b
	}
	want.inflight.Add(1)
	if got := sel.holder(peers, 3); got != other {
		t.Errorf("holder with one part in flight from the favourite = %v, want %s", got, other.Name)
	}
	want.inflight.Add(-1)
	if got := sel.holder(peers, 4); got != nil {
		t.Errorf("holder of a part no peer holds = %s", got.Name)
	}

	want.refused(3, refusedBusy, now)
	if got := sel.holder(peers, 3); got != other {
		t.Errorf("holder while %s is busy = %v, want %s", want.Name, got, other.Name)
	}
	now = now.Add(1100 * time.Millisecond)
	if got := sel.holder(peers, 3); got != want {
		t.Errorf("holder once the busy second is up = %v, want %s", got, want.Name)
	}
	want.refused(3, refusedGone, now)
	other.refused(3, refusedUnreachable, now)
	if got := sel.holder(peers, 3); got != nil {
		t.Errorf("holder after one no longer holds part 3 and the other went silent = %s", got.Name)
	}
	if sel.live(peers) != 2 {
		t.Errorf("live %d; want 2: a peer that did not send a part is not asked, but what it reads still counts", sel.live(peers))
	}
	if other.setLive(true, bitmap(16, 3), bitmap(16), nil, now); sel.holder(peers, 3) != other {
		t.Errorf("a peer that answers its /have again is not asked again")
	}
	other.setLive(false, nil, nil, nil, now) // its /have stopped answering
	if sel.live(peers) != 1 || sel.allLive(peers) {
		t.Errorf("live %d, allLive %v; want 1, false", sel.live(peers), sel.allLive(peers))
	}
	other.dropped = "transfer"
	if !sel.allLive(peers) {
		t.Error("a dropped peer keeps the swarm from being all live")
	}
	now = now.Add(stale)
	if sel.live(peers) != 0 {
		t.Errorf("a peer unheard for %s is live", stale)
	}
}

func TestSelectorSplitsOwnershipAcrossTheGroup(t *testing.T) {
	now := time.Now()
	const parts = 4000
	group := []string{"n0", "n1", "n2", "n3"}
	owned := map[string]int{}
	for _, self := range group {
		sel := newSelector(self, &now)
		var peers []*peerState
		for _, o := range group {
			if o != self {
				peers = append(peers, liveAt(o, parts, now))
			}
		}
		for i := range parts {
			if sel.owns(peers, i) {
				owned[self]++
			}
		}
	}
	total := 0
	for _, self := range group {
		total += owned[self]
		if n := owned[self]; n < parts/len(group)*8/10 || n > parts/len(group)*12/10 {
			t.Errorf("%s owns %d of %d parts; want about %d", self, n, parts, parts/len(group))
		}
	}
	if total != parts {
		t.Errorf("the group owns %d parts in all, want each of %d exactly once", total, parts)
	}
}

// A part a peer holds is taken at once, whichever it is: within the window the rarest first,
// ties broken by each node's own scores (so that two nodes with one view take different
// parts); past the window, in file order.
func TestAvailablePartsAreTakenInsteadOfWaitingOnOne(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	sel := newSelector("self", &now)
	pending := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	a, b := liveAt("a", 10, now, 7, 3), liveAt("b", 10, now, 3)
	if got := sel.pickPeer([]*peerState{a, b}, pending); got != 7 {
		t.Errorf("picked part %d; want 7, which one peer holds, over 3, which two do (and over 0–2, which none holds)", got)
	}
	if got := sel.pickPeer([]*peerState{liveAt("a", 10, now)}, pending); got != -1 {
		t.Errorf("picked part %d when no peer holds any", got)
	}
	sel.window = 4
	if got := sel.pickPeer([]*peerState{liveAt("a", 10, now, 8, 9)}, pending); got != 8 {
		t.Errorf("past the window picked part %d; want the first held, 8", got)
	}

	// Two nodes with the same view: over 100 windows of 8 parts that one peer holds alike, they
	// take different first parts almost always.
	x, y := newSelector("x", &now), newSelector("y", &now)
	same := 0
	for w := range 100 {
		var win []int
		for k := range 8 {
			win = append(win, 8*w+k)
		}
		peers := []*peerState{liveAt("h", 800, now, win...)}
		if x.pickPeer(peers, win) == y.pickPeer(peers, win) {
			same++
		}
	}
	if same > 30 {
		t.Errorf("two nodes with one view took the same first part in %d of 100 windows", same)
	}
}

// group builds, for each of names, the selector and its view of the others, all live at now.
func group(names []string, parts int, now *time.Time) (map[string]selector, map[string][]*peerState) {
	sels, views := map[string]selector{}, map[string][]*peerState{}
	for _, self := range names {
		sels[self] = newSelector(self, now)
		for _, o := range names {
			if o != self {
				views[self] = append(views[self], liveAt(o, parts, *now))
			}
		}
	}
	return sels, views
}

// peerIn is name's state in view.
func peerIn(view []*peerState, name string) *peerState {
	for _, p := range view {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// A reader that says its part waits on the origin (progress -1: a pause after SlowDown, its
// budget) is not claimed however long it waits, as long as it answers; once it stops
// answering, it is.
func TestAReaderWaitingOnTheOriginIsNotClaimed(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	names := []string{"r", "a", "b"}
	sels, views := group(names, 16, &now)
	const part = 3
	for k := range 60 { // 30 s of answers every half second, all waiting
		for _, self := range names[1:] {
			peerIn(views[self], "r").setLive(true, bitmap(16), bitmap(16, part), []int64{-1}, now)
			if got, _ := sels[self].pickSource(views[self], []int{part}, &pickState{}); got == part {
				t.Fatalf("%s claims a part waiting on the origin after %s", self, time.Duration(k)*time.Second/2)
			}
		}
		now = now.Add(time.Second / 2)
	}
	now = now.Add(10 * time.Second) // r stops answering
	claimed := 0
	for _, self := range names[1:] {
		if got, _ := sels[self].pickSource(views[self], []int{part}, &pickState{}); got == part {
			claimed++
		}
	}
	if claimed == 0 {
		t.Error("no one claims the part of a reader that stopped answering")
	}
}

// A reader whose part stops moving is waited for stall, then the best-ranked of the others
// claims the part alone, the next at twice stall; a part that moves again is not claimed.
func TestAStalledReaderIsClaimedOnceByRank(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	now := start
	names := []string{"r", "a", "b", "c"}
	sels, views := group(names, 16, &now)
	const part = 5
	say := func(progress int64) { // r reads part 5, at progress
		for _, self := range names[1:] {
			peerIn(views[self], "r").setLive(true, bitmap(16), bitmap(16, part), []int64{progress}, now)
		}
	}
	claimers := func() (out []string) {
		for _, self := range names[1:] {
			if got, _ := sels[self].pickSource(views[self], []int{part}, &pickState{}); got == part {
				out = append(out, self)
			}
		}
		return out
	}
	say(0)
	now = now.Add(2 * time.Second)
	say(1 << 20) // moved
	now = now.Add(2900 * time.Millisecond)
	say(1 << 20) // answered, not moved
	if got := claimers(); len(got) != 0 {
		t.Fatalf("%v claim a part that moved %s ago", got, 2900*time.Millisecond)
	}
	now = now.Add(200 * time.Millisecond)
	first := claimers()
	if len(first) != 1 {
		t.Fatalf("after %s without progress, %v claim the part; want exactly one", 3100*time.Millisecond, first)
	}
	ranked := []string{"a", "b", "c"}
	slices.SortFunc(ranked, func(x, y string) int {
		if rendezvous(x, part) > rendezvous(y, part) {
			return -1
		}
		return 1
	})
	if first[0] != ranked[0] {
		t.Errorf("%s claimed; want %s, ranked first for the part", first[0], ranked[0])
	}
	now = now.Add(3 * time.Second)
	if got := claimers(); len(got) != 2 || !slices.Contains(got, ranked[1]) {
		t.Errorf("at twice stall, %v claim; want %s and %s", got, ranked[0], ranked[1])
	}
	say(2 << 20) // moves again
	if got := claimers(); len(got) != 0 {
		t.Errorf("%v claim a part that just moved", got)
	}
}

// An owner that reads nothing has its parts taken by the others once they have had nothing of
// their own to read for stall, each the parts it ranks first for, with nothing read twice; a
// node reads its own parts before another's.
func TestAnIdleOwnersPartsAreTakenOnceTheOthersAreIdle(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	names := []string{"idle", "a", "b", "c"}
	sels, views := group(names, 64, &now)
	var idles []int
	for i := range 64 {
		if sels["idle"].owns(views["idle"], i) {
			idles = append(idles, i)
		}
	}
	if len(idles) < 4 {
		t.Fatalf("idle owns %d of 64 parts", len(idles))
	}
	states := map[string]*pickState{}
	for _, self := range names[1:] {
		states[self] = &pickState{}
		if i, _ := sels[self].pickSource(views[self], idles, states[self]); i >= 0 {
			t.Errorf("%s takes part %d of the owner's the moment it has nothing of its own", self, i)
		}
	}
	now = now.Add(3 * time.Second)
	for _, p := range views {
		for _, ps := range p {
			ps.setLive(true, bitmap(64), bitmap(64), nil, now)
		}
	}
	taken := map[int]string{}
	for _, self := range names[1:] {
		i, how := sels[self].pickSource(views[self], idles, states[self])
		if i < 0 {
			t.Fatalf("%s takes none of the idle owner's parts after stall", self)
		}
		if !how.claimed {
			t.Errorf("%s takes the idle owner's part %d as its own", self, i)
		}
		if was, ok := taken[i]; ok {
			t.Errorf("%s and %s both take part %d first", was, self, i)
		}
		taken[i] = self
	}
	mine := -1
	for i := range 64 {
		if sels["a"].owns(views["a"], i) {
			mine = i
			break
		}
	}
	if got, how := sels["a"].pickSource(views["a"], append(slices.Clone(idles), mine), states["a"]); got != mine || how.claimed {
		t.Errorf("a picks part %d (claimed %v); want its own part %d first, not claimed", got, how.claimed, mine)
	}
}

// With an upstream peer live, a part no peer holds or reads is read from the source only after
// it was wanted for wait.
func TestWithAnUpstreamOnlyTheLastResortReadsTheSource(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	now := start
	sel := newSelector("self", &now)
	up := liveAt("u", 16, now, 0, 1)
	up.Upstream = true
	peers := []*peerState{up, liveAt("g", 16, now)}
	wanted := &pickState{}
	if got, _ := sel.pickSource(peers, []int{0, 2}, wanted); got != -1 {
		t.Errorf("picked part %d to read with an upstream live", got)
	}
	now = now.Add(10 * time.Second)
	up.setLive(true, bitmap(16, 0, 1), bitmap(16), nil, now)
	if got, _ := sel.pickSource(peers, []int{2}, wanted); got != -1 {
		t.Errorf("picked part %d before wait", got)
	}
	now = now.Add(20 * time.Second)
	up.setLive(true, bitmap(16, 0, 1), bitmap(16), nil, now)
	if got, _ := sel.pickSource(peers, []int{0, 2}, wanted); got != 2 {
		t.Errorf("after wait picked %d; want part 2, which no peer holds (not 0, which the upstream does)", got)
	}
	up.setLive(false, nil, nil, nil, now) // its /have stopped answering
	peers[1].setLive(true, bitmap(16), bitmap(16), nil, now)
	owned := 0
	for i := range 16 {
		if sel.owns(peers, i) {
			owned++
		}
	}
	if sel.hasUpstream(peers) || owned == 0 || owned == 16 {
		t.Errorf("with the upstream silent, upstream live %v and this node owns %d of 16 parts in a group of two", sel.hasUpstream(peers), owned)
	}
}

// A part's progress counts as moving when its count changes, and when it starts being read;
// the same count answered again does not move it.
func TestProgressMovesAPartOnlyWhenItChanges(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	p := &peerState{Peer: Peer{Name: "p"}}
	p.setLive(true, bitmap(16), bitmap(16, 2, 9), []int64{10, 20}, now)
	t0 := now
	now = now.Add(time.Second)
	p.setLive(true, bitmap(16), bitmap(16, 2, 9), []int64{10, 25}, now)
	if p.movedAt[2] != t0 || p.movedAt[9] != now {
		t.Errorf("moved at %v and %v; want part 2 unmoved since %v, part 9 moved at %v", p.movedAt[2], p.movedAt[9], t0, now)
	}
	now = now.Add(time.Second)
	p.setLive(true, bitmap(16, 2), bitmap(16, 9), nil, now) // a holder that does not say how far
	if _, ok := p.movedAt[2]; ok || p.movedAt[9] != now {
		t.Errorf("after part 2 is held and progress is not said: %v", p.movedAt)
	}
}

// A peer that takes its parts from an upstream group of its own (its /have says so) owns no part
// of this node's group: a node that lists it as a member but is not listed by it in turn (views
// that differ) reads its parts itself rather than waiting for them.
func TestAPeerTakingFromItsOwnUpstreamOwnsNothing(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	sel := newSelector("self", &now)
	other := liveAt("other", 64, now)
	peers := []*peerState{other}
	mine := 0
	for i := range 64 {
		if sel.owns(peers, i) {
			mine++
		}
	}
	if mine == 0 || mine == 64 {
		t.Fatalf("self owns %d of 64 parts beside one member", mine)
	}
	other.fromUp = true
	for i := range 64 {
		if !sel.owns(peers, i) {
			t.Fatalf("self does not own part %d though its only member takes from an upstream", i)
		}
	}
}

// A holder that answered 429 still holds the part: for the moment it is not asked, but the part
// is not read from the source either, even by its owner. A holder that stopped sending is not
// counted on until its /have answers again, while what it reads still counts.
func TestABusyHolderStillHoldsItsPart(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	sel := newSelector("self", &now)
	mine := -1
	for i := range 64 {
		if rendezvous("self", i) > rendezvous("h", i) {
			mine = i
			break
		}
	}
	h := liveAt("h", 64, now, mine)
	peers := []*peerState{h}
	h.refused(mine, refusedBusy, now)
	if got := sel.pickPeer(peers, []int{mine}); got != -1 {
		t.Errorf("part %d taken from a holder that just answered 429", got)
	}
	if got, _ := sel.pickSource(peers, []int{mine}, &pickState{}); got != -1 {
		t.Errorf("this node reads its part %d from the source while a busy peer holds it", got)
	}
	h.refused(mine, refusedUnreachable, now)
	if got, _ := sel.pickSource(peers, []int{mine}, &pickState{}); got != mine {
		t.Errorf("picked %d; want this node's part %d, its only holder having stopped sending", got, mine)
	}
	other := -1
	for i := range 64 {
		if rendezvous("h", i) > rendezvous("self", i) {
			other = i
			break
		}
	}
	h.mu.Lock()
	h.movedAt = map[int]time.Time{other: now}
	h.mu.Unlock()
	if got, _ := sel.pickSource(peers, []int{other}, &pickState{}); got != -1 {
		t.Errorf("picked part %d that a peer which stopped sending is still reading, moving", got)
	}
}

// A node reads from the source with its share of the workers: the group's live members split
// them, so that the group keeps about as many reads in flight at the origin as one node would.
// Upstream peers, silent ones, stalled readers and members taking from an upstream group of their
// own read nothing for the group, and do not count.
func TestTheGroupSplitsTheSourceReads(t *testing.T) {
	now := time.Unix(1000, 0)
	var peers []Peer
	for k := range 7 {
		peers = append(peers, Peer{Name: string(rune('b' + k)), URL: "http://peer"})
	}
	s := NewSwarm(SwarmOptions{Self: "a", Peers: peers, Now: func() time.Time { return now }})
	if got := s.SourceReads(32); got != 32 {
		t.Errorf("no peer live yet: %d reads of 32; want all", got)
	}
	for _, p := range s.list() {
		p.setLive(true, bitmap(64), bitmap(64), nil, now)
	}
	if got := s.SourceReads(32); got != 4 {
		t.Errorf("8 members: %d reads of 32; want 4", got)
	}
	if got := s.SourceReads(4); got != 1 {
		t.Errorf("8 members: %d reads of 4; want 1", got)
	}
	ps := s.list()
	ps[0].setLive(false, nil, nil, nil, now)              // silent
	ps[1].setLive(true, bitmap(64), bitmap(64), nil, now) // taking from an upstream: below
	ps[1].fromUp = true
	ps[2].setLive(true, bitmap(64), bitmap(64, 5), []int64{100}, now) // reading part 5
	now = now.Add(4 * time.Second)                                    // past the stall: part 5 has not moved
	for _, p := range ps[3:] {
		p.setLive(true, bitmap(64), bitmap(64), nil, now)
	}
	ps[2].setLive(true, bitmap(64), bitmap(64, 5), []int64{100}, now)
	if got := s.SourceReads(32); got != 7 {
		t.Errorf("5 members (one silent, one from upstream, one stalled left out): %d reads of 32; want 7", got)
	}
	up := NewSwarm(SwarmOptions{Self: "a", Peers: []Peer{{Name: "u", URL: "http://up", Upstream: true}}, Now: func() time.Time { return now }})
	up.list()[0].setLive(true, bitmap(64), bitmap(64), nil, now)
	if got := up.SourceReads(32); got != 32 {
		t.Errorf("an upstream peer is not of the group: %d reads of 32; want all", got)
	}
}
