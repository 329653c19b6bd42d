package testutil

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// KwokNodeAnnotation marks the nodes kwok manages.
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// Cluster is an API server plus kube-controller-manager, kube-scheduler and kwok: Deployments
// and DaemonSets get real pods, scheduled onto simulated nodes that kwok keeps Ready.
type Cluster struct {
	*APIServer
	// KubeconfigPath is a cluster-admin kubeconfig, for processes the tests start.
	KubeconfigPath string
	// LogDir holds every process's log.
	LogDir string

	procs    []*Process
	keepLogs bool
}

// Process is a child process started by the harness, with its output in a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// StartProcess starts a binary with its stdout and stderr in logDir/<name>.log.
func StartProcess(logDir, name, path string, args ...string) (*Process, error) {
	return StartProcessEnv(logDir, name, path, nil, args...)
}

// StartProcessEnv is StartProcess with env added to (and overriding) the test's environment.
func StartProcessEnv(logDir, name, path string, env []string, args ...string) (*Process, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop sends SIGTERM, then SIGKILL after the grace period, and waits for the exit.
func (p *Process) Stop(grace time.Duration) {
	if done, _ := p.Exited(); done {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Kill kills the process (and its group) with SIGKILL, as a crash or an OOM kill would, and
// waits for it to end.
func (p *Process) Kill() {
	if done, _ := p.Exited(); done {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// LogTail returns the last n bytes of the process's log, for failure messages.
func (p *Process) LogTail(n int64) string { return FileTail(p.LogPath, n) }

// FileTail returns the last n bytes of the file at path (a log), or why it cannot be read, for
// failure messages.
func FileTail(path string, n int64) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(data)) > n {
		data = data[int64(len(data))-n:]
	}
	return string(data)
}

// ClusterOptions change the simulated cluster.
type ClusterOptions struct {
	// KwokStages, when set, rewrites kwok's Stage documents (e.g. to delay pods becoming ready,
	// as an image pull would).
	KwokStages func(stages string) string
	// LogDir, when set, is where the processes' logs go (kept after Stop); default a temporary
	// folder removed by Stop.
	LogDir string
	// ControlPlaneQPS, when set, is the client QPS of kube-controller-manager and kube-scheduler
	// (burst twice that), as large clusters set them; their defaults are 20 and 50.
	ControlPlaneQPS int
	// NodeLease, when set, is kwok's node lease duration (it renews at a fraction of it; 40 s
	// otherwise), and the node lifecycle controller waits 5 times as long before it marks a
	// silent node unreachable: thousands of nodes' lease writes then do not saturate the API
	// server of a small machine, and a busy kwok does not flip nodes NotReady.
	NodeLease time.Duration
	// MoreControllers are kube-controller-manager's controllers to run beside the usual ones
	// (namespace-controller, to delete namespaces).
	MoreControllers []string
	// CRDs are folders of other projects' CRDs to install besides prewarm's (KEDACRDs: a
	// cluster with KEDA's ScaledObject).
	CRDs []string
}

// StartCluster starts the API server, kube-controller-manager (deployment, replicaset,
// daemonset, garbage-collector and node-lifecycle controllers), kube-scheduler and kwok.
func StartCluster() (*Cluster, error) { return StartClusterWith(ClusterOptions{}) }

// StartClusterWith is StartCluster with options.
func StartClusterWith(opts ClusterOptions) (*Cluster, error) {
	api, err := startAPIServer(opts.LogDir, opts.CRDs...)
	if err != nil {
		return nil, err
	}
	c := &Cluster{APIServer: api}
	if err := c.start(opts); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(opts ClusterOptions) error {
	bin, err := TestBinDir()
	if err != nil {
		return err
	}
	if opts.LogDir != "" {
		c.LogDir, c.keepLogs = opts.LogDir, true
		if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
			return err
		}
	} else if c.LogDir, err = os.MkdirTemp("", "prewarm-cluster-"); err != nil {
		return err
	}
	stages, err := c.writeConfigs(bin, opts)
	if err != nil {
		return err
	}
	specs := []struct {
		name string
		args []string
	}{
		{"kube-controller-manager", []string{
			"--kubeconfig=" + c.KubeconfigPath,
			"--controllers=deployment-controller,replicaset-controller,daemonset-controller,garbage-collector-controller,node-lifecycle-controller",
			"--leader-elect=false", "--secure-port=0",
			"--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5",
		}},
		{"kube-scheduler", []string{"--kubeconfig=" + c.KubeconfigPath, "--leader-elect=false", "--secure-port=0"}},
		{"kwok", []string{
			"--kubeconfig=" + c.KubeconfigPath,
			"--config=" + stages,
			"--manage-all-nodes=false",
			"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
			"--node-lease-duration-seconds=40",
			"--server-address=127.0.0.1:0",
		}},
	}
	if d := opts.NodeLease; d > 0 {
		specs[0].args = append(specs[0].args, fmt.Sprintf("--node-monitor-grace-period=%s", 5*d))
		for i, a := range specs[2].args {
			if strings.HasPrefix(a, "--node-lease-duration-seconds=") {
				specs[2].args[i] = fmt.Sprintf("--node-lease-duration-seconds=%d", int(d.Seconds()))
			}
		}
	}
	for _, name := range opts.MoreControllers {
		for i, a := range specs[0].args {
			if strings.HasPrefix(a, "--controllers=") {
				specs[0].args[i] += "," + name
			}
		}
	}
	if q := opts.ControlPlaneQPS; q > 0 {
		for i := range specs[:2] {
			specs[i].args = append(specs[i].args, fmt.Sprintf("--kube-api-qps=%d", q), fmt.Sprintf("--kube-api-burst=%d", 2*q))
		}
	}
	for _, s := range specs {
		path := filepath.Join(bin, s.name)
		if s.name != "kwok" {
			if path, err = KubeBinary(s.name); err != nil {
				return err
			}
		}
		p, err := StartProcess(c.LogDir, s.name, path, s.args...)
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
	}
	// Give each process a moment to fail on bad flags before tests rely on it.
	time.Sleep(500 * time.Millisecond)
	return c.CheckProcesses()
}

// writeConfigs writes the control plane's kubeconfig and kwok's stages into the log folder,
// returning the stages' path.
func (c *Cluster) writeConfigs(bin string, opts ClusterOptions) (string, error) {
	kubeconfig, err := c.KubeConfig()
	if err != nil {
		return "", err
	}
	c.KubeconfigPath = filepath.Join(c.LogDir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, kubeconfig, 0o600); err != nil {
		return "", err
	}
	stages := filepath.Join(bin, "kwok-stages.yaml")
	if opts.KwokStages == nil {
		return stages, nil
	}
	data, err := os.ReadFile(stages)
	if err != nil {
		return "", err
	}
	stages = filepath.Join(c.LogDir, "kwok-stages.yaml")
	return stages, os.WriteFile(stages, []byte(opts.KwokStages(string(data))), 0o644)
}

// CheckProcesses returns an error naming any harness process that has exited, with its log.
func (c *Cluster) CheckProcesses() error {
	var errs []error
	for _, p := range c.procs {
		if done, err := p.Exited(); done {
			status := "exit status 0"
			if err != nil {
				status = err.Error()
			}
			errs = append(errs, fmt.Errorf("%s exited (%s); log %s:\n%s", p.Name, status, p.LogPath, p.LogTail(4000)))
		}
	}
	return errors.Join(errs...)
}

// Stop stops kwok, the scheduler, the controller-manager and the API server.
func (c *Cluster) Stop() error {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop(10 * time.Second)
	}
	err := c.APIServer.Stop()
	if err == nil && c.LogDir != "" && !c.keepLogs && os.Getenv("PREWARM_KEEP_LOGS") == "" {
		_ = os.RemoveAll(c.LogDir)
	}
	return err
}

// NodeOptions describe a simulated node.
type NodeOptions struct {
	// InstanceType is the node.kubernetes.io/instance-type label.
	InstanceType string
	// GPUs is the node's nvidia.com/gpu capacity.
	GPUs int64
	// Labels are extra labels.
	Labels map[string]string
	// Taints are the node's taints.
	Taints []corev1.Taint
	// InternalIP is the address the node reports (127.0.0.1: agents of the harness run as
	// processes on this machine, and the controller hands out only peer addresses of a node's
	// own).
	InternalIP string
}

// AddNode creates a kwok-managed node with the given instance type and capacity, and waits until
// it is Ready.
func (c *Cluster) AddNode(ctx context.Context, name string, opts NodeOptions) (*corev1.Node, error) {
	labels := map[string]string{
		"kubernetes.io/hostname":      name,
		"kubernetes.io/os":            "linux",
		"kubernetes.io/arch":          "amd64",
		"type":                        "kwok",
		inferencev1.InstanceTypeLabel: opts.InstanceType,
	}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("96"),
		corev1.ResourceMemory: resource.MustParse("384Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if opts.GPUs > 0 {
		capacity["nvidia.com/gpu"] = *resource.NewQuantity(opts.GPUs, resource.DecimalSI)
	}
	ip := cmp.Or(opts.InternalIP, "127.0.0.1")
	addresses := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	// The addresses are the node's from its creation, as a kubelet registers its node: kwok
	// keeps the addresses a node already has, but writes its own into a node that has none, and
	// a write of its made from a copy older than a later patch of ours would put them back.
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{KwokNodeAnnotation: "fake"}},
		Spec:       corev1.NodeSpec{Taints: opts.Taints},
		Status:     corev1.NodeStatus{Addresses: addresses, Capacity: capacity, Allocatable: capacity},
	}
	if err := c.Client.Create(ctx, node); err != nil {
		return nil, err
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity, "addresses": addresses}})
	if err != nil {
		return nil, err
	}
	if err := c.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return nil, err
	}
	// Should a status write of kwok's still replace them before the node is Ready, they are put
	// back until they hold.
	addrPatch, err := json.Marshal(map[string]any{"status": map[string]any{"addresses": addresses}})
	if err != nil {
		return nil, err
	}
	err = Eventually(ctx, 30*time.Second, func() (bool, error) {
		if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return false, err
		}
		if !NodeReady(node) {
			return false, nil
		}
		if slices.Equal(node.Status.Addresses, addresses) {
			return true, nil
		}
		return false, c.Client.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, addrPatch))
	})
	if err != nil {
		return nil, fmt.Errorf("node %s not Ready: %w", name, errors.Join(err, c.CheckProcesses()))
	}
	return node, nil
}

// Eventually polls cond every 100ms until it returns true, returns an error, or timeout passes.
func Eventually(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, lastErr)
			}
			return fmt.Errorf("timed out after %s", timeout)
		case <-tick.C:
		}
	}
}

// Until polls check every 100ms until it returns nil, or timeout passes; the error then carries
// check's last answer (why the condition did not hold yet).
func Until(ctx context.Context, timeout time.Duration, check func() error) error {
	return Eventually(ctx, timeout, func() (bool, error) {
		err := check()
		return err == nil, err
	})
}

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
