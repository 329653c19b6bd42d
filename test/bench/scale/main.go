// Command scale is make bench-scale: the control plane's cost of prewarm on a large fleet. For
// each fleet size it starts a real kube-apiserver and etcd, kube-controller-manager,
// kube-scheduler and kwok, makes the nodes (GPU capacity, ten instance types) and times kwok
// making them Ready and schedulable; then it runs the real controller binary with simulated
// agents (internal/testutil/agentsim: every node's agent, writing its NodeCache status as the
// real agent does) and, for each cache count, applies that many InferenceEndpointConfigs with
// weights and image caches spread over the instance types, and measures: the time until every
// cache is Ready with every label applied (and the gates open), API requests by verb and
// resource (the API server's own metrics), writes per node-cache, the controller's CPU seconds
// and memory, and the largest object. It writes the figures to docs/benchmarks.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/agentsim"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

const (
	namespace = "bench"
	bucket    = "bench-models"
	image     = "vllm/vllm-openai:v0.11.0"
	// maxParallel is the agents' agent.maxParallel (its default): caches one node downloads at once.
	maxParallel = 2
	// types is how many instance types the fleet has; node i is of type i % types.
	typeCount = 10
)

var instanceTypes = []string{
	"ml.g5.48xlarge", "ml.g6e.48xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge",
	"ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.g6.48xlarge", "ml.g5.24xlarge", "ml.trn1.32xlarge",
}

type options struct {
	nodes      []int
	caches     []int
	download   time.Duration
	out        string
	dir        string
	controller string
	cpQPS      int
	nodeLease  time.Duration
	timeout    time.Duration
	// maxNodeCaches skips the runs with more node-caches (0: none skipped).
	maxNodeCaches int
	// steady is how long the write rate is measured after a fleet's last run converged.
	steady time.Duration
	// apiPriority is whether the agents' FlowSchema is applied (the chart's apiPriority):
	// on, off, or both (each fleet twice, reported in the section of its own).
	apiPriority string
	// serverCPUs, when set, runs each fleet once per value with kube-apiserver and etcd
	// allowed that many CPUs between them (0: no cap), reported in the section of its own.
	serverCPUs []float64
	// writeCosts, when over 0, is how many writes of each kind measureWriteCosts makes on each
	// fleet after its last run.
	writeCosts int
	// profile, when set, is the folder that keeps kube-apiserver's CPU profiles of each step.
	profile string
}

