// Command fanout is make bench-fanout: how the time to warm N nodes, and what the origin sends,
// grow with N when the agents share their parts. Each node is a network namespace with its own
// agent process and disk folder, on a veth link shaped with tbf to --node-rate in each
// direction; the origin (versitygw) is behind a proxy on the bridge capped at --origin-rate for
// all nodes together. For N = 1, 2, 4, 8 (and N nodes with sharing off, for contrast) it creates
// one cache for the N nodes and measures, from its creation, each node's time to Ready (its
// NodeCache status, polled every 100 ms), T(N) (the last node's), and the bytes the origin
// sent. It writes the figures into docs/benchmarks.md.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
)

const (
	bucket = "fanout-models"
	prefix = "models/fanout"
	// noDigestPrefix holds the same model uploaded in parts: no file has a digest the nodes
	// could check a peer's bytes by, so each reads them from the origin (peers.trust).
	noDigestPrefix = "models/fanout-no-digest"
	root           = "/opt/dlami/nvme"
	peerTCP        = 9444
	metricsTCP     = 9445
)

type options struct {
	nodes       []int
	modelBytes  int64
	model       string // as given
	files       int
	nodeRate    int64 // bytes per second
	originRate  int64
	slowRate    int64 // the CPU-free variant's links and origin (0: not run)
	partSize    string
	partBytes   int64
	concurrency int
	streams     int
	maxPeers    int
	baseline    bool
	noDigest    bool
	witness     bool
	trace       bool
	pause       time.Duration // the stalled-owner run's pause (0: not run)
	pauseAt     time.Duration // when, from the cache's creation
	slowOwner   int64         // the slow-owner run's divisor of the first node's link (0: not run)
	stagger     time.Duration // the staggered run's gap between nodes joining (0: not run)
	out, dir    string
}

