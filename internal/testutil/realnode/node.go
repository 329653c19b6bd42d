package realnode

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
)

// NodeOptions describe a node.
type NodeOptions struct {
	Name string
	// InstanceType is the node.kubernetes.io/instance-type label, set by the kubelet.
	InstanceType string
	// GPUs is the nvidia.com/gpu capacity written into the node's status (no device plugin:
	// the pods ask for GPUs and use none).
	GPUs int64
	// HostPaths are host directories the node has of its own: in the node's mount namespace each
	// is a folder of the node's directory, on this machine's root filesystem (as a directory of
	// a node's root disk is).
	HostPaths []string
	// Disks are filesystems of their own the node has (its NVMe), by mount path: each an ext4
	// filesystem of the given size on a loop device, mounted there in the node's mount namespace.
	Disks map[string]int64
	// KubeletOn, when set, is one of Disks: the kubelet's directory is <disk>/kubelet bound
	// onto /var/lib/kubelet, as EKS's nodeadm and Karpenter bind it onto their RAID0 array.
	// Otherwise /var/lib/kubelet is a disk of its own (kubeletDiskSize), so that what the
	// kubelet and the agent measure of its filesystem is the node's, not this machine's.
	KubeletOn string
	// Aliases are more node paths, each bound onto another of the node's paths: the same disk
	// where another platform mounts it.
	Aliases map[string]string
	// RootPaths are directories the node sees as they are on this machine's root filesystem,
	// nothing bound there: directories of the node's OS disk, as a hostPath of one is.
	RootPaths []string
	// EvictionHard are the kubelet's hard eviction thresholds that replace the run's (1 %), by
	// signal.
	EvictionHard map[string]string
	// Labels are more labels the kubelet registers the node with.
	Labels map[string]string
	// Taints are the taints the kubelet registers the node with (key=value:Effect).
	Taints []string
}

// Node is a running node: its containerd and kubelet in a mount namespace of their own.
type Node struct {
	Name string
	// IP is the node's InternalIP.
	IP string
	// Dir is the node's directory.
	Dir string
	// Socket is its containerd's CRI socket.
	Socket string

	bridge string
	cgroup string
	disks  []disk
	// kubeletOn and rootPaths are NodeOptions.KubeletOn and RootPaths.
	kubeletOn string
	rootPaths []string
	holder    *exec.Cmd
	procs     []*testutil.Process
	cluster   *Cluster
}

// nodePaths are the host paths every node has of its own, besides NodeOptions.HostPaths:
// /etc/kubernetes/kubelet holds the kubelet's configuration, config.json, where EKS's AL2023
// nodes keep it.
var nodePaths = []string{"/var/lib/kubelet", "/var/log", "/var/lib/cni", "/run/containerd", kubeletConfigDir}

const (
	kubeletDir = "/var/lib/kubelet"
	// kubeletDiskSize is the size of containerd's disk, and of the kubelet's on a node whose
	// kubelet's directory is on no disk of NodeOptions.Disks: sparse, each costs the machine
	// what is written to it.
	kubeletDiskSize  = 16 << 30
	kubeletConfigDir = "/etc/kubernetes/kubelet"
	// KubeletConfig is where the kubelet's configuration is on every node.
	KubeletConfig = kubeletConfigDir + "/config.json"
)

// HostPath is where the node's path p (under one of its host paths, or a root path) is on this
// machine.
func (n *Node) HostPath(p string) string {
	for _, r := range n.rootPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return p
		}
	}
	if n.kubeletOn != "" && (p == kubeletDir || strings.HasPrefix(p, kubeletDir+"/")) {
		return filepath.Join(n.Dir, "host", n.kubeletOn, "kubelet", strings.TrimPrefix(p, kubeletDir))
	}
	return filepath.Join(n.Dir, "host", p)
}

