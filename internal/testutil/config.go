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
// (cacheRoots[].allowRootFilesystem).
func DirRoots(paths ...string) []config.CacheRoot {
	out := make([]config.CacheRoot, len(paths))
	for i, p := range paths {
		out[i] = config.CacheRoot{Path: p, AllowRootFilesystem: true}
	}
	return out
}