func main() {
	var o options
	nodes := flag.String("nodes", "1,2,4,8", "swarm sizes, comma-separated")
	model := flag.String("model", "256Mi", "model size")
	flag.IntVar(&o.files, "files", 4, "files the model is split into")
	nodeRate := flag.String("node-rate", "12.5M", "each node's link, bytes per second in each direction (12.5M: 100 Mbit/s)")
	originRate := flag.String("origin-rate", "", "the origin's cap for all nodes together, bytes per second (default: --node-rate)")
	flag.StringVar(&o.partSize, "part-size", "1Mi", "the agents' part size (1Mi: a part is 1/256 of the default model, as 16Mi is of a 4 GiB one)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "the agents' concurrency")
	flag.IntVar(&o.streams, "streams", 0, "the agents' peers.streams, parts taken from peers at once (0: the default)")
	flag.IntVar(&o.maxPeers, "max-peers", 0, "the agents' peers.maxPeers, peers sent parts at once (0: the default)")
	flag.BoolVar(&o.baseline, "baseline", true, "also run the largest N with sharing off")
	flag.BoolVar(&o.noDigest, "no-digest", true, "also run the largest N for the model uploaded in parts (no file has a digest of its own: only a CRC)")
	flag.BoolVar(&o.witness, "witness", true, "run the controller's witness, as the chart does: the nodes read the files without a digest through it and share them (false: each node reads them from the origin)")
	slowRate := flag.String("slow-rate", "2.5M", "also run 1 and the largest N with every link and the origin at this rate, slow enough that the machine's CPUs are not the limit (0: not run)")
	flag.BoolVar(&o.trace, "trace", false, "log every second the origin's rate and each node's downlink and uplink")
	flag.DurationVar(&o.pause, "pause", time.Minute, "also run the largest N with one agent stopped (SIGSTOP) this long mid-download, as a stalled owner (0: not run)")
	flag.DurationVar(&o.pauseAt, "pause-at", 5*time.Second, "when the stalled-owner run stops the agent, from the cache's creation")
	flag.Int64Var(&o.slowOwner, "slow-owner", 4, "also run the largest N with the first node's link this many times slower than the others', as a slow owner (0: not run)")
	flag.DurationVar(&o.stagger, "stagger", 2*time.Second, "also run the largest N with node k made a target k times this after the cache's creation (its instance-type label set then), a scale-out one node at a time (0: not run)")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "report to write into (its bench-fanout section; empty: print only)")
	flag.StringVar(&o.dir, "dir", "", "work folder for logs and disks (default: a temporary one, removed)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	var err error
	if o.nodes, err = testutil.Ints(*nodes); err != nil {
		log.Fatalf("--nodes: %v", err)
	}
	o.model = *model
	if o.modelBytes, err = bytesOf(*model); err != nil {
		log.Fatalf("--model: %v", err)
	}
	if o.nodeRate, err = bytesOf(*nodeRate); err != nil {
		log.Fatalf("--node-rate: %v", err)
	}
	o.originRate = o.nodeRate
	if *originRate != "" {
		if o.originRate, err = bytesOf(*originRate); err != nil {
			log.Fatalf("--origin-rate: %v", err)
		}
	}
	if o.partBytes, err = bytesOf(o.partSize); err != nil {
		log.Fatalf("--part-size: %v", err)
	}
	if o.slowRate, err = bytesOf(*slowRate); err != nil {
		log.Fatalf("--slow-rate: %v", err)
	}
	if os.Geteuid() != 0 {
		log.Fatal(errNotRoot)
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

// bytesOf reads 256Mi, 12.5M, 1G: binary (Ki, Mi, Gi) or decimal (k, M, G) units.
func bytesOf(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f * u.mult), err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// bench is what every run shares: the binaries, the cluster, the network, the origin.
type bench struct {
	o          options
	dir        string
	agent      string
	cluster    *testutil.Cluster
	net        *network
	origin     *shaper.Proxy
	kubeconfig string // the API server through the bridge
	confPeers  string
	confAlone  string
	procs      []*testutil.Process
	rate       int64 // the links' rate now
	stops      []func()
	cleanupS3  func()
	// witnessURL is where the agents reach the controller's witness ("": it runs none).
	witnessURL string
}

type result struct {
	nodes      int
	paused     string // the node whose agent was stopped for options.pause, if any
	slow       string // the node whose link was options.slowOwner times slower, if any
	peers      bool
	noDigest   bool            // the model without digests (noDigestPrefix)
	witness    bool            // read through the controller's witness
	rate       int64           // each link's rate and the origin's, bytes per second
	times      []time.Duration // each node's time to Ready, sorted
	originSent int64           // bytes the origin sent (bodies, listings included)
	status     inferencev1.ModelDataCacheConfigStatus
	uses       []nodeUse // each node's CPU, waits and links over the run, by time to Ready
	// othersReady is, with a paused node, when the last of the others was Ready.
	othersReady time.Duration
	// joined is, in a staggered run, when each node was made a target (nil otherwise).
	joined  map[string]time.Duration
	machine machineUse // the whole machine's CPU over the run
	// wait and stall are every node's parts over the run: the wait for a part's first byte,
	// and the longest time it went without one.
	wait, stall hist
}

func run(o options) error {
	tmp, err := os.MkdirTemp("", "prewarm-bench-fanout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.dir == "" {
		o.dir = tmp
	}
	b := &bench{o: o, dir: o.dir}
	defer b.close()
	if err := b.setUp(tmp); err != nil {
		return err
	}
	var results []result
	var runs []runSpec
	largest := slices.Max(o.nodes)
	for _, n := range o.nodes {
		runs = append(runs, runSpec{n: n, peers: true, rate: o.nodeRate})
	}
	if o.pause > 0 && largest > 1 {
		runs = append(runs, runSpec{n: largest, peers: true, pause: true, rate: o.nodeRate})
	}
	if o.slowOwner > 1 && largest > 1 {
		runs = append(runs, runSpec{n: largest, peers: true, slow: true, rate: o.nodeRate})
	}
	if o.stagger > 0 && largest > 1 {
		runs = append(runs, runSpec{n: largest, peers: true, stagger: true, rate: o.nodeRate})
	}
	if o.baseline {
		runs = append(runs, runSpec{n: largest, rate: o.nodeRate})
	}
	if o.noDigest {
		runs = append(runs, runSpec{n: largest, peers: true, noDigest: true, rate: o.nodeRate})
	}
	if o.slowRate > 0 {
		runs = append(runs, runSpec{n: 1, peers: true, rate: o.slowRate}, runSpec{n: largest, peers: true, rate: o.slowRate})
	}
	for i, r := range runs {
		if err := b.shape(r.rate); err != nil {
			return err
		}
		if r.slow {
			if err := b.net.setLinkRate(0, fmt.Sprintf("%dbit", 8*r.rate/o.slowOwner)); err != nil {
				return err
			}
		}
		res, err := b.runOnce(i, r)
		if err != nil {
			return fmt.Errorf("%d nodes: %w", r.n, err)
		}
		if r.slow {
			res.slow = res.uses[slices.IndexFunc(res.uses, func(u nodeUse) bool { return strings.HasSuffix(u.name, "-node0") })].name
			res.othersReady = 0
			for _, u := range res.uses {
				if u.name != res.slow {
					res.othersReady = max(res.othersReady, u.ready)
				}
			}
			if err := b.net.setLinkRate(0, fmt.Sprintf("%dbit", 8*r.rate)); err != nil {
				return err
			}
		}
		log.Printf("%d nodes, sharing %v: T = %s, origin sent %.2f× the model", r.n, r.peers, res.times[len(res.times)-1].Round(10*time.Millisecond),
			float64(res.originSent)/float64(o.modelBytes))
		results = append(results, res)
	}
	rep := report{o: o, results: results}
	fmt.Println(rep.markdown())
	if o.out == "" {
		return nil
	}
	return rep.write(o.out)
}

func (b *bench) setUp(tmp string) error {
	o := b.o
	build := exec.Command("go", "build", "-o", tmp+"/", "github.com/prewarm/prewarm/cmd/controller", "github.com/prewarm/prewarm/cmd/agent")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building the controller and the agent: %w", err)
	}
	b.agent = filepath.Join(tmp, "agent")
	var err error
	if b.net, err = newNetwork(slices.Max(o.nodes), fmt.Sprintf("%dbit", 8*o.nodeRate)); err != nil {
		return err
	}
	logs := filepath.Join(b.dir, "logs")
	if b.cluster, err = testutil.StartClusterWith(testutil.ClusterOptions{LogDir: logs}); err != nil {
		return err
	}
	ctx := context.Background()
	// The origin: versitygw on loopback, behind a proxy on the bridge with the origin's cap.
	s3, err := s3fixture.Start(filepath.Join(b.dir, "s3"))
	if err != nil {
		return err
	}
	b.cleanupS3 = s3.Stop
	if err := s3.CreateBucket(ctx, bucket); err != nil {
		return err
	}
	per := o.modelBytes / int64(o.files)
	for i := range o.files {
		n := per
		if i == o.files-1 {
			n = o.modelBytes - per*int64(o.files-1)
		}
		key := fmt.Sprintf("%s/model-%05d-of-%05d.safetensors", prefix, i+1, o.files)
		data := gen.Bytes(uint64(100+i), int(n))
		if err := s3.PutBytes(ctx, bucket, key, data); err != nil {
			return err
		}
		if o.noDigest {
			key := fmt.Sprintf("%s/model-%05d-of-%05d.safetensors", noDigestPrefix, i+1, o.files)
			if err := s3.PutMultipart(ctx, bucket, key, data, 8<<20); err != nil {
				return err
			}
		}
	}
	if b.origin, err = shaper.StartOn(b.net.hostIP()+":0", s3.Endpoint, shaper.Options{TotalBytesPerSecond: o.originRate}); err != nil {
		return err
	}
	b.rate = o.nodeRate
	if err := b.bridgeKubeconfig(ctx); err != nil {
		return err
	}
	for _, c := range []struct {
		path     *string
		disabled bool
	}{{&b.confPeers, false}, {&b.confAlone, true}} {
		op := config.OperatorConfiguration{CacheRoots: testutil.DirRoots(root),
			S3:           config.S3{Endpoint: b.origin.URL, PathStyle: true},
			SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: bucket}}},
			Agent:        config.Agent{ProgressInterval: metav1.Duration{Duration: time.Second}, Kubelet: testutil.NoKubelet()},
			Peers:        config.Peers{Disabled: c.disabled, Streams: o.streams, MaxPeers: o.maxPeers},
		}
		*c.path = filepath.Join(b.dir, fmt.Sprintf("config-%v.yaml", !c.disabled))
		if err := op.Write(*c.path); err != nil {
			return err
		}
	}
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY": s3fixture.SecretKey, "AWS_REGION": s3fixture.Region} {
		os.Setenv(k, v)
	}
	ctlArgs := []string{"--kubeconfig=" + b.cluster.KubeconfigPath, "--leader-elect=false", "--metrics-bind-address=0",
		"--health-probe-bind-address=0", "--config=" + b.confPeers}
	if o.witness {
		// On the bridge, where the namespaces reach it; a port free now (the bench runs alone).
		ln, err := net.Listen("tcp", b.net.hostIP()+":0")
		if err != nil {
			return err
		}
		addr := ln.Addr().String()
		ln.Close()
		ctlArgs = append(ctlArgs, "--witness-bind-address="+addr)
		b.witnessURL = "http://" + addr
	}
	p, err := testutil.StartProcess(logs, "controller", filepath.Join(tmp, "controller"), ctlArgs...)
	if err != nil {
		return err
	}
	b.procs = append(b.procs, p)
	return nil
}

