package controller

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// LegacyHeartbeat is how long an agent that keeps no Lease (one older than them, which writes
// its NodeCache status every minute instead) counts as alive after its last write.
const LegacyHeartbeat = 3 * time.Minute

// The agents' Leases are read from an informer of the operator namespace's Leases labelled
// prewarm.io/agent-lease (cmd/controller).
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=hyperpod-inference-system,resources=leases,verbs=list;watch

// Liveness tells whether the agent of a node is alive: it has renewed its Lease (named after the
// node, in the operator namespace) within the Lease's duration.
type Liveness struct {
	// Reader reads the Leases, from the informer.
	Reader    client.Reader
	Namespace string
	Now       func() time.Time
}

// Agent is what Liveness knows of a node's agent.
type Agent struct {
	Alive bool
	// Why says, for people, why a node's agent is not counted as alive.
	Why string
	// Renewed is when it last renewed its Lease (zero: it keeps none).
	Renewed time.Time
}

// Of tells whether the agent of node, whose NodeCache is nc (nil: none), is alive.
func (l Liveness) Of(ctx context.Context, node string, nc *prewarmv1alpha1.NodeCache) (Agent, error) {
	lease := &coordinationv1.Lease{}
	err := l.Reader.Get(ctx, types.NamespacedName{Namespace: l.Namespace, Name: node}, lease, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
		return l.legacy(nc), nil
	case err != nil:
		return Agent{}, err
	}
	return LeaseAgent(lease, l.Now()), nil
}

// LeaseAgent tells whether the agent that renews lease is alive at now.
func LeaseAgent(lease *coordinationv1.Lease, now time.Time) Agent {
	if lease.Spec.RenewTime == nil || lease.Spec.LeaseDurationSeconds == nil {
		return Agent{Why: fmt.Sprintf("the node's agent Lease %s/%s has never been renewed", lease.Namespace, lease.Name)}
	}
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	renewed := lease.Spec.RenewTime.Time
	if now.Sub(renewed) > duration {
		return Agent{Renewed: renewed, Why: fmt.Sprintf("the node's agent has not renewed its Lease %s/%s since %s (%s ago; it expires after %s): is the prewarm agent pod on this node running? What it reported before is not counted until it does",
			lease.Namespace, lease.Name, renewed.UTC().Format(time.RFC3339), now.Sub(renewed).Truncate(time.Second), duration)}
	}
	return Agent{Alive: true, Renewed: renewed}
}

// legacy judges an agent without a Lease by its last NodeCache status write.
func (l Liveness) legacy(nc *prewarmv1alpha1.NodeCache) Agent {
	if nc == nil || nc.Status.HeartbeatTime == nil {
		return Agent{Why: "no prewarm agent reports on this node; is the agent DaemonSet running here?"}
	}
	if last := nc.Status.HeartbeatTime.Time; l.Now().Sub(last) > LegacyHeartbeat {
		return Agent{Why: fmt.Sprintf("the node's agent keeps no Lease (%s/%s) and last wrote its NodeCache status at %s: is the prewarm agent pod on this node running, and as new as the controller?",
			l.Namespace, nc.Name, last.UTC().Format(time.RFC3339))}
	}
	return Agent{Alive: true}
}
