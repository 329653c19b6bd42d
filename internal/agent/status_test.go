package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/testutil"
)

// One cache's report never keeps the node's other caches from being reported. The status is
// written whole, so a message past the 1,024 characters a report holds ("listing s3://" and a
// 1,010-character prefix, or an error quoting it) would have the API server refuse the node's
// every report: bound clips it on whole characters, and should the server still refuse an entry,
// the others are written without it.
func TestOneCachesReportNeverBreaksTheNodesStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := testutil.APIServerFor(t)
	const node = "node-long-report"
	if err := api.Client.Create(ctx, &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(api.Client, agent.Options{NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	const uidLong, uidReady = "dddddddd-0000-4000-8000-00000000000a", "dddddddd-0000-4000-8000-00000000000b"
	report := func() prewarmv1alpha1.NodeCacheStatus {
		long := prewarmv1alpha1.CacheStatus{UID: uidLong}
		cachejob.Listing(&long, prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: "models", Prefix: strings.Repeat("é", 1010)})
		ready := prewarmv1alpha1.CacheStatus{UID: uidReady}
		cachejob.Verified(&ready, 1, 1<<20, "sha256:0")
		return prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{long, ready}}
	}
	reported := func() map[string]prewarmv1alpha1.CacheStatus {
		t.Helper()
		nc := &prewarmv1alpha1.NodeCache{}
		if err := api.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
			t.Fatal(err)
		}
		out := map[string]prewarmv1alpha1.CacheStatus{}
		for _, c := range nc.Status.Caches {
			out[c.UID] = c
		}
		return out
	}

	if err := a.WriteReport(ctx, report(), true); err != nil {
		t.Fatalf("writing the bounded report: %v", err)
	}
	got := reported()
	if got[uidReady].State != inferencev1.CacheReady {
		t.Errorf("the other cache's report: %+v; want Ready", got[uidReady])
	}
	if m := got[uidLong].Message; !strings.HasPrefix(m, "listing s3://models/éé") || utf8.RuneCountInString(m) > 1024 || !utf8.ValidString(m) {
		t.Errorf("the long cache's message, %d characters: %.80q…; want it clipped on whole characters", utf8.RuneCountInString(m), m)
	}

	// Were an entry refused all the same (a limit the agent does not know), the others go.
	if err := a.WriteReport(ctx, prewarmv1alpha1.NodeCacheStatus{}, true); err != nil {
		t.Fatal(err)
	}
	if err := a.WriteReport(ctx, report(), false); err != nil {
		t.Fatalf("writing a report with one entry the API server refuses: %v", err)
	}
	got = reported()
	if _, ok := got[uidLong]; ok || got[uidReady].State != inferencev1.CacheReady {
		t.Errorf("reports %+v; want the other cache Ready, the refused one left out", got)
	}
}
