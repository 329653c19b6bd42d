package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// uninstallRecipe is the first shell block of docs/operations.md's "Uninstall" section.
func uninstallRecipe(t *testing.T) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Uninstall\n")
	if !ok {
		t.Fatal(`docs/operations.md has no "### Uninstall" section`)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal(`docs/operations.md's "Uninstall" has no sh block`)
	}
	block, _, _ = strings.Cut(block, "```")
	return block
}

// helmStandIn is the one stand-in of the recipe: the release's processes here are the
// controller and the agents, so `helm uninstall` ends them as the kubelet ends the pods of a
// Deployment and a DaemonSet being deleted (SIGTERM to each process group), and, as
// `--cascade=foreground --wait` does, returns once they are gone. It refuses any other helm
// command, so that the recipe cannot drift from what this stands in for.
const helmStandIn = `#!/bin/bash
[ "$*" = "uninstall prewarm -n hyperpod-inference-system --cascade=foreground --wait" ] || { echo "the test stands in only for the recipe's helm uninstall, not: helm $*" >&2; exit 2; }
for pid in $PREWARM_PIDS; do kill -TERM -- "-$pid" || exit 3; done
for pid in $PREWARM_PIDS; do while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done; done
echo "release \"prewarm\" uninstalled"
`

// The uninstall of docs/operations.md, run as written with every kind of prewarm object
// present: an endpoint's weights and image caches, a standalone ModelWeightsCacheConfig and
// ModelImageCache, and a ModelDataCacheConfig written by hand. The real kubectl runs every
// command; helm uninstall is helmStandIn. The recipe must finish, and leave no CRD (so no
// prewarm object), no prewarm label on a node, no Lease, no operator namespace, and none of
// prewarm's directories on a node's disk or under its kubelet's directory.
func TestUninstallRecipeLeavesNothing(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{MoreControllers: []string{"namespace-controller"}})
	ctx, c := e.ctx, e.c
	nodes := []string{"g5-a", "g5-b"}
	for _, n := range nodes {
		e.addNode(n, "g5.24xlarge", s3srv.Endpoint, e.csiArgs(n)...)
	}
	ctrlProc := e.startEnv("controller", controllerPath, nil,
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, builders.MakeInferenceEndpointConfig("team-a", "model").Location(prefix).Obj()); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, builders.MakeModelDataCacheConfig("team-a", "by-hand")); err != nil {
		t.Fatal(err)
	}
	e.applyStandaloneCaches()
	e.waitCacheIn("team-a", "model-cache", 2)

	// What the uninstall must take away is there: the checks below can fail.
	left := func() error {
		var errs []error
		crds := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinitionList"}}
		if err := c.List(ctx, crds, client.MatchingLabels{inferencev1.APILabel: "true"}); err != nil {
			return err
		}
		for _, crd := range crds.Items {
			errs = append(errs, fmt.Errorf("CRD %s", crd.Name))
		}
		var list corev1.NodeList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		for _, n := range list.Items {
			for l := range n.Labels {
				if strings.HasPrefix(l, inferencev1.WeightsCacheReadyLabelPrefix) || strings.HasPrefix(l, inferencev1.ImageCacheReadyLabelPrefix) {
					errs = append(errs, fmt.Errorf("node %s's label %s", n.Name, l))
				}
			}
		}
		var leases coordinationv1.LeaseList
		if err := c.List(ctx, &leases); err != nil {
			return err
		}
		for _, l := range leases.Items {
			if l.Labels[prewarmv1alpha1.AgentLeaseLabel] == "true" || l.Name == controller.LeaderElectionID {
				errs = append(errs, fmt.Errorf("Lease %s/%s", l.Namespace, l.Name))
			}
		}
		switch err := c.Get(ctx, client.ObjectKey{Name: opNS}, &corev1.Namespace{}); {
		case err == nil:
			errs = append(errs, fmt.Errorf("namespace %s", opNS))
		case !apierrors.IsNotFound(err):
			return err
		}
		for _, n := range nodes {
			for _, d := range []string{
				filepath.Join(e.nodeRoot(n), prewarmv1alpha1.Directory),
				filepath.Join(e.kubeletDir(n), "plugins", prewarmv1alpha1.CSIDriverName),
			} {
				switch _, err := os.Lstat(d); {
				case err == nil:
					errs = append(errs, fmt.Errorf("%s's directory %s", n, d))
				case !errors.Is(err, os.ErrNotExist):
					return err
				}
			}
		}
		return errors.Join(errs...)
	}
	before := fmt.Sprint(left())
	for _, want := range []string{
		"CRD modelweightscacheconfigs." + inferencev1.GroupVersion.Group, "label " + inferencev1.WeightsCacheReadyLabelPrefix,
		"label " + inferencev1.ImageCacheReadyLabelPrefix, "Lease " + opNS + "/g5-a", "Lease " + opNS + "/" + controller.LeaderElectionID,
		"namespace " + opNS, "g5-a's directory " + filepath.Join(e.nodeRoot("g5-a"), prewarmv1alpha1.Directory),
		"g5-b's directory " + filepath.Join(e.kubeletDir("g5-b"), "plugins", prewarmv1alpha1.CSIDriverName),
	} {
		if !strings.Contains(before, want) {
			t.Fatalf("before the uninstall, no %q among what is there:\n%s", want, before)
		}
	}

	// The parents' statuses are checked up to here: the recipe deletes their CRDs.
	e.checkStatuses()

	// The recipe, as the doc writes it, in one shell that stops at the first failure.
	bin, err := testutil.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "helm"), []byte(helmStandIn), 0o755); err != nil {
		t.Fatal(err)
	}
	pids := []string{strconv.Itoa(ctrlProc.Pid())}
	for _, n := range nodes {
		pids = append(pids, strconv.Itoa(e.agents[n].Pid()))
	}
	recipe := uninstallRecipe(t)
	t.Logf("the recipe:\n%s", recipe)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", recipe)
	// Stopped as a whole when the test's time is up: a command of the recipe that never returns
	// fails the test, with what the recipe printed until then.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "PATH="+stub+":"+bin+":"+os.Getenv("PATH"),
		"KUBECONFIG="+e.cluster.KubeconfigPath, "PREWARM_PIDS="+strings.Join(pids, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the recipe failed after %s: %v\n%s", time.Since(start).Round(time.Second), err, out)
	}
	t.Logf("the recipe finished in %s:\n%s", time.Since(start).Round(time.Second), out)
	if err := left(); err != nil {
		t.Errorf("left behind:\n%v", err)
	}
}
