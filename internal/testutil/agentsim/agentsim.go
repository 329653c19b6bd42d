// Package agentsim plays the prewarm agents of many nodes against a real API server, as the
// scale benchmark needs: thousands of agent processes do not fit on one machine, but what the
// control plane sees of them does. Each simulated agent reads its NodeCache's requests and
// writes its status as the real agent does — the same reports (cachejob.Queued, Listing,
// Progressed, Verified), the same write policy (agent.WritePolicy), the same merge patch of the
// status subresource — with a download that takes a set time instead of reading a source.
// Each also renews its Lease as the agent does (Options.LeaseNamespace). What it does not
// reproduce: each agent's own watch of its NodeCache (one informer here watches
// them all) and the pods the agents read for the CSI volume's demands.
package agentsim

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine"
)

// Options describe the simulated agents.
type Options struct {
	// Policy is when an agent writes its status (the real agent's defaults when zero).
	Policy agent.WritePolicy
	// Download is how long one cache's download takes on a node.
	Download time.Duration
	// MaxParallel is how many caches one node downloads at once (the agent's agent.maxParallel,
	// 2 when zero); the others wait Queued, as on a real node.
	MaxParallel int
	// ModelBytes and Files are the size of every model.
	ModelBytes int64
	Files      int
	// Root is the cache root every node reports.
	Root string
	// Version is the agents' version.
	Version string
	// Workers is how many status writes are in flight at once (all agents together).
	Workers int
	// LeaseNamespace, when set, is where each agent keeps its Lease, renewed as the agent renews
	// it (agent.NewLeaseKeeper) every third of LeaseDuration (3m when zero).
	LeaseNamespace string
	LeaseDuration  time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Policy == (agent.WritePolicy{}) {
		var ao agent.Options
		ao.Defaults()
		o.Policy = ao.WritePolicy()
	}
	if o.Workers == 0 {
		o.Workers = 64
	}
	if o.MaxParallel == 0 {
		o.MaxParallel = 2
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Files == 0 {
		o.Files = 1
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 3 * time.Minute
	}
}

// Sim is the simulated agents of a set of nodes.
type Sim struct {
	o      Options
	c      client.Client
	reader client.Reader
	nodes  []*node

	// Writes counts the status writes made; Errors those that failed.
	Writes, Errors atomic.Int64
}

type node struct {
	name    string
	key     string // the agent's public key as reported (a stand-in: no credentials are sealed to it)
	mu      sync.Mutex
	jobs    map[string]*job
	last    prewarmv1alpha1.NodeCacheStatus
	lastAt  time.Time
	written bool
	busy    bool // a write is in flight
}

type job struct {
	req prewarmv1alpha1.CacheRequest
	// started is when the download began (zero while queued).
	started time.Time
	status  prewarmv1alpha1.CacheStatus
}

// Start runs simulated agents for nodes until ctx ends. cfg should allow the agents' aggregate
// request rate (each real agent has its own client and limits).
func Start(ctx context.Context, cfg *rest.Config, nodes []string, o Options) (*Sim, error) {
	o.defaults()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, err
	}
	informer, err := cache.New(cfg, cache.Options{Scheme: scheme.New(), ByObject: map[client.Object]cache.ByObject{
		&prewarmv1alpha1.NodeCache{}: {},
	}})
	if err != nil {
		return nil, err
	}
	if _, err := informer.GetInformer(ctx, &prewarmv1alpha1.NodeCache{}); err != nil {
		return nil, err
	}
	go func() { _ = informer.Start(ctx) }()
	if !informer.WaitForCacheSync(ctx) {
		return nil, ctx.Err()
	}
	s := &Sim{o: o, c: c, reader: informer}
	for _, name := range nodes {
		sum := sha256.Sum256([]byte("agentsim/" + name))
		s.nodes = append(s.nodes, &node{name: name, key: base64.StdEncoding.EncodeToString(sum[:]), jobs: map[string]*job{}})
	}
	if o.LeaseNamespace != "" {
		// In protobuf, as the agent renews it; the nodes' first renewals are spread over one
		// renewal interval, as agents that start with their nodes are.
		lcfg := rest.CopyConfig(cfg)
		lcfg.ContentType = runtime.ContentTypeProtobuf
		cs, err := kubernetes.NewForConfig(lcfg)
		if err != nil {
			return nil, err
		}
		spread := agent.RenewInterval(o.LeaseDuration) / time.Duration(max(1, len(nodes)))
		go func() {
			for i, name := range nodes {
				if i > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(spread):
					}
				}
				go agent.NewLeaseKeeper(cs, o.LeaseNamespace, name, name, o.LeaseDuration).Run(ctx)
			}
		}()
	}
	go s.run(ctx)
	return s, nil
}

// slots spreads the nodes' ticks over one Interval, as independent agents' are.
const slots = 20

func (s *Sim) run(ctx context.Context) {
	writes := make(chan *node, len(s.nodes))
	for range s.o.Workers {
		go func() {
			for n := range writes {
				s.write(ctx, n)
			}
		}()
	}
	tick := time.NewTicker(s.o.Policy.Interval / slots)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			close(writes)
			return
		case <-tick.C:
		}
		for j := i % slots; j < len(s.nodes); j += slots {
			n := s.nodes[j]
			if s.step(ctx, n) {
				writes <- n
			}
		}
	}
}

