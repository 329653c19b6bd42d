package agent

import (
	"context"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// WriteReport writes st to the node's NodeCache status as the status writer does, bounded first
// when bounded is set: for the tests of package agent_test, which start a real API server.
func (a *Agent) WriteReport(ctx context.Context, st prewarmv1alpha1.NodeCacheStatus, bounded bool) error {
	if bounded {
		bound(ctx, &st)
	}
	return a.writeStatus(ctx, st, true)
}
