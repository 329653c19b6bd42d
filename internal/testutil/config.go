package testutil

import (
	"path/filepath"
	"testing"

	"github.com/prewarm/prewarm/internal/config"
)

// OperatorConfig writes op as an operator configuration file in a test's temporary directory
// and returns its path, for the binaries' --config.
func OperatorConfig(t testing.TB, op config.Operator) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := op.Write(path); err != nil {
		t.Fatal(err)
	}
	return path
}
