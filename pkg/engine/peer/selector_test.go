package peer

import (
	"testing"
	"time"
)

// holds returns a live peer that holds the parts given, of a plan of n parts.
func holds(name string, n int, parts ...int) *peerState {
	p := &peerState{Peer: Peer{Name: name}, live: true, held: make([]byte, (n+7)/8)}
	for _, i := range parts {
		p.held[i/8] |= 1 << (i % 8)
	}
	return p
}

// The selector decides from the peers' states alone, on its own clock: a holder with fewer
// parts in flight wins, then the higher rendezvous score; a busy holder is passed over until
// its second is up; a dropped or silent peer holds nothing; one node of the group owns each
// part, and none reads from the source while an upstream peer is live.
func TestSelectorPicksFromStateAndClock(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	sel := selector{self: "self", now: func() time.Time { return now }}
	a, b := holds("a", 16, 3), holds("b", 16, 3)
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
	if sel.live(peers) != 1 || sel.allLive(peers) {
		t.Errorf("live %d, allLive %v; want 1, false", sel.live(peers), sel.allLive(peers))
	}
	other.dropped = "transfer"
	if !sel.allLive(peers) {
		t.Error("a dropped peer keeps the swarm from being all live")
	}
}

func TestSelectorSplitsOwnershipAcrossTheGroup(t *testing.T) {
	now := time.Now()
	const parts = 4000
	group := []string{"n0", "n1", "n2", "n3"}
	owned := map[string]int{}
	for _, self := range group {
		sel := selector{self: self, now: func() time.Time { return now }}
		var peers []*peerState
		for _, o := range group {
			if o != self {
				peers = append(peers, holds(o, parts))
			}
		}
		for i := range parts {
			if sel.leads(peers, i) {
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

	// A live upstream peer: this node reads nothing from the source; it leads again once the
	// upstream is gone.
	sel := selector{self: "n0", now: func() time.Time { return now }}
	up := holds("u", parts)
	up.Upstream = true
	peers := []*peerState{holds("n1", parts), up}
	for i := range parts {
		if sel.leads(peers, i) {
			t.Fatalf("leads part %d with an upstream peer live", i)
		}
	}
	up.refused(0, refusedUnreachable, now)
	if sel.hasUpstream(peers) || !anyLead(sel, peers, parts) {
		t.Errorf("upstream live %v, leads a part %v, once the upstream is unreachable; want false, true", sel.hasUpstream(peers), anyLead(sel, peers, parts))
	}
}

func anyLead(sel selector, peers []*peerState, parts int) bool {
	for i := range parts {
		if sel.leads(peers, i) {
			return true
		}
	}
	return false
}

// A part is waited for past Wait while the peer it is to come from is busy: the group's owner
// of the part (not another member) having gained a part within the last quiet, or reading from
// the source and having gained one within the last stall; with an upstream, any live upstream
// peer.
func TestProviderBusyFollowsTheOwnersActivity(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	sel := selector{self: "self", now: func() time.Time { return now }}
	const n, quiet, stall = 16, 30 * time.Second, 2 * time.Minute
	// a part owned by a, not by self or b
	part := -1
	for i := range n {
		if rendezvous("a", i) > rendezvous("self", i) && rendezvous("a", i) > rendezvous("b", i) {
			part = i
			break
		}
	}
	if part < 0 {
		t.Fatal("a owns none of 16 parts")
	}
	a, b := &peerState{Peer: Peer{Name: "a"}}, &peerState{Peer: Peer{Name: "b"}}
	peers := []*peerState{a, b}
	a.setLive(true, make([]byte, 2), make([]byte, 2), now)
	b.setLive(true, make([]byte, 2), []byte{0xff, 0xff}, now)
	if !sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner that just answered is not busy")
	}
	now = now.Add(quiet)
	if sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner idle for quiet is busy (because another member reads?)")
	}
	a.setLive(true, make([]byte, 2), []byte{0, 1}, now) // reads part 8, after quiet without a gain
	if !sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner reading from the source is not busy")
	}
	now = now.Add(stall - quiet - time.Second)
	if !sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner reading from the source, its last gain under stall ago, is not busy")
	}
	now = now.Add(2 * time.Second)
	if sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner that says it reads but gained nothing for stall is busy")
	}
	a.setLive(true, []byte{0, 1}, make([]byte, 2), now) // holds part 8 now
	if !sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner that just gained a part is not busy")
	}
	now = now.Add(quiet)
	a.setLive(true, []byte{0, 1}, make([]byte, 2), now) // the same again: no gain
	if sel.providerBusy(peers, part, quiet, stall) {
		t.Error("an owner answering the same holdings is busy")
	}
	a.setLive(false, nil, nil, now)
	b.setLive(true, []byte{0, 2}, []byte{1, 0}, now) // gains part 9, reads part 0
	if sel.providerBusy(peers, part, quiet, stall) == (rendezvous("b", part) < rendezvous("self", part)) {
		t.Errorf("with a silent, the owner of part %d is b (busy) or self (nothing to wait for)", part)
	}
	up := &peerState{Peer: Peer{Name: "up", Upstream: true}}
	up.setLive(true, make([]byte, 2), []byte{1, 0}, now)
	if !sel.providerBusy(append(peers, up), part, quiet, stall) {
		t.Error("an upstream peer reading from the source is not busy")
	}
}
