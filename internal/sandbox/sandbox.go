// Package sandbox runs the whole of prewarm on one machine: a real control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) with kwok nodes, a local S3 server
// holding a generated model, a Hugging Face Hub stand-in for the JumpStart path, the controller
// and one agent process per node; it applies the seed's two manifests, shows per-node progress,
// then scales the endpoint and measures warm and cold pods.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/csikubelet"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/pkg/engine"
)

// Options configure a sandbox.
type Options struct {
	// Dir holds everything the sandbox makes: logs, the kubeconfig, the nodes' disks, S3's data.
	Dir string
	// BinDir holds the controller and agent binaries.
	BinDir string
	// ModelSize is the size of the generated model behind the InferenceEndpointConfig.
	ModelSize int64
	// Nodes is the number of simulated nodes at the start: all ml.g5.24xlarge but one
	// ml.g5.xlarge (2-5; default 4). A node without the cache joins later.
	Nodes int
	// Exit stops after the measurement instead of staying up.
	Exit bool
	// Out receives what the sandbox shows.
	Out io.Writer
	// Interval is the time between two progress displays.
	Interval time.Duration
	// Kind is the kind of nodes (KindReal or KindKwok; see ResolveKind).
	Kind string
	// Status renders the parents' status (kubectl-prewarm status) from a kubeconfig, and says
	// whether every parent is ready.
	Status func(ctx context.Context, kubeconfig string) (text string, ready bool, err error)
}

const (
	bucket     = "example-bucket"
	prefix     = "models/example-model"
	root       = "/opt/dlami/nvme"
	opNS       = "hyperpod-inference-system"
	llamaRepo  = "meta-llama/Llama-3.1-8B-Instruct"
	hubToken   = "hf_sandbox"
	pidFile    = "sandbox.pid"
	coldNode   = "g5-cold"
	replicas   = 5
	agentImage = "prewarm/agent:sandbox"
)

// sandbox is a running sandbox.
type sandbox struct {
	o       Options
	logs    string
	cluster *testutil.Cluster
	s3      *s3fixture.Server
	// s3Sent counts what S3 sends the agents of the first nodes.
	s3Sent *shaper.Proxy
	hub    *hubfixture.Hub
	procs  []*testutil.Process
	files  map[string]int64             // the model's files and sizes
	real   *realseed.Env                // the real-node run (Kind real)
	op     config.OperatorConfiguration // the operator configuration of the kwok run
}

// step is one step of the sandbox.
type step struct {
	name string
	run  func(context.Context) error
}

// Up runs the sandbox. It returns when ctx ends (Ctrl-C, or `sandbox down`), or, with Exit, after
// the measurement; it removes what it made on the way out, except the logs after a failure.
func Up(ctx context.Context, o Options) (err error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.Nodes == 0 {
		o.Nodes = 4
	}
	if o.Nodes < 2 || o.Nodes > replicas {
		return fmt.Errorf("--nodes %d: want 2 to %d (at least one ml.g5.24xlarge node and the ml.g5.xlarge one; at most as many as leave a pod for the node that joins)", o.Nodes, replicas)
	}
	if o.ModelSize < 4<<20 {
		return fmt.Errorf("--model-size %d: at least 4MiB", o.ModelSize)
	}
	if _, err := os.Stat(o.Dir); err == nil {
		return fmt.Errorf("%s exists: is a sandbox running? stop it with `prewarm-sandbox down` (or remove the folder)", o.Dir)
	}
	// Real nodes run the controller and agent from their images; kwok nodes from BinDir.
	for _, b := range kwokBinaries(o.Kind) {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("%s is not in %s: run `make build` (or pass --bin-dir)", b, o.BinDir)
		}
	}
	s := &sandbox{o: o, logs: filepath.Join(o.Dir, "logs")}
	if err := os.MkdirAll(s.logs, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	s.say("prewarm sandbox in %s (logs in %s)", o.Dir, s.logs)
	defer func() {
		s.stop()
		if err != nil && !errors.Is(err, context.Canceled) {
			_ = os.Remove(filepath.Join(o.Dir, pidFile))
			s.say("stopped; the logs are kept in %s", s.logs)
			return
		}
		if rerr := os.RemoveAll(o.Dir); rerr != nil && err == nil {
			err = rerr
		}
		s.say("stopped; removed %s", o.Dir)
	}()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go s.watchdog(ctx, cancel)
	steps := []step{
		{"start the control plane and kwok nodes", s.startCluster},
		{"start S3 with a generated model, and a Hugging Face Hub stand-in", s.startSources},
		{"start the controller and one agent per node", s.startPrewarm},
		{"apply the seed's two manifests unchanged", s.applySeed},
		{"wait until both are ready", s.waitReady},
		{"scale the endpoint to 5 replicas and measure each pod's weights", s.measure},
	}
	if o.Kind == KindReal {
		steps = s.realSteps()
	}
	for i, st := range steps {
		s.say("[%d/%d] %s", i+1, len(steps), st.name)
		if err := st.run(ctx); err != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				err = cause
			}
			return fmt.Errorf("%s: %w", st.name, err)
		}
	}
	if o.Exit {
		return nil
	}
	s.say("\nThe sandbox is up. %s\nStop it with Ctrl-C or `prewarm-sandbox down`.", s.explore())
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// Down stops the sandbox running from dir and waits until it has cleaned up.
func Down(dir string, out io.Writer) error {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(dir); serr == nil {
			fmt.Fprintf(out, "no sandbox runs from %s; removing what is left there\n", dir)
			return os.RemoveAll(dir)
		}
		fmt.Fprintf(out, "no sandbox in %s\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, pidFile), err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		fmt.Fprintf(out, "the sandbox process %d is gone (%v); removing %s\n", pid, err, dir)
		return os.RemoveAll(dir)
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			fmt.Fprintf(out, "sandbox stopped (process %d)\n", pid)
			return nil
		}
	}
	return fmt.Errorf("the sandbox process %d did not stop within 2 minutes", pid)
}

