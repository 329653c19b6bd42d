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
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/text"
)

// A cache root must be on a disk, and not on the node's root filesystem (the filesystem of / as
// the node sees it): a model of 100 GB or more there fills the small OS disk that the kubelet,
// the container runtime and the system need. The agent refuses such a root unless the cluster
// admin allows it (cacheRoots[].allowRootFilesystem), and reports NoLocalDisk; the node's pods
// then read their model from the source, into a copy that goes with them (scratch).
//
// A data disk that the kubelet or the container runtime also use is taken: that is how the
// clusters lay out their NVMe (EKS's nodeadm and Karpenter RAID0, Bottlerocket, GKE's local SSD
// ephemeral storage bind /var/lib/kubelet and /var/lib/containerd onto the array). On such a
// disk, and on the root filesystem where allowed, the caches stay clear of the kubelet's
// eviction and image garbage collection thresholds (kubelet.go).

// noDiskFSTypes are filesystems that hold no disk: memory, and the container's own root (a root
// the agent's pod does not mount is on it).
var noDiskFSTypes = []string{"tmpfs", "ramfs", "overlay"}

// diskCheck is what a root's filesystem is judged against: the mount table (the agent's own,
// /proc/self/mountinfo) and the directories whose filesystem the kubelet and the container
// runtime use.
type diskCheck struct {
	mounts func() ([]*mountinfo.Info, error)
	// refs are the directories, as seen from the agent, whose filesystem the kubelet uses, with
	// what they are for messages.
	refs []diskRef
	// runtimeFile is a file the container runtime mounts into the agent's container from its
	// own directory (/etc/hostname: containerd's sandbox directory): when a mount of its own,
	// the filesystem it is on is the runtime's.
	runtimeFile string

	mu sync.Mutex
	// verdicts are the last checks of each root directory, for diskCheckTTL: the status is
	// written every few seconds, and a node's mount table can be long.
	verdicts map[string]verdict
}

type verdict struct {
	disk diskVerdict
	err  error
	at   time.Time
}

// diskVerdict is what a root's filesystem is, when it is a disk.
type diskVerdict struct {
	// rootFS: the root is a directory of the node's root filesystem.
	rootFS bool
	// shares names what else uses the root's filesystem (the kubelet's or the container
	// runtime's directory), if anything.
	shares string
	// what is the filesystem, for people (its device and type).
	what string
}

// diskCheckTTL is how long a root's verdict holds: a disk mounted after the agent started is
// taken on within it (and within the jobs' next try).
const diskCheckTTL = 30 * time.Second

// cached is check, at most once per diskCheckTTL for each root.
func (d *diskCheck) cached(dir, nodePath string, now time.Time) (diskVerdict, error) {
	d.mu.Lock()
	v, ok := d.verdicts[dir]
	d.mu.Unlock()
	if ok && now.Sub(v.at) < diskCheckTTL {
		return v.disk, v.err
	}
	dv, err := d.check(dir, nodePath)
	d.mu.Lock()
	d.verdicts[dir] = verdict{disk: dv, err: err, at: now}
	d.mu.Unlock()
	return dv, err
}

type diskRef struct{ dir, what string }

