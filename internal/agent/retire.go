package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// A pod's model volume is a bind mount of its cache's model directory. When that directory must
// be replaced (it holds another revision than the cache is pinned to, or no longer checks)
// while a volume mounts it, removing it would empty the model under the running pod, and the
// copy that replaces it would be a new directory the pod never sees. So it is set aside
// instead, beside the model, and removed once no volume mounts it (sweepSetAside). The cache's
// files are never removed under a mounted pod; the space the old copy holds is given back when
// its last pod goes.

// setAsidePrefix names the copies set aside in a cache's directory.
const setAsidePrefix = ".model.prewarm-set-aside-"

// setAside moves model out of the way if a pod's volume mounts it, and reports whether it did.
func (a *Agent) setAside(model string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(model, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil // nothing there: the mount table is not read
		}
		return false, err
	}
	mounted, err := a.mountedDirs(model)
	if err != nil || !mounted[st.Ino] {
		return false, err
	}
	aside := filepath.Join(filepath.Dir(model), setAsidePrefix+strconv.FormatInt(a.opts.Now().UnixNano(), 10))
	return true, os.Rename(model, aside)
}

// sweepSetAside removes the copies set aside in model's cache directory that no volume mounts
// any more.
func (a *Agent) sweepSetAside(model string) error {
	aside, err := setAsideCopies(model)
	if err != nil {
		return err
	}
	if len(aside) == 0 {
		return nil
	}
	mounted, err := a.mountedDirs(model)
	if err != nil {
		return err
	}
	for _, p := range aside {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || mounted[st.Ino] {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// mountedDirs returns the inodes of the directories that volumes of the node's pods mount from
// the filesystem holding path (only mounts under the kubelet's pods/ directory, and only those
// of that filesystem are looked at: a hung network volume of another pod is never touched).
func (a *Agent) mountedDirs(path string) (map[uint64]bool, error) {
	if a.opts.KubeletDir == "" {
		return nil, nil // no node plugin: no volume mounts a cache
	}
	mounts, err := a.disks.mounts()
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	home := mountOf(mounts, abs)
	if home == nil {
		return nil, nil
	}
	var fsys unix.Stat_t
	if err := unix.Stat(home.Mountpoint, &fsys); err != nil {
		return nil, err
	}
	pods := filepath.Join(a.opts.KubeletDir, "pods")
	inodes := map[uint64]bool{}
	for _, m := range mounts {
		if m.Major != home.Major || m.Minor != home.Minor || !within(m.Mountpoint, pods) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(m.Mountpoint, &st); err == nil && st.Dev == fsys.Dev {
			inodes[st.Ino] = true
		}
	}
	return inodes, nil
}

// cacheMounted reports whether a volume of a pod on the node mounts cache uid's model, or a
// copy of it set aside. It reads the mount table, which knows of a pod the pod list may not show
// yet (or any more).
func (a *Agent) cacheMounted(uid string) (bool, error) {
	for _, root := range a.opts.Config.Roots() {
		model := prewarmv1alpha1.ModelDir(a.opts.rootDir(root), uid)
		mounted, err := a.mountedDirs(model)
		if err != nil || len(mounted) == 0 {
			if err != nil {
				return false, err
			}
			continue
		}
		aside, _ := setAsideCopies(model)
		for _, d := range append(aside, model) {
			var st unix.Stat_t
			if unix.Lstat(d, &st) == nil && mounted[st.Ino] {
				return true, nil
			}
		}
	}
	return false, nil
}

// setAsideCopies lists the copies set aside beside model.
func setAsideCopies(model string) ([]string, error) {
	dir := filepath.Dir(model)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var aside []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), setAsidePrefix) {
			aside = append(aside, filepath.Join(dir, e.Name()))
		}
	}
	return aside, nil
}