// bridgeKubeconfig writes a kubeconfig that reaches the API server from the namespaces: through
// a forwarder on the bridge, with the server's certificate checked for its own name.
func (b *bench) bridgeKubeconfig(ctx context.Context) error {
	cfg, err := clientcmd.LoadFromFile(b.cluster.KubeconfigPath)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		target := strings.TrimPrefix(c.Server, "https://")
		addr, stop, err := forward(ctx, b.net.hostIP()+":0", target)
		if err != nil {
			return err
		}
		b.stops = append(b.stops, stop)
		c.Server, c.TLSServerName = "https://"+addr, "localhost"
	}
	b.kubeconfig = filepath.Join(b.dir, "kubeconfig-bridge")
	return clientcmd.WriteToFile(*cfg, b.kubeconfig)
}

func (b *bench) close() {
	for _, p := range slices.Backward(b.procs) {
		p.Stop(10 * time.Second)
	}
	for _, stop := range b.stops {
		stop()
	}
	if b.origin != nil {
		_ = b.origin.Close()
	}
	if b.cleanupS3 != nil {
		b.cleanupS3()
	}
	if b.cluster != nil {
		_ = b.cluster.Stop()
	}
	if b.net != nil {
		b.net.close()
	}
}

// shape sets every link to rate, and the origin to the same share of its own cap.
func (b *bench) shape(rate int64) error {
	if b.rate == rate {
		return nil
	}
	if err := b.net.setRate(fmt.Sprintf("%dbit", 8*rate)); err != nil {
		return err
	}
	b.origin.SetOptions(shaper.Options{TotalBytesPerSecond: b.o.originRate * rate / b.o.nodeRate})
	b.rate = rate
	return nil
}

