package agent

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// statusWriter writes the agent's status to its NodeCache as its WritePolicy says: a change of
// state at the next StatusInterval tick, progress at most every ProgressInterval, nothing when
// nothing changes (the agent's Lease says it is alive).
type statusWriter struct{ a *Agent }

// NeedLeaderElection is false: every node's agent writes its own status.
func (statusWriter) NeedLeaderElection() bool { return false }

func (w statusWriter) Start(ctx context.Context) error {
	a := w.a
	log := ctrl.LoggerFrom(ctx).WithName("status")
	var last prewarmv1alpha1.NodeCacheStatus
	var lastWrite time.Time
	written := false
	policy := a.opts.WritePolicy()
	tick := time.NewTicker(a.opts.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		a.mu.Lock()
		seen := a.seen
		a.mu.Unlock()
		demands, err := a.demands(ctx)
		if err != nil {
			log.Error(err, "listing the node's pods for their caches")
		}
		if !seen && len(demands) == 0 && !a.servesPeers() {
			a.reported.Store(err == nil)
			continue // nothing to say before the NodeCache is read
		}
		st := a.status()
		st.Demands = demands
		a.metrics.observe(st)
		if !policy.Due(last, st, a.opts.Now().Sub(lastWrite), written) {
			continue
		}
		if err := a.writeStatus(ctx, st, seen); err != nil {
			log.Error(err, "writing NodeCache status")
			continue
		}
		a.reported.Store(true)
		last, lastWrite, written = st, a.opts.Now(), seen
	}
}