// AddNode starts node number i (1-254): its mount namespace, containerd and kubelet; waits until
// it is Ready and writes its GPU capacity.
func (c *Cluster) AddNode(ctx context.Context, i int, o NodeOptions) (*Node, error) {
	id := c.identity("system:node:" + o.Name)
	if id.token == "" {
		return nil, fmt.Errorf("node %s was not in Options.Nodes when the cluster started (it has no credentials)", o.Name)
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	if _, ok := o.Disks[o.KubeletOn]; o.KubeletOn != "" && !ok {
		return nil, fmt.Errorf("node %s: KubeletOn %s is none of its disks", o.Name, o.KubeletOn)
	}
	n := &Node{
		Name: o.Name, IP: fmt.Sprintf("10.250.0.%d", i), Dir: filepath.Join(c.Dir, "nodes", o.Name),
		bridge: fmt.Sprintf("pwbr%d", i), cgroup: fmt.Sprintf("/prewarm-%x-%s", suffix, o.Name), cluster: c,
		kubeletOn: o.KubeletOn, rootPaths: o.RootPaths,
	}
	n.Socket = filepath.Join(n.Dir, "containerd", "containerd.sock")
	c.Nodes = append(c.Nodes, n)
	if err := n.start(ctx, i, o, id); err != nil {
		return nil, err
	}
	return n, nil
}

func (c *Cluster) identity(name string) identity {
	for _, id := range c.ids {
		if id.name == name {
			return id
		}
	}
	return identity{}
}

func (n *Node) start(ctx context.Context, i int, o NodeOptions, id identity) error {
	if err := run("ip", "addr", "add", n.IP+"/32", "dev", nodeBridge); err != nil {
		return err
	}
	if err := n.makeCgroups(); err != nil {
		return err
	}
	// The disks first: mounted at the node's folder on this machine (where the tests look at
	// them), they are in the node's mount namespace when it is made, and bound to their paths.
	disks := slices.Sorted(maps.Keys(o.Disks))
	for _, p := range disks {
		if err := n.mountDisk(p, o.Disks[p]); err != nil {
			return fmt.Errorf("disk %s: %w", p, err)
		}
	}
	// The kubelet's directory on a disk of its own, unless on one of the node's: the kubelet
	// measures its filesystem (evictions) and so does the agent (scratch copies), and this
	// machine's disk, which every test and build on it fills, is no node's to measure.
	if o.KubeletOn == "" {
		if err := n.mountDisk(kubeletDir, kubeletDiskSize); err != nil {
			return fmt.Errorf("the kubelet's disk: %w", err)
		}
	}
	// And containerd's directory (its images and containers, the kubelet's imagefs): the kubelets
	// evicted every pod once the machine's disk was 99 % full.
	if err := n.mountImage("containerd", filepath.Join(n.Dir, "containerd"), kubeletDiskSize); err != nil {
		return fmt.Errorf("containerd's disk: %w", err)
	}
	// The disks before the kubelet's directory: it may be bound from one.
	if err := n.makeMountNamespace(slices.Concat(disks, nodePaths, o.HostPaths), o.Aliases); err != nil {
		return err
	}
	for _, p := range o.RootPaths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	if err := n.writeContainerdConfig(i); err != nil {
		return err
	}
	if err := n.startInNamespace("containerd", "containerd", "--config", filepath.Join(n.Dir, "containerd", "config.toml")); err != nil {
		return err
	}
	if err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		_, err := os.Stat(n.Socket)
		return err == nil, errors.Join(err, n.check())
	}); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	bin, err := testutil.TestBinDir()
	if err != nil {
		return err
	}
	kc := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := writeKubeconfig(kc, fmt.Sprintf("https://%s:%d", HostIP, apiPort), n.cluster.pki.path("ca.crt"), id); err != nil {
		return err
	}
	conf, err := n.writeKubeletConfig(i, o.EvictionHard)
	if err != nil {
		return err
	}
	labels := []string{}
	if o.InstanceType != "" {
		labels = append(labels, inferencev1.InstanceTypeLabel+"="+o.InstanceType)
	}
	for _, k := range slices.Sorted(maps.Keys(o.Labels)) {
		labels = append(labels, k+"="+o.Labels[k])
	}
	args := []string{"--config=" + conf, "--kubeconfig=" + kc,
		"--cert-dir=" + filepath.Join(n.Dir, "kubelet-pki"), "--hostname-override=" + n.Name, "--node-ip=" + n.IP, "--v=1"}
	if len(labels) > 0 {
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	if len(o.Taints) > 0 {
		args = append(args, "--register-with-taints="+strings.Join(o.Taints, ","))
	}
	if err := n.startInNamespace("kubelet", filepath.Join(bin, "kubelet"), args...); err != nil {
		return err
	}
	return n.waitReady(ctx, o.GPUs)
}

