package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/testutil"
)

// Options describe the cluster.
type Options struct {
	// Dir holds everything the cluster makes; it must not exist or be empty.
	Dir string
	// Nodes are the nodes, started in order.
	Nodes []NodeOptions
	// Mirrors are registries (e.g. docker.io) whose images containerd pulls from the loopback
	// registry instead, under the same repository names.
	Mirrors []string
	// AdmissionPlugins are admission plugins the API server runs besides its defaults and
	// NodeRestriction (ExtendedResourceToleration, as EKS and GKE run it).
	AdmissionPlugins []string
}

// Cluster is a running control plane, its nodes and the loopback registry.
type Cluster struct {
	// Dir is the cluster's directory; LogDir holds every process's log.
	Dir, LogDir string
	// Kubeconfig is a cluster-admin kubeconfig; Config and Client are for the same identity.
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	// Registry is the loopback registry's host:port; push images there.
	Registry string
	// Nodes are the running nodes.
	Nodes []*Node

	opts     Options
	pki      *pki
	ids      []identity
	procs    []*testutil.Process
	registry *http.Server
}

// Start starts the control plane, the registry and the nodes. It must run in the namespace Main
// made. On error, what was started is stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if why := Unsupported(); why != "" {
		return nil, errors.New(why)
	}
	if !InNetns() {
		return nil, errors.New("realnode.Start must run under realnode.Main (in the run's network namespace)")
	}
	c := &Cluster{Dir: opts.Dir, LogDir: filepath.Join(opts.Dir, "logs"), opts: opts}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return err
	}
	if err := c.startRegistry(); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	for i, no := range c.opts.Nodes {
		if _, err := c.AddNode(ctx, i+1, no); err != nil {
			return fmt.Errorf("node %s: %w", no.Name, err)
		}
	}
	return nil
}

// startRegistry serves an OCI registry on loopback, its blobs on disk.
func (c *Cluster) startRegistry() error {
	blobs := filepath.Join(c.Dir, "registry")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c.Registry = l.Addr().String()
	c.registry = &http.Server{
		Handler:           registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(blobs)), registry.Logger(discardLogger())),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = c.registry.Serve(l) }()
	return nil
}

// startControlPlane starts etcd, kube-apiserver (token and RBAC/Node authorization, with
// NodeRestriction), kube-controller-manager and kube-scheduler, and waits until the API serves.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	bin, err := testutil.TestBinDir()
	if err != nil {
		return err
	}
	p, err := newPKI(filepath.Join(c.Dir, "pki"), []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(ServiceIP), net.ParseIP(HostIP)})
	if err != nil {
		return err
	}
	c.pki = p
	if err := c.writeCredentials(); err != nil {
		return err
	}
	etcdData := filepath.Join(c.Dir, "etcd")
	specs := []struct {
		name string
		args []string
	}{
		{"etcd", []string{"--name=realnode", "--data-dir=" + etcdData,
			"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
			"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
			"--initial-cluster=realnode=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn"}},
		{"kube-apiserver", []string{"--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0",
			fmt.Sprintf("--secure-port=%d", apiPort), "--advertise-address=" + HostIP,
			"--tls-cert-file=" + p.path("apiserver.crt"), "--tls-private-key-file=" + p.path("apiserver.key"),
			"--client-ca-file=" + p.path("ca.crt"), "--token-auth-file=" + p.path("tokens.csv"),
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=" + strings.Join(append([]string{"NodeRestriction"}, c.opts.AdmissionPlugins...), ","),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p.path("sa.pub"), "--service-account-signing-key-file=" + p.path("sa.key"),
			"--service-cluster-ip-range=" + serviceCIDR, "--allow-privileged=true",
			"--kubelet-client-certificate=" + p.path("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + p.path("apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP",
			// The aggregation layer, as kubeadm configures it, so that extension API servers
			// (KEDA's external metrics) serve through it; it reaches them at their endpoints'
			// addresses, as no kube-proxy runs here.
			"--requestheader-client-ca-file=" + p.path("front-proxy/ca.crt"), "--requestheader-allowed-names=" + FrontProxyClient,
			"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + p.path("front-proxy/"+FrontProxyClient+".crt"),
			"--proxy-client-key-file=" + p.path("front-proxy/"+FrontProxyClient+".key"),
			"--enable-aggregator-routing=true"}},
	}
	for _, s := range specs {
		if err := c.startProcess(s.name, filepath.Join(bin, s.name), s.args...); err != nil {
			return err
		}
	}
	if err := c.connect(ctx); err != nil {
		return err
	}
	for _, s := range []struct{ name, kubeconfig string }{{"kube-controller-manager", "kcm"}, {"kube-scheduler", "scheduler"}} {
		kc := filepath.Join(c.Dir, s.kubeconfig+".kubeconfig")
		args := []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"}
		if s.name == "kube-controller-manager" {
			args = append(args, "--root-ca-file="+p.path("ca.crt"), "--service-account-private-key-file="+p.path("sa.key"),
				"--use-service-account-credentials=true", "--cluster-signing-duration=24h")
		}
		if err := c.startProcess(s.name, filepath.Join(bin, s.name), args...); err != nil {
			return err
		}
	}
	return nil
}

