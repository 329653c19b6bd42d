// Package architecture checks the import rules that keep prewarm's layers apart.
package architecture

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
)

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs `go list -json` on patterns in the module root.
func list(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps"}, patterns...)...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", patterns, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %v found no packages", patterns)
	}
	return pkgs
}

func isStdlib(path string) bool { return !strings.Contains(strings.SplitN(path, "/", 2)[0], ".") }

// API types are imported by every client of prewarm: they may depend only on apimachinery,
// k8s.io/api and each other, never on controller-runtime, client-go or prewarm's internals.
func TestAPIImportsOnlyAPIMachineryAndCoreAPI(t *testing.T) {
	for _, p := range list(t, "./api/...") {
		for _, imp := range p.Imports {
			switch {
			case isStdlib(imp),
				strings.HasPrefix(imp, "k8s.io/apimachinery/"),
				strings.HasPrefix(imp, "k8s.io/api/"),
				strings.HasPrefix(imp, "github.com/prewarm/prewarm/api/"):
			default:
				t.Errorf("%s imports %s; api/ may import only apimachinery and k8s.io/api", p.ImportPath, imp)
			}
		}
	}
}

// The download engine runs in the agent, in inference pods' init containers and on laptops:
// nothing from Kubernetes may reach it, not even indirectly.
func TestEngineImportsNothingFromKubernetes(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "pkg", "engine")); errors.Is(err, os.ErrNotExist) {
		t.Skip("pkg/engine does not exist yet")
	}
	for _, p := range list(t, "./pkg/engine/...") {
		for _, dep := range p.Deps {
			if strings.HasPrefix(dep, "k8s.io/") || strings.HasPrefix(dep, "sigs.k8s.io/") ||
				strings.HasPrefix(dep, "github.com/prewarm/prewarm/api/") ||
				strings.HasPrefix(dep, "github.com/prewarm/prewarm/internal/") {
				t.Errorf("%s depends on %s; pkg/engine must not depend on Kubernetes", p.ImportPath, dep)
			}
		}
	}
}

// The binaries prewarm ships link no test code, not even indirectly: the agent runs on every GPU
// node, the controller in every cluster. And the controller does not link the agent, nor the
// agent the controller. (prewarm-sandbox, a development tool on the test harness, is not shipped.)
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	const mod = "github.com/prewarm/prewarm/"
	testCode := []string{
		mod + "internal/testutil", mod + "internal/sandbox",
		"sigs.k8s.io/controller-runtime/pkg/envtest", "net/http/httptest", "testing",
	}
	notIn := map[string][]string{
		mod + "cmd/controller": {mod + "internal/agent", mod + "internal/cli/agentcmd"},
		mod + "cmd/agent":      {mod + "internal/controller", mod + "internal/cli/kubectl"},
	}
	for _, p := range list(t, "./cmd/agent", "./cmd/controller", "./cmd/kubectl-prewarm", "./cmd/sleeper") {
		for _, dep := range p.Deps {
			for _, bad := range append(testCode, notIn[p.ImportPath]...) {
				if dep == bad || strings.HasPrefix(dep, bad+"/") {
					t.Errorf("%s links %s", p.ImportPath, dep)
				}
			}
		}
	}
}

// Package testutil, the cluster harness every suite uses, imports no prewarm
// component: the agent's and the controllers' own tests import it from inside their packages,
// which an import of theirs would make a cycle. What runs a component in a test (an agent in
// process, the controller's indexes) is in testutil/harness.
func TestTestutilRootImportsNoComponent(t *testing.T) {
	const mod = "github.com/prewarm/prewarm/"
	components := []string{mod + "internal/agent", mod + "internal/controller", mod + "internal/cli", mod + "internal/sandbox"}
	for _, p := range list(t, "./internal/testutil") {
		for _, dep := range p.Deps {
			for _, c := range components {
				if dep == c || strings.HasPrefix(dep, c+"/") {
					t.Errorf("%s depends on %s; run components in tests from internal/testutil/harness", p.ImportPath, dep)
				}
			}
		}
	}
}

// The object builders (testutil/builders) are dependency-free: the API types and nothing that
// starts, dials or reads a cluster, so a unit test that builds a HyperPod object pulls in no
// harness.
func TestBuildersAreDependencyFree(t *testing.T) {
	const mod = "github.com/prewarm/prewarm/"
	allowed := []string{mod + "api/"}
	banned := []string{"sigs.k8s.io/controller-runtime", "k8s.io/client-go", "os/exec"}
	for _, p := range list(t, "./internal/testutil/builders") {
		for _, dep := range p.Deps {
			for _, b := range banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s; builders build objects, the cluster harness is internal/testutil", p.ImportPath, dep)
				}
			}
			if strings.HasPrefix(dep, mod) && !slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(dep, a) }) {
				t.Errorf("%s depends on %s; builders import only prewarm's API types", p.ImportPath, dep)
			}
		}
	}
}
