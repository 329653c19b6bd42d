// Package integration tests prewarm's API against a real kube-apiserver and etcd, built by
// hack/testbin.sh.
package integration

import (
	"os"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
)

var server *testutil.APIServer

func TestMain(m *testing.M) { os.Exit(testutil.RunWithAPIServer(m, &server)) }