func kwokBinaries(kind string) []string {
	if kind == KindReal {
		return nil
	}
	return []string{"controller", "agent"}
}

// warmNodes is how many ml.g5.24xlarge nodes there are at the start (each gets an agent).
func (s *sandbox) warmNodes() int { return s.o.Nodes - 1 }

func (s *sandbox) say(format string, args ...any) { fmt.Fprintf(s.o.Out, format+"\n", args...) }

func (s *sandbox) kubeconfig() string { return filepath.Join(s.o.Dir, "kubeconfig") }

// watchdog ends the sandbox when one of its processes dies, naming it and its log.
func (s *sandbox) watchdog(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.cluster != nil {
			if err := s.cluster.CheckProcesses(); err != nil {
				cancel(err)
				return
			}
		}
		for _, p := range s.procs {
			if done, err := p.Exited(); done {
				status := "exit status 0"
				if err != nil {
					status = err.Error()
				}
				cancel(fmt.Errorf("%s exited (%s); its log is %s:\n%s", p.Name, status, p.LogPath, p.LogTail(2000)))
				return
			}
		}
	}
}

func (s *sandbox) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].Stop(10 * time.Second)
	}
	if s.cluster != nil {
		_ = s.cluster.Stop()
	}
	if s.s3Sent != nil {
		_ = s.s3Sent.Close()
	}
	if s.s3 != nil {
		s.s3.Stop()
	}
	if s.hub != nil {
		s.hub.Close()
	}
	if s.real != nil {
		if err := s.real.Stop(); err != nil {
			s.say("stopping the real nodes: %v", err)
		}
	}
}

func (s *sandbox) startCluster(ctx context.Context) error {
	c, err := testutil.StartClusterWith(testutil.ClusterOptions{LogDir: s.logs})
	if err != nil {
		return err
	}
	s.cluster = c
	kc, err := os.ReadFile(c.KubeconfigPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.kubeconfig(), kc, 0o600); err != nil {
		return err
	}
	for i := 1; i <= s.warmNodes(); i++ {
		if err := s.addNode(ctx, fmt.Sprintf("g5-%d", i), "ml.g5.24xlarge", 4); err != nil {
			return err
		}
	}
	return s.addNode(ctx, "g5x-1", "ml.g5.xlarge", 1)
}

func (s *sandbox) addNode(ctx context.Context, name, instanceType string, gpus int64) error {
	if _, err := s.cluster.AddNode(ctx, name, testutil.NodeOptions{InstanceType: instanceType, GPUs: gpus}); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(s.o.Dir, "nodes", name, root), 0o755)
}

func (s *sandbox) startSources(ctx context.Context) error {
	srv, err := s3fixture.StartLogged(filepath.Join(s.o.Dir, "s3"), filepath.Join(s.logs, "versitygw.log"))
	if err != nil {
		return err
	}
	s.s3 = srv
	if err := srv.CreateBucket(ctx, bucket); err != nil {
		return err
	}
	// A model shaped like a real one: config files and four safetensors shards.
	s.files = map[string]int64{"config.json": 0, "tokenizer.json": 2 << 20, "generation_config.json": 0}
	shard := (s.o.ModelSize - 2<<20) / 4
	for i := 1; i <= 4; i++ {
		s.files[fmt.Sprintf("model-%05d-of-00004.safetensors", i)] = shard
	}
	var seed uint64
	for name, size := range s.files {
		seed++
		if size == 0 {
			body := []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama"}`)
			s.files[name] = int64(len(body))
			if err := srv.PutBytes(ctx, bucket, prefix+"/"+name, body); err != nil {
				return err
			}
			continue
		}
		if err := srv.Put(ctx, bucket, prefix+"/"+name, io.LimitReader(gen.Reader(seed), size), size); err != nil {
			return err
		}
	}
	s.say("  s3://%s/%s: %d files, %s, at %s", bucket, prefix, len(s.files), engine.HumanBytes(s.modelBytes()), srv.Endpoint)

	s.hub = hubfixture.Start()
	commit := s.hub.AddCommit(llamaRepo, "main", map[string][]byte{
		"config.json":       []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"model.safetensors": gen.Bytes(7, 12<<20),
		"tokenizer.json":    gen.Bytes(8, 1<<20),
	})
	s.hub.SetGated(llamaRepo, hubToken)
	s.say("  Hugging Face Hub stand-in at %s: %s@%s (gated)", s.hub.URL, llamaRepo, commit[:12])
	return s.writeCatalog(ctx, commit)
}

