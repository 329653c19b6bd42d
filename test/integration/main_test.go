// Package integration tests prewarm's API against a real kube-apiserver and etcd, built by
// hack/testbin.sh.
package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
)

var server *testutil.APIServer

func TestMain(m *testing.M) {
	var err error
	server, err = testutil.StartAPIServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := server.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the API server:", err)
	}
	os.Exit(code)
}
