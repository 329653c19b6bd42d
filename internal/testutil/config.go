package testutil

import (
	"path/filepath"
	"testing"

	"github.com/prewarm/prewarm/internal/config"
)

// OperatorConfig writes op as an operator configuration file in a test's temporary directory
// and returns its path, for the binaries' --config.
func OperatorConfig(t testing.TB, op config.OperatorConfiguration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := op.Write(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// DirRoots are cache roots at paths that are directories of the machine the test runs on, not
// disks of their own: the nodes the tests simulate with agent processes keep their caches there
// (cacheRoots[].allowRootFilesystem). Their watermarks are 100 %: the machine's disk is not a
// node's, and how full other things make it (build caches, other suites' files, the blocks a
// filesystem keeps for root, all of which the agent counts as used on a disk it shares) says
// nothing of the test. A cache there still never takes more than the disk has available, and
// the tests of watermarks and eviction set their own on disks of their own.
func DirRoots(paths ...string) []config.CacheRoot {
	out := make([]config.CacheRoot, len(paths))
	for i, p := range paths {
		out[i] = config.CacheRoot{Path: p, AllowRootFilesystem: true, HighWatermarkPercent: 100, LowWatermarkPercent: 100}
	}
	return out
}

// NoKubelet are the thresholds of a node beside which no kubelet runs: the agent processes the
// tests and the sandbox start keep their caches on the machine's own disk (DirRoots), which the
// agents take for the node's root filesystem and so keep clear of a kubelet's thresholds. No
// kubelet evicts anything there, so none are kept clear of: the roots' own watermarks stand.
func NoKubelet() config.Kubelet {
	none := int32(0)
	return config.Kubelet{
		EvictionHard:                map[string]string{config.SignalNodefsAvailable: "0%", config.SignalImagefsAvailable: "0%"},
		ImageGCHighThresholdPercent: 100,
		MarginPercent:               &none,
	}
}
