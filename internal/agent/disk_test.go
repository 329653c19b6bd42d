package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The disk check judges a cache root by the mount table: a directory of the node's root
// filesystem, memory, or nothing at all is refused; a filesystem mounted there (or above it,
// elsewhere than /) is taken, and said to be shared when the kubelet's directory is on it too.
func TestDiskCheck(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "opt", "dlami", "nvme")
	kubelet := filepath.Join(dir, "var", "lib", "kubelet")
	for _, d := range []string{root, filepath.Join(kubelet, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The tests' directories are all on one filesystem; the mount tables say what each is.
	for _, tc := range []struct {
		name, mounts string
		kubelet      bool
		want         diskVerdict
		refused      string // a word of the refusal, when refused
	}{
		{"a disk mounted at the root", line(root, "/", "ext4", "/dev/nvme1n1"), false, diskVerdict{}, ""},
		{"a directory of a disk mounted above it", line(filepath.Dir(root), "/data", "xfs", "/dev/nvme1n1"), false, diskVerdict{}, ""},
		// A hostPath of a directory of the node's /: mounted at the root, the filesystem's
		// directory /opt/dlami/nvme.
		{"a directory of the node's root filesystem", line(root, "/opt/dlami/nvme", "ext4", "/dev/nvme0n1p1"), false, diskVerdict{rootFS: true}, ""},
		{"memory", line(root, "/", "tmpfs", "tmpfs"), false, diskVerdict{}, "memory"},
		{"the container's own filesystem", line("/", "/", "overlay", "overlay"), false, diskVerdict{}, "container's own"},
		// nodeadm's RAID0: the array mounted at the root, the kubelet's directory bound onto it.
		{"a data disk the kubelet's directory is on too", line(root, "/", "ext4", "/dev/md0"), true, diskVerdict{shares: "the kubelet's directory " + kubelet}, ""},
		{"the root filesystem, the kubelet's directory on it too", line(root, "/opt/dlami/nvme", "ext4", "/dev/nvme0n1p1"), true,
			diskVerdict{rootFS: true, shares: "the kubelet's directory " + kubelet}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &diskCheck{mounts: mountTableFrom(strings.NewReader(tc.mounts))}
			if tc.kubelet {
				d.refs = newDiskCheck(kubelet).refs
			}
			got, err := d.check(root, "/opt/dlami/nvme")
			switch {
			case tc.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refused != "" && (!errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("check = %v; want a NoLocalDisk refusal saying %q", err, tc.refused)
			case tc.refused == "" && (got.rootFS != tc.want.rootFS || got.shares != tc.want.shares):
				t.Errorf("check = %+v; want root filesystem %v, shared with %q", got, tc.want.rootFS, tc.want.shares)
			}
		})
	}
	d := &diskCheck{mounts: mountTableFrom(strings.NewReader(line("/", "/", "ext4", "/dev/vda")))}
	if _, err := d.check(filepath.Join(dir, "missing"), "/mnt/nvme"); !errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a missing root: %v", err)
	}
}

// The container runtime's directory is known by the file it mounts into the agent's container
// (/etc/hostname, from containerd's sandbox directory): a root on that filesystem is shared
// with it; a file that is no mount of its own, or one in memory, says nothing.
func TestDiskCheckContainerRuntime(t *testing.T) {
	dir := t.TempDir()
	root, hostname := filepath.Join(dir, "mnt", "k8s-disks", "0"), filepath.Join(dir, "hostname")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostname, []byte("node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	disk := line(root, "/", "xfs", "/dev/md0")
	for _, tc := range []struct {
		name, mounts, want string
	}{
		{"mounted from the runtime's directory on the disk", disk + line(hostname, "/containerd/sandboxes/1/hostname", "xfs", "/dev/md0"), "the container runtime's directory"},
		{"not a mount of its own", disk, ""},
		{"mounted from memory", disk + line(hostname, "/hostname", "tmpfs", "tmpfs"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &diskCheck{mounts: mountTableFrom(strings.NewReader(tc.mounts)), runtimeFile: hostname}
			got, err := d.check(root, "/mnt/k8s-disks/0")
			if err != nil || got.shares != tc.want || got.rootFS {
				t.Errorf("check = %+v, %v; want shared with %q", got, err, tc.want)
			}
		})
	}
}

// line is one line of /proc/self/mountinfo: the filesystem's directory root mounted at point.
func line(point, root, fstype, source string) string {
	return fmt.Sprintf("36 25 259:1 %s %s rw,relatime shared:1 - %s %s rw\n", root, point, fstype, source)
}

// On this machine's own mount table: a real filesystem mounted at the root (a loop device's
// ext4) is a disk of its own, and a directory beside it on the test's filesystem is not, beside
// a kubelet directory there.
func TestDiskCheckOnRealMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a filesystem: needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	dir := t.TempDir()
	img, disk, plain, kubelet := filepath.Join(dir, "disk.img"), filepath.Join(dir, "nvme"), filepath.Join(dir, "plain"), filepath.Join(dir, "kubelet")
	for _, d := range []string{disk, plain, filepath.Join(kubelet, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	run("mkfs.ext4", "-q", "-F", img)
	run("mount", "-o", "loop", img, disk)
	t.Cleanup(func() { _ = exec.Command("umount", disk).Run() })
	d := newDiskCheck(kubelet)
	if v, err := d.check(disk, "/mnt/nvme"); err != nil || v.shares != "" || v.rootFS {
		t.Errorf("a mounted ext4 filesystem: %+v, %v; want it taken, a disk of its own", v, err)
	}
	if v, err := d.check(plain, "/mnt/plain"); err != nil || !strings.Contains(v.shares, "the kubelet's directory") {
		t.Errorf("a directory beside the kubelet's: %+v, %v; want it taken, shared with the kubelet", v, err)
	}
	// nodeadm's RAID0: the kubelet's directory bound onto a directory of the array, the cache
	// root the array itself.
	onDisk := filepath.Join(disk, "kubelet")
	if err := os.MkdirAll(filepath.Join(onDisk, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	raid := filepath.Join(dir, "raid-kubelet")
	if err := os.MkdirAll(raid, 0o755); err != nil {
		t.Fatal(err)
	}
	run("mount", "--bind", onDisk, raid)
	t.Cleanup(func() { _ = exec.Command("umount", raid).Run() })
	if v, err := newDiskCheck(raid).check(disk, "/mnt/k8s-disks/0"); err != nil || !strings.Contains(v.shares, "the kubelet's directory") || v.rootFS {
		t.Errorf("the array the kubelet's directory is bound onto: %+v, %v; want it taken, shared with the kubelet", v, err)
	}
}