// newDiskCheck judges roots by this process's mount table, against the kubelet's directory
// (kubeletDir, as the agent sees it; empty: none).
func newDiskCheck(kubeletDir string) *diskCheck {
	d := &diskCheck{mounts: func() ([]*mountinfo.Info, error) { return mountinfo.GetMounts(nil) }, verdicts: map[string]verdict{}, runtimeFile: "/etc/hostname"}
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

// check says what filesystem dir (the root nodePath, as seen from the agent) is on: a directory
// of the node's root filesystem or not, and what else uses it; or an errNoDisk when it is no
// disk at all.
func (d *diskCheck) check(dir, nodePath string) (diskVerdict, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return diskVerdict{}, errNoDisk{fmt.Sprintf("%s does not exist on this node: no local disk is mounted there", nodePath)}
	}
	if err != nil {
		return diskVerdict{}, fmt.Errorf("resolving the cache root %s: %w", nodePath, err)
	}
	mounts, err := d.mounts()
	if err != nil {
		return diskVerdict{}, fmt.Errorf("reading the mount table: %w", err)
	}
	m := mountOf(mounts, resolved)
	if m == nil {
		return diskVerdict{}, fmt.Errorf("no mount holds %s", nodePath)
	}
	v := diskVerdict{what: fmt.Sprintf("%s, %s", m.Source, m.FSType)}
	if slices.Contains(noDiskFSTypes, m.FSType) {
		return v, errNoDisk{fmt.Sprintf("%s is on %s: memory or the container's own filesystem, not a disk", nodePath, v.what)}
	}
	// The mount's root is the directory of its filesystem that is mounted there. A directory of
	// the filesystem mounted at / is at the same path inside that filesystem as on the node; a
	// data disk is mounted at or above the root, so the root is elsewhere inside it.
	rel, _ := filepath.Rel(m.Mountpoint, resolved)
	v.rootFS = filepath.Join(m.Root, rel) == filepath.Clean(nodePath)
	var st unix.Stat_t
	if err := unix.Stat(resolved, &st); err != nil {
		return v, err
	}
	refs := d.refs
	if rm := mountOf(mounts, d.runtimeFile); d.runtimeFile != "" && rm != nil && rm.Mountpoint == d.runtimeFile && !slices.Contains(noDiskFSTypes, rm.FSType) {
		refs = append(slices.Clip(refs), diskRef{d.runtimeFile, "the container runtime's directory"})
	}
	for _, ref := range refs {
		var rs unix.Stat_t
		if err := unix.Stat(ref.dir, &rs); err != nil {
			continue // not mounted here: nothing to compare with
		}
		if rs.Dev == st.Dev {
			v.shares = ref.what
			break
		}
	}
	return v, nil
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
	if _, err := a.checkDisk(root); err != nil {
		rs.Reason, rs.Message = prewarmv1alpha1.ReasonNoLocalDisk, text.Clip(err.Error(), text.MaxMessage)
		if !errors.As(err, new(errNoDisk)) {
			rs.Reason = ""
		}
	}
	if f, err := a.figures(root); err == nil && rs.Reason == "" {
		rs.CapacityBytes, rs.UsedBytes, rs.FreeBytes = f.capacity, f.used, min(f.room(), f.avail)
		rs.HighWatermarkPercent, rs.LowWatermarkPercent = f.high, f.low
		rs.SharedWith = text.Clip(f.shares, prewarmv1alpha1.MaxSharedWith)
		if f.shares != "" {
			rs.KubeletThresholds = text.Clip(a.kubelet.String(), prewarmv1alpha1.MaxKubeletThresholds)
		}
	}
	return rs
}

// checkDisk returns what else uses root's filesystem ("" when nothing does), when the node may
// keep caches under root: a disk, not the node's root filesystem unless the configuration allows
// it. Otherwise it returns an errNoDisk (or the error that kept the agent from telling).
func (a *Agent) checkDisk(root string) (string, error) {
	r, ok := a.opts.Config.Root(root)
	if !ok {
		return "", nil
	}
	v, err := a.disks.cached(a.opts.rootDir(root), a.opts.nodePath(root), a.opts.Now())
	switch {
	case r.AllowRootFilesystem && err != nil:
		return "", nil // allowed wherever it is; not a disk the agent could judge
	case err == nil && v.rootFS && r.AllowRootFilesystem:
		return "the node's root filesystem", nil
	case err == nil && v.rootFS:
		err = errNoDisk{fmt.Sprintf("%s is a directory of the node's root filesystem (%s), not a data disk", a.opts.nodePath(root), v.what)}
	case err == nil:
		return v.shares, nil
	}
	var nd errNoDisk
	if errors.As(err, &nd) {
		return "", errNoDisk{fmt.Sprintf("%s: the node keeps no cache there, and its pods read their model from the source "+
			"(mount the node's data disk there, or set cacheRoots[].nodePath to where the node mounts it: /mnt/k8s-disks/0 on EKS with nodeadm's or Karpenter's RAID0, "+
			"/local on Bottlerocket, /mnt/stateful_partition/kube-ephemeral-ssd on GKE with local SSD ephemeral storage; docs/operations.md)", nd.msg)}
	}
	return "", err
}

// logShared logs, once per root, that root's filesystem is shared and the thresholds its high
// watermark derives from.
func (a *Agent) logShared(root, shares string, high int32) {
	if _, logged := a.sharedLogged.LoadOrStore(root, true); logged {
		return
	}
	log := ctrl.LoggerFrom(a.life).WithValues("root", root, "sharedWith", shares, "highWatermarkPercent", high, "kubeletThresholds", a.kubelet.String())
	if a.kubeletErr != nil {
		log.Error(a.kubeletErr, "the cache root shares its disk; the kubelet's configuration could not be read, so its defaults stand in for what it did not say")
		return
	}
	log.Info("the cache root shares its disk: caches stay clear of the kubelet's eviction and image garbage collection thresholds")
}