func main() {
	var o options
	nodes := flag.String("nodes", "500,1000,2000,5000", "fleet sizes, comma-separated")
	caches := flag.String("caches", "1,10,50", "cache counts per fleet, comma-separated")
	flag.DurationVar(&o.download, "download", 10*time.Second, "how long each simulated download takes")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "report to write into (its bench-scale section; empty: print only)")
	flag.StringVar(&o.dir, "dir", "", "work folder for logs (default: a temporary one, removed)")
	flag.IntVar(&o.cpQPS, "control-plane-qps", 500, "kube-controller-manager's and kube-scheduler's client QPS (burst twice that)")
	flag.DurationVar(&o.nodeLease, "node-lease", 200*time.Second, "kwok's node lease duration (the node lifecycle controller's grace is 5 times that)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "longest wait for one step")
	flag.IntVar(&o.maxNodeCaches, "max-node-caches", 0, "skip the runs with more node-caches than this (0: run them all; 5,000 nodes × 50 caches is 25,000 node-caches, about 20 minutes on 2 CPUs); the report lists them as skipped")
	flag.DurationVar(&o.steady, "steady", 10*time.Minute, "how long to measure the API write rate of a converged fleet, minute by minute (0: not measured)")
	flag.StringVar(&o.apiPriority, "api-priority", "off", "the agents' FlowSchema and priority level (the chart's apiPriority, off by default): on, off, or both (every fleet without, then with it; the report goes to its own section)")
	serverCPUs := flag.String("server-cpus", "", "run each fleet once per value, kube-apiserver and etcd allowed that many CPUs between them (a cgroup's CPU quota; 0: no cap), e.g. 0.5,1,0: the same load on a smaller and a larger API server; the report goes to its own section")
	flag.IntVar(&o.writeCosts, "write-costs", 0, "after each fleet's last run, make this many writes of each kind prewarm makes (NodeCache status, NodeCache, node label, Lease) and report the API server's CPU per write (0: not measured)")
	flag.StringVar(&o.profile, "profile", "", "keep kube-apiserver's CPU profiles, while kwok makes the nodes and while each rollout converges, in this folder (NODES-nodes-kwok-NNN.pprof, NODES-nodes-CACHES-caches-NNN.pprof: windows of 10 s; go tool pprof reads a step's files together)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard()) // the informers' and clients' own logs; the controller logs to its file
	var err error
	if o.nodes, err = testutil.Ints(*nodes); err != nil {
		log.Fatalf("--nodes: %v", err)
	}
	if o.caches, err = testutil.Ints(*caches); err != nil {
		log.Fatalf("--caches: %v", err)
	}
	for _, v := range strings.Split(*serverCPUs, ",") {
		if v == "" {
			continue
		}
		cpus, err := strconv.ParseFloat(v, 64)
		if err != nil || cpus < 0 {
			log.Fatalf("--server-cpus: %q is not a number of CPUs", v)
		}
		o.serverCPUs = append(o.serverCPUs, cpus)
	}
	if len(o.serverCPUs) > 0 && o.apiPriority == "both" {
		log.Fatal("--server-cpus and --api-priority both each make a section of their own: run them apart")
	}
	if !slices.Contains([]string{"on", "off", "both"}, o.apiPriority) {
		log.Fatalf("--api-priority: %q is not on, off or both", o.apiPriority)
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	tmp, err := os.MkdirTemp("", "prewarm-bench-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.dir == "" {
		o.dir = filepath.Join(tmp, "logs")
	}
	build := exec.Command("go", "build", "-o", tmp+"/", "github.com/prewarm/prewarm/cmd/controller")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the controller: %w", err)
	}
	o.controller = filepath.Join(tmp, "controller")
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return err
		}
	}
	rep := report{opts: o, started: time.Now()}
	modes := map[string][]bool{"on": {true}, "off": {false}, "both": {false, true}}[o.apiPriority]
	caps := o.serverCPUs
	if len(caps) == 0 {
		caps = []float64{0}
	}
	for _, n := range o.nodes {
		for _, apf := range modes {
			for _, cpus := range caps {
				fr, err := runFleet(o, n, apf, cpus)
				if err != nil {
					return fmt.Errorf("%d nodes: %w", n, err)
				}
				rep.fleets = append(rep.fleets, fr)
				_, _, text := rep.section()
				fmt.Println(text)
			}
		}
	}
	if o.out == "" {
		return nil
	}
	return rep.write(o.out)
}

// fleetResult is one fleet size's figures.
type fleetResult struct {
	nodes int
	// apiPriority: the agents had their FlowSchema and priority level.
	apiPriority bool
	// serverCap is the CPUs kube-apiserver and etcd were allowed between them (0: no cap);
	// nodesServerCPU, the CPU seconds they used while the nodes were made.
	serverCap, nodesServerCPU float64
	// nodesReady is kwok's time to make every node Ready; schedulable adds the node lifecycle
	// controller lifting the not-ready taint.
	nodesReady, schedulable time.Duration
	runs                    []cacheResult
	// skipped are the cache counts not run (--max-node-caches).
	skipped []int
	// background is the write rate (per second, by resource) of the fleet before the controller
	// and agents start: kwok's node leases and status.
	background map[string]float64
	// steady is the write rate of each minute after the last run converged (per second, by
	// resource).
	steady []map[string]float64
	// costs is the API server's CPU per write of each kind (--write-costs).
	costs []writeCost
	// sizes are the fleet's NodeCaches' and Nodes' sizes after the last run (--write-costs).
	sizes []objectSizes
}