// makeCgroups makes the node's cgroup root in every cgroup v1 hierarchy (the kubelet insists it
// exists), with the root cpuset's CPUs and memory nodes.
func (n *Node) makeCgroups() error {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "unified" {
			continue // symlinks (cpu -> cpu,cpuacct) and the controller-less cgroup2 mount
		}
		dir := filepath.Join("/sys/fs/cgroup", e.Name(), n.cgroup)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		if e.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// makeMountNamespace starts a process holding the node's mount namespace and bind-mounts, in it,
// a folder of the node's directory onto each of paths (HostPath), then each alias's target onto
// the alias.
func (n *Node) makeMountNamespace(paths []string, aliases map[string]string) error {
	n.holder = exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "infinity")
	n.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.holder.Start(); err != nil {
		return err
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	err = testutil.Eventually(context.Background(), 10*time.Second, func() (bool, error) {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid))
		return err == nil && ns != self && n.holderRunsSleep(), err
	})
	if err != nil {
		return fmt.Errorf("the node's mount namespace: %w", err)
	}
	bind := func(src, p string) error {
		// The mount point must exist on the machine; it stays empty there.
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := run("nsenter", "--mount="+n.mountNS(), "--", "mount", "--bind", src, p); err != nil {
			return err
		}
		// Shared, as a node's mounts are: a CSI plugin's mounts under /var/lib/kubelet/pods
		// (Bidirectional propagation) then reach the kubelet and the pods.
		return run("nsenter", "--mount="+n.mountNS(), "--", "mount", "--make-rshared", p)
	}
	for _, p := range paths {
		src := n.HostPath(p)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := bind(src, p); err != nil {
			return err
		}
	}
	for _, alias := range slices.Sorted(maps.Keys(aliases)) {
		if err := bind(aliases[alias], alias); err != nil {
			return err
		}
	}
	// And the rest shared too, as systemd makes a node's mounts: a hostPath of a directory of
	// the node's root filesystem, nothing bound there, can then be mounted into a container with
	// HostToContainer propagation, which containerd refuses from a private mount. After the
	// binds: a bind of a shared mount would be its peer, and the node's folders would show what
	// is mounted on their binds.
	return run("nsenter", "--mount="+n.mountNS(), "--", "mount", "--make-rshared", "/")
}

// mountDisk makes an ext4 filesystem of size bytes in a sparse file of the node's directory and
// mounts it, through a loop device, at the node's folder for p (HostPath(p)), before the node's
// mount namespace is made, which binds it at p: a disk of the node's own, as its NVMe is.
func (n *Node) mountDisk(p string, size int64) error {
	return n.mountImage(strings.ReplaceAll(strings.Trim(p, "/"), "/", "-"), n.HostPath(p), size)
}

// mountImage makes an ext4 filesystem of size bytes in the sparse file disks/<name>.img of the
// node's directory and mounts it at the machine's directory dir.
func (n *Node) mountImage(name, dir string, size int64) error {
	img := filepath.Join(n.Dir, "disks", name+".img")
	if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
		return err
	}
	if err := os.Truncate(img, 0); err != nil && !os.IsNotExist(err) {
		return err
	}
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return err
	}
	// Sparse, and kept so: few inodes, none of the tables written now or later (noinit_itable),
	// so a disk of tens of GB costs the machine only what is written to it.
	if err := run("mkfs.ext4", "-q", "-F", "-m", "0", "-N", "65536", "-E", "lazy_itable_init=1,lazy_journal_init=1", img); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := run("mount", "-o", "loop,noinit_itable", img, dir); err != nil {
		return err
	}
	n.disks = append(n.disks, disk{img: img, mount: dir})
	return nil
}

// disk is a node's disk: its image, and where it is mounted on this machine.
type disk struct{ img, mount string }

// holderRunsSleep reports whether unshare has exec'ed sleep (after making the namespace).
func (n *Node) holderRunsSleep() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", n.holder.Process.Pid))
	return err == nil && strings.TrimSpace(string(b)) == "sleep"
}

func (n *Node) mountNS() string { return fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Process.Pid) }

func (n *Node) startInNamespace(name, path string, args ...string) error {
	p, err := testutil.StartProcess(n.cluster.LogDir, n.Name+"-"+name, "nsenter", append([]string{"--mount=" + n.mountNS(), "--", path}, args...)...)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}

