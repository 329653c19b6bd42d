package cachejob

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/source/fs"
	"github.com/prewarm/prewarm/pkg/engine/sources"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// CheckCredentials checks, at most once per CredentialCheckInterval, that the origin lets the
// cache's namespace read the source: with the credentials the cache is read with (the
// namespace's own token or keys), or, for a Hugging Face source read without any, anonymously
// (a gated repository refuses that). The bytes on the node's disk serve every pod of the cache,
// but a pod mounts them only while its namespace is entitled to the source: a token revoked (or
// removed) stops new mounts. An S3 or FSx source read with prewarm's own identity, which the
// operator configuration allows for the namespace, needs no check.
func (j *Job) CheckCredentials(ctx context.Context) error {
	r := j.Current()
	digest := ""
	switch {
	case r.Credentials != nil:
		digest = r.Credentials.Digest
	case r.Source.Type != inferencev1.ModelSourceHuggingFace:
		return nil
	}
	j.mu.Lock()
	ok := j.credsChecked && j.credsDigest == digest && j.env.Now().Sub(j.credsAt) < CredentialCheckInterval
	j.mu.Unlock()
	if ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	src, closeSrc, err := j.openSource(ctx)
	if err != nil {
		return err
	}
	defer closeSrc()
	if _, err := src.List(ctx); err != nil {
		return err
	}
	j.credentialsAccepted(digest)
	return nil
}

// credentialsAccepted records that the origin accepted the credentials of this digest ("":
// none).
func (j *Job) credentialsAccepted(digest string) {
	j.mu.Lock()
	j.credsChecked, j.credsDigest, j.credsAt = true, digest, j.env.Now()
	j.mu.Unlock()
}

// trustsPeers says whether files without a source digest may come from peers.
func (j *Job) trustsPeers() bool { return j.env.TrustPeers }

// witnessed is src read through the node's witness, and the digests it vouches for, when the
// node shares an S3 cache's parts with its peers only where they can be checked: the parts of
// files S3 has no SHA-256 or SHA-1 of (uploaded in parts, with a CRC) are then shared too. stop
// ends the learning of its digests. Otherwise src, no digests, and a stop that does nothing.
//
// A node that has no peer yet reads through the witness too: a node that joins later (a
// scale-out) takes those parts from it, checked, instead of reading the origin again.
func (j *Job) witnessed(ctx context.Context, src source.Source) (source.Source, engine.PartDigests, func()) {
	w := j.env.Witness
	if w == nil || j.env.Swarm == nil || j.env.TrustPeers || j.req.Source.Type != inferencev1.ModelSourceS3 {
		return src, nil, func() {}
	}
	o := witness.ClientOptions{URL: w.URL, Model: j.req.UID, Origin: src, HTTP: w.Client, Token: w.Token,
		Log: slog.New(logr.ToSlogHandler(logr.FromContextOrDiscard(ctx).WithValues("cache", j.req.UID)))}
	if w.Bytes != nil {
		via, direct := w.Bytes.WithLabelValues("witness"), w.Bytes.WithLabelValues("origin")
		o.Counted = func(viaWitness bool, n int) {
			if viaWitness {
				via.Add(float64(n))
			} else {
				direct.Add(float64(n))
			}
		}
	}
	c := witness.NewClient(o)
	ctx, cancel := context.WithCancel(ctx)
	go c.Run(ctx)
	return c, c, cancel
}

// swarm is the Swarm a download of j's cache shares parts through, or nil.
func (j *Job) swarm(ctx context.Context) engine.Swarm {
	if j.env.Swarm == nil {
		return nil
	}
	peersNow := func() []peer.Peer {
		var peers []peer.Peer
		for _, cp := range j.Current().Peers {
			// The controller hands out only IP:port addresses it checked; anything else (a
			// host name, a path) is not sent this agent's token.
			if ap, err := netip.ParseAddrPort(cp.Address); err != nil || ap.String() != cp.Address {
				continue
			}
			peers = append(peers, peer.Peer{Name: cp.Node, URL: "http://" + cp.Address, Upstream: cp.Upstream})
		}
		return peers
	}
	o := *j.env.Swarm
	o.Key, o.Peers = j.req.UID, peersNow()
	// The controller lists a node's peers once their agents report where they serve, which may
	// be after this node's download started: it takes them on as they come.
	o.Refresh = peersNow
	o.Log = slog.New(logr.ToSlogHandler(logr.FromContextOrDiscard(ctx).WithValues("cache", j.req.UID)))
	return peer.NewSwarm(o)
}