// step brings one node's jobs up to date with its NodeCache and the clock, and says whether its
// status is due to be written.
func (s *Sim) step(ctx context.Context, n *node) bool {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := s.reader.Get(ctx, types.NamespacedName{Name: n.name}, nc); err != nil {
		return false // not asked anything yet: a real agent writes nothing either
	}
	now := s.o.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy {
		return false
	}
	want := map[string]prewarmv1alpha1.CacheRequest{}
	for _, r := range nc.Spec.Caches {
		want[r.UID] = r
	}
	for uid := range n.jobs {
		if _, ok := want[uid]; !ok {
			delete(n.jobs, uid) // withdrawn: the agent removes the files, and the cache leaves its status
		}
	}
	// In the order of the requests, as the agent's download slots take them.
	downloading := 0
	for _, j := range n.jobs {
		if j.status.State == inferencev1.CacheDownloading {
			downloading++
		}
	}
	for _, r := range nc.Spec.Caches {
		j := n.jobs[r.UID]
		if j == nil {
			j = &job{req: r, status: cachejob.Queued(r.UID, stamp(now))}
			n.jobs[r.UID] = j
		}
		j.req = r
		if j.started.IsZero() && j.status.State != inferencev1.CacheReady && !r.Retained() && downloading < s.o.MaxParallel {
			j.started = now
			downloading++
		}
		before := j.status.State
		s.advance(j, now)
		if before == inferencev1.CacheDownloading && j.status.State == inferencev1.CacheReady {
			downloading--
		}
	}
	st := s.status(n, now)
	if !s.o.Policy.Due(n.last, st, now.Sub(n.lastAt), n.written) {
		return false
	}
	n.busy = true
	return true
}

// advance moves a job along its simulated download.
func (s *Sim) advance(j *job, now time.Time) {
	st := &j.status
	if j.req.Retained() && st.State != inferencev1.CacheReady && st.State != inferencev1.CacheDownloading {
		before := st.State
		cachejob.NotTarget(st)
		transition(st, before, now)
		return
	}
	if st.State == inferencev1.CacheReady || j.started.IsZero() {
		return // done, or waiting for a download slot
	}
	elapsed := now.Sub(j.started)
	before := st.State
	if st.State != inferencev1.CacheDownloading {
		cachejob.Listing(st, j.req.Source)
	}
	done := min(s.o.ModelBytes, int64(float64(s.o.ModelBytes)*elapsed.Seconds()/s.o.Download.Seconds()))
	// Every byte from the origin: the simulated agents share nothing.
	p := engine.Progress{Phase: engine.PhaseDownloading, BytesDone: done, BytesTotal: s.o.ModelBytes,
		FilesTotal: s.o.Files, BytesPerSecond: float64(s.o.ModelBytes) / s.o.Download.Seconds(), Fetched: done}
	cachejob.Progressed(st, p, engine.Progress{Fetched: st.OriginBytes})
	if elapsed >= s.o.Download {
		cachejob.Verified(st, s.o.Files, s.o.ModelBytes, revision(j.req))
		st.DiskBytes = s.o.ModelBytes    // what a real agent measures of a whole copy, about
		st.LastVerifiedTime = stamp(now) // the agent reads a new copy back once, as it does every verify interval
	}
	transition(st, before, now)
}

func transition(st *prewarmv1alpha1.CacheStatus, before inferencev1.CacheState, now time.Time) {
	if st.State != before {
		st.LastTransitionTime = stamp(now)
	}
}

// revision is the content revision every node of a cache reports: the same for all of them, as
// it is for one source.
func revision(r prewarmv1alpha1.CacheRequest) string {
	if r.Source.Revision != "" {
		return r.Source.Revision
	}
	sum := sha256.Sum256([]byte(r.Source.String()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func stamp(t time.Time) *metav1.Time {
	m := metav1.NewTime(t.Truncate(time.Second))
	return &m
}

// status is the node's NodeCache status now, as the agent builds it.
func (s *Sim) status(n *node, now time.Time) prewarmv1alpha1.NodeCacheStatus {
	st := prewarmv1alpha1.NodeCacheStatus{AgentVersion: s.o.Version, HeartbeatTime: stamp(now), CredentialsKey: n.key}
	if s.o.Root != "" {
		st.Roots = []prewarmv1alpha1.RootStatus{{Path: s.o.Root, CapacityBytes: 28 << 40, FreeBytes: 20 << 40}}
	}
	for _, j := range n.jobs {
		st.Caches = append(st.Caches, *j.status.DeepCopy())
	}
	slices.SortFunc(st.Caches, func(x, y prewarmv1alpha1.CacheStatus) int { return strings.Compare(x.UID, y.UID) })
	return st
}

// write writes the node's status as the agent does: a merge patch of the status subresource,
// from the NodeCache as the agent's informer holds it.
func (s *Sim) write(ctx context.Context, n *node) {
	n.mu.Lock()
	st := s.status(n, s.o.Now())
	n.mu.Unlock()
	err := func() error {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := s.reader.Get(ctx, types.NamespacedName{Name: n.name}, nc); err != nil {
			return err
		}
		orig := nc.DeepCopy()
		nc.Status = st
		return s.c.Status().Patch(ctx, nc, client.MergeFrom(orig))
	}()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.busy = false
	if err != nil {
		s.Errors.Add(1)
		return
	}
	s.Writes.Add(1)
	n.last, n.lastAt, n.written = st, s.o.Now(), true
}
