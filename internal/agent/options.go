// Package agent is prewarm's node agent: it holds, on one node's local disk, the weights caches
// its NodeCache asks for, and reports what it holds.
package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Options configure an agent.
type Options struct {
	// NodeName is the node this agent serves; its NodeCache has the same name.
	NodeName string
	// Config is the operator configuration the agents share with the controller: the cache
	// roots, how S3 and the Hub are reached, where FSx file systems are mounted.
	Config config.OperatorConfiguration
	// HostPrefix is where the node's filesystem is seen from the agent: a root /opt/dlami/nvme is
	// at HostPrefix+/opt/dlami/nvme. Empty when the roots are mounted at their own paths.
	HostPrefix string
	// KubeletDir is the kubelet's root directory as the agent sees it (empty: the agent is not
	// the node's CSI plugin). A cache root on its filesystem shares the kubelet's disk (its
	// watermarks stay below the kubelet's thresholds); the copies that the node plugin makes for
	// the pods of a node without a cache are kept under it.
	KubeletDir string
	// Reserve is the free space, per root, that caches never take.
	Reserve int64
	// MaxParallel is how many caches download at once.
	MaxParallel int
	// StatusInterval is the least time between two status writes.
	StatusInterval time.Duration
	// Leases, when set, keeps the agent's Lease (NewLeaseKeeper) in LeaseNamespace (the
	// operator namespace when empty), held by LeaseHolder (the node's name when empty): without
	// it the controller counts none of the node's caches.
	Leases                      kubernetes.Interface
	LeaseNamespace, LeaseHolder string
	// ProgressInterval is the least time between two status writes that change only the
	// progress of downloads (10 s): a change of state is written at the next StatusInterval.
	ProgressInterval time.Duration
	// RecheckInterval is how often a Ready cache is re-checked (manifest and sizes).
	RecheckInterval time.Duration
	// VerifyInterval is how often a Ready cache's content is read back and compared with its
	// checksums (also once after the agent starts).
	VerifyInterval time.Duration
	// VerifyRate caps the bytes per second that re-verification reads (0: no cap).
	VerifyRate int64
	// RetryInterval is the first wait before a failed download is tried again; it doubles up
	// to MaxRetryInterval.
	RetryInterval, MaxRetryInterval time.Duration
	// Connections sizes each S3 source's connection pool.
	Connections int
	// Engine are extra engine options (concurrency, part size, rate limit).
	Engine []engine.Option
	// Registerer, when set, receives the agent's and the engine's metrics.
	Registerer prometheus.Registerer
	// MountWait is the most time a mount waits for its cache before answering that it is not
	// ready yet.
	MountWait time.Duration
	// EventInterval is the least time between two events of one reason on one pod.
	EventInterval time.Duration
	// Peers, when set, shares the caches' parts with other agents.
	Peers *Peers
	// Version is reported in the NodeCache status.
	Version string
	// Now is the clock.
	Now func() time.Time
}

