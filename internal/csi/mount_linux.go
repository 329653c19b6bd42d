package csi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

var mounter = mount.New("")

// bindReadOnly mounts the directory model at target, read-only, nosuid and nodev. The mount
// is made detached (open_tree), made read-only, then attached in one step (move_mount): the
// target never shows a writable mount, whatever moment the agent is killed at. Kernels before
// 5.12 (no mount_setattr) get a bind mount then a read-only remount, which a retry checks.
func bindReadOnly(model, target string) error {
	// The model is opened without following a link in its last component; its parents were
	// checked to be real directories by the agent.
	fd, err := unix.Open(model, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", model, err)
	}
	defer unix.Close(fd)
	return bindFDReadOnly(fd, target)
}

// bindFDReadOnly is bindReadOnly of the directory open as fd: what is mounted is that
// directory, whatever its path leads to now.
func bindFDReadOnly(fd int, target string) error {
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.ENOSYS) {
		return bindRemount(fd, target)
	}
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return bindRemount(fd, target)
		}
		return fmt.Errorf("mount_setattr: %w", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// bindRemount is the older way: a bind mount, then a read-only remount of it.
func bindRemount(fd int, target string) error {
	src := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		_ = unix.Unmount(target, 0)
		return fmt.Errorf("read-only remount: %w", err)
	}
	return nil
}

// isMountPoint reports whether target is a mount point; a missing target is not.
func isMountPoint(target string) (bool, error) {
	mounted, err := mounter.IsMountPoint(target)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return mounted, err
}

// readOnly reports whether the filesystem mounted at target is read-only.
func readOnly(target string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return false, err
	}
	return st.Flags&unix.ST_RDONLY != 0, nil
}

// unmount unmounts target (every mount stacked there) and removes the directory; a target
// already gone is fine. It calls umount(2) itself: the agent's image has no umount binary
// (which mount-utils' Unmount runs).
func unmount(target string) error {
	for range 8 {
		mounted, err := isMountPoint(target)
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if err := unix.Unmount(target, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("umount %s: %w", target, err)
		}
	}
	if mounted, err := isMountPoint(target); err != nil || mounted {
		return errors.Join(err, fmt.Errorf("%s is still a mount point", target))
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
