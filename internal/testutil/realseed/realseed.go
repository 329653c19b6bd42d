// Package realseed runs prewarm as a user would, on real kubelet nodes (package realnode): its
// images built by hack/images and pushed to the cluster's loopback registry, its Helm chart
// installed, S3 holding a generated model and a Hugging Face Hub stand-in holding the JumpStart
// one, the seed's two manifests applied unchanged. The real-node tests and the sandbox use it.
package realseed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/internal/version"
)

const (
	OpNS      = "hyperpod-inference-system"
	Bucket    = "example-bucket"
	Prefix    = "models/example-model"
	CacheRoot = "/opt/dlami/nvme"
	Version   = "v0.0.0-realnode"
	llamaRepo = "meta-llama/Llama-3.1-8B-Instruct"
	hubToken  = "hf_realnode"
	// GatedRepo is the gated repository on the Hub stand-in (the JumpStart model's); only the
	// seed namespace's token is granted.
	GatedRepo = llamaRepo
	// AgentConcurrency and AgentPartSize are the agents' engine settings in the run: a download
	// stopped at any moment loses at most AgentConcurrency parts in flight.
	AgentConcurrency = 16
	AgentPartSize    = 16 << 20
	// HubToken is the token the Hub stand-in grants GatedRepo to.
	HubToken = hubToken
	// ServerImage is the seed's image: the stand-in model server, large.
	ServerImage = "vllm/vllm-openai:latest"
	// CatalogImage is the test catalog's JumpStart image.
	CatalogImage = "vllm/vllm-openai:v0.6.3"
	// Warm1 and Warm2 are of the seed's instance type; Cold is not, so it never holds the caches.
	Warm1, Warm2, Cold = "g5-1", "g5-2", "g5x-1"
)

// Options describe the run.
type Options struct {
	// Dir holds everything the run makes.
	Dir string
	// ModelSize is the InferenceEndpointConfig's model's size.
	ModelSize int64
	// Logf receives what the run does, step by step.
	Logf func(format string, args ...any)
	// Nodes are the cluster's nodes. Default: Warm1 and Warm2 of the seed's instance type and
	// Cold of another, labelled as HyperPod labels them, each with a disk of its own at
	// CacheRoot.
	Nodes []realnode.NodeOptions
	// AdmissionPlugins are admission plugins the API server runs besides its defaults.
	AdmissionPlugins []string
	// CatalogGPUs is how many GPUs the test catalog's JumpStart pods ask for (0, so that they
	// never take one an InferenceEndpointConfig's pods need; the shipped catalog's ask for 1).
	CatalogGPUs int
	// Release, when set, publishes prewarm to the cluster's registry as a release does (make push
	// and make chart-push) instead of installing it: the caller installs it from there
	// (InstallRelease), as a user would.
	Release bool
}

// AgentReserve is the room the agents of a run keep free on their disks (agent.reserve).
const AgentReserve = "1Gi"

// DiskSize is the size of the nodes' disks for a model of size bytes: room for the caches a run
// makes of it and of the JumpStart model, beside the agents' reserve (the chart's 20 GiB). The
// disks are sparse: only what is written takes room on this machine.
func DiskSize(modelSize int64) int64 { return 4*modelSize + 24<<30 }

// Env is the running cluster, its sources, and prewarm installed on it.
type Env struct {
	C   *realnode.Cluster
	S3  *s3fixture.Server
	Hub *hubfixture.Hub
	// Root is the module root; Dir the run's folder.
	Root, Dir string
	// Model and JSModel are the two parents' models, file by file.
	Model, JSModel []FileSpec
	// HubCommit is the commit of GatedRepo.
	HubCommit string

	logf func(format string, args ...any)
}

// FileSpec is one file of a model and what the model server checks it against.
type FileSpec struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	seed   uint64
	data   []byte
}

// ModelBytes is the size of a model.
func ModelBytes(files []FileSpec) int64 {
	var n int64
	for _, f := range files {
		n += f.Size
	}
	return n
}

// Start starts the cluster (two nodes of the seed's instance type, one of another), S3 with a
// model of ModelSize and the Hub stand-in, pushes every image, and installs prewarm's chart. On
// error, what was started is stopped.
func Start(ctx context.Context, o Options) (*Env, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return nil, err
	}
	e := &Env{Root: root, Dir: o.Dir, logf: o.Logf}
	if e.logf == nil {
		e.logf = func(string, ...any) {}
	}
	if err := e.start(ctx, o); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	return e, nil
}

