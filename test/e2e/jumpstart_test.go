package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
)

const llamaRepo = "meta-llama/Llama-3.1-8B-Instruct"

func (e *weightsEnv) jumpStart(ns, name string) *inferencev1.JumpStartModel {
	j := &inferencev1.JumpStartModel{}
	if err := e.c.Get(e.ctx, types.NamespacedName{Namespace: ns, Name: name}, j); err != nil {
		e.t.Fatal(err)
	}
	return j
}

// events lists the reasons of the Events about an object.
func (e *weightsEnv) events(ns, kind, name string) []string {
	list := &eventsv1.EventList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(ns)); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if ev.Regarding.Kind == kind && ev.Regarding.Name == name {
			out = append(out, ev.Reason)
		}
	}
	return out
}

func newJumpStart(ns, name, modelID string, acceptEula bool) *inferencev1.JumpStartModel {
	return &inferencev1.JumpStartModel{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: inferencev1.JumpStartModelSpec{
			Model:            inferencev1.JumpStartModelRef{ModelID: modelID, AcceptEula: acceptEula},
			Server:           inferencev1.JumpStartServer{InstanceType: "ml.g5.24xlarge"},
			ModelCacheConfig: &inferencev1.ModelCacheConfig{WeightsCache: &inferencev1.WeightsCacheConfig{Enabled: true}},
		},
	}
}