func (s *sandbox) modelBytes() int64 {
	var n int64
	for _, size := range s.files {
		n += size
	}
	return n
}

// writeCatalog makes the operator namespace, a JumpStart catalog that points the seed's model at
// the Hub stand-in, and the token Secret the seed's namespace needs for it.
func (s *sandbox) writeCatalog(ctx context.Context, commit string) error {
	c := s.cluster.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}}); err != nil {
		return err
	}
	// The catalog's JumpStart pod asks for no GPU, so it does not take one the endpoint's pods need.
	cm := builders.JumpStartCatalog(opNS, llamaRepo, commit)
	if err := c.Create(ctx, cm); err != nil {
		return err
	}
	return c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hf-token"},
		Data: map[string][]byte{"token": []byte(hubToken)}})
}

// startAgent starts node n's agent with the configuration conf. It serves prewarm's CSI node
// plugin under the node's kubelet directory, which the sandbox drives as the kubelet would.
func (s *sandbox) startAgent(ctx context.Context, n, conf string) error {
	// Each agent serves its parts to the others on a loopback port, with a token of the
	// agents' service account, as in a cluster.
	peerArgs, err := testutil.PeerArgs(ctx, s.cluster.Client, n, s.o.Dir)
	if err != nil {
		return err
	}
	return s.start("agent-"+n, "agent", slices.Concat([]string{"--node-name=" + n, "--kubeconfig=" + s.kubeconfig(),
		"--host-prefix=" + filepath.Join(s.o.Dir, "nodes", n), "--config=" + conf, "--reserve=0",
		"--status-interval=500ms", "--metrics-bind-address=0", "--health-probe-bind-address=0"},
		peerArgs, csikubelet.AgentArgs(s.kubeletDir(n), 5*time.Second))...)
}

// kubeletDir is node n's kubelet directory.
func (s *sandbox) kubeletDir(n string) string {
	return filepath.Join(s.o.Dir, "nodes", n, "var/lib/kubelet")
}

func (s *sandbox) start(name, bin string, args ...string) error {
	p, err := testutil.StartProcess(s.logs, name, filepath.Join(s.o.BinDir, bin), args...)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	return nil
}

func (s *sandbox) startPrewarm(ctx context.Context) error {
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY": s3fixture.SecretKey} {
		if err := os.Setenv(k, v); err != nil {
			return err
		}
	}
	// One operator configuration for the controller and every agent, as the prewarm-config
	// ConfigMap is in a cluster.
	conf := filepath.Join(s.o.Dir, "config.yaml")
	// The agents read S3 through a byte counter: the nodes warming the seed's cache together
	// share its parts, and S3 sends about one model for them all.
	var err error
	if s.s3Sent, err = shaper.Start(s.s3.Endpoint, shaper.Options{}); err != nil {
		return err
	}
	op := config.OperatorConfiguration{
		CacheRoots:  testutil.DirRoots(root),
		S3:          config.S3{Endpoint: s.s3Sent.URL, PathStyle: true},
		HuggingFace: config.HuggingFace{Endpoint: s.hub.URL},
		// The seed's bucket is read with the agents' own identity, for every namespace.
		SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: bucket}}},
		// Progress every second, to watch on a small cluster.
		Agent: config.Agent{ProgressInterval: metav1.Duration{Duration: time.Second}, Kubelet: testutil.NoKubelet()},
	}
	if err := op.Write(conf); err != nil {
		return err
	}
	if err := s.start("controller", "controller", "--kubeconfig="+s.kubeconfig(), "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--config="+conf, "--gate-timeout=10m",
		"--agent-image="+agentImage); err != nil {
		return err
	}
	nodes := []string{"g5x-1"}
	for i := 1; i <= s.warmNodes(); i++ {
		nodes = append(nodes, fmt.Sprintf("g5-%d", i))
	}
	s.op = op
	for _, n := range nodes {
		if err := s.startAgent(ctx, n, conf); err != nil {
			return err
		}
	}
	// As a DaemonSet's rollout is waited for: each agent up, saying where it serves its parts,
	// before the seed's caches are asked of the nodes.
	err = testutil.Until(ctx, time.Minute, func() error {
		for _, n := range nodes {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := s.cluster.Client.Get(ctx, types.NamespacedName{Name: n}, nc); err != nil || nc.Status.PeerAddress == "" {
				return fmt.Errorf("the agent of %s has not reported yet", n)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.say("  controller and %d agents started; each node's disk is %s/nodes/<node>%s", len(nodes), s.o.Dir, root)
	return nil
}

func (s *sandbox) applySeed(ctx context.Context) error {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	return realseed.CreateSeed(ctx, s.cluster.Client, root, func(format string, args ...any) { s.say("  "+format, args...) })
}
