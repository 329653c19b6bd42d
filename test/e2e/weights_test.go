package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/ports"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/test/compat/hyperpodstatus"
)

const root = "/opt/dlami/nvme"

// weightsEnv is the whole system: a cluster with kwok nodes, the controller, and one agent
// process per node, each with its own directory standing in for the node's NVMe.
type weightsEnv struct {
	t        *testing.T
	ctx      context.Context
	cluster  *testutil.Cluster
	c        client.Client
	nodes    string // nodes/<name> is a node's filesystem
	logDir   string
	agents   map[string]*testutil.Process
	restarts map[string]int
	procs    []*testutil.Process
	// hfEndpoint, when set, is the Hugging Face Hub the agents use.
	hfEndpoint string
	// fsx are the FSx file systems the configuration maps to mounts.
	fsx []config.FSxMount
	// agentEnv is added to the environment of a node's agent.
	agentEnv map[string][]string
	// configure, when set, changes the operator configuration the controller and agents read.
	configure func(*config.OperatorConfiguration)
	// statuses checks every status the controller writes of a parent, until checkStatuses.
	statuses *hyperpodstatus.Watch
}

// checkStatuses stops checking the parents' statuses and fails the test on any that HyperPod's
// clients would not read; a test that deletes prewarm's CRDs calls it first.
func (e *weightsEnv) checkStatuses() {
	if e.statuses == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, problems := e.statuses.Stop(ctx)
	e.statuses = nil
	for _, p := range problems {
		e.t.Errorf("a status HyperPod's clients would not read: %s", p)
	}
}

func (e *weightsEnv) nodeRoot(node string) string { return filepath.Join(e.nodes, node, root) }

// cacheDir is where node holds cache uid's model; its parent, the cache's own directory, is
// all that the cache's pods mount.
func (e *weightsEnv) cacheDir(node, uid string) string {
	return prewarmv1alpha1.ModelDir(e.nodeRoot(node), uid)
}

func s3Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3fixture.SecretKey}
}

// startController starts the controller binary with args.
func (e *weightsEnv) startController(args ...string) {
	e.startEnv("controller", controllerPath, nil, args...)
}

// startEnv starts a process with env added to the test's environment.
func (e *weightsEnv) startEnv(name, path string, env []string, args ...string) *testutil.Process {
	e.t.Helper()
	p, err := testutil.StartProcessEnv(e.logDir, name, path, env, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.procs = append(e.procs, p)
	return p
}

// addNode adds a kwok node and starts its agent, reaching S3 at endpoint.
func (e *weightsEnv) addNode(name, instanceType, endpoint string, agentArgs ...string) {
	e.t.Helper()
	if _, err := e.cluster.AddNode(e.ctx, name, testutil.NodeOptions{InstanceType: instanceType, GPUs: 4}); err != nil {
		e.t.Fatal(err)
	}
	if err := os.MkdirAll(e.nodeRoot(name), 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.startAgent(name, endpoint, agentArgs...)
}

// noSharing is the agent flag that turns sharing parts off on one node.
const noSharing = "--peer-bind-address=0"

func (e *weightsEnv) startAgent(name, endpoint string, extra ...string) {
	e.t.Helper()
	args := append([]string{
		"--node-name=" + name, "--kubeconfig=" + e.cluster.KubeconfigPath,
		"--host-prefix=" + filepath.Join(e.nodes, name), "--config=" + e.config(endpoint), "--reserve=0",
		"--status-interval=250ms", "--retry-interval=1s", "--recheck-interval=1s",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--part-size=2MiB", "--concurrency=8",
	}, extra...)
	peerArgs, err := testutil.PeerArgs(e.ctx, e.c, name, e.logDir)
	if err != nil {
		e.t.Fatal(err)
	}
	args = append(peerArgs, args...)
	logName := "agent-" + name
	if n := e.restarts[name]; n > 0 {
		logName += fmt.Sprintf("-%d", n)
	}
	e.restarts[name]++
	e.agents[name] = e.startEnv(logName, agentPath, e.agentEnv[name], args...)
}

func (e *weightsEnv) check() {
	e.t.Helper()
	for _, p := range e.procs {
		if done, err := p.Exited(); done && p != nil && !strings.Contains(p.Name, "killed") && !strings.Contains(p.Name, "stopped") {
			e.t.Fatalf("%s exited (%v):\n%s", p.Name, err, p.LogTail(3000))
		}
	}
	if err := e.cluster.CheckProcesses(); err != nil {
		e.t.Fatal(err)
	}
}

// eventually polls cond until it holds; on timeout it fails with cond's last word.
func (e *weightsEnv) eventually(timeout time.Duration, what string, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := testutil.Eventually(e.ctx, timeout, func() (bool, error) {
		ok, why := cond()
		last = why
		return ok, nil
	})
	if err != nil {
		e.check()
		e.t.Fatalf("%s: %v; last: %s", what, err, last)
	}
}

func (e *weightsEnv) mdcc(name string) (*inferencev1.ModelDataCacheConfig, error) {
	m := &inferencev1.ModelDataCacheConfig{}
	return m, e.c.Get(e.ctx, types.NamespacedName{Namespace: "default", Name: name}, m)
}

// waitCache waits until the named cache is Ready with n target and ready nodes.
func (e *weightsEnv) waitCache(name string, n int32) *inferencev1.ModelDataCacheConfig {
	e.t.Helper()
	var m *inferencev1.ModelDataCacheConfig
	e.eventually(90*time.Second, "cache "+name+" Ready", func() (bool, string) {
		var err error
		if m, err = e.mdcc(name); err != nil {
			return false, err.Error()
		}
		st := m.Status
		return st.State == inferencev1.CacheReady && st.TargetNodes == n && st.ReadyNodes == n,
			fmt.Sprintf("state %s target %d ready %d nodes %+v", st.State, st.TargetNodes, st.ReadyNodes, st.Nodes)
	})
	return m
}

// labelled lists the nodes that carry label key.
func (e *weightsEnv) labelled(key string) []string {
	nodes := &corev1.NodeList{}
	if err := e.c.List(e.ctx, nodes); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, n := range nodes.Items {
		if n.Labels[key] == inferencev1.LabelTrue {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out
}

// assertTree checks that dir holds exactly files (plus the manifest), byte for byte.
func assertTree(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(files)+1 {
		t.Errorf("%s holds %d entries, want %d files and the manifest", dir, len(entries), len(files))
	}
	for p, data := range files {
		got, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: differs from the source (%v)", filepath.Join(dir, p), err)
		}
	}
}

// entries lists what a node holds under <root>/prewarm.
func (e *weightsEnv) entries(node string) []string {
	list, err := os.ReadDir(filepath.Join(e.nodeRoot(node), "prewarm"))
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	var out []string
	for _, d := range list {
		out = append(out, d.Name())
	}
	return out
}

func applySeed(t *testing.T, c client.Client) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "inference-endpoint-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), u); err != nil {
		t.Fatalf("applying the seed's inference-endpoint-config.yaml: %v", err)
	}
}

// freeAddr is a loopback address free now, for a process to bind later (ports.Free).
func freeAddr(t *testing.T) string {
	port, err := ports.Free("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func httpGet(u string) (string, error) {
	resp, err := http.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", u, resp.Status)
	}
	return string(b), err
}

func condition(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// newEnv starts a cluster (with opts) for the test, and cleans everything up after it.
// config writes the operator configuration the controller and the agents read: the test's
// cache root, the S3 endpoint given, the env's Hugging Face Hub and FSx mounts.
func (e *weightsEnv) config(s3Endpoint string) string {
	op := config.OperatorConfiguration{CacheRoots: testutil.DirRoots(root), FSx: e.fsx,
		SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: bucket}}},
		// Progress at every status tick: the tests act at points of a download.
		Agent: config.Agent{ProgressInterval: metav1.Duration{Duration: 250 * time.Millisecond}, Kubelet: testutil.NoKubelet()}}
	if s3Endpoint != "" {
		op.S3 = config.S3{Endpoint: s3Endpoint, PathStyle: true, CredentialsSecret: "prewarm-s3"}
	}
	op.HuggingFace.Endpoint = e.hfEndpoint
	if e.configure != nil {
		e.configure(&op)
	}
	return testutil.OperatorConfig(e.t, op)
}