// cacheResult is one cache count's figures on a fleet.
type cacheResult struct {
	caches, nodeCaches int
	converge, gate     time.Duration
	deleted            time.Duration
	requests           map[string]float64 // "VERB resource[/subresource]" -> count
	waits              apiWaits
	probe              probeFigures // the other client's requests during the run
	agentWrites        int64
	controllerCPU      float64 // seconds
	rssMiB, peakMiB    float64
	baseMiB            float64
	largest            objectSize
	procCPU            map[string]float64
	// client is the controller's own view: its requests' latency and its wait for its rate limiter.
	client clientFigures
	// milestones are when each step was first seen done, from the apply.
	milestones map[string]time.Duration
}

// The steps of a run, in order.
var milestoneNames = []string{"caches made", "nodes asked", "agents Ready", "caches Ready", "nodes labelled", "images Complete", "gates open"}

type objectSize struct {
	kind, name string
	bytes      int
}

// fleet is one cluster with its nodes, the controller and the simulated agents.
type fleet struct {
	o       options
	ctx     context.Context
	cluster *testutil.Cluster
	c       client.Client
	view    cache.Cache
	ctrl    *testutil.Process
	sim     *agentsim.Sim
	probe   *probe
	nodes   int
	// metricsAddr is the controller's metrics endpoint.
	metricsAddr string
}

