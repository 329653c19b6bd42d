package agent

import (
	"context"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// jobEnv is what the agent's jobs use of it (cachejob.Env): its settings, what the
// configuration allows, the node's slots, budgets, counters and space, and the parts offered to
// peers.
func (a *Agent) jobEnv() *cachejob.Env {
	o := &a.opts
	e := &cachejob.Env{
		NodeName: o.NodeName, Now: o.Now,
		RetryInterval: o.RetryInterval, MaxRetryInterval: o.MaxRetryInterval, RecheckInterval: o.RecheckInterval,
		VerifyInterval: o.VerifyInterval, ProgressInterval: o.StatusInterval,
		Reserve: o.Reserve, Engine: o.Engine, Registerer: o.Registerer, Key: a.key,
		Roots: o.Config.Roots, AllowedRoot: o.allowedRoot,
		SourceSpec: o.sourceSpec, MayRead: o.mayRead, FileSource: o.fileSource,
		CacheDir: o.cacheDir, EnsureCacheDir: o.ensureCacheDir, CheckDisk: a.checkDisk, MigrateLayout: a.migrateLayout,
		SetAside: a.setAside, SweepSetAside: a.sweepSetAside,
		Slots: a.sem, Urgent: a.urgent, Budget: a.budget, VerifyLimiter: a.verifyLimiter,
		Metrics:    cachejob.Metrics{Failures: a.metrics.failures, Verified: a.metrics.verified, Damaged: a.metrics.damaged, Repaired: a.metrics.repaired},
		ClaimSpace: a.claimSpace, RoomFor: a.roomFor, MakeRoom: a.makeRoom,
		Offer: a.offer, Withdraw: a.withdraw,
		WarnDamaged: func(ctx context.Context, j *cachejob.Job, msg string) {
			a.warnPods(ctx, j, EventCacheDamaged, msg)
		},
	}
	if p := o.Peers; p != nil {
		e.TrustPeers, e.Witness = p.TrustPeers, p.Witness
		if p.Server != nil {
			e.Swarm = &peer.SwarmOptions{Self: o.NodeName, Server: p.Server, Client: p.Client, Token: p.Token,
				Wait: p.Wait, Stall: p.Stall, SlowPart: p.SlowPart, Streams: p.Streams, Metrics: p.Metrics}
		}
	}
	return e
}

// roomFor is what cache uid may still take under root without evicting (freeFor), and what of
// that keeps the disk under its low watermark: an evicted cache is fetched again only when it
// fits there (up to the high one, the next download would evict again at once).
func (a *Agent) roomFor(root, uid string) (cachejob.Room, error) {
	f, free, err := a.freeFor(root, uid)
	if err != nil {
		return cachejob.Room{}, err
	}
	r := cachejob.Room{Free: free, Quiet: free, Disk: f.describe(root)}
	if f.capacity > 0 {
		r.Quiet = min(free, max(0, f.target()-f.used-(f.room()-free)))
	}
	return r, nil
}

// Reason is the status reason of a download refused room: cachejob.Refusal.
func (e *errNoRoom) Reason() string { return prewarmv1alpha1.ReasonInsufficientCapacity }

// Reason is the status reason of a download past its namespace's per-node limit:
// cachejob.Refusal.
func (e *errOverBudget) Reason() string { return prewarmv1alpha1.ReasonBudgetExceeded }

// Is makes an errNoDisk match cachejob.ErrNoDisk, which the jobs report as NoLocalDisk.
func (errNoDisk) Is(target error) bool { return target == cachejob.ErrNoDisk }