// download runs fn with an engine that reports into the job's status and the cache's source,
// once one of the node's download slots is free.
func (j *Job) download(ctx context.Context, fn func(*engine.Engine, source.Source) error) error {
	var last engine.Progress
	return j.DownloadReporting(ctx, j.env.ClaimSpace(j.req.UID, j.req.Namespace), func(p engine.Progress) {
		// What this copy cost the origin and the peers adds up over every download of it
		// since the agent started.
		j.Set(func(st *prewarmv1alpha1.CacheStatus) { Progressed(st, p, last) })
		last = p
	}, fn)
}

// DownloadReporting runs fn with an engine that claims its room with claim, reports to progress
// and reads the cache's source, once one of the node's download slots is free.
func (j *Job) DownloadReporting(ctx context.Context, claim engine.ClaimSpace, progress func(engine.Progress), fn func(*engine.Engine, source.Source) error) error {
	release, err := j.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	src, closeSrc, err := j.openSource(ctx)
	if err != nil {
		return err
	}
	defer closeSrc()
	e := j.env
	eng := engine.New(append(append([]engine.Option{}, e.Engine...),
		engine.WithClaimSpace(claim), engine.WithRegisterer(e.Registerer), engine.WithBudget(e.Budget(j.req.Source.Type)),
		engine.WithProgress(progress, e.ProgressInterval))...)
	err = fn(eng, src)
	if fs, ok := src.(*fs.Source); ok && len(fs.Skipped()) > 0 {
		ctrl.LoggerFrom(ctx).Info("links that lead out of the model's directory were skipped", "links", fs.Skipped())
	}
	return err
}

// slot waits for one of the node's download slots. A cache a pod waits for (fill on a miss)
// may also take the node's one extra slot for such caches, so it does not queue behind caches
// no pod waits for.
func (j *Job) slot(ctx context.Context) (func(), error) {
	sem, urgent := j.env.Slots, j.env.Urgent
	for {
		if j.isDemanded() {
			select {
			case sem <- struct{}{}:
				return func() { <-sem }, nil
			case urgent <- struct{}{}:
				return func() { <-urgent }, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		select {
		case sem <- struct{}{}:
			return func() { <-sem }, nil
		case <-j.demanded:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// openSource opens the cache's source. An FSx source is opened through real directories only,
// inside what its sourceAccess rule allows (fileSource), and read inside its own directory.
func (j *Job) openSource(ctx context.Context) (source.Source, func(), error) {
	e := j.env
	cs := j.req.Source
	if cs.Type == inferencev1.ModelSourceFSx {
		dir, err := e.FileSource(j.req.Namespace, cs)
		if err != nil {
			return nil, nil, err
		}
		src, err := fs.NewIn(dir, ".", cs.String())
		if err != nil {
			dir.Close()
			return nil, nil, err
		}
		return src, func() { src.Close(); dir.Close() }, nil
	}
	spec, srcOpts, err := e.SourceSpec(cs)
	if err != nil {
		return nil, nil, err
	}
	if c := j.Current().Credentials; c != nil {
		creds, err := e.Key.Open(e.NodeName, j.req.UID, c)
		if err != nil {
			return nil, nil, &source.AccessError{Err: err}
		}
		srcOpts.Token = creds.HFToken
		srcOpts.AccessKeyID, srcOpts.SecretAccessKey, srcOpts.SessionToken = creds.AWSAccessKeyID, creds.AWSSecretAccessKey, creds.AWSSessionToken
	}
	src, err := sources.Open(ctx, spec, srcOpts)
	if err != nil {
		return nil, nil, err
	}
	return src, func() {}, nil
}