func runFleet(o options, n int, apiPriority bool, serverCap float64) (fleetResult, error) {
	fr := fleetResult{nodes: n, apiPriority: apiPriority, serverCap: serverCap}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logDir := filepath.Join(o.dir, fmt.Sprintf("%d-nodes", n))
	cluster, err := testutil.StartClusterWith(testutil.ClusterOptions{LogDir: logDir, ControlPlaneQPS: o.cpQPS, NodeLease: o.nodeLease})
	if err != nil {
		return fr, err
	}
	defer cluster.Stop() //nolint:errcheck // the report is written; a failed stop is in the logs
	defer cancel()       // the simulated agents stop before the cluster does
	if serverCap > 0 {
		release, err := capServer(serverCap)
		if err != nil {
			return fr, err
		}
		defer release()
		log.Printf("%d nodes: kube-apiserver and etcd allowed %s", n, cpuCap(serverCap))
	}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return fr, err
	}
	view, err := cache.New(cfg, cache.Options{Scheme: scheme.New()})
	if err != nil {
		return fr, err
	}
	for _, obj := range []client.Object{&corev1.Node{}, &inferencev1.ModelDataCacheConfig{}, &inferencev1.InferenceImageCache{},
		&inferencev1.InferenceEndpointConfig{}, &prewarmv1alpha1.NodeCache{}} {
		if _, err := view.GetInformer(ctx, obj); err != nil {
			return fr, err
		}
	}
	go func() { _ = view.Start(ctx) }()
	view.WaitForCacheSync(ctx)
	f := &fleet{o: o, ctx: ctx, cluster: cluster, c: c, view: view, nodes: n}
	for _, ns := range []string{inferencev1.DefaultOperatorNamespace, namespace} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fr, err
		}
	}
	log.Printf("%d nodes: making them", n)
	cpu0 := serverCPU(childCPU())
	stopProfile := f.profile(fmt.Sprintf("%d-nodes-kwok", n))
	fr.nodesReady, fr.schedulable, err = f.makeNodes()
	stopProfile()
	if err != nil {
		return fr, err
	}
	fr.nodesServerCPU = serverCPU(childCPU()) - cpu0
	log.Printf("%d nodes: Ready in %s, schedulable in %s", n, fr.nodesReady.Round(time.Millisecond), fr.schedulable.Round(time.Millisecond))
	if o.steady > 0 {
		log.Printf("%d nodes: measuring the write rate without prewarm for a minute", n)
		rates, err := f.writeRates(time.Minute, 1)
		if err != nil {
			return fr, err
		}
		fr.background = rates[0]
	}
	if apiPriority {
		if err := f.applyAPIPriority(); err != nil {
			return fr, err
		}
	}
	if f.probe, err = f.startProbe(ctx); err != nil {
		return fr, err
	}
	if err := f.startController(logDir); err != nil {
		return fr, err
	}
	defer f.ctrl.Stop(10 * time.Second)
	names := make([]string, n)
	for i := range names {
		names[i] = nodeName(i)
	}
	agentCfg, err := f.asServiceAccount(cfg, "prewarm-agent")
	if err != nil {
		return fr, err
	}
	if f.sim, err = agentsim.Start(ctx, agentCfg, names, agentsim.Options{Download: o.download, MaxParallel: maxParallel,
		ModelBytes: 145 << 30, Files: 64, Root: config.DefaultCacheRoot, Version: "agentsim", LeaseNamespace: inferencev1.DefaultOperatorNamespace, LeaseDuration: leaseDuration}); err != nil {
		return fr, err
	}
	for ki, k := range o.caches {
		if nc := nodeCachesOf(n, k); o.maxNodeCaches > 0 && nc > o.maxNodeCaches {
			log.Printf("%d nodes: %d caches (%d node-caches) skipped: over --max-node-caches", n, k, nc)
			fr.skipped = append(fr.skipped, k)
			continue
		}
		log.Printf("%d nodes: %d caches", n, k)
		// The last run's caches are not deleted: the cluster goes.
		cr, err := f.runCaches(k, ki == len(o.caches)-1 || (o.maxNodeCaches > 0 && nodeCachesOf(n, o.caches[ki+1]) > o.maxNodeCaches))
		if err != nil {
			return fr, fmt.Errorf("%d caches: %w", k, err)
		}
		fr.runs = append(fr.runs, cr)
		log.Printf("%d nodes, %d caches: converged in %s, %d node-caches; %d agent writes failed (in all); controller: %s",
			n, k, cr.converge.Round(time.Millisecond), cr.nodeCaches, f.sim.Errors.Load(), cr.client)
	}
	if o.writeCosts > 0 && len(fr.runs) > 0 {
		log.Printf("%d nodes: measuring the API server's CPU per write", n)
		if fr.sizes, err = f.sizesOf(); err != nil {
			return fr, err
		}
		if fr.costs, err = f.measureWriteCosts(cfg, o.writeCosts); err != nil {
			return fr, err
		}
	}
	if o.steady > 0 && len(fr.runs) > 0 {
		log.Printf("%d nodes: measuring the steady write rate for %s", n, o.steady)
		if fr.steady, err = f.writeRates(time.Minute, int(o.steady/time.Minute)); err != nil {
			return fr, err
		}
	}
	return fr, nil
}

// writeRates measures the API server's write requests per second, by resource, over each of
// n spans of every.
func (f *fleet) writeRates(every time.Duration, n int) ([]map[string]float64, error) {
	before, err := f.apiMetrics()
	if err != nil {
		return nil, err
	}
	var out []map[string]float64
	for range n {
		select {
		case <-f.ctx.Done():
			return nil, f.ctx.Err()
		case <-time.After(every):
		}
		after, err := f.apiMetrics()
		if err != nil {
			return nil, err
		}
		rate := map[string]float64{}
		for key, v := range after {
			verb, res, _ := strings.Cut(key, " ")
			if d := v - before[key]; d > 0 && isWrite(verb) {
				rate[res] += d / every.Seconds()
			}
		}
		out = append(out, rate)
		before = after
	}
	return out, nil
}

// leaseDuration is the agents' agent.leaseDuration: the default.
const leaseDuration = 3 * time.Minute

func nodeName(i int) string { return fmt.Sprintf("gpu-%05d", i) }

