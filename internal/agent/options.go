// Package agent is prewarm's node agent: it holds, on one node's local disk, the weights caches
// its NodeCache asks for, and reports what it holds.
package agent

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Options configure an agent.
type Options struct {
	// NodeName is the node this agent serves; its NodeCache has the same name.
	NodeName string
	// Roots are the node directories the cluster admin allows caches under.
	Roots []string
	// HostPrefix is where the node's filesystem is seen from the agent: a root /opt/dlami/nvme is
	// at HostPrefix+/opt/dlami/nvme. Empty when the roots are mounted at their own paths.
	HostPrefix string
	// FileSourceRoots are the node directories a file source (a mounted FSx) may read from.
	FileSourceRoots []string
	// Reserve is the free space, per root, that caches never take.
	Reserve int64
	// MaxParallel is how many caches download at once.
	MaxParallel int
	// StatusInterval is the least time between two status writes.
	StatusInterval time.Duration
	// HeartbeatInterval is the most time between two status writes.
	HeartbeatInterval time.Duration
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
	// Sources configures the S3 source (endpoint, addressing, connections).
	Sources sources.Options
	// HFEndpoint is the Hugging Face Hub endpoint (a mirror); empty means huggingface.co.
	HFEndpoint string
	// Engine are extra engine options (concurrency, part size, rate limit).
	Engine []engine.Option
	// Registerer, when set, receives the agent's and the engine's metrics.
	Registerer prometheus.Registerer
	// Namespace is prewarm's namespace, where token Secrets for this agent are.
	Namespace string
	// Version is reported in the NodeCache status.
	Version string
	// Now is the clock.
	Now func() time.Time
}

// Defaults fills the zero fields of o.
func (o *Options) Defaults() {
	if len(o.Roots) == 0 {
		o.Roots = []string{"/opt/dlami/nvme"}
	}
	if o.MaxParallel <= 0 {
		o.MaxParallel = 2
	}
	if o.StatusInterval <= 0 {
		o.StatusInterval = 2 * time.Second
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Minute
	}
	if o.RecheckInterval <= 0 {
		o.RecheckInterval = 5 * time.Minute
	}
	if o.VerifyInterval <= 0 {
		o.VerifyInterval = 24 * time.Hour
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = 10 * time.Second
	}
	if o.MaxRetryInterval <= 0 {
		o.MaxRetryInterval = 5 * time.Minute
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
	for _, list := range [][]string{o.Roots, o.FileSourceRoots} {
		for _, r := range list {
			if !filepath.IsAbs(r) || filepath.Clean(r) != r || r == "/" {
				return fmt.Errorf("root %q: want a clean absolute path other than /", r)
			}
		}
	}
	if o.Reserve < 0 {
		return fmt.Errorf("reserve %d: must not be negative", o.Reserve)
	}
	return nil
}

var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// allowedRoot reports whether root is one of the allowed roots.
func (o *Options) allowedRoot(root string) bool {
	for _, r := range o.Roots {
		if r == root {
			return true
		}
	}
	return false
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
	return prewarmv1alpha1.CacheDir(o.local(root), uid)
}

// checkSource refuses sources the agent may not read: file sources outside FileSourceRoots.
func (o *Options) checkSource(src string) error {
	switch {
	case strings.HasPrefix(src, "s3://"), strings.HasPrefix(src, "hf://"):
		return nil
	case strings.Contains(src, "://"):
		return fmt.Errorf("source %q: unknown scheme", src)
	}
	clean := filepath.Clean(src)
	if !filepath.IsAbs(src) || clean != src {
		return fmt.Errorf("source %q: want s3://, hf:// or a clean absolute path", src)
	}
	for _, r := range o.FileSourceRoots {
		if strings.HasPrefix(clean, r+"/") {
			return nil
		}
	}
	return fmt.Errorf("source %s is not under an allowed file source root (%s)", src, strings.Join(o.FileSourceRoots, ", "))
}
