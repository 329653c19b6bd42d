package placement

import (
	"fmt"
	"strings"
)

// LeftOut counts the nodes left out of a cache's targets, by why, and names the first few of
// each: what a cache with fewer targets than its placement selects says about the others.
type LeftOut struct {
	count int
	// nodes are the first maxNamedPerWhy nodes left out for each reason.
	nodes map[string][]string
	// whys are the reasons in the order first seen.
	whys []string
}

// maxNamedPerWhy is how many nodes left out for one reason a message names.
const maxNamedPerWhy = 5

// NotGrantedLead says, in LeftOut.Describe, that nodes are left out because a standalone
// cache's namespace is not granted them.
const NotGrantedLead = "not granted to the namespace's standalone caches"

// Add counts node as left out for why.
func (e *LeftOut) Add(why, node string) {
	if e.nodes == nil {
		e.nodes = map[string][]string{}
	}
	if _, ok := e.nodes[why]; !ok {
		e.whys = append(e.whys, why)
	}
	e.count++
	if len(e.nodes[why]) < maxNamedPerWhy {
		e.nodes[why] = append(e.nodes[why], node)
	}
}

// Count is how many nodes are left out.
func (e LeftOut) Count() int { return e.count }

// Describe says how many nodes are left out and on what ground (lead), each reason with the
// nodes it names ("": none is), for a condition.
func (e LeftOut) Describe(lead string) string {
	if e.count == 0 {
		return ""
	}
	parts := make([]string, len(e.whys))
	for i, why := range e.whys {
		parts[i] = fmt.Sprintf("%s (%s)", why, strings.Join(e.nodes[why], ", "))
	}
	return fmt.Sprintf("%d node(s) the placement selects are left out, %s: %s", e.count, lead, strings.Join(parts, "; "))
}
