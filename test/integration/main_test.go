// Package integration tests prewarm's API against a real kube-apiserver and etcd, built by
// hack/testbin.sh.
package integration

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/test/compat/hyperpodstatus"
)

var server *testutil.APIServer

// The API server also serves KEDA's ScaledObject (its CRD, as KEDA v2.21.0 ships it): the
// controller writes them for autoScalingSpec.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithAPIServer(statusChecked{m}, &server, testutil.KEDACRDs()))
}

// statusChecked runs the package's tests while watching every parent they make: each status
// the controller writes, of every parent in every test, must be one HyperPod's clients read
// (hyperpodstatus.Check). A status they would drop fails the package.
type statusChecked struct{ m *testing.M }

func (r statusChecked) Run() int {
	w, err := hyperpodstatus.StartWatch(server.Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: watching the parents' status:", err)
		return 1
	}
	code := r.m.Run()
	checked, problems := w.Stop(context.Background())
	if testing.Short() {
		return code
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: statuses HyperPod's clients would not read:\n")
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "  "+p)
		}
		return 1
	}
	if code != 0 {
		return code
	}
	if checked == 0 {
		fmt.Fprintln(os.Stderr, "FAIL: no parent status was seen: the status check checked nothing")
		return 1
	}
	fmt.Printf("checked %d parent statuses against HyperPod's clients\n", checked)
	return 0
}

// kubeMinor is the test API server's Kubernetes minor version (31 for 1.31.14): make
// test-oldest runs this package against the oldest supported Kubernetes, where some answers of
// the server differ.
func kubeMinor(t *testing.T) int {
	t.Helper()
	v, err := server.KubeVersion()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		t.Fatal(err)
	}
	return int(parsed.Minor())
}
