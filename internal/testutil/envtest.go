// Package testutil is the cluster harness prewarm's tests share: a real control plane (etcd and
// kube-apiserver, with kwok or real kubelet nodes) from the binaries hack/testbin.sh builds,
// processes with their logs, waits, tokens and configuration files. The objects the tests
// create are built by testutil/builders, which needs none of this; the fixture servers
// (s3fixture, hubfixture, jsfixture) and the in-process components (harness) have packages of
// their own.
package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/scheme"
)

// ModuleRoot returns the directory that holds prewarm's go.mod, found from the working
// directory upwards (go test runs each package in its own directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(data), "module github.com/prewarm/prewarm\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("prewarm's go.mod not found above the working directory")
		}
		dir = parent
	}
}

// TestBinPin is a version hack/testbin.sh pins, by its variable (HELM_VERSION: v3.22.0).
func TestBinPin(name string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "testbin.sh"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `=(\S+)`).FindSubmatch(script)
	if m == nil {
		return "", fmt.Errorf("no %s in hack/testbin.sh", name)
	}
	return string(m[1]), nil
}

// TestBinDir returns the folder that holds the binaries hack/testbin.sh builds, failing with
// a message that says how to build them when kube-apiserver is not there.
func TestBinDir() (string, error) {
	if dir := os.Getenv("PREWARM_TESTBIN_DIR"); dir != "" {
		return dir, checkTestBin(dir)
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out, err := exec.Command("bash", filepath.Join(root, "hack", "testbin.sh"), "--print").Output()
	if err != nil {
		return "", fmt.Errorf("hack/testbin.sh --print: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	return dir, checkTestBin(dir)
}

// K8sBinDirEnv names a folder of kube-apiserver, kube-controller-manager and kube-scheduler that
// the harness runs instead of the testbin folder's (StartAPIServer, StartCluster): make
// test-oldest points it at the oldest Kubernetes prewarm supports (hack/testbin.sh
// --print-oldest). etcd, kwok, helm and the real-node tests' binaries still come from
// TestBinDir.
const K8sBinDirEnv = "PREWARM_K8S_BIN_DIR"

// KubeBinary returns the path of a control-plane binary (kube-apiserver, kube-controller-manager
// or kube-scheduler): from $PREWARM_K8S_BIN_DIR when it is set, else from TestBinDir.
func KubeBinary(name string) (string, error) {
	dir := os.Getenv(K8sBinDirEnv)
	if dir == "" {
		var err error
		if dir, err = TestBinDir(); err != nil {
			return "", err
		}
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is not built in %s: run `make testbin` (hack/testbin.sh) first", name, dir)
	}
	return path, nil
}

func checkTestBin(dir string) error {
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("%s is not built in %s: run `make testbin` (hack/testbin.sh) first", name, dir)
		}
	}
	return nil
}

// Scheme returns a scheme with the built-in kinds and both of prewarm's APIs.
func Scheme() *runtime.Scheme { return scheme.New() }

// APIServer is a real kube-apiserver and etcd with prewarm's CRDs installed.
type APIServer struct {
	// Config reaches the server as a cluster admin.
	Config *rest.Config
	// Client is a controller-runtime client (no cache) on Config.
	Client client.Client
	// Root is the module root, for tests that read files of the repository.
	Root string

	env *envtest.Environment
}

// StartAPIServer starts kube-apiserver and etcd from hack/testbin.sh's folder and installs the
// CRDs in config/crd/bases. Stop it when done.
func StartAPIServer() (*APIServer, error) { return startAPIServer("") }

// KEDACRDs is the folder holding KEDA's ScaledObject CRD as KEDA ships it (v2.21.0), for test
// API servers of clusters where KEDA is installed.
func KEDACRDs() string {
	root, err := ModuleRoot()
	if err != nil {
		panic(err) // tests run inside the module
	}
	return filepath.Join(root, "test", "testdata", "keda")
}

// StartAPIServerWith is StartAPIServer that also installs the CRDs in the folders crds (other
// projects' kinds prewarm writes, such as KEDA's ScaledObject).
func StartAPIServerWith(crds ...string) (*APIServer, error) { return startAPIServer("", crds...) }

// APIServerFor starts an API server for test t (skipped with -short) and stops it when t ends.
func APIServerFor(t testing.TB) *APIServer {
	t.Helper()
	NeedsTestBin(t)
	api, err := StartAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	return api
}

// startAPIServer is StartAPIServer with the two processes' output in logDir (when set).
func startAPIServer(logDir string, crds ...string) (*APIServer, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	bin, err := TestBinDir()
	if err != nil {
		return nil, err
	}
	apiserver, err := KubeBinary("kube-apiserver")
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    bin,
		CRDDirectoryPaths:        append([]string{filepath.Join(root, "config", "crd", "bases")}, crds...),
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	env.ControlPlane.GetAPIServer().Path = apiserver
	var logs []*os.File
	if logDir != "" {
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return nil, err
		}
		for _, name := range []string{"kube-apiserver", "etcd"} {
			f, err := os.Create(filepath.Join(logDir, name+".log"))
			if err != nil {
				return nil, err
			}
			logs = append(logs, f)
		}
		api := env.ControlPlane.GetAPIServer()
		api.Out, api.Err = logs[0], logs[0]
		env.ControlPlane.Etcd = &envtest.Etcd{Out: logs[1], Err: logs[1]}
	}
	cfg, err := env.Start()
	if err != nil {
		// Start may fail after the processes are up (e.g. a CRD the server refuses): stop them.
		_ = env.Stop()
		return nil, fmt.Errorf("starting %s and etcd from %s: %w", apiserver, bin, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	if err := installPriorityClasses(c, root); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &APIServer{Config: cfg, Client: c, Root: root, env: env}, nil
}

// installPriorityClasses creates the PriorityClasses that prewarm's install brings
// (config/agent/priorityclasses.yaml, which the chart matches), as an install would.
func installPriorityClasses(c client.Client, root string) error {
	b, err := os.ReadFile(filepath.Join(root, "config", "agent", "priorityclasses.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		pc := &schedulingv1.PriorityClass{}
		if err := yaml.UnmarshalStrict([]byte(doc), pc); err != nil {
			return fmt.Errorf("config/agent/priorityclasses.yaml: %w", err)
		}
		if err := c.Create(context.Background(), pc); err != nil {
			return fmt.Errorf("creating PriorityClass %s: %w", pc.Name, err)
		}
	}
	return nil
}

// KubeConfig returns a kubeconfig for a new cluster-admin user of the server, for processes
// (controller-manager, scheduler, kwok, prewarm's own binaries) that the tests start.
func (s *APIServer) KubeConfig() ([]byte, error) {
	user, err := s.env.AddUser(envtest.User{Name: "prewarm-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	return user.KubeConfig()
}

// KubeVersion is the server's Kubernetes version without its "v" (1.37.2), as helm's
// --kube-version takes it.
func (s *APIServer) KubeVersion() (string, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(s.Config)
	if err != nil {
		return "", err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(v.GitVersion, "v"), nil
}

// Stop stops the server and etcd and removes their data.
func (s *APIServer) Stop() error { return s.env.Stop() }

// Table fetches a list (an API path) as the server's Table, the form `kubectl get` prints.
func (s *APIServer) Table(path string) (*metav1.Table, error) { return Table(s.Config, path) }

// Table fetches a list (an API path) from the server cfg names as a Table.
func Table(cfg *rest.Config, path string) (*metav1.Table, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL, resp.Status, body)
	}
	tab := &metav1.Table{}
	return tab, json.Unmarshal(body, tab)
}

// TableHeaders returns the column names kubectl prints by default (priority 0), as kubectl
// prints them: upper-cased.
func TableHeaders(tab *metav1.Table) []string {
	var out []string
	for _, c := range tab.ColumnDefinitions {
		if c.Priority == 0 {
			out = append(out, strings.ToUpper(c.Name))
		}
	}
	return out
}

// RunWithAPIServer runs a package's tests (from its TestMain) against one API server, started
// first (with prewarm's CRDs and those in the folders crds) and stored in *server, and stopped
// after them; it returns the exit code.
func RunWithAPIServer(m interface{ Run() int }, server **APIServer, crds ...string) int {
	if SkipPackageIfShort() {
		return 0
	}
	s, err := StartAPIServerWith(crds...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*server = s
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the API server:", err)
	}
	return code
}