func newEnv(t *testing.T, opts testutil.ClusterOptions) *weightsEnv {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	cluster, err := testutil.StartClusterWith(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Error(err)
		}
	})
	e := &weightsEnv{t: t, ctx: ctx, cluster: cluster, c: cluster.Client, nodes: t.TempDir(), logDir: t.TempDir(),
		agents: map[string]*testutil.Process{}, restarts: map[string]int{}, agentEnv: map[string][]string{}}
	t.Cleanup(func() {
		for _, p := range e.procs {
			p.Stop(5 * time.Second)
		}
		if t.Failed() {
			for _, p := range e.procs {
				t.Logf("--- %s (%s):\n%s", p.Name, p.LogPath, p.LogTail(2500))
			}
		}
	})
	// Every status the controller writes of every parent, while the test runs, must be one
	// HyperPod's clients read; checked when the test ends, before the cluster stops.
	if e.statuses, err = hyperpodstatus.StartWatch(cluster.Config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.checkStatuses)
	for _, kv := range s3Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return e
}

func TestWeightsCacheEndToEnd(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx, cluster := e.ctx, e.cluster

	for _, n := range []string{"g5-a", "g5-b", "g5-c"} {
		e.addNode(n, "ml.g5.24xlarge", s3srv.Endpoint)
	}
	e.addNode("small-a", "ml.g5.xlarge", s3srv.Endpoint)
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	e.startController(
		"--kubeconfig="+cluster.KubeconfigPath, "--leader-elect", "--leader-election-namespace=default",
		"--metrics-bind-address="+metricsAddr, "--health-probe-bind-address="+probeAddr,
		"--config="+e.config(s3srv.Endpoint), "--gate-timeout=3m", "--retention=10m", "--agent-image=prewarm/agent:e2e")

	// The Deployment must not exist before the cache is Ready on all three nodes. Read the
	// Deployment first, then the cache: readyNodes only grows here, so a Deployment seen with a
	// cache short of 3 was created early.
	var early atomic.Value
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for watchCtx.Err() == nil {
			dep := &appsv1.Deployment{}
			if err := e.c.Get(watchCtx, types.NamespacedName{Namespace: "default", Name: "example-model"}, dep); err == nil {
				if m, err := e.mdcc("example-model-cache"); err == nil && m.Status.ReadyNodes < 3 {
					early.Store(fmt.Sprintf("Deployment existed while the cache had %d ready nodes", m.Status.ReadyNodes))
				}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	applySeed(t, e.c)
	var uid string
	t.Run("seed manifest warms the three ml.g5.24xlarge nodes", func(t *testing.T) {
		m := e.waitCache("example-model-cache", 3)
		uid = string(m.UID)
		for _, n := range []string{"g5-a", "g5-b", "g5-c"} {
			assertTree(t, e.cacheDir(n, uid), model)
		}
		if got := e.entries("small-a"); len(got) != 0 {
			t.Errorf("the ml.g5.xlarge node holds %v, want nothing", got)
		}
		if got, want := e.labelled(inferencev1.WeightsCacheReadyLabel(uid)), []string{"g5-a", "g5-b", "g5-c"}; !slices.Equal(got, want) {
			t.Errorf("label %s on %v, want %v", inferencev1.WeightsCacheReadyLabel(uid), got, want)
		}
		if m.Status.TotalBytes != total {
			t.Errorf("totalBytes = %d, want %d", m.Status.TotalBytes, total)
		}
		if ref := metav1.GetControllerOf(m); ref == nil || ref.Kind != "InferenceEndpointConfig" || ref.Name != "example-model" {
			t.Errorf("cache controller = %+v, want the InferenceEndpointConfig", ref)
		}

		dep := &appsv1.Deployment{}
		e.eventually(30*time.Second, "Deployment created", func() (bool, string) {
			err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, dep)
			return err == nil, fmt.Sprint(err)
		})
		stopWatch()
		<-watchDone
		if v := early.Load(); v != nil {
			t.Error(v)
		}
		tmpl := dep.Spec.Template.Spec
		pref := tmpl.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
		if len(pref) == 0 || pref[0].Weight != 100 || pref[0].Preference.MatchExpressions[0].Key != inferencev1.WeightsCacheReadyLabel(uid) {
			t.Errorf("preferred affinity = %+v, want weight 100 to the cache label", pref)
		}
		req := tmpl.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		if req == nil || req.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "ml.g5.24xlarge" {
			t.Errorf("required affinity = %+v, want the instance type", req)
		}
		for _, term := range req.NodeSelectorTerms {
			for _, r := range term.MatchExpressions {
				if strings.HasPrefix(r.Key, inferencev1.WeightsCacheReadyLabelPrefix) {
					t.Errorf("the cache label is required, want only preferred: %+v", r)
				}
			}
		}
		if len(tmpl.InitContainers) != 0 {
			t.Errorf("init containers = %+v, want none: the model is prewarm's CSI volume", tmpl.InitContainers)
		}
		w := tmpl.Containers[0]
		if w.Image != "vllm/vllm-openai:latest" || w.Ports[0].ContainerPort != 8000 || !w.Resources.Limits["nvidia.com/gpu"].Equal(resource.MustParse("4")) {
			t.Errorf("worker = %+v", w)
		}
		if !slices.ContainsFunc(w.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == "/opt/ml/model" && v.ReadOnly }) {
			t.Errorf("worker mounts = %+v, want the model at /opt/ml/model", w.VolumeMounts)
		}
		// The pods see their own cache and nothing else of the node: no host directory, only
		// prewarm's read-only CSI volume naming this cache.
		if len(tmpl.Volumes) != 1 || tmpl.Volumes[0].CSI == nil || tmpl.Volumes[0].CSI.Driver != prewarmv1alpha1.CSIDriverName ||
			tmpl.Volumes[0].CSI.VolumeAttributes[prewarmv1alpha1.VolumeAttributeCacheUID] != uid {
			t.Errorf("pod volumes %+v, want only prewarm's CSI volume of cache %s", tmpl.Volumes, uid)
		}
		svc := &corev1.Service{}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, svc); err != nil || svc.Spec.Ports[0].Port != 8000 {
			t.Errorf("Service: %v %+v", err, svc.Spec.Ports)
		}
		iec := &inferencev1.InferenceEndpointConfig{}
		e.eventually(30*time.Second, "parent status", func() (bool, string) {
			if err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, iec); err != nil {
				return false, err.Error()
			}
			g := condition(iec.Status.Conditions, inferencev1.ConditionGated)
			ws := condition(iec.Status.Conditions, inferencev1.ConditionWeightsCacheReady)
			return g.Status == metav1.ConditionFalse && g.Reason == inferencev1.ReasonGateOpen && ws.Status == metav1.ConditionTrue &&
					strings.HasPrefix(ws.Message, fmt.Sprintf("weights cache %s %s: all 3 target nodes hold the cache", "example-model-cache", inferencev1.CacheReady)),
				fmt.Sprintf("%+v", iec.Status)
		})
		// An HPA (or kubectl scale) scales the parent through /scale; the Deployment follows and
		// the parent reports the pods.
		scale := &autoscalingv1.Scale{}
		// The controller writes the parent's status meanwhile: an HPA retries on a conflict too.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := e.c.SubResource("scale").Get(ctx, iec, scale); err != nil {
				return err
			}
			scale.Spec.Replicas = 2
			return e.c.SubResource("scale").Update(ctx, iec, client.WithSubResourceBody(scale))
		})
		if err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "scaled to 2", func() (bool, string) {
			if err := e.c.SubResource("scale").Get(ctx, iec, scale); err != nil {
				return false, err.Error()
			}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
				return false, err.Error()
			}
			return *dep.Spec.Replicas == 2 && scale.Status.Replicas == 2 && scale.Status.Selector == "prewarm.io/endpoint-uid="+string(iec.UID),
				fmt.Sprintf("deployment %d, scale status %+v", *dep.Spec.Replicas, scale.Status)
		})
		// The pods land on warm nodes and run (kwok).
		e.eventually(60*time.Second, "inference pods running on warm nodes", func() (bool, string) {
			pods := &corev1.PodList{}
			if err := e.c.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"prewarm.io/endpoint-uid": string(iec.UID)}); err != nil {
				return false, err.Error()
			}
			running := 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && slices.Contains([]string{"g5-a", "g5-b", "g5-c"}, p.Spec.NodeName) {
					running++
				}
			}
			return running == 2, fmt.Sprintf("%d pods, %d running on warm nodes", len(pods.Items), running)
		})
	})
	if t.Failed() {
		return
	}

	t.Run("the controller serves health probes and metrics", func(t *testing.T) {
		for _, u := range []string{"http://" + probeAddr + "/healthz", "http://" + probeAddr + "/readyz"} {
			if body, err := httpGet(u); err != nil || body != "ok" {
				t.Errorf("%s: %q, %v", u, body, err)
			}
		}
		body, err := httpGet("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`controller_runtime_reconcile_total{controller="weightscache",result="success"}`,
			`controller_runtime_reconcile_total{controller="endpoint",result="success"}`} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
		lease := &coordinationv1.Lease{}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "prewarm-controller.prewarm.io"}, lease); err != nil || lease.Spec.HolderIdentity == nil {
			t.Errorf("leader election Lease: %v %+v", err, lease.Spec)
		}
	})

	t.Run("agent prepare links on a warm node and downloads on a cold one", func(t *testing.T) {
		proxy, err := shaper.Start(s3srv.Endpoint, shaper.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer proxy.Close()
		prepare := func(cacheDir, dest string) string {
			cmd := exec.CommandContext(ctx, agentPath, "prepare", "--cache-dir="+cacheDir, "--dest="+dest,
				"--s3-bucket="+bucket, "--s3-prefix="+prefix, "--region=us-west-2", "--s3-endpoint="+proxy.URL, "--s3-path-style")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("agent prepare: %v\n%s", err, out)
			}
			return string(out)
		}
		warm := filepath.Join(t.TempDir(), "model")
		out := prepare(e.cacheDir("g5-a", uid), warm)
		if !strings.Contains(out, "warm") {
			t.Errorf("warm prepare said %q", out)
		}
		if n := proxy.Requests.Load(); n != 0 {
			t.Errorf("warm prepare sent %d requests to S3, want 0", n)
		}
		// Every file is a link into the cache: nothing is copied, so the time does not grow
		// with the model's size.
		var linkedBytes int64
		for p, data := range model {
			path := filepath.Join(warm, p)
			info, err := os.Lstat(path)
			if err != nil || info.Mode()&os.ModeSymlink == 0 {
				t.Errorf("%s is not a link (%v)", p, err)
				continue
			}
			linkedBytes += info.Size()
			if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
				t.Errorf("%s reads differently from the source (%v)", p, err)
			}
		}
		if linkedBytes > 4096 {
			t.Errorf("the warm tree takes %d bytes of links; want a few hundred, whatever the model's size (%d)", linkedBytes, total)
		}

		cold := filepath.Join(t.TempDir(), "model")
		out = prepare(e.cacheDir("small-a", uid), cold)
		if !strings.Contains(out, "cold") {
			t.Errorf("cold prepare said %q", out)
		}
		assertTree(t, cold, model)
		if served := proxy.Served.Load(); served < total {
			t.Errorf("cold prepare read %d bytes from S3, want the model's %d", served, total)
		}
	})

	// The node that joins reaches S3 through a slow link, so its download can be interrupted.
	slow, err := shaper.Start(s3srv.Endpoint, shaper.Options{BytesPerSecond: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Close() })
	t.Run("cordon keeps the cache; after the retention it goes, but not while a pod uses it", func(t *testing.T) {
		pods := &corev1.PodList{}
		if err := e.c.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app.kubernetes.io/managed-by": "prewarm"}); err != nil {
			t.Fatal(err)
		}
		var node, pod string
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				node, pod = p.Spec.NodeName, p.Name
				break
			}
		}
		if node == "" {
			t.Fatal("no inference pod on a node")
		}
		config, err := os.Stat(filepath.Join(e.cacheDir(node, uid), "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		cordon := func(on bool) {
			t.Helper()
			n := &corev1.Node{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: node}, n); err != nil {
				t.Fatal(err)
			}
			patch := client.MergeFrom(n.DeepCopy())
			n.Spec.Unschedulable = on
			if err := e.c.Patch(ctx, n, patch); err != nil {
				t.Fatal(err)
			}
		}
		request := func() *prewarmv1alpha1.CacheRequest {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
				return nil
			}
			for i := range nc.Spec.Caches {
				if nc.Spec.Caches[i].UID == uid {
					return &nc.Spec.Caches[i]
				}
			}
			return nil
		}
		label := inferencev1.WeightsCacheReadyLabel(uid)

		// Cordoned: not a target any more, but the copy stays, and the status says so.
		cordon(true)
		e.eventually(30*time.Second, "the cordoned node retained, not counted", func() (bool, string) {
			m, err := e.mdcc("example-model-cache")
			if err != nil {
				return false, err.Error()
			}
			i := slices.IndexFunc(m.Status.Nodes, func(n inferencev1.NodeCacheStatus) bool { return n.Name == node })
			r := request()
			return m.Status.TargetNodes == 2 && m.Status.ReadyNodes == 2 && i >= 0 && m.Status.Nodes[i].Retained &&
					m.Status.Nodes[i].Reason == prewarmv1alpha1.ReasonNotTarget && strings.Contains(m.Status.Nodes[i].Message, "cordoned") &&
					r != nil && r.RetainedSince != "",
				fmt.Sprintf("target %d ready %d nodes %+v request %+v", m.Status.TargetNodes, m.Status.ReadyNodes, m.Status.Nodes, r)
		})
		assertTree(t, e.cacheDir(node, uid), model)
		// Uncordoned before the retention passes: a target again, with the same files.
		cordon(false)
		e.waitCache("example-model-cache", 3)
		if after, err := os.Stat(filepath.Join(e.cacheDir(node, uid), "config.json")); err != nil || !os.SameFile(config, after) {
			t.Errorf("the cache was fetched again after an uncordon (%v)", err)
		}

		// Cordoned past the retention: the request is withdrawn, but the files stay while the
		// pod there runs, and the node's agent says why. The retention (10m here) is made to have
		// passed by backdating the request's retainedSince.
		cordon(true)
		e.eventually(30*time.Second, "retained again", func() (bool, string) {
			r := request()
			return r != nil && r.RetainedSince != "", fmt.Sprintf("request %+v", r)
		})
		backdated := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
		backdate := func() {
			old := request()
			if old == nil || old.RetainedSince == backdated {
				return
			}
			old.RetainedSince = backdated
			entry, err := runtime.DefaultUnstructuredConverter.ToUnstructured(old)
			if err != nil {
				t.Fatal(err)
			}
			apply := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": prewarmv1alpha1.GroupVersion.String(), "kind": "NodeCache",
				"metadata": map[string]any{"name": node}, "spec": map[string]any{"caches": []any{entry}},
			}}
			if err := e.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner("prewarm-e2e"), client.ForceOwnership); err != nil {
				t.Fatal(err)
			}
		}
		e.eventually(60*time.Second, "withdrawn after the retention, kept for the pod", func() (bool, string) {
			// A reconcile that started on the informer's view from before the cordon stamps the
			// retention anew, over the backdating: backdate again until the withdrawal is seen.
			backdate()
			nc := &prewarmv1alpha1.NodeCache{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
				return false, err.Error()
			}
			i := slices.IndexFunc(nc.Status.Caches, func(c prewarmv1alpha1.CacheStatus) bool { return c.UID == uid })
			return request() == nil && i >= 0 && nc.Status.Caches[i].Reason == prewarmv1alpha1.ReasonInUse &&
					strings.Contains(nc.Status.Caches[i].Message, "default/"+pod),
				fmt.Sprintf("request %+v status %+v", request(), nc.Status.Caches)
		})
		assertTree(t, e.cacheDir(node, uid), model)
		// The pod goes: so do the files and the label.
		if err := e.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pod}}, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "removed once no pod uses it", func() (bool, string) {
			_, err := os.Stat(prewarmv1alpha1.CacheDir(e.nodeRoot(node), uid))
			got := e.labelled(label)
			return os.IsNotExist(err) && !slices.Contains(got, node), fmt.Sprintf("dir: %v; label on %v", err, got)
		})
		// Back in service: warmed again.
		cordon(false)
		e.waitCache("example-model-cache", 3)
		assertTree(t, e.cacheDir(node, uid), model)
	})

	t.Run("a node that joins is warmed; its agent stopped or killed mid-download resumes", func(t *testing.T) {
		proxy := slow
		// Sharing off on g5-d: what this shows is the agent's own reading of S3 (stopped, killed,
		// resumed); TestNodesWarmingTogetherReadTheSourceAboutOnce shows the sharing.
		e.addNode("g5-d", "ml.g5.24xlarge", proxy.URL, "--concurrency=2", noSharing)
		var done int64
		downloadingPast := func(pct int64) func() (bool, string) {
			return func() (bool, string) {
				nc := &prewarmv1alpha1.NodeCache{}
				if err := e.c.Get(ctx, types.NamespacedName{Name: "g5-d"}, nc); err != nil {
					return false, err.Error()
				}
				for _, c := range nc.Status.Caches {
					if c.UID == uid {
						done = c.BytesDone
						return c.State == inferencev1.CacheDownloading && c.BytesTotal > 0 && c.BytesDone*100 >= c.BytesTotal*pct,
							fmt.Sprintf("%+v", c)
					}
				}
				return false, fmt.Sprintf("%+v", nc.Status)
			}
		}
		// SIGTERM, as the kubelet sends it: the download stops cleanly, well within the
		// DaemonSet's 30 s grace period, and the agent says so before it exits.
		e.eventually(60*time.Second, "g5-d downloading past 30%", downloadingPast(30))
		stopped := e.agents["g5-d"]
		stopped.Name += "-stopped"
		start := time.Now()
		stopped.Stop(30 * time.Second)
		took := time.Since(start)
		if log := stopped.LogTail(1 << 20); !strings.Contains(log, "every cache job has stopped") || !strings.Contains(log, "cache job stopped") {
			t.Errorf("the agent did not stop its download on SIGTERM before exiting (%s); log:\n%s", took, stopped.LogTail(2000))
		}
		t.Logf("SIGTERM at %d bytes: the agent stopped in %s", done, took.Round(time.Millisecond))
		e.startAgent("g5-d", proxy.URL, "--concurrency=2", noSharing)

		e.eventually(60*time.Second, "g5-d downloading past 60%", downloadingPast(60))
		agent := e.agents["g5-d"]
		agent.Name += "-killed"
		agent.Kill()
		beforeRestart := proxy.Served.Load()
		if beforeRestart >= total {
			t.Fatalf("the download was already over (%d of %d bytes) when the agent was killed", beforeRestart, total)
		}
		e.startAgent("g5-d", proxy.URL, "--concurrency=2", noSharing)
		m := e.waitCache("example-model-cache", 4)
		_ = m
		assertTree(t, e.cacheDir("g5-d", uid), model)
		if got, want := e.labelled(inferencev1.WeightsCacheReadyLabel(uid)), []string{"g5-a", "g5-b", "g5-c", "g5-d"}; !slices.Equal(got, want) {
			t.Errorf("label on %v, want %v", got, want)
		}
		afterRestart := proxy.Served.Load() - beforeRestart
		if afterRestart >= total {
			t.Errorf("after the restart the agent read %d bytes, the whole model (%d): it did not resume (%d were done at the kill)", afterRestart, total, done)
		}
		t.Logf("killed at %d of %d bytes; the restarted agent read %d more", done, total, afterRestart)
		proxy.SetOptions(shaper.Options{}) // full speed from here on
		if entries, _ := os.ReadDir(filepath.Join(e.nodeRoot("g5-d"), "prewarm")); len(entries) != 1 {
			t.Errorf("g5-d holds %v under prewarm/, want only the cache", entries)
		}
		if entries, _ := os.ReadDir(prewarmv1alpha1.CacheDir(e.nodeRoot("g5-d"), uid)); len(entries) != 1 {
			t.Errorf("g5-d's cache directory holds %v, want only the model (no partial left)", entries)
		}
	})

	t.Run("a damaged cache loses its label until the damaged file is fetched again, and only that file", func(t *testing.T) {
		slow.SetOptions(shaper.Options{BytesPerSecond: 1 << 20}) // keep the repair slow enough to see
		const lost = "model-00002-of-00003.safetensors"
		before := slow.Served.Load()
		if err := os.Remove(filepath.Join(e.cacheDir("g5-d", uid), lost)); err != nil {
			t.Fatal(err)
		}
		label := inferencev1.WeightsCacheReadyLabel(uid)
		e.eventually(30*time.Second, "label removed from g5-d", func() (bool, string) {
			m, err := e.mdcc("example-model-cache")
			if err != nil {
				return false, err.Error()
			}
			got := e.labelled(label)
			return !slices.Contains(got, "g5-d") && m.Status.ReadyNodes == 3 && m.Status.State != inferencev1.CacheReady,
				fmt.Sprintf("labels on %v; cache %s %d/%d", got, m.Status.State, m.Status.ReadyNodes, m.Status.TargetNodes)
		})
		slow.SetOptions(shaper.Options{})
		e.waitCache("example-model-cache", 4)
		assertTree(t, e.cacheDir("g5-d", uid), model)
		if got := e.labelled(label); !slices.Equal(got, []string{"g5-a", "g5-b", "g5-c", "g5-d"}) {
			t.Errorf("label on %v after the repair, want all four", got)
		}
		// The repair read the lost file (and a listing), not the model again.
		read := slow.Served.Load() - before
		if lostSize := int64(len(model[lost])); read < lostSize || read > lostSize+lostSize/4 {
			t.Errorf("the repair read %d bytes from S3; want about the lost file's %d (the model is %d)", read, lostSize, total)
		}
		t.Logf("repair read %d bytes for a lost file of %d (model %d)", read, len(model[lost]), total)
	})

	t.Run("a node too small fails with the size; the rest are ready; the gate opens", func(t *testing.T) {
		var st unix.Statfs_t
		if err := unix.Statfs(e.nodes, &st); err != nil {
			t.Fatal(err)
		}
		whole := int64(st.Blocks) * st.Bsize
		e.addNode("g5m-a", "ml.g5.12xlarge", s3srv.Endpoint)
		// Keeping the whole filesystem free leaves this node no room at all.
		smallMetrics := freeAddr(t)
		e.addNode("g5m-b", "ml.g5.12xlarge", s3srv.Endpoint, fmt.Sprintf("--reserve=%d", whole), "--metrics-bind-address="+smallMetrics)
		iec := builders.MakeInferenceEndpointConfig("default", "small-disk").
			Location(prefix).InstanceType("ml.g5.12xlarge").Obj()
		if err := e.c.Create(ctx, iec); err != nil {
			t.Fatal(err)
		}
		var m *inferencev1.ModelDataCacheConfig
		e.eventually(60*time.Second, "small-disk cache settled", func() (bool, string) {
			var err error
			if m, err = e.mdcc("small-disk-cache"); err != nil {
				return false, err.Error()
			}
			return m.Status.State == inferencev1.CacheFailed && m.Status.ReadyNodes == 1, fmt.Sprintf("%+v", m.Status)
		})
		for _, n := range m.Status.Nodes {
			switch n.Name {
			case "g5m-a":
				if n.State != inferencev1.CacheReady {
					t.Errorf("g5m-a: %+v, want Ready", n)
				}
			case "g5m-b":
				if n.State != inferencev1.CacheFailed || n.Reason != "InsufficientCapacity" ||
					!strings.HasPrefix(n.Message, "needs ") || !strings.Contains(n.Message, root+" is ") || !strings.Contains(n.Message, "free for caches") {
					t.Errorf("g5m-b: %+v, want Failed, InsufficientCapacity, needs ... %s is N%% full ... free for caches", n, root)
				}
			}
		}
		// The cache's own (empty) directory is all there is: no byte of the model was written.
		if got := e.entries("g5m-b"); len(got) > 1 || len(got) == 1 && got[0] != string(m.UID) {
			t.Errorf("the small node holds %v, want at most the cache's empty directory", got)
		} else if inside, _ := os.ReadDir(prewarmv1alpha1.CacheDir(e.nodeRoot("g5m-b"), string(m.UID))); len(inside) != 0 {
			t.Errorf("the small node's cache directory holds %v, want nothing written", inside)
		}
		if v, err := scrape(smallMetrics, `prewarm_agent_download_failures_total{reason="InsufficientCapacity"}`); err != nil || v < 1 {
			t.Errorf("the small node's agent counts %g InsufficientCapacity failures (%v), want >= 1", v, err)
		}
		if got := e.labelled(inferencev1.WeightsCacheReadyLabel(string(m.UID))); !slices.Equal(got, []string{"g5m-a"}) {
			t.Errorf("label on %v, want [g5m-a]", got)
		}
		e.eventually(30*time.Second, "small-disk Deployment and conditions", func() (bool, string) {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(iec), iec); err != nil {
				return false, err.Error()
			}
			dep := &appsv1.Deployment{}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(iec), dep); err != nil {
				return false, err.Error()
			}
			g, w := condition(iec.Status.Conditions, inferencev1.ConditionGated), condition(iec.Status.Conditions, inferencev1.ConditionWeightsCacheReady)
			return g.Status == metav1.ConditionFalse && g.Reason == inferencev1.ReasonGateOpen && strings.Contains(g.Message, "g5m-b") &&
					w.Status == metav1.ConditionFalse && w.Reason == "InsufficientCapacity" && strings.Contains(w.Message, "g5m-b: needs "),
				fmt.Sprintf("gated %+v; weights %+v", g, w)
		})
		if err := e.c.Delete(ctx, iec); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "small-disk cache removed", func() (bool, string) {
			_, err := e.mdcc("small-disk-cache")
			return apierrors.IsNotFound(err) && len(e.entries("g5m-a")) == 0, fmt.Sprintf("%v; g5m-a holds %v", err, e.entries("g5m-a"))
		})
	})

	t.Run("a hostPath outside the allowed roots is refused and nothing is written", func(t *testing.T) {
		iec := builders.MakeInferenceEndpointConfig("default", "elsewhere").
			Location(prefix).HostPath("/etc/prewarm").Obj()
		if err := e.c.Create(ctx, iec); err != nil {
			t.Fatal(err)
		}
		e.eventually(30*time.Second, "HostPathNotAllowed condition", func() (bool, string) {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(iec), iec); err != nil {
				return false, err.Error()
			}
			w := condition(iec.Status.Conditions, inferencev1.ConditionWeightsCacheReady)
			return w.Reason == inferencev1.ReasonHostPathNotAllowed && iec.Status.State == inferencev1.DeploymentFailed &&
					strings.Contains(w.Message, "/etc/prewarm is not an allowed cache root") && strings.Contains(w.Message, root),
				fmt.Sprintf("%+v", iec.Status)
		})
		caches := &inferencev1.ModelDataCacheConfigList{}
		if err := e.c.List(ctx, caches, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		for _, m := range caches.Items {
			if m.Spec.ParentReference.Name == "elsewhere" {
				t.Errorf("cache %s was created for a refused hostPath", m.Name)
			}
		}
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(iec), &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment for a refused hostPath: %v, want none", err)
		}
		matches, _ := filepath.Glob(filepath.Join(e.nodes, "*", "etc"))
		if len(matches) != 0 {
			t.Errorf("something was written under /etc on a node: %v", matches)
		}
		if err := e.c.Delete(ctx, iec); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a new modelLocation gets a new cache; the Deployment rolls; the old cache goes", func(t *testing.T) {
		v2 := map[string][]byte{}
		for p, data := range model {
			v2[p] = data
		}
		v2["generation_config.json"] = gen.Bytes(99, 5000)
		for p, data := range v2 {
			if err := s3srv.PutBytes(ctx, bucket, "models/example-model-v2/"+p, data); err != nil {
				t.Fatal(err)
			}
		}
		iec := &inferencev1.InferenceEndpointConfig{}
		if err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, iec); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(iec.DeepCopy())
		iec.Spec.ModelSourceConfig.ModelLocation = "models/example-model-v2"
		if err := e.c.Patch(ctx, iec, patch); err != nil {
			t.Fatal(err)
		}
		var newName, newUID string
		e.eventually(90*time.Second, "new cache Ready and the Deployment on it", func() (bool, string) {
			list := &inferencev1.ModelDataCacheConfigList{}
			if err := e.c.List(ctx, list, client.InNamespace("default")); err != nil {
				return false, err.Error()
			}
			for _, m := range list.Items {
				if m.Spec.ModelSourceConfig.ModelLocation == "models/example-model-v2" && m.Status.State == inferencev1.CacheReady && m.Status.ReadyNodes == 4 {
					newName, newUID = m.Name, string(m.UID)
				}
			}
			dep := &appsv1.Deployment{}
			if err := e.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, dep); err != nil {
				return false, err.Error()
			}
			return newName != "" && dep.Spec.Template.Annotations["prewarm.io/weights-cache"] == newName,
				fmt.Sprintf("new cache %q; Deployment on %q", newName, dep.Spec.Template.Annotations["prewarm.io/weights-cache"])
		})
		if newName == "example-model-cache" || newUID == uid {
			t.Errorf("the new cache is %s (%s), want a new object", newName, newUID)
		}
		e.eventually(60*time.Second, "old cache, its files and labels gone", func() (bool, string) {
			_, err := e.mdcc("example-model-cache")
			var left []string
			for _, n := range []string{"g5-a", "g5-b", "g5-c", "g5-d"} {
				if _, err := os.Stat(prewarmv1alpha1.CacheDir(e.nodeRoot(n), uid)); err == nil {
					left = append(left, n)
				}
			}
			labels := e.labelled(inferencev1.WeightsCacheReadyLabel(uid))
			return apierrors.IsNotFound(err) && len(left) == 0 && len(labels) == 0,
				fmt.Sprintf("old cache: %v; files on %v; labels on %v", err, left, labels)
		})
		for _, n := range []string{"g5-a", "g5-b", "g5-c", "g5-d"} {
			assertTree(t, e.cacheDir(n, newUID), v2)
		}
		uid = newUID
	})

	t.Run("a node that leaves leaves the target set", func(t *testing.T) {
		if err := e.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "g5-d"}}); err != nil {
			t.Fatal(err)
		}
		list := &inferencev1.ModelDataCacheConfigList{}
		e.eventually(60*time.Second, "TARGET/READY 3/3", func() (bool, string) {
			if err := e.c.List(ctx, list, client.InNamespace("default")); err != nil || len(list.Items) != 1 {
				return false, fmt.Sprintf("%v, %d caches", err, len(list.Items))
			}
			st := list.Items[0].Status
			return st.TargetNodes == 3 && st.ReadyNodes == 3 && st.State == inferencev1.CacheReady && len(st.Nodes) == 3,
				fmt.Sprintf("%s %d/%d", st.State, st.ReadyNodes, st.TargetNodes)
		})
	})

	t.Run("deleting the parent removes every cache directory, label and object", func(t *testing.T) {
		iec := &inferencev1.InferenceEndpointConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "example-model"}}
		if err := e.c.Delete(ctx, iec); err != nil {
			t.Fatal(err)
		}
		e.eventually(60*time.Second, "everything gone", func() (bool, string) {
			list := &inferencev1.ModelDataCacheConfigList{}
			if err := e.c.List(ctx, list); err != nil {
				return false, err.Error()
			}
			var files []string
			for _, n := range []string{"g5-a", "g5-b", "g5-c", "small-a"} {
				for _, f := range e.entries(n) {
					files = append(files, n+":"+f)
				}
			}
			labels := e.labelled(inferencev1.WeightsCacheReadyLabel(uid))
			ncs := &prewarmv1alpha1.NodeCacheList{}
			if err := e.c.List(ctx, ncs); err != nil {
				return false, err.Error()
			}
			var entries []string
			for _, nc := range ncs.Items {
				for _, c := range nc.Spec.Caches {
					entries = append(entries, nc.Name+":"+c.Name)
				}
				for _, c := range nc.Status.Caches {
					entries = append(entries, nc.Name+":"+c.UID)
				}
			}
			return len(list.Items) == 0 && len(files) == 0 && len(labels) == 0 && len(entries) == 0,
				fmt.Sprintf("caches %d; files %v; labels %v; node entries %v", len(list.Items), files, labels, entries)
		})
	})

	t.Run("a source no rule allows is read with the namespace's own credentials, sealed to the node", func(t *testing.T) {
		// A bucket the configuration does not let prewarm read with its own identity, a namespace
		// that provides its own credentials, and a node whose agent has no AWS identity at all:
		// the cache fills only if the sealed credentials reach that agent and are used.
		const tenantBucket, tenantNS = "tenant-models", "tenant"
		if err := s3srv.CreateBucket(ctx, tenantBucket); err != nil {
			t.Fatal(err)
		}
		for p, data := range model {
			if err := s3srv.PutBytes(ctx, tenantBucket, prefix+"/"+p, data); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantNS}}); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: "prewarm-s3"},
			Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte(s3fixture.AccessKey), "AWS_SECRET_ACCESS_KEY": []byte(s3fixture.SecretKey)}}); err != nil {
			t.Fatal(err)
		}
		e.agentEnv["g6-t"] = []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SESSION_TOKEN=", "AWS_EC2_METADATA_DISABLED=true"}
		e.addNode("g6-t", "ml.g6.12xlarge", s3srv.Endpoint)
		iec := builders.MakeInferenceEndpointConfig(tenantNS, "tenant-model").Obj()
		iec.Spec.InstanceType = "ml.g6.12xlarge"
		iec.Spec.ModelCacheConfig.ImageCache.Enabled = false
		iec.Spec.ModelSourceConfig.S3Storage.BucketName, iec.Spec.ModelSourceConfig.ModelLocation = tenantBucket, prefix
		if err := e.c.Create(ctx, iec); err != nil {
			t.Fatal(err)
		}
		m := &inferencev1.ModelDataCacheConfig{}
		e.eventually(90*time.Second, "the tenant's cache Ready on g6-t", func() (bool, string) {
			if err := e.c.Get(ctx, types.NamespacedName{Namespace: tenantNS, Name: "tenant-model-cache"}, m); err != nil {
				return false, err.Error()
			}
			return m.Status.State == inferencev1.CacheReady && m.Status.ReadyNodes == 1, fmt.Sprintf("%s %+v", m.Status.State, m.Status.Nodes)
		})
		assertTree(t, e.cacheDir("g6-t", string(m.UID)), model)
		nc := &prewarmv1alpha1.NodeCache{}
		if err := e.c.Get(ctx, types.NamespacedName{Name: "g6-t"}, nc); err != nil {
			t.Fatal(err)
		}
		for _, r := range nc.Spec.Caches {
			if r.UID == string(m.UID) && (r.Credentials == nil || strings.Contains(r.Credentials.Sealed, s3fixture.SecretKey)) {
				t.Errorf("the request carries %+v; want the credentials sealed", r.Credentials)
			}
		}
	})
	e.check()
}
