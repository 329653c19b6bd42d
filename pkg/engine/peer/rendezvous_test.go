package peer

import (
	"fmt"
	"testing"
)

// Every node of a group owns about its share of the parts, whatever its name looks like.
func TestRendezvousSpreadsTheParts(t *testing.T) {
	for _, names := range [][]string{
		{"node0", "node1"},
		{"run0-node0", "run0-node1", "run0-node2", "run0-node3", "run0-node4", "run0-node5", "run0-node6", "run0-node7"},
		{"ip-10-0-1-17.ec2.internal", "ip-10-0-1-18.ec2.internal", "ip-10-0-2-17.ec2.internal"},
	} {
		const parts = 4000
		owned := map[string]int{}
		for i := range parts {
			best, score := "", uint64(0)
			for _, n := range names {
				if s := rendezvous(n, i); best == "" || s > score {
					best, score = n, s
				}
			}
			owned[best]++
		}
		fair := parts / len(names)
		for _, n := range names {
			if got := owned[n]; got < fair*8/10 || got > fair*12/10 {
				t.Errorf("%v: %s owns %d of %d parts, want about %d", names, n, got, parts, fair)
			}
		}
		t.Log(fmt.Sprint(owned))
	}
}