func TestJumpStartEndToEnd(t *testing.T) {
	hub := hubfixture.Start()
	t.Cleanup(hub.Close)
	files := map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"model-00001-of-00002.safetensors": gen.Bytes(31, 6<<20),
		"model-00002-of-00002.safetensors": gen.Bytes(32, 3<<20),
		"tokenizer.json":                   gen.Bytes(33, 300_000),
	}
	commit := hub.AddCommit(llamaRepo, "main", files)
	hub.SetGated(llamaRepo, "hf_granted")

	e := newEnv(t, testutil.ClusterOptions{})
	e.hfEndpoint = hub.URL
	ctx, c := e.ctx, e.c
	agentMetrics := freeAddr(t)
	e.addNode("g5-a", "ml.g5.24xlarge", s3srv.Endpoint, "--metrics-bind-address="+agentMetrics)
	for _, n := range []string{"g5-b", "g5-c"} {
		e.addNode(n, "ml.g5.24xlarge", s3srv.Endpoint)
	}
	e.addNode("small-a", "ml.g5.xlarge", s3srv.Endpoint)
	metricsAddr := freeAddr(t)
	e.startController(
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address="+metricsAddr, "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")

	for _, ns := range []string{opNS, "team-b", "team-c"} {
		// The operator namespace holds the agents' service account already (their peer tokens).
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, builders.JumpStartCatalog(opNS, llamaRepo, commit)); err != nil {
		t.Fatal(err)
	}
	for ns, token := range map[string]string{"default": "hf_granted", "team-b": "hf_not_granted"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hf-token"}, Data: map[string][]byte{"token": []byte(token)}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	// The seed's jumpstart-model.yaml, unchanged.
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "jumpstart-model.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}

	t.Run("the seed's JumpStartModel is cached on its nodes and served", func(t *testing.T) {
		m := e.waitCache("example-jumpstart-model-cache", 3)
		for _, n := range []string{"g5-a", "g5-b", "g5-c"} {
			assertTree(t, e.cacheDir(n, string(m.UID)), files)
		}
		if got := m.Spec.ModelSourceConfig.HuggingFaceModel; got == nil || got.ModelID != llamaRepo || got.CommitSHA != commit {
			t.Errorf("cache source %+v, want %s at %s", got, llamaRepo, commit)
		}
		if m.Status.ResolvedRevision != commit {
			t.Errorf("resolvedRevision %q, want %s", m.Status.ResolvedRevision, commit)
		}
		var ic *inferencev1.InferenceImageCache
		e.eventually(60*time.Second, "image cache Complete", func() (bool, string) {
			for _, x := range e.imageCaches() {
				if x.Spec.Image == "vllm/vllm-openai:v0.6.3" && x.Status.Phase == inferencev1.ImageComplete && x.Status.CachedNodes == 3 {
					ic = &x
					return true, ""
				}
			}
			return false, fmt.Sprint(e.imageCaches())
		})
		if !seedCacheName.MatchString(ic.Name) {
			t.Errorf("image cache %s", ic.Name)
		}
		dep := &appsv1.Deployment{}
		e.eventually(60*time.Second, "Deployment available and the parent complete", func() (bool, string) {
			if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-jumpstart-model"}, dep); err != nil {
				return false, err.Error()
			}
			j := e.jumpStart("default", "example-jumpstart-model")
			return j.Status.State == inferencev1.DeploymentComplete, fmt.Sprintf("%s %+v", j.Status.State, j.Status.Conditions)
		})
		w := dep.Spec.Template.Spec.Containers[0]
		if w.Image != "vllm/vllm-openai:v0.6.3" || !slices.Equal(w.Args, []string{"--model=/opt/ml/model", "--port=8080"}) || w.Ports[0].ContainerPort != 8080 {
			t.Errorf("worker %+v, want the catalog's image, args and port", w)
		}
		// The model comes from the node's agent through prewarm's CSI volume; the token reaches
		// the agents (sealed), never the pods.
		spec := dep.Spec.Template.Spec
		if len(spec.InitContainers) != 0 || len(spec.Volumes) != 1 || spec.Volumes[0].CSI == nil || spec.Volumes[0].CSI.Driver != prewarmv1alpha1.CSIDriverName {
			t.Errorf("init containers %+v, volumes %+v; want only prewarm's CSI volume", spec.InitContainers, spec.Volumes)
		}
		for _, v := range w.Env {
			if v.ValueFrom != nil && v.ValueFrom.SecretKeyRef != nil {
				t.Errorf("the worker reads Secret %s", v.ValueFrom.SecretKeyRef.Name)
			}
		}
		j := e.jumpStart("default", "example-jumpstart-model")
		ws, is := condition(j.Status.Conditions, inferencev1.ConditionWeightsCacheReady), condition(j.Status.Conditions, inferencev1.ConditionImageCacheReady)
		if ws.Status != metav1.ConditionTrue || !strings.Contains(ws.Message, "all 3 target nodes hold the cache") ||
			is.Status != metav1.ConditionTrue || !strings.Contains(is.Message, "all 3 target nodes hold") || j.Status.ObservedGeneration != j.Generation {
			t.Errorf("status %+v", j.Status)
		}
		e.eventually(30*time.Second, "events", func() (bool, string) {
			got := e.events("default", "JumpStartModel", "example-jumpstart-model")
			ok := true
			for _, want := range []string{"CacheCreated", "GateOpen", "DeploymentCreated"} {
				ok = ok && slices.Contains(got, want)
			}
			cacheEvents := e.events("default", "ModelDataCacheConfig", "example-jumpstart-model-cache")
			return ok && slices.Contains(cacheEvents, "NodeReady"), fmt.Sprintf("parent %v; cache %v", got, cacheEvents)
		})
	})
	if t.Failed() {
		return
	}

	problems := []struct {
		name, ns, id string
		eula         bool
		reason, says string
	}{
		{"gated model without acceptEula", "default", "meta-textgeneration-llama-3-1-8b-instruct", false,
			"EULANotAccepted", "is a gated model: accept its end-user licence by setting spec.model.acceptEula: true"},
		{"unknown model", "default", "meta-textgeneration-llama-9-instruct", true,
			"ModelNotInCatalog", "model meta-textgeneration-llama-9-instruct (hub SageMakerPublicHub) is not in the catalog; add an entry"},
		{"a token the Hub refuses", "team-b", "meta-textgeneration-llama-3-1-8b-instruct", true,
			"TokenSecretProblem", "the token in Secret team-b/hf-token cannot read " + llamaRepo},
		{"no token Secret", "team-c", "meta-textgeneration-llama-3-1-8b-instruct", true,
			"TokenSecretProblem", "Secret team-c/hf-token (key token), the Hugging Face token for " + llamaRepo + ", does not exist"},
	}
	for i, p := range problems {
		t.Run(p.name, func(t *testing.T) {
			name := fmt.Sprintf("problem-%d", i)
			if err := c.Create(ctx, newJumpStart(p.ns, name, p.id, p.eula)); err != nil {
				t.Fatal(err)
			}
			e.eventually(30*time.Second, "condition "+p.reason, func() (bool, string) {
				j := e.jumpStart(p.ns, name)
				r := condition(j.Status.Conditions, inferencev1.ConditionReady)
				return j.Status.State == inferencev1.DeploymentFailed && r.Reason == p.reason && strings.Contains(r.Message, p.says),
					fmt.Sprintf("%s %+v", j.Status.State, r)
			})
			e.eventually(30*time.Second, "Warning event "+p.reason, func() (bool, string) {
				got := e.events(p.ns, "JumpStartModel", name)
				return slices.Contains(got, p.reason), fmt.Sprint(got)
			})
			if err := c.Get(ctx, types.NamespacedName{Namespace: p.ns, Name: name}, &appsv1.Deployment{}); err == nil {
				t.Error("a Deployment was created for a refused model")
			}
		})
	}

	t.Run("fixing the token Secret lets the model through", func(t *testing.T) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: "hf-token"}, Data: map[string][]byte{"token": []byte("hf_granted")}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		// Nothing watches Secrets (the controller caches none): the parent is retried on its own.
		e.eventually(90*time.Second, "team-c cache ready", func() (bool, string) {
			m := &inferencev1.ModelDataCacheConfig{}
			if err := c.Get(ctx, types.NamespacedName{Namespace: "team-c", Name: "problem-3-cache"}, m); err != nil {
				return false, err.Error()
			}
			return m.Status.State == inferencev1.CacheReady && m.Status.ReadyNodes == 3, fmt.Sprintf("%+v", m.Status)
		})
	})

	t.Run("a cold pod's init container downloads the gated model with the Secret's token", func(t *testing.T) {
		prepare := func(token string) (string, string, error) {
			dest := filepath.Join(t.TempDir(), "model")
			cmd := exec.CommandContext(ctx, agentPath, "prepare", "--cache-dir=/nonexistent", "--dest="+dest,
				"--hf-repo="+llamaRepo, "--hf-revision="+commit, "--hf-endpoint="+hub.URL)
			cmd.Env = append(os.Environ(), "HF_TOKEN="+token)
			out, err := cmd.CombinedOutput()
			return dest, string(out), err
		}
		dest, out, err := prepare("hf_granted")
		if err != nil || !strings.Contains(out, "cold") {
			t.Fatalf("prepare with the token: %v\n%s", err, out)
		}
		assertTree(t, dest, files)
		if _, out, err := prepare(""); err == nil || !strings.Contains(out, "gated") {
			t.Errorf("prepare without a token: %v\n%s; want a gated-repository error", err, out)
		}
	})

	t.Run("kubectl prewarm status and explain on the live system", func(t *testing.T) {
		run := func(args ...string) string {
			out, err := exec.CommandContext(ctx, cliPath, append(args, "--kubeconfig="+e.cluster.KubeconfigPath)...).CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl-prewarm %v: %v\n%s", args, err, out)
			}
			return string(out)
		}
		out := run("status", "example-jumpstart-model", "-n", "default")
		for _, want := range []string{
			"JumpStartModel default/example-jumpstart-model: DeploymentComplete",
			"weights cache example-jumpstart-model-cache: Ready, 3/3 nodes ready",
			"revision " + commit,
			"image cache hyperpod-inference-system/iic-vllm-openai-ml-g5-24xlarge-",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("status lacks %q:\n%s", want, out)
			}
		}
		out = run("status", "problem-0", "-n", "default")
		if !strings.Contains(out, "ready: False EULANotAccepted: meta-textgeneration-llama-3-1-8b-instruct is a gated model") {
			t.Errorf("status of the refused model:\n%s", out)
		}
		out = run("explain", "node", "g5-a")
		if !strings.Contains(out, "default/example-jumpstart-model-cache: WARM: Ready: 4 files") || !strings.Contains(out, "agent: alive") {
			t.Errorf("explain g5-a:\n%s", out)
		}
		out = run("explain", "node", "small-a")
		if !strings.Contains(out, "default/example-jumpstart-model-cache: NOT WARM: not a target: instance type ml.g5.xlarge is not ml.g5.24xlarge") {
			t.Errorf("explain small-a:\n%s", out)
		}
	})

	t.Run("metrics from the running controller and agent", func(t *testing.T) {
		m, err := e.mdcc("example-jumpstart-model-cache")
		if err != nil {
			t.Fatal(err)
		}
		var total float64
		for _, data := range files {
			total += float64(len(data))
		}
		var ic string
		for _, x := range e.imageCaches() {
			if x.Spec.Image == "vllm/vllm-openai:v0.6.3" {
				ic = x.Name
			}
		}
		checks := []struct {
			addr, series string
			ok           func(float64) bool
			want         string
		}{
			{metricsAddr, `prewarm_weights_cache_ready_nodes{cache="example-jumpstart-model-cache",namespace="default"}`, three, "3"},
			{metricsAddr, `prewarm_weights_cache_target_nodes{cache="example-jumpstart-model-cache",namespace="default"}`, three, "3"},
			{metricsAddr, `prewarm_weights_cache_nodes{cache="example-jumpstart-model-cache",namespace="default",state="Ready"}`, three, "3"},
			{metricsAddr, `prewarm_image_cache_cached_nodes{cache="` + ic + `"}`, three, "3"},
			{metricsAddr, `prewarm_gate_wait_seconds_count`, atLeast(1), ">= 1"},
			{metricsAddr, `prewarm_reconcile_errors_total{controller="jumpstart"}`, atLeast(0), "present"},
			// The three nodes share the parts: g5-a's come from the source and from its peers
			// (their sum is checked above).
			{agentMetrics, `prewarm_engine_downloaded_bytes_total`, atLeast(0), "present"},
			{agentMetrics, `prewarm_engine_peer_bytes_total`, atLeast(0), "present"},
			// Sums over the node's caches: the metrics port names no cache unless
			// agent.metricsPerCache is set (checked below).
			{agentMetrics, `prewarm_agent_cache_state{state="Ready"}`, atLeast(1), ">= 1"},
			{agentMetrics, `prewarm_agent_cache_bytes`, atLeast(total), fmt.Sprintf(">= %.0f", total)},
			{agentMetrics, `prewarm_agent_root_free_bytes{root="/opt/dlami/nvme"}`, atLeast(1), "> 0"},
		}
		e.eventually(30*time.Second, "source and peer bytes", func() (bool, string) {
			src, err1 := scrape(agentMetrics, `prewarm_engine_downloaded_bytes_total`)
			peers, err2 := scrape(agentMetrics, `prewarm_engine_peer_bytes_total`)
			return err1 == nil && err2 == nil && src+peers >= total, fmt.Sprintf("%g from the source and %g from peers, want the model's %g in all (%v %v)", src, peers, total, err1, err2)
		})
		for _, c := range checks {
			e.eventually(30*time.Second, c.series, func() (bool, string) {
				v, err := scrape(c.addr, c.series)
				if err != nil {
					return false, err.Error()
				}
				return c.ok(v), fmt.Sprintf("%g, want %s", v, c.want)
			})
		}
		if body, err := httpGet("http://" + agentMetrics + "/metrics"); err != nil || strings.Contains(body, string(m.UID)) {
			t.Errorf("the agent's unauthenticated metrics name the cache %s (%v); want sums over the node's caches", m.UID, err)
		}
	})
	e.check()
}

func three(v float64) bool                    { return v == 3 }
func atLeast(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }

// scrape reads one series' value from a Prometheus endpoint.
func scrape(addr, series string) (float64, error) {
	body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("no series %s", series)
}