// writeCredentials makes a token for the admin, the controller-manager, the scheduler and each
// node, the API server's token file, and the kubeconfigs of the first three.
func (c *Cluster) writeCredentials() error {
	for _, u := range []struct{ name, group string }{
		{"admin", "system:masters"}, {"system:kube-controller-manager", ""}, {"system:kube-scheduler", ""},
	} {
		var groups []string
		if u.group != "" {
			groups = append(groups, u.group)
		}
		id, err := newIdentity(u.name, groups...)
		if err != nil {
			return err
		}
		c.ids = append(c.ids, id)
	}
	for _, no := range c.opts.Nodes {
		id, err := newIdentity("system:node:"+no.Name, "system:nodes")
		if err != nil {
			return err
		}
		c.ids = append(c.ids, id)
	}
	if err := writeTokens(c.pki.path("tokens.csv"), c.ids); err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", HostIP, apiPort)
	for i, name := range []string{"admin", "kcm", "scheduler"} {
		if err := writeKubeconfig(filepath.Join(c.Dir, name+".kubeconfig"), server, c.pki.path("ca.crt"), c.ids[i]); err != nil {
			return err
		}
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	return nil
}

// connect waits until the API server answers, then makes the admin client.
func (c *Cluster) connect(ctx context.Context) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.Config = cfg
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	err = testutil.Until(ctx, 60*time.Second, func() error {
		if err := c.CheckProcesses(); err != nil {
			return err
		}
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w", errors.Join(err, c.CheckProcesses()))
	}
	c.Client, err = client.New(cfg, client.Options{Scheme: testutil.Scheme()})
	return err
}

func (c *Cluster) startProcess(name, path string, args ...string) error {
	return c.startProcessEnv(name, path, nil, args...)
}

// startProcessEnv starts a process of the cluster with env added to the run's environment; it
// stops with the cluster, and CheckProcesses reports its exit.
func (c *Cluster) startProcessEnv(name, path string, env []string, args ...string) error {
	p, err := testutil.StartProcessEnv(c.LogDir, name, path, env, args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// CheckProcesses returns an error naming any process of the cluster that has exited, with its
// log's end.
func (c *Cluster) CheckProcesses() error {
	var errs []error
	for _, p := range c.procs {
		if done, err := p.Exited(); done {
			errs = append(errs, fmt.Errorf("%s exited (%w); log %s:\n%s", p.Name, err, p.LogPath, p.LogTail(3000)))
		}
	}
	for _, n := range c.Nodes {
		if err := n.check(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Node returns the node of that name (nil if none).
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Stop stops the nodes (removing their pods, so that no container outlives the run), the
// control plane and the registry, and removes the nodes' cgroups. The directory stays.
func (c *Cluster) Stop() error {
	var errs []error
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		errs = append(errs, c.Nodes[i].stop())
	}
	// The API server before etcd: stopped together, it waits on etcd in its graceful shutdown.
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop(10 * time.Second)
	}
	if c.registry != nil {
		errs = append(errs, c.registry.Close())
	}
	return errors.Join(errs...)
}
