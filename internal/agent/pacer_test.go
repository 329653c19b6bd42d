package agent

import (
	"testing"
	"time"
)

// An event is recorded at most once per interval for the same key, every time when always is
// set; other keys are paced apart; keys not seen for an hour are forgotten.
func TestPacerAllowsOncePerInterval(t *testing.T) {
	var p pacer
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		key    string
		at     time.Duration
		always bool
		want   bool
	}{
		{"pod/a", 0, false, true},
		{"pod/a", 10 * time.Second, false, false},
		{"pod/b", 10 * time.Second, false, true},
		{"pod/a", 20 * time.Second, true, true},
		{"pod/a", 59 * time.Second, false, false},
		{"pod/a", 81 * time.Second, false, true},
	}
	for _, s := range steps {
		if got := p.allow(s.key, t0.Add(s.at), time.Minute, s.always); got != s.want {
			t.Errorf("allow(%s at %v, always=%v) = %v; want %v", s.key, s.at, s.always, got, s.want)
		}
	}
	p.allow("pod/c", t0.Add(2*time.Hour), time.Minute, false)
	if len(p.last) != 1 {
		t.Errorf("after two hours the pacer remembers %d keys; want only the last one", len(p.last))
	}
}
