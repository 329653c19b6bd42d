package serving

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/prewarm/prewarm/internal/testutil"
)

// An event that tells of a status transition is recorded only once the status is written: a
// reconcile whose status write conflicts records nothing, and the retry tells of it once.
func TestTransitionEventsWaitForTheStatusWrite(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Recorder: rec}
	iec := testutil.MakeInferenceEndpointConfig("ns", "m").Obj()
	m := fromEndpoint(iec)
	p := &problem{"InvalidSpec", "no"}

	ctx, _ := withTransitions(context.Background())
	r.fail(ctx, m, iec.Status.DeepCopy(), p) // the status whose write conflicts
	if n := len(rec.Events); n != 0 {
		t.Fatalf("%d events before the status write", n)
	}
	// The write conflicted: the retry starts again from the stored status.
	ctx, pending := withTransitions(context.Background())
	r.fail(ctx, m, iec.Status.DeepCopy(), p)
	pending.flush()
	if n := len(rec.Events); n != 1 {
		t.Fatalf("%d events after the written retry; want 1", n)
	}
	if e := <-rec.Events; e != corev1.EventTypeWarning+" InvalidSpec no" {
		t.Errorf("event %q", e)
	}
}
