package agent

import (
	"testing"
	"time"
)

// A copy a pod asked for within the quiet time is not removed; once removed, the next ask makes a
// new copy, and the removal's move ran under the same lock (the copy was gone when it ran).
func TestScratchesRemoveHonoursTheLastAsk(t *testing.T) {
	var c scratches
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	mk := func() *scratch { return &scratch{uid: "u", wake: make(chan struct{}, 1)} }
	s, _, made := c.ask("u", t0, mk)
	if !made {
		t.Fatal("the first ask made no copy")
	}
	if _, _, made := c.ask("u", t0.Add(time.Second), mk); made {
		t.Error("a second ask made another copy")
	}
	moved := false
	if removed, err := c.remove(s, t0.Add(5*time.Second), 10*time.Second, func() error { moved = true; return nil }); removed || err != nil || moved {
		t.Errorf("removed %v, moved %v, err %v within the quiet time; want kept", removed, moved, err)
	}
	if removed, err := c.remove(s, t0.Add(12*time.Second), 10*time.Second, func() error {
		if c.byUID["u"] != nil {
			t.Error("the directory was moved while the copy was still listed")
		}
		moved = true
		return nil
	}); !removed || err != nil || !moved {
		t.Errorf("removed %v, moved %v, err %v after the quiet time; want removed", removed, moved, err)
	}
	if got, _ := c.state("u"); got != nil {
		t.Error("a removed copy is still listed")
	}
	s2, _, made := c.ask("u", t0.Add(13*time.Second), mk)
	if !made || s2 == s {
		t.Error("an ask after the removal made no new copy")
	}
	c.update(s2, func(st *scratchState) { st.err = &errNoScratchRoom{"full"} })
	if n := c.note("u"); n != "; no copy for the node's pods either: full" {
		t.Errorf("note for a refused copy: %q", n)
	}
}
