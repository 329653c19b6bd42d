package chart

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
)

// The chart installs on the Kubernetes versions prewarm supports, from the oldest one the tests
// run (K8S_OLDEST_VERSION in hack/testbin.sh: make test-oldest runs the API-level suites against
// its control plane) to the newest (K8S_VERSION), including the versions the clouds report
// (EKS's v1.31.13-eks-…, GKE's v1.31.6-gke.…); on the minor release before the oldest, helm refuses
// it before anything is installed, saying which versions it needs.
func TestChartInstallsOnTheSupportedKubernetesVersionsOnly(t *testing.T) {
	oldest, newest := pin(t, "K8S_OLDEST_VERSION"), pin(t, "K8S_VERSION")
	major, rest, _ := strings.Cut(strings.TrimPrefix(oldest, "v"), ".")
	minorText, _, _ := strings.Cut(rest, ".")
	minor, err := strconv.Atoi(minorText)
	if major != "1" || err != nil {
		t.Fatalf("K8S_OLDEST_VERSION %s is not a Kubernetes 1.x version", oldest)
	}
	for _, v := range []string{
		oldest, newest,
		fmt.Sprintf("v1.%d.0", minor),
		fmt.Sprintf("v1.%d.13-eks-3025e55", minor),
		fmt.Sprintf("v1.%d.6-gke.1020000", minor),
	} {
		runHelm(t, "template", "prewarm", "charts/prewarm", "--namespace", namespace, "--kube-version", v)
	}

	older := fmt.Sprintf("v1.%d.99", minor-1)
	out, err := helmCmd(t, "template", "prewarm", "charts/prewarm", "--namespace", namespace, "--kube-version", older).CombinedOutput()
	if err == nil {
		t.Fatalf("helm rendered the chart for Kubernetes %s, older than the oldest supported %s", older, oldest)
	}
	want := fmt.Sprintf("chart requires kubeVersion: >=1.%d.0-0 which is incompatible with Kubernetes %s", minor, older)
	if !strings.Contains(string(out), want) {
		t.Errorf("helm's refusal for Kubernetes %s does not say %q:\n%s", older, want, out)
	}
}

func pin(t *testing.T, name string) string {
	t.Helper()
	v, err := testutil.TestBinPin(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
