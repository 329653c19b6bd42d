package agent

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// The agent says it is alive by renewing a Lease, as the kubelet does for its node (KEP-589): a
// Lease is small and protobuf-encoded, where a NodeCache status write re-encodes and validates
// every cache the node reports. Its NodeCache status is written on a change only.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=hyperpod-inference-system,resources=leases,verbs=get;create;update

// NewLeaseKeeper returns what keeps the Lease of node's agent: named after the node, in
// namespace, held by holder (the agent's pod), renewed every third of duration. The Lease is
// labelled prewarmv1alpha1.AgentLeaseLabel and owned by the Node, so that it goes with it.
func NewLeaseKeeper(cs kubernetes.Interface, namespace, node, holder string, duration time.Duration) lease.Controller {
	var ownerUID string
	mark := func(l *coordinationv1.Lease) error {
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[prewarmv1alpha1.AgentLeaseLabel] = "true"
		// The lease controller sets the holder only when it creates the Lease; an agent pod
		// that replaces another takes it over.
		l.Spec.HolderIdentity = &holder
		if len(l.OwnerReferences) > 0 {
			return nil
		}
		if ownerUID == "" {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return nil // no Node to own it (yet): asked again at the next renewal
			case err != nil:
				return err
			}
			ownerUID = string(n.UID)
		}
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(ownerUID)}}
		return nil
	}
	failed := func() {
		ctrl.Log.WithName("lease").Info("renewing the agent's Lease keeps failing; the controller counts none of the node's caches once it expires",
			"namespace", namespace, "lease", node, "duration", duration)
	}
	return lease.NewController(clock.RealClock{}, cs, holder, int32(duration/time.Second), failed, RenewInterval(duration), node, namespace, mark)
}

// RenewInterval is how often an agent renews a Lease of duration: a third of it, so that two
// renewals may fail before it expires.
func RenewInterval(duration time.Duration) time.Duration { return duration / 3 }

// leaseKeeper runs the agent's lease.Controller under the manager.
type leaseKeeper struct{ lease.Controller }

// NeedLeaderElection is false: every node's agent renews its own Lease.
func (leaseKeeper) NeedLeaderElection() bool { return false }

func (k leaseKeeper) Start(ctx context.Context) error {
	k.Run(ctx)
	return nil
}
