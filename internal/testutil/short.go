package testutil

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// The tests that need the test binaries (kube-apiserver, etcd, kwok, versitygw, kubelets: make
// testbin) are skipped with go test -short, so that make test-unit runs the rest in about a
// minute on a machine without them.

// NeedsTestBin skips t under -short.
func NeedsTestBin(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the test binaries (make testbin): not run with -short")
	}
}

// SkipPackageIfShort, first in a TestMain whose tests all need the test binaries, reports
// whether to skip them all (go test -short), saying so.
func SkipPackageIfShort() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	if !testing.Short() {
		return false
	}
	fmt.Fprintln(os.Stderr, "-short: this package's tests need the test binaries (make testbin); none run")
	return true
}
