// Package harness runs prewarm's own components inside a test: an agent under its own manager
// against a test API server (RunAgent), and a client that answers the controller's indexed lists
// as its manager's cache would (IndexedClient). It is apart from package testutil, whose
// builders and cluster harness import no prewarm component, so that every package's tests,
// the agent's and the controller's included, can use those.
package harness

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
)

// RunAgent runs a prewarm agent for node in this process, under its own manager on api, until
// the test ends. A zero ProgressInterval becomes the StatusInterval: the tests watch downloads
// at every tick.
func RunAgent(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, o agent.Options) *agent.Agent {
	t.Helper()
	if o.ProgressInterval == 0 {
		o.ProgressInterval = o.StatusInterval
	}
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{
		Scheme:     testutil.Scheme(),
		Cache:      agent.CacheOptions(node),
		Client:     agent.ClientOptions(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Logger:     logr.Discard(),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, // several agents in one process
	})
	if err != nil {
		t.Fatal(err)
	}
	o.NodeName = node
	if o.Leases == nil {
		o.Leases = kubernetes.NewForConfigOrDie(api.Config)
	}
	a, err := agent.New(mgr.GetClient(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	a.SetRecorder(mgr.GetEventRecorder("prewarm-agent"))
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return a
}
