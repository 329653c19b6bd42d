// Package realnode runs prewarm as a user would, on real kubelet nodes: images built by
// hack/images and pushed to a loopback registry, the Helm chart installed, the seed's two
// manifests applied unchanged, real pods started, downloads made by the chart's agent pods.
package realnode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
)

func TestMain(m *testing.M) { os.Exit(realnode.Main(m.Run)) }

const (
	opNS        = "hyperpod-inference-system"
	bucket      = "example-bucket"
	prefix      = "models/example-model"
	cacheRoot   = "/opt/dlami/nvme"
	version     = "v0.0.0-realnode"
	llamaRepo   = "meta-llama/Llama-3.1-8B-Instruct"
	hubToken    = "hf_realnode"
	serverImage = "vllm/vllm-openai:latest" // the seed's image: the stand-in model server, large
	catalogImg  = "vllm/vllm-openai:v0.6.3" // the test catalog's JumpStart image
	// warm1 and warm2 are the seed's instance type; cold is not, so it never holds the caches.
	warm1, warm2, cold = "g5-1", "g5-2", "g5x-1"
)

// env is the running cluster, its sources, and prewarm installed on it.
type env struct {
	c       *realnode.Cluster
	s3      *s3fixture.Server
	hub     *hubfixture.Hub
	root    string // the module root
	work    string
	model   []fileSpec // the InferenceEndpointConfig's model
	jsModel []fileSpec // the JumpStartModel's
}

// fileSpec is one file of a model and what the model server checks it against.
type fileSpec struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	seed   uint64
	data   []byte
}

