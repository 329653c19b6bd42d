package weightscache

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// maxNodeEventTargets is the most target nodes a cache may have for its nodes' every transition
// to be an event (on more, only their failures are): an event is a write, and a fleet's caches
// would write one per node and transition.
const maxNodeEventTargets = 16

// nodeEvents queues, in s, the events of each node's cache becoming Ready, Failed or
// Downloading between the stored status and s.status.
func (r *Reconciler) nodeEvents(s *state) {
	m, st := s.m, &s.status
	event := func(eventType, reason, note string) { s.events.Tell(eventType, reason, "Download", note) }
	before := map[string]inferencev1.NodeCacheStatus{}
	for _, n := range m.Status.Nodes {
		before[n.Name] = n
	}
	// On a fleet larger than status.nodes holds, a node missing from either list says nothing
	// of its transitions: only the failures of listed nodes are told (the counts, the Ready
	// condition and each node's NodeCache tell the rest), not one event per node.
	small := int(st.TargetNodes) <= maxNodeEventTargets && len(m.Status.Nodes) < inferencev1.MaxStatusNodes && len(st.Nodes) < inferencev1.MaxStatusNodes
	for _, n := range st.Nodes {
		b, ok := before[n.Name]
		if ok && b.State == n.State && b.Reason == n.Reason {
			continue
		}
		evicted := n.State == inferencev1.CachePending && n.Reason == prewarmv1alpha1.ReasonEvicted
		if !small && (!ok || n.State != inferencev1.CacheFailed && !evicted) {
			continue
		}
		switch n.State {
		case inferencev1.CachePending:
			if evicted {
				event(corev1.EventTypeWarning, controller.EventNodeEvicted, fmt.Sprintf("node %s: %s: %s", n.Name, n.Reason, n.Message))
			}
		case inferencev1.CacheReady:
			event(corev1.EventTypeNormal, controller.EventNodeReady, fmt.Sprintf("node %s holds the cache: %s", n.Name, n.Message))
		case inferencev1.CacheFailed:
			event(corev1.EventTypeWarning, controller.EventNodeFailed, fmt.Sprintf("node %s: %s: %s", n.Name, n.Reason, n.Message))
		case inferencev1.CacheDownloading:
			if _, ok := before[n.Name]; !ok || before[n.Name].State != inferencev1.CacheDownloading {
				event(corev1.EventTypeNormal, controller.EventNodeDownloading, fmt.Sprintf("node %s started downloading", n.Name))
			}
		}
	}
}
