package serving

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// An event that tells of a status transition is recorded only once the status is written: a
// reconcile whose status write conflicts records only what it did, and the retry tells of the
// transition once.
func TestTransitionEventsWaitForTheStatusWrite(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Recorder: rec}
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	p := &problem{"InvalidSpec", "no"}

	s := &state{m: fromEndpoint(iec), status: iec.Status.DeepCopy()} // the status whose write conflicts
	s.record("DeploymentCreated", "Create", "created")
	s.fail(p)
	s.events.Emit(r.Recorder, s.m.owner, false)
	if n := len(rec.Events); n != 1 {
		t.Fatalf("%d events after a status write that failed; want 1 (what was done)", n)
	}
	if e := <-rec.Events; e != corev1.EventTypeNormal+" DeploymentCreated created" {
		t.Errorf("event %q", e)
	}
	// The write conflicted: the retry starts again from the stored status.
	s = &state{m: fromEndpoint(iec), status: iec.Status.DeepCopy()}
	s.fail(p)
	s.events.Emit(r.Recorder, s.m.owner, true)
	if n := len(rec.Events); n != 1 {
		t.Fatalf("%d events after the written retry; want 1", n)
	}
	if e := <-rec.Events; e != corev1.EventTypeWarning+" InvalidSpec no" {
		t.Errorf("event %q", e)
	}
	// A status that already tells of the problem tells of it no more.
	again := &state{m: s.m, status: s.status}
	again.fail(p)
	again.events.Emit(r.Recorder, again.m.owner, true)
	if n := len(rec.Events); n != 0 {
		t.Errorf("%d events for a problem the status already tells of", n)
	}
}
