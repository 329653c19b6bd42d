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
// filesystem, a directory of the kubelet's filesystem, memory, or nothing at all is not a disk
// of its own; a filesystem mounted there (or above it, elsewhere than /) is.
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
		want         string // "" accepted, else a word of the refusal
	}{
		{"a disk mounted at the root", line(root, "/", "ext4", "/dev/nvme1n1"), false, ""},
		{"a directory of a disk mounted above it", line(filepath.Dir(root), "/data", "xfs", "/dev/nvme1n1"), false, ""},
		// A hostPath of a directory of the node's /: mounted at the root, the filesystem's
		// directory /opt/dlami/nvme.
		{"a directory of the node's root filesystem", line(root, "/opt/dlami/nvme", "ext4", "/dev/nvme0n1p1"), false, "root filesystem"},
		{"memory", line(root, "/", "tmpfs", "tmpfs"), false, "memory"},
		{"the container's own filesystem", line("/", "/", "overlay", "overlay"), false, "container's own"},
		{"on the kubelet's filesystem", line(root, "/", "ext4", "/dev/nvme1n1"), true, "the kubelet's directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &diskCheck{mounts: mountTableFrom(strings.NewReader(tc.mounts))}
			if tc.kubelet {
				d.refs = newDiskCheck(kubelet).refs
			}
			err := d.check(root, "/opt/dlami/nvme")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (!errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("check = %v; want a NoLocalDisk refusal saying %q", err, tc.want)
			}
		})
	}
	d := &diskCheck{mounts: mountTableFrom(strings.NewReader(line("/", "/", "ext4", "/dev/vda")))}
	if err := d.check(filepath.Join(dir, "missing"), "/mnt/nvme"); !errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a missing root: %v", err)
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
	if err := d.check(disk, "/mnt/nvme"); err != nil {
		t.Errorf("a mounted ext4 filesystem: %v; want it taken", err)
	}
	if err := d.check(plain, "/mnt/plain"); !errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), "the kubelet's directory") {
		t.Errorf("a directory beside the kubelet's: %v; want NoLocalDisk", err)
	}
}