// Defaults fills the zero fields of o.
func (o *Options) Defaults() {
	// What the configuration tunes takes its value there (internal/config holds the defaults).
	o.Config.SetDefaults()
	ac := o.Config.Agent
	if o.MaxParallel <= 0 {
		o.MaxParallel = ac.MaxParallel
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = ac.ProgressInterval.Duration
	}
	if o.VerifyInterval <= 0 {
		o.VerifyInterval = ac.VerifyInterval.Duration
	}
	if o.StatusInterval <= 0 {
		o.StatusInterval = ac.StatusInterval.Duration
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = o.Config.OperatorNamespace
	}
	if o.LeaseHolder == "" {
		o.LeaseHolder = o.NodeName
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = ac.RecheckInterval.Duration
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = ac.RetryInterval.Duration
	}
	if o.MaxRetryInterval <= 0 {
		o.MaxRetryInterval = 5 * time.Minute
	}
	if o.MountWait <= 0 {
		o.MountWait = ac.MountWait.Duration
	}
	if o.EventInterval <= 0 {
		o.EventInterval = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options a user sets.
func (o *Options) Validate() error {
	if o.NodeName == "" {
		return fmt.Errorf("the node name is required (--node-name, or $NODE_NAME from the downward API)")
	}
	if err := o.Config.Validate(); err != nil {
		return err
	}
	if o.Reserve < 0 {
		return fmt.Errorf("reserve %d: must not be negative", o.Reserve)
	}
	return nil
}

var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// allowedRoot reports whether root is one of the allowed roots.
func (o *Options) allowedRoot(root string) bool {
	ok, _ := o.Config.CacheRootAllowed(root)
	return ok
}

// rootDir returns where the allowed root that parents name root is, as seen from the agent:
// its node path (cacheRoots[].nodePath, else the root itself) under the host prefix.
func (o *Options) rootDir(root string) string {
	if r, ok := o.Config.Root(root); ok {
		return o.local(r.OnNode())
	}
	return o.local(root)
}

// nodePath returns where the allowed root that parents name root is on the node.
func (o *Options) nodePath(root string) string {
	if r, ok := o.Config.Root(root); ok {
		return r.OnNode()
	}
	return root
}

// local returns where a node path is seen from the agent.
func (o *Options) local(nodePath string) string {
	if o.HostPrefix == "" {
		return nodePath
	}
	return filepath.Join(o.HostPrefix, nodePath)
}

// cacheDir returns, as seen from the agent, the directory that holds cache uid under root.
func (o *Options) cacheDir(root, uid string) string {
	return prewarmv1alpha1.CacheDir(o.rootDir(root), uid)
}

// mayRead refuses a source the agent would read with its own identity on behalf of a namespace
// the operator configuration does not allow it for: an S3 source without the namespace's own
// credentials, or an FSx directory. The controller refuses these first; the agent does not rely
// on it.
func (o *Options) mayRead(r prewarmv1alpha1.CacheRequest) error {
	if r.Source.Type == inferencev1.ModelSourceS3 && r.Credentials != nil {
		return nil // read with the namespace's own credentials
	}
	if ok, why := o.Config.SourceAllowed(r.Namespace, r.Source); !ok {
		return errors.New(why)
	}
	return nil
}

// sourceSpec returns the address the engine opens for a cache's source, and the options to
// open it with. An FSx source is read where the configuration says its file system is mounted
// (as seen from the agent).
func (o *Options) sourceSpec(cs prewarmv1alpha1.CacheSource) (sources.Spec, sources.Options, error) {
	opts := sources.Options{Connections: o.Connections}
	switch cs.Type {
	case inferencev1.ModelSourceS3:
		opts.Endpoint, opts.PathStyle = o.Config.S3.Endpoint, o.Config.S3.UsePathStyle()
		return sources.Spec{Kind: sources.S3, Bucket: cs.Bucket, Prefix: cs.Prefix, Region: cs.Region}, opts, nil
	case inferencev1.ModelSourceHuggingFace:
		opts.Endpoint = o.Config.HuggingFace.Endpoint
		return sources.Spec{Kind: sources.HuggingFace, Repo: cs.RepoID, Revision: cs.Revision}, opts, nil
	case inferencev1.ModelSourceFSx:
		mount, err := o.Config.FSxMountPath(cs.FileSystemID)
		if err != nil {
			return sources.Spec{}, opts, err
		}
		if cs.Path != "" && !filepath.IsLocal(cs.Path) {
			return sources.Spec{}, opts, fmt.Errorf("FSx path %q: want a path inside the file system", cs.Path)
		}
		return sources.Spec{Kind: sources.Dir, Path: filepath.Join(mount, cs.Path)}, opts, nil
	}
	return sources.Spec{}, opts, fmt.Errorf("source type %q: want s3, huggingface or fsx", cs.Type)
}

// WritePolicy is when the agent writes its NodeCache status.
func (o *Options) WritePolicy() WritePolicy {
	return WritePolicy{Interval: o.StatusInterval, ProgressInterval: o.ProgressInterval}
}
