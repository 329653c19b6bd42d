package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/text"
)

// A cache root must be a disk of its own: a model of 100 GB or more on the node's root
// filesystem, or on the kubelet's, fills the disk that the kubelet and the container runtime
// need, and the kubelet then evicts every pod of the node. The agent refuses such a root unless
// the cluster admin allows it (cacheRoots[].allowRootFilesystem), and reports NoLocalDisk; the
// node's pods then read their model from the source, into a copy that goes with them (scratch).

// noDiskFSTypes are filesystems that hold no disk: memory, and the container's own root (a root
// the agent's pod does not mount is on it).
var noDiskFSTypes = []string{"tmpfs", "ramfs", "overlay"}

// diskCheck is what a root's filesystem is judged against: the mount table (the agent's own,
// /proc/self/mountinfo) and the directories whose filesystem must not hold caches (the
// kubelet's).
type diskCheck struct {
	mounts func() ([]*mountinfo.Info, error)
	// refs are the directories, as seen from the agent, whose filesystem is not a cache's disk,
	// with what they are for messages.
	refs []diskRef

	mu sync.Mutex
	// verdicts are the last checks of each root directory, for diskCheckTTL: the status is
	// written every few seconds, and a node's mount table can be long.
	verdicts map[string]verdict
}

type verdict struct {
	err error
	at  time.Time
}

// diskCheckTTL is how long a root's verdict holds: a disk mounted after the agent started is
// taken on within it (and within the jobs' next try).
const diskCheckTTL = 30 * time.Second

// cached is check, at most once per diskCheckTTL for each root.
func (d *diskCheck) cached(dir, nodePath string, now time.Time) error {
	d.mu.Lock()
	v, ok := d.verdicts[dir]
	d.mu.Unlock()
	if ok && now.Sub(v.at) < diskCheckTTL {
		return v.err
	}
	err := d.check(dir, nodePath)
	d.mu.Lock()
	d.verdicts[dir] = verdict{err: err, at: now}
	d.mu.Unlock()
	return err
}

type diskRef struct{ dir, what string }

// newDiskCheck judges roots by this process's mount table, against the kubelet's directory
// (kubeletDir, as the agent sees it; empty: none).
func newDiskCheck(kubeletDir string) *diskCheck {
	d := &diskCheck{mounts: func() ([]*mountinfo.Info, error) { return mountinfo.GetMounts(nil) }, verdicts: map[string]verdict{}}
	if kubeletDir != "" {
		// The agent mounts the kubelet's pods directory (it mounts pods' volumes there), which
		// is on the kubelet's filesystem.
		d.refs = append(d.refs, diskRef{filepath.Join(kubeletDir, "pods"), "the kubelet's directory " + kubeletDir})
	}
	return d
}

// mountTableFrom reads a mount table in /proc/PID/mountinfo's format (for tests).
func mountTableFrom(r io.Reader) func() ([]*mountinfo.Info, error) {
	mounts, err := mountinfo.GetMountsFromReader(r, nil)
	return func() ([]*mountinfo.Info, error) { return mounts, err }
}

// errNoDisk says a root is not a disk prewarm may keep caches on.
type errNoDisk struct{ msg string }

func (e errNoDisk) Error() string { return e.msg }

// check returns nil when dir (the root nodePath, as seen from the agent) is on a disk of its
// own, else an errNoDisk saying why not.
func (d *diskCheck) check(dir, nodePath string) error {
	resolved, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return errNoDisk{fmt.Sprintf("%s does not exist on this node: no local disk is mounted there", nodePath)}
	}
	if err != nil {
		return fmt.Errorf("resolving the cache root %s: %w", nodePath, err)
	}
	mounts, err := d.mounts()
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	m := mountOf(mounts, resolved)
	if m == nil {
		return fmt.Errorf("no mount holds %s", nodePath)
	}
	what := fmt.Sprintf("%s, %s", m.Source, m.FSType)
	if slices.Contains(noDiskFSTypes, m.FSType) {
		return errNoDisk{fmt.Sprintf("%s is on %s: memory or the container's own filesystem, not a disk", nodePath, what)}
	}
	// The mount's root is the directory of its filesystem that is mounted there. A directory of
	// the filesystem mounted at / is at the same path inside that filesystem as on the node.
	rel, _ := filepath.Rel(m.Mountpoint, resolved)
	if filepath.Join(m.Root, rel) == filepath.Clean(nodePath) {
		return errNoDisk{fmt.Sprintf("%s is a directory of the node's root filesystem (%s), not a disk of its own", nodePath, what)}
	}
	var st unix.Stat_t
	if err := unix.Stat(resolved, &st); err != nil {
		return err
	}
	for _, ref := range d.refs {
		var rs unix.Stat_t
		if err := unix.Stat(ref.dir, &rs); err != nil {
			continue // not mounted here: nothing to compare with
		}
		if rs.Dev == st.Dev {
			return errNoDisk{fmt.Sprintf("%s is on the same filesystem as %s (%s), not a disk of its own", nodePath, ref.what, what)}
		}
	}
	return nil
}

// mountOf returns the mount that holds path: the one with the longest mount point above it, the
// last mounted where several share it.
func mountOf(mounts []*mountinfo.Info, path string) *mountinfo.Info {
	var best *mountinfo.Info
	for _, m := range mounts {
		if !within(path, m.Mountpoint) {
			continue
		}
		if best == nil || len(m.Mountpoint) >= len(best.Mountpoint) {
			best = m
		}
	}
	return best
}

func within(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// rootStatus measures the filesystem under root, and says why the node keeps no cache there
// when it is not a disk it may.
func (a *Agent) rootStatus(root string) prewarmv1alpha1.RootStatus {
	rs := prewarmv1alpha1.RootStatus{Path: root, ReservedBytes: a.opts.Reserve}
	if p := a.opts.nodePath(root); p != root {
		rs.NodePath = p
	}
	if err := a.checkDisk(root); err != nil {
		rs.Reason, rs.Message = prewarmv1alpha1.ReasonNoLocalDisk, text.Clip(err.Error(), text.MaxMessage)
		if !errors.As(err, new(errNoDisk)) {
			rs.Reason = ""
		}
	}
	if f, err := a.figures(root); err == nil && rs.Reason == "" {
		rs.CapacityBytes, rs.UsedBytes, rs.FreeBytes = f.capacity, f.used, min(f.room(), f.avail)
		rs.HighWatermarkPercent, rs.LowWatermarkPercent = f.high, f.low
	}
	return rs
}

// checkDisk returns nil when the node may keep caches under root: it is a disk of its own, or
// the configuration allows it where it is. Otherwise it returns an errNoDisk (or the error that
// kept the agent from telling).
func (a *Agent) checkDisk(root string) error {
	if r, ok := a.opts.Config.Root(root); !ok || r.AllowRootFilesystem {
		return nil
	}
	err := a.disks.cached(a.opts.rootDir(root), a.opts.nodePath(root), a.opts.Now())
	var nd errNoDisk
	if errors.As(err, &nd) {
		return errNoDisk{fmt.Sprintf("%s: the node keeps no cache there, and its pods read their model from the source "+
			"(mount a local disk there, map the root to where the disk is with cacheRoots[].nodePath, or allow the root filesystem with cacheRoots[].allowRootFilesystem)", nd.msg)}
	}
	return err
}