// setup starts the cluster (two nodes of the seed's instance type, one of another), S3 with a
// model of modelSize and the Hub stand-in, pushes every image, and installs prewarm's chart.
func setup(t *testing.T, ctx context.Context, modelSize int64) *env {
	t.Helper()
	if why := realnode.Unsupported(); why != "" {
		t.Skip("no real nodes on this machine: " + why)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, work: t.TempDir()}
	start := time.Now()
	gpus := int64(8)
	nodes := []realnode.NodeOptions{
		{Name: warm1, InstanceType: "ml.g5.24xlarge", GPUs: gpus, HostPaths: []string{cacheRoot}},
		{Name: warm2, InstanceType: "ml.g5.24xlarge", GPUs: gpus, HostPaths: []string{cacheRoot}},
		{Name: cold, InstanceType: "ml.g5.xlarge", GPUs: gpus, HostPaths: []string{cacheRoot}},
	}
	e.c, err = realnode.Start(ctx, realnode.Options{Dir: filepath.Join(e.work, "cluster"), Nodes: nodes, Mirrors: []string{"docker.io"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, e.c.LogDir, e.c.Nodes)
		}
		if err := e.c.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	t.Logf("control plane and %d real nodes Ready in %s", len(nodes), time.Since(start).Round(time.Millisecond))

	e.s3, err = s3fixture.StartOn(realnode.HostIP, filepath.Join(e.work, "s3"), filepath.Join(e.c.LogDir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.s3.Stop)
	e.hub, err = hubfixture.StartOn(realnode.HostIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.hub.Close)
	e.putModel(t, ctx, modelSize)
	commit := e.putHubModel()
	e.pushImages(t)
	e.install(t, ctx, commit)
	return e
}

// keepLogs copies the cluster's logs where a failed CI run keeps them, when asked to.
func keepLogs(t *testing.T, dir string, nodes []*realnode.Node) {
	dest := os.Getenv("PREWARM_KEEP_LOGS")
	if dest == "" {
		t.Logf("logs were in %s (set PREWARM_KEEP_LOGS=DIR to keep them)", dir)
		return
	}
	if out, err := exec.Command("cp", "-r", dir, filepath.Join(dest, "realnode-logs")).CombinedOutput(); err != nil {
		t.Logf("keeping the logs: %v: %s", err, out)
		return
	}
	for _, n := range nodes {
		// The containers' logs, as the kubelet keeps them on the node.
		_ = exec.Command("cp", "-r", n.HostPath("/var/log/pods"), filepath.Join(dest, "realnode-logs", n.Name+"-pods")).Run()
	}
	t.Logf("logs kept in %s", filepath.Join(dest, "realnode-logs"))
}

// putModel writes a model shaped like a real one (config files and two safetensors shards) of
// about size bytes to S3, and remembers each file's digest.
func (e *env) putModel(t *testing.T, ctx context.Context, size int64) {
	t.Helper()
	if err := e.s3.CreateBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	small := []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama"}`)
	e.model = []fileSpec{
		{Path: "config.json", data: small},
		{Path: "tokenizer.json", Size: 2 << 20, seed: 11},
		{Path: "model-00001-of-00002.safetensors", Size: (size - 2<<20) / 2, seed: 12},
		{Path: "model-00002-of-00002.safetensors", Size: (size - 2<<20) / 2, seed: 13},
	}
	for i := range e.model {
		f := &e.model[i]
		if f.data != nil {
			f.Size = int64(len(f.data))
			sum := sha256.Sum256(f.data)
			f.SHA256 = hex.EncodeToString(sum[:])
			if err := e.s3.PutBytes(ctx, bucket, prefix+"/"+f.Path, f.data); err != nil {
				t.Fatal(err)
			}
			continue
		}
		h := sha256.New()
		if _, err := io.Copy(h, io.LimitReader(gen.Reader(f.seed), f.Size)); err != nil {
			t.Fatal(err)
		}
		f.SHA256 = hex.EncodeToString(h.Sum(nil))
		if err := e.s3.Put(ctx, bucket, prefix+"/"+f.Path, io.LimitReader(gen.Reader(f.seed), f.Size), f.Size); err != nil {
			t.Fatal(err)
		}
	}
}

// putHubModel puts the JumpStart model on the Hub stand-in, gated, and returns its commit.
func (e *env) putHubModel() string {
	files := map[string][]byte{
		"config.json":       []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"model.safetensors": gen.Bytes(7, 12<<20),
		"tokenizer.json":    gen.Bytes(8, 1<<20),
	}
	for p, data := range files {
		sum := sha256.Sum256(data)
		e.jsModel = append(e.jsModel, fileSpec{Path: p, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	}
	commit := e.hub.AddCommit(llamaRepo, "main", files)
	e.hub.SetGated(llamaRepo, hubToken)
	return commit
}

// pushImages builds and pushes prewarm's images (with hack/images, as `make push` does), the
// stand-in model server as the seed's and the catalog's images, and the sandbox (pause) image.
func (e *env) pushImages(t *testing.T) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", "run", "./hack/images", "--out", filepath.Join(e.work, "images"), "--version", version,
		"--push", e.c.Registry+"/prewarm")
	cmd.Dir = e.root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/images: %v\n%s", err, out)
	}
	t.Logf("hack/images built and pushed prewarm's images in %s", time.Since(start).Round(time.Millisecond))
	bins := filepath.Join(e.work, "bin")
	for pkg, out := range map[string]string{"./test/images/modelserver": "modelserver", "./cmd/sleeper": "sleeper"} {
		if err := realnode.BuildStatic(e.root, pkg, filepath.Join(bins, out)); err != nil {
			t.Fatal(err)
		}
	}
	server, err := os.ReadFile(filepath.Join(bins, "modelserver"))
	if err != nil {
		t.Fatal(err)
	}
	sleeper, err := os.ReadFile(filepath.Join(bins, "sleeper"))
	if err != nil {
		t.Fatal(err)
	}
	// The seed's image is large, in several layers, as an inference image is: the server and
	// its model's listing, then three layers of 200 MiB of incompressible bytes.
	big := []v1.Layer{e.serverLayer(t, server, e.model)}
	for i := range 3 {
		l, err := realnode.RandomLayer(fmt.Sprintf("/usr/lib/weights-free-%d.bin", i), uint64(100+i), 200<<20)
		if err != nil {
			t.Fatal(err)
		}
		big = append(big, l)
	}
	pause, err := realnode.FilesLayer(map[string]realnode.File{"pause": {Data: sleeper, Mode: 0o755}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("test images' layers made in %s", time.Since(start).Round(time.Millisecond))
	for ref, layers := range map[string][]v1.Layer{
		serverImage: big,
		catalogImg:  {e.serverLayer(t, server, e.jsModel)},
	} {
		e.push(t, ref, []string{"/modelserver"}, layers...)
	}
	e.push(t, "pause:3.10", []string{"/pause"}, pause)
	t.Logf("images built and pushed to %s in %s", e.c.Registry, time.Since(start).Round(time.Millisecond))
}

func (e *env) serverLayer(t *testing.T, server []byte, model []fileSpec) v1.Layer {
	t.Helper()
	listing, err := json.Marshal(model)
	if err != nil {
		t.Fatal(err)
	}
	l, err := realnode.FilesLayer(map[string]realnode.File{
		"modelserver":                  {Data: server, Mode: 0o755},
		"etc/modelserver/listing.json": {Data: listing},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (e *env) push(t *testing.T, ref string, entrypoint []string, layers ...v1.Layer) {
	t.Helper()
	img, err := realnode.ImageOf(entrypoint, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Push(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
}

// install creates the operator namespace with the JumpStart catalog (pointing at the Hub
// stand-in) and the S3 credentials, the seed namespace's Secrets, and runs `helm install`.
func (e *env) install(t *testing.T, ctx context.Context, commit string) {
	t.Helper()
	c := e.c.Client
	creds := map[string][]byte{"AWS_ACCESS_KEY_ID": []byte(s3fixture.AccessKey), "AWS_SECRET_ACCESS_KEY": []byte(s3fixture.SecretKey)}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}},
		testutil.JumpStartCatalog(opNS, llamaRepo, commit),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "prewarm-s3"}, Data: creds},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "prewarm-s3"}, Data: creds},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hf-token"}, Data: map[string][]byte{"token": []byte(hubToken)}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	values := map[string]any{
		"image": map[string]any{
			"controller": map[string]any{"repository": e.c.Registry + "/prewarm/controller", "tag": version},
			"agent":      map[string]any{"repository": e.c.Registry + "/prewarm/agent", "tag": version},
		},
		"catalog": map[string]any{"enabled": false},
		"agent": map[string]any{
			"envFrom": []any{map[string]any{"secretRef": map[string]any{"name": "prewarm-s3"}}},
		},
		"config": config.Operator{
			CacheRoots:  []string{cacheRoot},
			S3:          config.S3{Endpoint: e.s3.Endpoint, PathStyle: true, CredentialsSecret: "prewarm-s3"},
			HuggingFace: config.HuggingFace{Endpoint: e.hub.URL},
			// The seed's bucket is read with the agents' own identity, for every namespace.
			SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: bucket}}},
			Controller:   config.Controller{GateTimeout: "10m"},
			Agent:        config.Agent{Reserve: "1Gi", MaxParallel: 2, Concurrency: 16, PartSize: "16Mi"},
		},
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	valuesFile := filepath.Join(e.work, "values.yaml")
	if err := os.WriteFile(valuesFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := testutil.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := filepath.Glob(filepath.Join(bin, "helm-*"))
	if err != nil || len(helm) == 0 {
		t.Fatalf("no helm in %s: run `make testbin`", bin)
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, helm[0], "install", "prewarm", filepath.Join(e.root, "charts", "prewarm"),
		"--namespace", opNS, "--values", valuesFile, "--wait", "--timeout", "5m", "--kubeconfig", e.c.Kubeconfig)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(e.work, "helm"), "HELM_CONFIG_HOME="+filepath.Join(e.work, "helm"),
		"HELM_DATA_HOME="+filepath.Join(e.work, "helm"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s\n%s", err, out, e.podReport(ctx, opNS))
	}
	t.Logf("helm install --wait: controller and agents up from %s/prewarm in %s", e.c.Registry, time.Since(start).Round(time.Millisecond))
}

// applySeed creates the seed's two manifests (config/samples, the seed's files) unchanged.
func (e *env) applySeed(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, f := range []string{"inference-endpoint-config.yaml", "jumpstart-model.yaml"} {
		data, err := os.ReadFile(filepath.Join(e.root, "config", "samples", f))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Client.Create(ctx, u); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

// podReport describes the namespace's pods, for failure messages.
func (e *env) podReport(ctx context.Context, ns string) string {
	var pods corev1.PodList
	if err := e.c.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if w := s.State.Waiting; w != nil {
				fmt.Fprintf(&b, "; %s waiting: %s %s", s.Name, w.Reason, w.Message)
			}
			if x := s.State.Terminated; x != nil && x.ExitCode != 0 {
				fmt.Fprintf(&b, "; %s exited %d: %s", s.Name, x.ExitCode, x.Message)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