// instanceType keeps each run's nodes apart: a run's cache selects its own nodes only (the
// nodes and agents of earlier runs stay; a run sharing their instance type would be asked for
// their cache too, and download two models at once).
func instanceType(run int) string { return fmt.Sprintf("ml.fanout-run%d.48xlarge", run) }

// runSpec is one run: n nodes, sharing or not, the model with digests or without, a stalled
// owner, a slow owner or nodes joining one by one, at a link rate.
type runSpec struct {
	n                                     int
	peers, noDigest, pause, slow, stagger bool
	rate                                  int64
}

// token writes, into the file named name, a token of the agents for audience bound to node, and
// returns its path.
func (b *bench) token(ctx context.Context, node, audience, name string) (string, error) {
	tok, err := testutil.NodePeerToken(ctx, b.cluster.Client, node, audience)
	if err != nil {
		return "", err
	}
	file := filepath.Join(b.dir, name)
	return file, os.WriteFile(file, []byte(tok), 0o600)
}

// lateType is the instance type of a staggered run's nodes until they are made targets.
const lateType = "ml.fanout-late.48xlarge"

// runOnce warms r.n nodes and measures it; with pause, the first node's agent is stopped for
// options.pause from options.pauseAt on; with stagger, node i is made a target i ×
// options.stagger after the cache's creation.
func (b *bench) runOnce(k int, r runSpec) (result, error) {
	n, peers, noDigest, pause := r.n, r.peers, r.noDigest, r.pause
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := b.cluster.Client
	itype := instanceType(k)
	conf := b.confPeers
	if !peers {
		conf = b.confAlone
	}
	var nodes []string
	var agents []*testutil.Process
	defer func() {
		for _, a := range agents {
			a.Stop(10 * time.Second)
		}
	}()
	logs := filepath.Join(b.dir, "logs")
	for i := range n {
		name := fmt.Sprintf("run%d-node%d", k, i)
		nodes = append(nodes, name)
		typ := itype
		if r.stagger && i > 0 {
			typ = lateType
		}
		if _, err := b.cluster.AddNode(ctx, name, testutil.NodeOptions{InstanceType: typ, GPUs: 8, InternalIP: b.net.nodeIP(i)}); err != nil {
			return result{}, err
		}
		disk := filepath.Join(b.dir, "nodes", name)
		if err := os.MkdirAll(filepath.Join(disk, root), 0o755); err != nil {
			return result{}, err
		}
		args := []string{"netns", "exec", b.net.namespace(i), b.agent, "--node-name=" + name, "--kubeconfig=" + b.kubeconfig,
			"--host-prefix=" + disk, "--config=" + conf, "--reserve=0", "--status-interval=250ms",
			fmt.Sprintf("--metrics-bind-address=%s:%d", b.net.nodeIP(i), metricsTCP), "--health-probe-bind-address=0",
			"--part-size=" + b.o.partSize, "--concurrency=" + strconv.Itoa(b.o.concurrency)}
		if peers {
			file, err := b.token(ctx, name, testutil.PeerAudience, "token-"+name)
			if err != nil {
				return result{}, err
			}
			addr := fmt.Sprintf("%s:%d", b.net.nodeIP(i), peerTCP)
			args = append(args, "--peer-bind-address="+addr, "--peer-address="+addr, "--peer-token-file="+file,
				"--peer-service-account="+testutil.PeerUser)
			if b.witnessURL != "" {
				file, err := b.token(ctx, name, config.DefaultWitnessAudience, "witness-token-"+name)
				if err != nil {
					return result{}, err
				}
				args = append(args, "--witness-url="+b.witnessURL, "--witness-token-file="+file)
			}
		}
		p, err := testutil.StartProcess(logs, "agent-"+name, "ip", args...)
		if err != nil {
			return result{}, err
		}
		agents = append(agents, p)
	}
	if peers {
		// The agents report where they serve before the cache exists, as a running fleet's do.
		if err := until(ctx, func() (bool, string) {
			for _, name := range nodes {
				nc := &prewarmv1alpha1.NodeCache{}
				if err := c.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil || nc.Status.PeerAddress == "" {
					return false, name + " reports no peer address"
				}
			}
			return true, ""
		}); err != nil {
			return result{}, err
		}
	}
	// What each node and the machine have used before the cache exists (the agents' metrics
	// serve once they have started).
	sample := func() ([]nodeSample, machineSample, error) {
		var nodes []nodeSample
		for i := range n {
			s, err := sampleNode(ctx, fmt.Sprintf("http://%s:%d/metrics", b.net.nodeIP(i), metricsTCP), b.net.hostLink(i))
			if err != nil {
				return nil, machineSample{}, err
			}
			nodes = append(nodes, s)
		}
		m, err := sampleMachine()
		return nodes, m, err
	}
	var before []nodeSample
	var machineBefore machineSample
	if err := until(ctx, func() (bool, string) {
		var err error
		if before, machineBefore, err = sample(); err != nil {
			return false, err.Error()
		}
		return true, ""
	}); err != nil {
		return result{}, err
	}
	sentBefore := b.origin.Served.Load()
	if b.o.trace {
		tctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			last := sentBefore
			links := func() (rx, tx []int64) {
				for i := range n {
					r, _ := linkCounter(b.net.hostLink(i), "tx_bytes") // the host end's transmit is the node's receive
					t, _ := linkCounter(b.net.hostLink(i), "rx_bytes")
					rx, tx = append(rx, r), append(tx, t)
				}
				return rx, tx
			}
			lastRx, lastTx := links()
			for t := time.NewTicker(time.Second); ; {
				select {
				case <-tctx.Done():
					return
				case <-t.C:
				}
				now := b.origin.Served.Load()
				rx, tx := links()
				var line strings.Builder
				for i := range n {
					fmt.Fprintf(&line, " %4.1f/%4.1f", float64(rx[i]-lastRx[i])/1e6, float64(tx[i]-lastTx[i])/1e6)
				}
				log.Printf("origin %.1f MB/s; nodes down/up MB/s:%s", float64(now-last)/1e6, line.String())
				last, lastRx, lastTx = now, rx, tx
			}
		}()
	}
	location := prefix
	if noDigest {
		location = noDigestPrefix
	}
	iec := builders.MakeInferenceEndpointConfig("default", fmt.Sprintf("fanout-%d", k)).Location(location).InstanceType(itype).Obj()
	iec.Spec.ModelSourceConfig.S3Storage.BucketName = bucket
	iec.Spec.ModelCacheConfig.ImageCache = nil
	start := time.Now()
	if err := c.Create(ctx, iec); err != nil {
		return result{}, err
	}
	if pause {
		resume := stopFor(ctx, agents[0], b.o.pauseAt, b.o.pause)
		defer resume()
	}
	var joined *joining
	if r.stagger {
		joined = b.join(ctx, start, nodes, itype)
	}
	ready := map[string]time.Duration{}
	var uid string
	err := until(ctx, func() (bool, string) {
		if uid == "" {
			m := &inferencev1.ModelDataCacheConfig{}
			if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: iec.Name + "-cache"}, m); err != nil {
				return false, err.Error()
			}
			uid = string(m.UID)
		}
		for _, name := range nodes {
			if _, ok := ready[name]; ok {
				continue
			}
			nc := &prewarmv1alpha1.NodeCache{}
			if err := c.Get(ctx, types.NamespacedName{Name: name}, nc); err != nil {
				continue
			}
			if rep, ok := nc.Report(uid); ok && rep.State == inferencev1.CacheReady {
				ready[name] = time.Since(start)
			}
		}
		for _, a := range agents {
			if done, err := a.Exited(); done {
				return false, fmt.Sprintf("%s exited (%v): %s", a.Name, err, a.LogTail(2000))
			}
		}
		return len(ready) == n, fmt.Sprintf("%d of %d nodes Ready", len(ready), n)
	})
	if err != nil {
		return result{}, err
	}
	res := result{nodes: n, peers: peers, noDigest: noDigest, witness: noDigest && peers && b.witnessURL != "", rate: b.rate, originSent: b.origin.Served.Load() - sentBefore}
	if r.stagger {
		res.joined = joined.wait()
	}
	if pause {
		res.paused = nodes[0]
		res.othersReady = slices.Max(slices.Collect(maps.Values(deleted(ready, nodes[0]))))
	}
	for _, d := range ready {
		res.times = append(res.times, d)
	}
	slices.Sort(res.times)
	after, machineAfter, err := sample()
	if err != nil {
		return result{}, err
	}
	res.machine = machineAfter.since(machineBefore)
	for i, name := range nodes {
		u := after[i].use(before[i], res.times[len(res.times)-1], b.rate)
		u.name, u.ready = name, ready[name]
		res.uses = append(res.uses, u)
		if name == res.paused {
			continue // its own parts stood still while it was stopped: the others' are the goal's
		}
		res.wait = res.wait.plus(after[i].wait.minus(before[i].wait))
		res.stall = res.stall.plus(after[i].stall.minus(before[i].stall))
	}
	slices.SortFunc(res.uses, func(a, b nodeUse) int { return cmp.Compare(a.ready, b.ready) })
	// The cache's status, once the controller has summed every node's report.
	m := &inferencev1.ModelDataCacheConfig{}
	_ = until(ctx, func() (bool, string) {
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: iec.Name + "-cache"}, m); err != nil {
			return false, err.Error()
		}
		return m.Status.ReadyNodes == int32(n) && m.Status.OriginBytes+m.Status.PeerBytes >= int64(n)*b.o.modelBytes, "status not summed yet"
	})
	res.status = m.Status
	return res, nil
}

