package agent

import (
	"fmt"
	"testing"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// One namespace's pods naming many caches (low UIDs) do not crowd another namespace's demand
// out of the capped list.
func TestDemandsAreSharedAmongNamespaces(t *testing.T) {
	count := map[prewarmv1alpha1.CacheDemand]int32{}
	for i := range 100 {
		count[prewarmv1alpha1.CacheDemand{UID: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), Namespace: "greedy"}] = 1
	}
	victim := prewarmv1alpha1.CacheDemand{UID: "ffffffff-ffff-4fff-8fff-ffffffffffff", Namespace: "team-b"}
	count[victim] = 2
	got := fairDemands(count, prewarmv1alpha1.MaxDemands)
	if len(got) != prewarmv1alpha1.MaxDemands {
		t.Fatalf("%d demands, want the cap %d", len(got), prewarmv1alpha1.MaxDemands)
	}
	kept := false
	for _, d := range got {
		kept = kept || d.UID == victim.UID && d.Namespace == "team-b" && d.Pods == 2
	}
	if !kept {
		t.Errorf("team-b's demand was crowded out by another namespace's %d", len(count)-1)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].UID > got[i].UID {
			t.Fatalf("demands not sorted by UID: %v", got)
		}
	}
	if len(fairDemands(map[prewarmv1alpha1.CacheDemand]int32{}, 64)) != 0 {
		t.Error("no demands listed some")
	}
}