func (e *Env) start(ctx context.Context, o Options) error {
	start := time.Now()
	modelSize := o.ModelSize
	nodes := o.Nodes
	if nodes == nil {
		disk := map[string]int64{CacheRoot: DiskSize(modelSize)}
		nodes = []realnode.NodeOptions{
			{Name: Warm1, InstanceType: "ml.g5.24xlarge", GPUs: 8, Disks: disk},
			{Name: Warm2, InstanceType: "ml.g5.24xlarge", GPUs: 8, Disks: disk},
			{Name: Cold, InstanceType: "ml.g5.xlarge", GPUs: 8, Disks: disk},
		}
	}
	c, err := realnode.Start(ctx, realnode.Options{Dir: filepath.Join(e.Dir, "cluster"), Nodes: nodes, Mirrors: []string{"docker.io"},
		AdmissionPlugins: o.AdmissionPlugins})
	if err != nil {
		return err
	}
	e.C = c
	e.logf("control plane and %d real nodes Ready in %s", len(nodes), time.Since(start).Round(time.Millisecond))
	if e.S3, err = s3fixture.StartOn(realnode.HostIP, filepath.Join(e.Dir, "s3"), filepath.Join(c.LogDir, "versitygw.log")); err != nil {
		return err
	}
	if e.Hub, err = hubfixture.StartOn(realnode.HostIP); err != nil {
		return err
	}
	if err := e.putModel(ctx, modelSize); err != nil {
		return err
	}
	e.logf("s3://%s/%s: %d files, %d bytes, at %s", Bucket, Prefix, len(e.Model), ModelBytes(e.Model), e.S3.Endpoint)
	commit := e.putHubModel()
	e.HubCommit = commit
	if err := e.pushTestImages(); err != nil {
		return err
	}
	if err := e.prepare(ctx, commit, o.CatalogGPUs); err != nil {
		return err
	}
	if o.Release {
		return e.publish(ctx)
	}
	if err := e.pushImages(); err != nil {
		return err
	}
	return e.install(ctx)
}

// Stop stops the cluster and the sources.
func (e *Env) Stop() error {
	var err error
	if e.C != nil {
		err = e.C.Stop()
	}
	if e.S3 != nil {
		e.S3.Stop()
	}
	if e.Hub != nil {
		e.Hub.Close()
	}
	return err
}

// KeepLogs copies the processes' logs and the nodes' container logs into dest/realnode-logs.
func (e *Env) KeepLogs(dest string) error {
	to := filepath.Join(dest, "realnode-logs")
	if out, err := exec.Command("cp", "-r", e.C.LogDir, to).CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	for _, n := range e.C.Nodes {
		_ = exec.Command("cp", "-r", n.HostPath("/var/log/pods"), filepath.Join(to, n.Name+"-pods")).Run()
	}
	return nil
}

// putModel writes a model shaped like a real one (config files and two safetensors shards) of
// about size bytes to S3, and remembers each file's digest.
func (e *Env) putModel(ctx context.Context, size int64) error {
	if err := e.S3.CreateBucket(ctx, Bucket); err != nil {
		return err
	}
	small := []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama"}`)
	e.Model = []FileSpec{
		{Path: "config.json", data: small},
		{Path: "tokenizer.json", Size: 2 << 20, seed: 11},
		{Path: "model-00001-of-00002.safetensors", Size: (size - 2<<20) / 2, seed: 12},
		{Path: "model-00002-of-00002.safetensors", Size: (size - 2<<20) / 2, seed: 13},
	}
	for i := range e.Model {
		f := &e.Model[i]
		if f.data != nil {
			f.Size = int64(len(f.data))
			sum := sha256.Sum256(f.data)
			f.SHA256 = hex.EncodeToString(sum[:])
			if err := e.S3.PutBytes(ctx, Bucket, Prefix+"/"+f.Path, f.data); err != nil {
				return err
			}
			continue
		}
		h := sha256.New()
		if _, err := io.Copy(h, io.LimitReader(gen.Reader(f.seed), f.Size)); err != nil {
			return err
		}
		f.SHA256 = hex.EncodeToString(h.Sum(nil))
		if err := e.S3.Put(ctx, Bucket, Prefix+"/"+f.Path, io.LimitReader(gen.Reader(f.seed), f.Size), f.Size); err != nil {
			return err
		}
	}
	return nil
}