// nodeCachesOf is how many node-caches k caches make on n nodes.
func nodeCachesOf(n, k int) int {
	total := 0
	for j := range k {
		total += targetsOf(n, placementOf(j, k))
	}
	return total
}

// ownTime is what the agents themselves take, whatever the control plane: each node downloads
// its caches maxParallel at a time.
func ownTime(n, k int, download time.Duration) time.Duration {
	perNode := (nodeCachesOf(n, k) + n - 1) / n
	return time.Duration((perNode+maxParallel-1)/maxParallel) * download
}

// makeNodes creates the fleet's nodes and returns kwok's time to make them Ready, and the time
// until none has the not-ready taint any more.
func (f *fleet) makeNodes() (time.Duration, time.Duration, error) {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("8"),
	}
	statusPatch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	g, ctx := errgroup.WithContext(f.ctx)
	g.SetLimit(64)
	for i := range f.nodes {
		g.Go(func() error {
			name := nodeName(i)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels: map[string]string{
					"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
					inferencev1.InstanceTypeLabel: instanceTypes[i%typeCount],
				},
				Annotations: map[string]string{testutil.KwokNodeAnnotation: "fake"}}}
			if err := f.c.Create(ctx, node); err != nil {
				return err
			}
			return f.c.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, statusPatch))
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	var ready time.Duration
	err = f.until(func() (bool, string) {
		nodes := &corev1.NodeList{}
		if err := f.view.List(f.ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
			return false, err.Error()
		}
		nReady, nSched := 0, 0
		for i := range nodes.Items {
			if testutil.NodeReady(&nodes.Items[i]) {
				nReady++
				if !slices.ContainsFunc(nodes.Items[i].Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady }) {
					nSched++
				}
			}
		}
		if nReady == f.nodes && ready == 0 {
			ready = time.Since(start)
		}
		return nSched == f.nodes, fmt.Sprintf("%d of %d nodes Ready, %d schedulable", nReady, f.nodes, nSched)
	})
	return ready, time.Since(start), err
}

func (f *fleet) startController(logDir string) error {
	op := config.OperatorConfiguration{
		SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: bucket}}},
	}
	conf := filepath.Join(logDir, "operator.yaml")
	if err := op.Write(conf); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	f.metricsAddr = l.Addr().String()
	l.Close()
	kubeconfig, err := f.kubeconfigAs(logDir, "prewarm-controller")
	if err != nil {
		return err
	}
	f.ctrl, err = testutil.StartProcess(logDir, "controller", f.o.controller, "--kubeconfig="+kubeconfig,
		"--leader-elect=false", "--metrics-bind-address="+f.metricsAddr, "--health-probe-bind-address=0", "--config="+conf,
		"--agent-image=prewarm/agent:bench")
	return err
}

// The controller and the simulated agents reach the API server with tokens of the chart's
// service accounts, so that API Priority and Fairness classifies their requests as a real
// installation's (the admin's would be exempt). The accounts may do anything: the bench
// measures load, not RBAC (the chart's roles are tested elsewhere).
func (f *fleet) serviceAccountToken(name string) (string, error) {
	ns := inferencev1.DefaultOperatorNamespace
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := f.c.Create(f.ctx, sa); err != nil {
		return "", err
	}
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bench-" + name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
	if err := f.c.Create(f.ctx, b); err != nil {
		return "", err
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}
	if err := f.c.SubResource("token").Create(f.ctx, sa, tr); err != nil {
		return "", fmt.Errorf("a token for %s: %w", name, err)
	}
	return tr.Status.Token, nil
}

// asServiceAccount is cfg with the service account's token instead of the admin's certificate.
func (f *fleet) asServiceAccount(cfg *rest.Config, name string) (*rest.Config, error) {
	tok, err := f.serviceAccountToken(name)
	if err != nil {
		return nil, err
	}
	out := rest.AnonymousClientConfig(cfg)
	out.BearerToken, out.QPS, out.Burst = tok, cfg.QPS, cfg.Burst
	return out, nil
}