// joining is when a staggered run's nodes were made targets; wait returns it once all were.
type joining struct {
	done chan struct{}
	at   map[string]time.Duration
}

func (j *joining) wait() map[string]time.Duration { <-j.done; return j.at }

// join makes nodes[i] (i ≥ 1) a target of the cache at i × options.stagger after start, by
// setting its instance-type label to itype, and records when each was.
func (b *bench) join(ctx context.Context, start time.Time, nodes []string, itype string) *joining {
	j := &joining{done: make(chan struct{}), at: map[string]time.Duration{nodes[0]: 0}}
	go func() {
		defer close(j.done)
		for i, name := range nodes[1:] {
			t := time.NewTimer(time.Until(start.Add(time.Duration(i+1) * b.o.stagger)))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, inferencev1.InstanceTypeLabel, itype)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := b.cluster.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
				log.Printf("making %s a target: %v", name, err)
				continue
			}
			j.at[name] = time.Since(start)
		}
	}()
	return j
}

// stopFor stops agent (SIGSTOP: it neither reads, serves nor answers, its connections left open,
// as a node that hangs) at after, and lets it go on (SIGCONT) pause later, or when resume is
// called.
func stopFor(ctx context.Context, agent *testutil.Process, after, pause time.Duration) (resume func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-time.After(after):
		case <-ctx.Done():
			return
		}
		if err := syscall.Kill(agent.Pid(), syscall.SIGSTOP); err != nil {
			log.Printf("stopping %s: %v", agent.Name, err)
			return
		}
		log.Printf("%s stopped for %s", agent.Name, pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		_ = syscall.Kill(agent.Pid(), syscall.SIGCONT)
		log.Printf("%s goes on", agent.Name)
	}()
	return func() {
		cancel()
		<-done
	}
}

// deleted is m without key.
func deleted[K comparable, V any](m map[K]V, key K) map[K]V {
	out := maps.Clone(m)
	delete(out, key)
	return out
}

// until polls cond every 100 ms until it holds or ctx ends.
func until(ctx context.Context, cond func() (bool, string)) error {
	last := ""
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