// writeContainerdConfig writes containerd's configuration, the registry mirrors and the CNI
// network of node i (bridge pwbrI, pods in 10.244.I.0/24).
func (n *Node) writeContainerdConfig(i int) error {
	d := filepath.Join(n.Dir, "containerd")
	c := n.cluster
	files := map[string]string{
		"config.toml": fmt.Sprintf(`version = 2
root = "%[1]s/root"
state = "%[1]s/state"
[grpc]
  address = "%[1]s/containerd.sock"
[ttrpc]
  address = ""
[debug]
  address = "%[1]s/debug.sock"
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "%[1]s/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "%[2]s/pause:3.10"
    netns_mounts_under_state_dir = true
    # Without CAP_SYS_RESOURCE (a VM's container) runc cannot lower oom_score_adj.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "%[1]s/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "%[3]s"
      conf_dir = "%[1]s/net.d"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "%[1]s/certs.d"
`, d, c.Registry, cniDir()),
		"net.d/10-prewarm.conflist": fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "prewarm-%[1]s", "plugins": [{
  "type": "bridge", "bridge": %[2]q, "isGateway": true, "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "%[3]s/ipam", "ranges": [[{"subnet": "10.244.%[4]d.0/24"}]]}}]}
`, n.Name, n.bridge, d, i),
		"certs.d/" + c.Registry + "/hosts.toml": fmt.Sprintf("server = \"http://%[1]s\"\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", c.Registry),
	}
	for _, m := range c.opts.Mirrors {
		upstream := "https://" + m
		if m == "docker.io" {
			upstream = "https://registry-1.docker.io"
		}
		files["certs.d/"+m+"/hosts.toml"] = fmt.Sprintf("server = %q\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream, c.Registry)
	}
	for name, body := range files {
		p := filepath.Join(d, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeKubeletConfig writes the kubelet's configuration for node i, in JSON at KubeletConfig,
// with the thresholds evictionHard replaces; it returns its node path.
func (n *Node) writeKubeletConfig(i int, evictionHard map[string]string) (string, error) {
	// The node's disks are sparse files of this machine's disk, which holds less than they say
	// they can: evict only when one is truly full.
	eviction := map[string]string{"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}
	maps.Copy(eviction, evictionHard)
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: %s
# cgroup v1 (this kind of VM): kubelet 1.37 refuses it unless told otherwise.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
clusterDomain: cluster.local
serializeImagePulls: false
syncFrequency: 10s
# Nor remove images before it is: the agents stay clear of this threshold too, on a disk
# the kubelet shares.
imageGCHighThresholdPercent: 100
`, n.IP, 10300+i, n.cluster.pki.path("ca.crt"), n.cgroup, n.Socket)
	b, err := yaml.YAMLToJSON([]byte(conf))
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	m["evictionHard"] = eviction
	if b, err = json.MarshalIndent(m, "", "  "); err != nil {
		return "", err
	}
	return KubeletConfig, os.WriteFile(n.HostPath(KubeletConfig), b, 0o644)
}

// waitReady waits until the node is Ready, then writes its GPU capacity into its status.
func (n *Node) waitReady(ctx context.Context, gpus int64) error {
	c := n.cluster.Client
	node := &corev1.Node{}
	err := testutil.Eventually(ctx, 60*time.Second, func() (bool, error) {
		if err := n.check(); err != nil {
			return false, err
		}
		if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
			return false, err
		}
		return testutil.NodeReady(node), nil
	})
	if err != nil {
		return fmt.Errorf("not Ready: %w", err)
	}
	if gpus == 0 {
		return nil
	}
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": map[string]any{"nvidia.com/gpu": q}, "allocatable": map[string]any{"nvidia.com/gpu": q},
	}})
	if err != nil {
		return err
	}
	return c.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch))
}

// check returns an error when one of the node's processes has exited.
func (n *Node) check() error {
	var errs []error
	for _, p := range n.procs {
		if done, err := p.Exited(); done {
			errs = append(errs, fmt.Errorf("%s exited (%w); log %s:\n%s", p.Name, err, p.LogPath, p.LogTail(3000)))
		}
	}
	return errors.Join(errs...)
}