// kubeconfigAs writes the cluster's kubeconfig with the service account's token.
func (f *fleet) kubeconfigAs(dir, name string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(f.cluster.KubeconfigPath)
	if err != nil {
		return "", err
	}
	tok, err := f.serviceAccountToken(name)
	if err != nil {
		return "", err
	}
	for _, a := range cfg.AuthInfos {
		a.ClientCertificate, a.ClientCertificateData, a.ClientKey, a.ClientKeyData = "", nil, "", nil
		a.Token = tok
	}
	path := filepath.Join(dir, "kubeconfig-"+name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

// until polls cond every 250 ms until it holds or the step's timeout passes.
func (f *fleet) until(cond func() (bool, string)) error {
	deadline := time.Now().Add(f.o.timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return nil
		}
		last = why
		if err := f.cluster.CheckProcesses(); err != nil {
			return err
		}
		if f.ctrl != nil {
			if done, err := f.ctrl.Exited(); done {
				return fmt.Errorf("the controller exited (%w): %s", err, f.ctrl.LogTail(3000))
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %s: %s", f.o.timeout, last)
}

// placementOf is the instance types cache j of k targets: one type each (several caches share
// a type when k > types), or every type for a single cache.
func placementOf(j, k int) []string {
	if k == 1 {
		return instanceTypes
	}
	return []string{instanceTypes[j%typeCount]}
}

// targetsOf is how many of n nodes are of instance types its.
func targetsOf(n int, its []string) int {
	count := 0
	for i := range n {
		if slices.Contains(its, instanceTypes[i%typeCount]) {
			count++
		}
	}
	return count
}

func (f *fleet) runCaches(k int, last bool) (cacheResult, error) {
	cr := cacheResult{caches: k, procCPU: map[string]float64{}}
	ctx := f.ctx
	targets := map[string]int{}
	for j := range k {
		targets[parentName(j)] = targetsOf(f.nodes, placementOf(j, k))
		cr.nodeCaches += targets[parentName(j)]
	}
	pid := f.ctrl.Pid()
	cr.baseMiB = rssMiB(pid, "VmRSS")
	before, err := f.apiMetrics()
	if err != nil {
		return cr, err
	}
	waitsBefore, err := f.apiWaits()
	if err != nil {
		return cr, err
	}
	probe0, probeFailed0 := f.probe.mark()
	procs0 := childCPU()
	cpu0 := cpuSeconds(pid)
	writes0 := f.sim.Writes.Load()

	stopProfile := f.profile(fmt.Sprintf("%d-nodes-%d-caches", f.nodes, k))
	defer stopProfile()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for j := range k {
		g.Go(func() error { return f.c.Create(gctx, parent(j, placementOf(j, k))) })
	}
	if err := g.Wait(); err != nil {
		return cr, err
	}
	gates := map[string]time.Duration{}
	cr.milestones = map[string]time.Duration{}
	var largest objectSize
	lastSize := time.Time{}
	err = f.until(func() (bool, string) {
		if time.Since(lastSize) > 5*time.Second {
			lastSize = time.Now()
			largest = maxSize(largest, f.largestObject())
		}
		return f.converged(targets, gates, start, cr.milestones, cr.nodeCaches)
	})
	if err != nil {
		return cr, err
	}
	cr.converge = time.Since(start)
	stopProfile()
	for _, d := range gates {
		cr.gate = max(cr.gate, d)
	}
	cr.largest = maxSize(largest, f.largestObject())
	after, err := f.apiMetrics()
	if err != nil {
		return cr, err
	}
	waitsAfter, err := f.apiWaits()
	if err != nil {
		return cr, err
	}
	cr.waits = waitsAfter.since(waitsBefore)
	cr.probe = f.probe.since(probe0, probeFailed0)
	cr.requests = map[string]float64{}
	for key, v := range after {
		if d := v - before[key]; d > 0 {
			cr.requests[key] = d
		}
	}
	cr.controllerCPU = cpuSeconds(pid) - cpu0
	cr.client = f.controllerClientFigures()
	cr.agentWrites = f.sim.Writes.Load() - writes0
	for name, v := range childCPU() {
		cr.procCPU[name] = v - procs0[name]
	}
	cr.rssMiB, cr.peakMiB = rssMiB(pid, "VmRSS"), rssMiB(pid, "VmHWM")

	if last {
		return cr, nil
	}
	// Delete the parents, and wait until every cache has gone from every node.
	start = time.Now()
	for j := range k {
		p := &inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: parentName(j)}}
		if err := f.c.Delete(ctx, p); err != nil {
			return cr, err
		}
	}
	err = f.until(func() (bool, string) {
		mdccs := &inferencev1.ModelDataCacheConfigList{}
		iics := &inferencev1.InferenceImageCacheList{}
		iecs := &inferencev1.InferenceEndpointConfigList{}
		nodes := &corev1.NodeList{}
		for _, l := range []client.ObjectList{mdccs, iics, iecs, nodes} {
			if err := f.view.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
				return false, err.Error()
			}
		}
		// The image caches' pods too, so that the next run starts from an idle cluster.
		pods := &metav1.PartialObjectMetadataList{}
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := f.c.List(ctx, pods, client.InNamespace(inferencev1.DefaultOperatorNamespace)); err != nil {
			return false, err.Error()
		}
		labelled := 0
		for i := range nodes.Items {
			for key := range nodes.Items[i].Labels {
				if controller.IsCacheLabel(key) {
					labelled++
				}
			}
		}
		return len(mdccs.Items) == 0 && len(iics.Items) == 0 && len(iecs.Items) == 0 && labelled == 0 && len(pods.Items) == 0,
			fmt.Sprintf("%d parents, %d weights caches, %d image caches, %d pods, %d node labels left",
				len(iecs.Items), len(mdccs.Items), len(iics.Items), len(pods.Items), labelled)
	})
	cr.deleted = time.Since(start)
	return cr, err
}

func parentName(j int) string { return fmt.Sprintf("model-%02d", j) }

func parent(j int, its []string) *inferencev1.InferenceEndpointConfig {
	p := builders.MakeInferenceEndpointConfig(namespace, parentName(j)).Obj()
	p.Spec.ModelSourceConfig.S3Storage.BucketName = bucket
	p.Spec.InstanceType, p.Spec.InstanceTypes = "", its
	p.Spec.Worker.Image = image
	return p
}

// converged reports whether every cache is Ready on all its targets with every node labelled,
// and every image cache too; it records when each parent's gate opened.
func (f *fleet) converged(targets map[string]int, gates map[string]time.Duration, start time.Time, milestones map[string]time.Duration, nodeCaches int) (bool, string) {
	ctx := f.ctx
	mdccs := &inferencev1.ModelDataCacheConfigList{}
	iics := &inferencev1.InferenceImageCacheList{}
	iecs := &inferencev1.InferenceEndpointConfigList{}
	nodes := &corev1.NodeList{}
	ncs := &prewarmv1alpha1.NodeCacheList{}
	for _, l := range []client.ObjectList{mdccs, iics, iecs, nodes, ncs} {
		if err := f.view.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return false, err.Error()
		}
	}
	mark := func(name string, done bool) {
		if _, seen := milestones[name]; done && !seen {
			milestones[name] = time.Since(start)
		}
	}
	asked, reported := 0, 0
	for i := range ncs.Items {
		asked += len(ncs.Items[i].Spec.Caches)
		for _, c := range ncs.Items[i].Status.Caches {
			if c.State == inferencev1.CacheReady {
				reported++
			}
		}
	}
	mark("caches made", len(mdccs.Items) == len(targets))
	mark("nodes asked", asked == nodeCaches)
	mark("agents Ready", reported == nodeCaches)
	labels := map[string]int{}
	for i := range nodes.Items {
		for key := range nodes.Items[i].Labels {
			labels[key]++
		}
	}
	for i := range iecs.Items {
		p := &iecs.Items[i]
		if c := meta.FindStatusCondition(p.Status.Conditions, inferencev1.ConditionGated); c != nil && c.Status == metav1.ConditionFalse {
			if _, ok := gates[p.Name]; !ok {
				gates[p.Name] = time.Since(start)
			}
		}
	}
	ready, imagesReady, statusReady, labelled := 0, 0, 0, 0
	var waiting []string
	for i := range mdccs.Items {
		m := &mdccs.Items[i]
		want := targets[m.Spec.ParentReference.Name]
		if m.Status.State == inferencev1.CacheReady && int(m.Status.ReadyNodes) == want {
			statusReady++
		}
		if labels[inferencev1.WeightsCacheReadyLabel(string(m.UID))] == want {
			labelled++
		}
		if m.Status.State == inferencev1.CacheReady && int(m.Status.ReadyNodes) == want && int(m.Status.TargetNodes) == want &&
			labels[inferencev1.WeightsCacheReadyLabel(string(m.UID))] == want {
			ready++
		} else if len(waiting) < 3 {
			waiting = append(waiting, fmt.Sprintf("%s %s %d/%d (labelled %d, want %d)", m.Name, m.Status.State, m.Status.ReadyNodes,
				m.Status.TargetNodes, labels[inferencev1.WeightsCacheReadyLabel(string(m.UID))], want))
		}
	}
	for i := range iics.Items {
		x := &iics.Items[i]
		if x.Status.Phase == inferencev1.ImageComplete && x.Status.CachedNodes == x.Status.TargetNodes && x.Status.TargetNodes > 0 &&
			labels[inferencev1.ImageCacheReadyLabel(string(x.UID))] == int(x.Status.TargetNodes) {
			imagesReady++
		} else if len(waiting) < 5 {
			waiting = append(waiting, fmt.Sprintf("image %s %s %d/%d", x.Name, x.Status.Phase, x.Status.CachedNodes, x.Status.TargetNodes))
		}
	}
	mark("caches Ready", statusReady == len(targets))
	mark("nodes labelled", labelled == len(targets))
	mark("images Complete", len(iics.Items) > 0 && imagesReady == len(iics.Items))
	mark("gates open", len(gates) == len(targets))
	done := ready == len(targets) && len(mdccs.Items) == len(targets) && len(iics.Items) > 0 && imagesReady == len(iics.Items) &&
		len(gates) == len(targets)
	return done, fmt.Sprintf("%d of %d weights caches, %d of %d image caches, %d gates open; %s",
		ready, len(targets), imagesReady, len(iics.Items), len(gates), strings.Join(waiting, "; "))
}

// largestObject is the largest prewarm object the API server holds now.
func (f *fleet) largestObject() objectSize {
	var best objectSize
	lists := map[string]client.ObjectList{
		"ModelDataCacheConfig": &inferencev1.ModelDataCacheConfigList{}, "InferenceImageCache": &inferencev1.InferenceImageCacheList{},
		"InferenceEndpointConfig": &inferencev1.InferenceEndpointConfigList{}, "NodeCache": &prewarmv1alpha1.NodeCacheList{},
	}
	for kind, l := range lists {
		if err := f.view.List(f.ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			continue
		}
		items, _ := meta.ExtractList(l)
		for _, it := range items {
			b, err := json.Marshal(it)
			if err == nil && len(b) > best.bytes {
				best = objectSize{kind: kind, name: it.(client.Object).GetName(), bytes: len(b)}
			}
		}
	}
	return best
}

func maxSize(a, b objectSize) objectSize {
	if b.bytes > a.bytes {
		return b
	}
	return a
}
