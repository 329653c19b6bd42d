package agent

import (
	"sync"
	"time"
)

// pacer paces the events the node plugin records on pods: the kubelet tries a mount again every
// few seconds, and each try would otherwise record the same event again. It guards itself.
type pacer struct {
	mu   sync.Mutex
	last map[string]time.Time // by pod, cache and reason: when its event was last recorded
}

// forgetAfter is how long a key whose event is not recorded again is remembered.
const forgetAfter = time.Hour

// allow says whether the event keyed key may be recorded at now: at most once per interval, or
// every time when always is set. An allowed event is remembered; keys not seen for forgetAfter
// are forgotten.
func (p *pacer) allow(key string, now time.Time, interval time.Duration, always bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, seen := p.last[key]; seen && now.Sub(last) < interval && !always {
		return false
	}
	if p.last == nil {
		p.last = map[string]time.Time{}
	}
	p.last[key] = now
	for k, t := range p.last {
		if now.Sub(t) > forgetAfter {
			delete(p.last, k)
		}
	}
	return true
}