// putHubModel puts the JumpStart model on the Hub stand-in, gated, and returns its commit.
func (e *Env) putHubModel() string {
	files := map[string][]byte{
		"config.json":       []byte(`{"architectures":["LlamaForCausalLM"]}`),
		"model.safetensors": gen.Bytes(7, 12<<20),
		"tokenizer.json":    gen.Bytes(8, 1<<20),
	}
	for p, data := range files {
		sum := sha256.Sum256(data)
		e.JSModel = append(e.JSModel, FileSpec{Path: p, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	}
	commit := e.Hub.AddCommit(llamaRepo, "main", files)
	e.Hub.SetGated(llamaRepo, hubToken)
	return commit
}

// pushImages builds and pushes prewarm's images (with hack/images, as `make push` does), tagged
// Version.
func (e *Env) pushImages() error {
	start := time.Now()
	cmd := exec.Command("go", "run", "./hack/images", "--out", filepath.Join(e.Dir, "images"), "--version", Version,
		"--push", e.C.Registry+"/prewarm")
	cmd.Dir = e.Root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/images: %w\n%s", err, out)
	}
	e.logf("prewarm's images built by hack/images and pushed to %s/prewarm in %s", e.C.Registry, time.Since(start).Round(time.Millisecond))
	return nil
}

// Registry is where a Release run publishes prewarm: the images under it, the chart at
// oci://<Registry>/charts/prewarm.
func (e *Env) Registry() string { return e.C.Registry + "/prewarm" }

// publish publishes prewarm as a release does, to Registry: `make push` and `make chart-push`.
func (e *Env) publish(ctx context.Context) error {
	start := time.Now()
	for _, target := range []string{"push", "chart-push"} {
		// Its own image folder: hack/images empties the one it writes, and test/chart's release
		// test may push beside it.
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", target, "REGISTRY="+e.Registry(), "HELM_PUSH_FLAGS=--plain-http",
			"IMAGES_OUT="+filepath.Join(e.Dir, "release-images"))
		cmd.Dir = e.Root
		cmd.Env = append(os.Environ(), e.helmEnv()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make %s: %w\n%s", target, err, out)
		}
	}
	e.logf("prewarm published as a release to %s (make push, make chart-push) in %s", e.Registry(), time.Since(start).Round(time.Millisecond))
	return nil
}

// helmEnv keeps helm's caches and settings in the run's folder: none of the user's is read.
func (e *Env) helmEnv() []string {
	h := filepath.Join(e.Dir, "helm")
	return []string{"HELM_CACHE_HOME=" + h, "HELM_CONFIG_HOME=" + h, "HELM_DATA_HOME=" + h, "DOCKER_CONFIG=" + h}
}

