// Package witness serves, from the controller, the witness the agents read the parts of S3 files
// without a SHA-256 of their own through (pkg/engine/witness), so that they can share those parts
// and check what a peer relays against digests no node computed.
//
// Every replica serves it; the leader publishes its own address as the endpoint of the
// prewarm-witness Service (an EndpointSlice it writes), so that all agents read through one
// witness and learn the same digests. An agent that cannot reach it reads the origin itself.
package witness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/tokenreview"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=discovery.k8s.io,namespace=hyperpod-inference-system,resources=endpointslices,verbs=create
// +kubebuilder:rbac:groups=discovery.k8s.io,namespace=hyperpod-inference-system,resources=endpointslices,resourceNames=prewarm-witness,verbs=get;update;delete
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=services,resourceNames=prewarm-witness,verbs=get

// ServiceName names the Service, in the operator namespace, the agents reach the witness by,
// and the EndpointSlice the leader writes for it. PortName is its port's name.
const (
	ServiceName = config.WitnessService
	PortName    = "witness"
)

// Open returns a witness.Server's Open: the request must bear a prewarm agent's token for the
// witness audience, bound to a pod on a node; sources gives the model's source for that node (the
// model is a cache's UID), or refuses.
func Open(reviewer *tokenreview.Reviewer, sources func(ctx context.Context, node, uid string) (source.Source, error)) func(*http.Request, string) (source.Source, error) {
	return func(r *http.Request, model string) (source.Source, error) {
		node, err := reviewer.Authorize(r)
		switch {
		case errors.Is(err, peer.ErrUnauthenticated):
			return nil, fmt.Errorf("%w: %w", witness.ErrUnauthenticated, err)
		case errors.Is(err, peer.ErrTooManyRequests):
			return nil, fmt.Errorf("%w: %w", witness.ErrTooManyRequests, err)
		case err != nil: // another service account's token, or the review failed (as the peer server answers)
			return nil, fmt.Errorf("%w: %w", witness.ErrForbidden, err)
		case node == "" || strings.ContainsAny(node, ":/"):
			return nil, fmt.Errorf("%w: %s: the token must be bound to an agent's pod on a node", witness.ErrForbidden, node)
		}
		return sources(r.Context(), node, model)
	}
}

// Publisher makes the leader the witness's endpoint: it writes the EndpointSlice of the
// prewarm-witness Service with this replica's address, and writes it again if it changes. The
// slice is owned by the Service, so it goes with it (an uninstall, or the witness turned off);
// without the Service nothing is published.
type Publisher struct {
	// Reader reads the slice from the API server (no informer: it is one object); Client
	// writes it.
	Reader    client.Reader
	Client    client.Client
	Namespace string
	// PodIP is this replica's address (POD_IP); Port the witness's.
	PodIP string
	Port  int
	// Every is how often the slice is checked (a minute when zero).
	Every time.Duration
}

// NeedLeaderElection is true: only the leader is the endpoint.
func (p *Publisher) NeedLeaderElection() bool { return true }

// Start publishes until ctx ends.
func (p *Publisher) Start(ctx context.Context) error {
	ip, err := netip.ParseAddr(p.PodIP)
	if err != nil {
		return fmt.Errorf("the witness's endpoint: POD_IP %q is not an address: %w", p.PodIP, err)
	}
	every := p.Every
	if every <= 0 {
		every = time.Minute
	}
	log := ctrl.LoggerFrom(ctx).WithName("witness")
	for {
		wait := every
		if err := p.publish(ctx, ip.Unmap()); err != nil {
			log.Error(err, "publishing the witness's endpoint; agents read the origin themselves meanwhile")
			wait = min(every, retryPublish)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// retryPublish is how soon a failed write of the slice is tried again.
const retryPublish = 5 * time.Second

// Slice is the EndpointSlice naming ip as the witness, owned by svc.
func (p *Publisher) Slice(ip netip.Addr, svc *corev1.Service) *discoveryv1.EndpointSlice {
	family := discoveryv1.AddressTypeIPv4
	if ip.Is6() {
		family = discoveryv1.AddressTypeIPv6
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: ServiceName, Namespace: p.Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: ServiceName,
			discoveryv1.LabelManagedBy:   "controller.prewarm.io",
		}, OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: ptr.To(true)}}},
		AddressType: family,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(PortName), Port: ptr.To(int32(p.Port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
}

func (p *Publisher) publish(ctx context.Context, ip netip.Addr) error {
	svc := &corev1.Service{}
	if err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: ServiceName}, svc); err != nil {
		return fmt.Errorf("the %s Service, which the endpoint belongs to: %w", ServiceName, err)
	}
	want := p.Slice(ip, svc)
	have := &discoveryv1.EndpointSlice{}
	switch err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: ServiceName}, have); {
	case apierrors.IsNotFound(err):
		return p.Client.Create(ctx, want)
	case err != nil:
		return err
	}
	if have.AddressType == want.AddressType && len(have.Endpoints) == 1 && len(have.Ports) == 1 &&
		fmt.Sprint(have.Endpoints[0].Addresses) == fmt.Sprint(want.Endpoints[0].Addresses) && ptr.Deref(have.Ports[0].Port, 0) == int32(p.Port) &&
		len(have.OwnerReferences) == 1 && have.OwnerReferences[0].UID == svc.UID {
		return nil
	}
	if have.AddressType != want.AddressType { // immutable
		if err := p.Client.Delete(ctx, have); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return p.Client.Create(ctx, want)
	}
	have.Labels, have.OwnerReferences, have.Endpoints, have.Ports = want.Labels, want.OwnerReferences, want.Endpoints, want.Ports
	return p.Client.Update(ctx, have)
}
