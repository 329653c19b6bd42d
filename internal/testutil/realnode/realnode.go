// Package realnode runs a Kubernetes cluster of real nodes on one machine, for tests and the
// sandbox: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and per node a
// containerd (runc, bridge CNI) and a kubelet, so pods really run: images are pulled, init
// containers run, volumes are mounted, probes are probed.
//
// Everything runs in one network namespace made for the run (the caller re-executes itself into
// it with Main), so addresses, routes and iptables rules never touch the machine's own network.
// Each node's containerd and kubelet share a mount namespace of their own, in which the node's
// host paths (its disk, /var/lib/kubelet, /var/log, /var/lib/cni, /run/containerd) are bind
// mounts of folders under the run's directory: the nodes have separate disks, as machines do,
// and two runs on one machine share nothing. A loopback OCI registry (go-containerregistry's)
// serves every image; containerd mirrors the registries the workloads name to it.
package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

const (
	// inNetnsEnv marks the process that Main re-executed into the run's network namespace.
	inNetnsEnv = "PREWARM_REALNODE_NETNS"
	// HostIP is the control plane's address (the API server, and the servers the caller starts
	// for the pods, such as S3): pods reach it through their bridge's gateway.
	HostIP = "10.250.0.254"
	// ServiceIP is the kubernetes Service's ClusterIP; a DNAT rule stands in for kube-proxy.
	ServiceIP   = "10.96.0.1"
	serviceCIDR = "10.96.0.0/12"
	apiPort     = 6443
	nodeBridge  = "pwnodes"
)

// Unsupported says why this machine cannot run real nodes ("" when it can).
func Unsupported() string {
	if os.Geteuid() != 0 {
		return "real nodes need root (mounts, network namespaces, cgroups)"
	}
	var missing []string
	for _, b := range []string{"containerd", "runc", "unshare", "nsenter", "mount", "ip", "iptables", "tc", "losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if cniDir() == "" {
		missing = append(missing, "the CNI plugins (bridge, host-local)")
	}
	if len(missing) > 0 {
		return "missing " + strings.Join(missing, ", ") + ": `make testbin` installs them as root on Debian (containerd, runc, containernetworking-plugins, iptables, e2fsprogs, mount)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		// The recipe is for cgroup v1 (the kubelet's cgroupfs driver, no systemd).
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
			return "no cgroup file system under /sys/fs/cgroup"
		}
	}
	return ""
}

// cniDir is where the CNI plugins are: Debian's /usr/lib/cni, or /opt/cni/bin.
func cniDir() string {
	for _, d := range []string{"/usr/lib/cni", "/opt/cni/bin"} {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			return d
		}
	}
	return ""
}

// Main runs run in the run's own network namespace. The first call re-executes the program under
// `unshare --net` and returns its exit code; in the re-executed program it brings up the
// namespace's loopback and calls run. Where Unsupported is not empty, run runs where it is (the
// tests skip, saying why). Use it as TestMain's body: os.Exit(realnode.Main(m.Run)).
func Main(run func() int) int {
	if Unsupported() != "" {
		return run()
	}
	if os.Getenv(inNetnsEnv) == "" {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "realnode:", err)
			return 1
		}
		cmd := exec.Command("unshare", append([]string{"--net", "--", self}, os.Args[1:]...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
		if err := cmd.Run(); err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode()
			}
			fmt.Fprintln(os.Stderr, "realnode: re-executing in a network namespace:", err)
			return 1
		}
		return 0
	}
	if err := setupNetns(); err != nil {
		fmt.Fprintln(os.Stderr, "realnode: setting up the network namespace:", err)
		return 1
	}
	return run()
}

// InNetns reports whether this process runs in a namespace Main made.
func InNetns() bool { return os.Getenv(inNetnsEnv) != "" }

// setupNetns brings up loopback, the nodes' bridge carrying the control plane's address, and the
// DNAT rule that takes pods' traffic for the kubernetes Service to the API server.
func setupNetns() error {
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", nodeBridge, "type", "bridge"},
		{"ip", "addr", "add", HostIP + "/32", "dev", nodeBridge},
		{"ip", "link", "set", nodeBridge, "up"},
		{"iptables", "-t", "nat", "-A", "PREROUTING", "-d", ServiceIP + "/32", "-p", "tcp", "--dport", "443",
			"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", HostIP, apiPort)},
		{"iptables", "-t", "nat", "-A", "OUTPUT", "-d", ServiceIP + "/32", "-p", "tcp", "--dport", "443",
			"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", HostIP, apiPort)},
	} {
		if err := run(args...); err != nil {
			return err
		}
	}
	return nil
}

// run runs a command, returning its output in the error when it fails.
func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