// Helm runs helm against the cluster.
func (e *Env) Helm(ctx context.Context, args ...string) ([]byte, error) {
	bin, err := testutil.TestBinDir()
	if err != nil {
		return nil, err
	}
	helm, err := filepath.Glob(filepath.Join(bin, "helm-*"))
	if err != nil || len(helm) == 0 {
		return nil, fmt.Errorf("no helm in %s: run `make testbin`", bin)
	}
	cmd := exec.CommandContext(ctx, helm[0], append(args, "--kubeconfig", e.C.Kubeconfig)...)
	cmd.Env = append(os.Environ(), e.helmEnv()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// InstallRelease installs the release Publish published, from its chart in the registry, with
// the values given (a values file's content), as the install doc does: helm install --wait.
func (e *Env) InstallRelease(ctx context.Context, values string) error {
	file := filepath.Join(e.Dir, fmt.Sprintf("values-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(file, []byte(values), 0o644); err != nil {
		return err
	}
	start := time.Now()
	if _, err := e.Helm(ctx, "install", "prewarm", "oci://"+e.Registry()+"/charts/prewarm", "--version", version.Number, "--plain-http",
		"--namespace", OpNS, "--values", file, "--wait", "--timeout", "5m"); err != nil {
		return fmt.Errorf("%w\n%s", err, e.PodReport(ctx, OpNS))
	}
	e.logf("helm install oci://%s/charts/prewarm --version %s --wait: up in %s", e.Registry(), version.Number, time.Since(start).Round(time.Millisecond))
	return nil
}

// pushTestImages builds and pushes the stand-in model server as the seed's and the catalog's
// images, and the sandbox (pause) image.
func (e *Env) pushTestImages() error {
	start := time.Now()
	bins := filepath.Join(e.Dir, "bin")
	read := map[string][]byte{}
	for pkg, out := range map[string]string{"./test/images/modelserver": "modelserver", "./cmd/sleeper": "sleeper"} {
		p := filepath.Join(bins, out)
		if err := realnode.BuildStatic(e.Root, pkg, p); err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		read[out] = b
	}
	big, err := e.serverLayers(read["modelserver"], 100)
	if err != nil {
		return err
	}
	catalog, err := e.serverLayer(read["modelserver"], e.JSModel)
	if err != nil {
		return err
	}
	pause, err := realnode.FilesLayer(map[string]realnode.File{"pause": {Data: read["sleeper"], Mode: 0o755}})
	if err != nil {
		return err
	}
	for _, im := range []struct {
		ref, entrypoint string
		layers          []v1.Layer
	}{{ServerImage, "/modelserver", big}, {CatalogImage, "/modelserver", []v1.Layer{catalog}}, {"pause:3.10", "/pause", []v1.Layer{pause}}} {
		img, err := realnode.ImageOf([]string{im.entrypoint}, im.layers...)
		if err != nil {
			return err
		}
		if im.entrypoint == "/modelserver" {
			// The model server runs as a non-root user, as the restricted Pod Security level
			// requires (vLLM's own image runs as root; its users there rebuild it).
			if img, err = asUser(img, "65532"); err != nil {
				return err
			}
		}
		if err := e.C.Push(im.ref, img); err != nil {
			return fmt.Errorf("pushing %s: %w", im.ref, err)
		}
	}
	e.logf("test images (%s standing in for the seed's, %s, pause) pushed in %s", ServerImage, CatalogImage, time.Since(start).Round(time.Millisecond))
	return nil
}

// serverLayers are the layers of an image of the seed's shape, large, in several layers, as an
// inference image is: the model server and its model's listing, then three layers of 200 MiB of
// incompressible bytes, drawn from seed.
func (e *Env) serverLayers(server []byte, seed uint64) ([]v1.Layer, error) {
	l, err := e.serverLayer(server, e.Model)
	if err != nil {
		return nil, err
	}
	layers := []v1.Layer{l}
	for i := range 3 {
		l, err := realnode.RandomLayer(fmt.Sprintf("/usr/lib/weights-free-%d.bin", i), seed+uint64(i), 200<<20)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	return layers, nil
}

// PushServerImage pushes, as ref, an image of the seed's image's shape whose large layers are
// drawn from seed: with a seed other than the seed's image's (100), a node that holds that image
// still pulls all of this one.
func (e *Env) PushServerImage(ref string, seed uint64) error {
	server, err := os.ReadFile(filepath.Join(e.Dir, "bin", "modelserver"))
	if err != nil {
		return err
	}
	layers, err := e.serverLayers(server, seed)
	if err != nil {
		return err
	}
	img, err := realnode.ImageOf([]string{"/modelserver"}, layers...)
	if err != nil {
		return err
	}
	if img, err = asUser(img, "65532"); err != nil {
		return err
	}
	return e.C.Push(ref, img)
}

// asUser sets the image's user.
func asUser(img v1.Image, user string) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Config.User = user
	return mutate.ConfigFile(img, cf)
}

// serverLayer is the model server and its model's listing, where it reads it by default.
func (e *Env) serverLayer(server []byte, model []FileSpec) (v1.Layer, error) {
	listing, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	return realnode.FilesLayer(map[string]realnode.File{
		"modelserver":                  {Data: server, Mode: 0o755},
		"etc/modelserver/listing.json": {Data: listing},
	})
}

// values are the chart values of the run: prewarm's images from the loopback registry, the
// agents' and the controller's S3 credentials, and the sources' endpoints.
func (e *Env) values() map[string]any {
	return map[string]any{
		"image":   map[string]any{"registry": e.C.Registry + "/prewarm", "tag": Version},
		"catalog": map[string]any{"enabled": false},
		"agent": map[string]any{
			"envFrom": []any{map[string]any{"secretRef": map[string]any{"name": "prewarm-s3"}}},
		},
		"controller": map[string]any{
			"envFrom": []any{map[string]any{"secretRef": map[string]any{"name": "prewarm-s3"}}},
		},
		"config": config.OperatorConfiguration{
			CacheRoots:  []config.CacheRoot{{Path: CacheRoot}},
			S3:          config.S3{Endpoint: e.S3.Endpoint, PathStyle: true, CredentialsSecret: "prewarm-s3"},
			HuggingFace: config.HuggingFace{Endpoint: e.Hub.URL},
			// The seed's bucket is read with the agents' own identity, for every namespace.
			SourceAccess: []config.SourceRule{{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: Bucket}}},
			Controller:   config.Controller{GateTimeout: metav1.Duration{Duration: 10 * time.Minute}},
			// Progress every second: the tests act at points of a download.
			// The agents read the kubelets' configuration (EKS's path): they evict only when this
			// machine's disk, which every node's kubelet directory is on, is truly full.
			Agent: config.Agent{Reserve: ptr.To(resource.MustParse(AgentReserve)), MaxParallel: 2, Concurrency: AgentConcurrency, PartSize: ptr.To(resource.MustParse("16Mi")), ProgressInterval: metav1.Duration{Duration: time.Second},
				Kubelet: config.Kubelet{ConfigFile: realnode.KubeletConfig}},
			// Sharing off: these runs time a cold node reading S3 (at S3's pace, 120 MB/s in
			// one of them) and count what S3 sends it; with sharing, the cold node would take the
			// model from the warm one. Sharing is measured by make bench-fanout and the e2e tests.
			Peers: config.Peers{Disabled: true},
		},
	}
}

// prepare creates the operator namespace with the JumpStart catalog (pointing at the Hub
// stand-in) and the S3 credentials, and the seed namespace's Secrets.
func (e *Env) prepare(ctx context.Context, commit string, gpus int) error {
	creds := map[string][]byte{"AWS_ACCESS_KEY_ID": []byte(s3fixture.AccessKey), "AWS_SECRET_ACCESS_KEY": []byte(s3fixture.SecretKey)}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OpNS}},
		builders.JumpStartCatalogGPUs(OpNS, llamaRepo, commit, gpus),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: OpNS, Name: "prewarm-s3"}, Data: creds},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "prewarm-s3"}, Data: creds},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hf-token"}, Data: map[string][]byte{"token": []byte(hubToken)}},
	} {
		if err := e.C.Client.Create(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// install runs `helm install` of the chart in the module, with the run's images and values.
func (e *Env) install(ctx context.Context) error {
	b, err := yaml.Marshal(e.values())
	if err != nil {
		return err
	}
	valuesFile := filepath.Join(e.Dir, "values.yaml")
	if err := os.WriteFile(valuesFile, b, 0o644); err != nil {
		return err
	}
	start := time.Now()
	if _, err := e.Helm(ctx, "install", "prewarm", filepath.Join(e.Root, "charts", "prewarm"),
		"--namespace", OpNS, "--values", valuesFile, "--wait", "--timeout", "5m"); err != nil {
		return fmt.Errorf("%w\n%s", err, e.PodReport(ctx, OpNS))
	}
	e.logf("helm install --wait: the controller and an agent per node up from those images in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// ApplySeed creates the seed's two manifests (config/samples, the seed's files) unchanged.
func (e *Env) ApplySeed(ctx context.Context) error {
	return CreateSeed(ctx, e.C.Client, e.Root, e.logf)
}

// CreateSeed creates the seed's two manifests from the module at root, unchanged, with c.
func CreateSeed(ctx context.Context, c client.Client, root string, logf func(string, ...any)) error {
	for _, f := range []string{"inference-endpoint-config.yaml", "jumpstart-model.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, "config", "samples", f))
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			return err
		}
		if err := c.Create(ctx, u); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		logf("created %s %s/%s (config/samples/%s)", u.GetKind(), u.GetNamespace(), u.GetName(), f)
	}
	return nil
}

// PodReport describes the namespace's pods, for failure messages.
func (e *Env) PodReport(ctx context.Context, ns string) string {
	var pods corev1.PodList
	if err := e.C.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	// The not Ready pods' last events say why (a refused mount, a failed pull).
	var events eventsv1.EventList
	_ = e.C.Client.List(ctx, &events, client.InNamespace(ns)) // none listed: the report without them
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
		if !PodReady(&p) {
			for _, ev := range lastEvents(events.Items, p.UID, 4) {
				fmt.Fprintf(&b, "  %s %s (%s, x%d): %s\n", ev.Type, ev.Reason, ev.ReportingController, max(1, ev.DeprecatedCount), text.Clip(ev.Note, 400))
			}
		}
	}
	return b.String()
}

// lastEvents are the last n events regarding the object uid, oldest first.
func lastEvents(events []eventsv1.Event, uid types.UID, n int) []eventsv1.Event {
	var about []eventsv1.Event
	for _, ev := range events {
		if ev.Regarding.UID == uid {
			about = append(about, ev)
		}
	}
	slices.SortStableFunc(about, func(a, b eventsv1.Event) int { return EventTime(a).Compare(EventTime(b)) })
	return about[max(0, len(about)-n):]
}

// EventTime is when the event last happened, whichever API wrote it.
func EventTime(ev eventsv1.Event) time.Time {
	switch {
	case ev.Series != nil:
		return ev.Series.LastObservedTime.Time
	case !ev.DeprecatedLastTimestamp.IsZero():
		return ev.DeprecatedLastTimestamp.Time
	}
	return ev.EventTime.Time
}