// stop stops the kubelet, removes every pod sandbox (stopping its containers and releasing its
// network), stops containerd, kills what is left in the node's cgroups and the shims, and
// removes the cgroups.
func (n *Node) stop() error {
	var errs []error
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		if strings.HasSuffix(p.Name, "-kubelet") {
			p.Stop(10 * time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			if err := n.removePods(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: removing pods: %w", n.Name, err))
			}
			cancel()
			continue
		}
		p.Stop(10 * time.Second)
	}
	n.killShims()
	errs = append(errs, n.removeCgroups())
	if n.holder != nil && n.holder.Process != nil {
		_ = n.holder.Process.Kill()
		_ = n.holder.Wait()
	}
	// The run's network namespace outlives the cluster (another test of the binary starts one):
	// the node's address and pod bridge go with it.
	_ = exec.Command("ip", "addr", "del", n.IP+"/32", "dev", nodeBridge).Run()
	_ = exec.Command("ip", "link", "del", n.bridge).Run()
	// The loop devices go with their last mount (autoclear); one a process still holds is
	// detached as soon as it lets go.
	for _, d := range n.disks {
		if err := run("umount", d.mount); err != nil {
			errs = append(errs, err)
		}
		out, _ := exec.Command("losetup", "-j", d.img, "-O", "NAME", "-n").Output()
		for _, dev := range strings.Fields(string(out)) {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	}
	return errors.Join(errs...)
}

// killShims kills the containerd shims of this node's containerd (they outlive it).
func (n *Node) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !strings.Contains(string(b), n.Socket) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(f, "/proc/%d/cmdline", &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeCgroups kills every process left in the node's cgroups and removes them, deepest first.
func (n *Node) removeCgroups() error {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue // symlinks; the kubelet also makes the root in the cgroup2 mount (unified)
		}
		root := filepath.Join("/sys/fs/cgroup", e.Name(), n.cgroup)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			killAll(dirs[i])
			var err error
			for range 50 { // the kernel frees a cgroup a moment after its last process exits
				if err = os.Remove(dirs[i]); err == nil || os.IsNotExist(err) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func killAll(cgroup string) {
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// Throttle limits the traffic towards the node's pods (its pod bridge's egress: downloads by
// the agent and the init containers) to bytesPerSec, with tc's token bucket filter; 0 removes
// the limit. Image pulls, which containerd makes on the node itself, are not limited.
func (n *Node) Throttle(bytesPerSec int64) error {
	if bytesPerSec == 0 {
		out, err := exec.Command("tc", "qdisc", "show", "dev", n.bridge).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") {
			return err // no limit to remove
		}
		return run("tc", "qdisc", "del", "dev", n.bridge, "root")
	}
	return run("tc", "qdisc", "replace", "dev", n.bridge, "root", "tbf",
		"rate", fmt.Sprintf("%dbit", bytesPerSec*8), "burst", "256kb", "latency", "500ms")
}

// CountFrom starts counting the bytes the node's pods receive from TCP port on the control
// plane's address (an iptables counter on the node's pod bridge). read returns the count so
// far; stop removes the counter.
func (n *Node) CountFrom(port int) (read func() (int64, error), stop func() error, err error) {
	comment := fmt.Sprintf("prewarm-count-%s-%d-%d", n.Name, port, time.Now().UnixNano())
	rule := []string{"OUTPUT", "-o", n.bridge, "-p", "tcp", "-s", HostIP, "--sport", strconv.Itoa(port), "-m", "comment", "--comment", comment}
	if err := run(append([]string{"iptables", "-w", "-I"}, rule...)...); err != nil {
		return nil, nil, err
	}
	read = func() (int64, error) {
		out, err := exec.Command("iptables", "-w", "-L", "OUTPUT", "-n", "-v", "-x").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("iptables -L: %w: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 2 && strings.Contains(line, comment) {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
		return 0, fmt.Errorf("counter %s not found", comment)
	}
	stop = func() error { return run(append([]string{"iptables", "-w", "-D"}, rule...)...) }
	return read, stop, nil
}

// Fill takes the free space of the node's filesystem at p down to leave bytes with a file of
// its own (allocated, not written, so it costs the machine nothing), as a disk full of other
// things is; undo removes the file.
func (n *Node) Fill(p string, leave int64) (undo func() error, err error) {
	dir := n.HostPath(p)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil, err
	}
	size := int64(st.Bavail)*st.Bsize - leave
	if size <= 0 {
		return func() error { return nil }, nil
	}
	f, err := os.CreateTemp(dir, ".fill-")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	undo = func() error { return os.Remove(f.Name()) }
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		_ = undo()
		return nil, fmt.Errorf("fill %s with %d bytes: %w", dir, size, err)
	}
	return undo, nil
}
