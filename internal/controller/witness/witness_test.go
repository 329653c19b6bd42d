package witness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/tokenreview"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

const agentSA = "system:serviceaccount:prewarm-system:prewarm-agent"

// reviewer answers TokenReviews: "node-<n>" is the agents' token bound to a pod on node n,
// "pod" one bound to a pod on no node, "other" another service account's; any other is refused.
func reviewer() *tokenreview.Reviewer {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			tr, ok := obj.(*authenticationv1.TokenReview)
			if !ok {
				return fmt.Errorf("unexpected %T", obj)
			}
			st := authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authenticationv1.UserInfo{Username: agentSA, Extra: map[string]authenticationv1.ExtraValue{}}}
			switch tok := tr.Spec.Token; {
			case len(tok) > 5 && tok[:5] == "node-":
				st.User.Extra["authentication.kubernetes.io/node-name"] = authenticationv1.ExtraValue{tok[5:]}
			case tok == "pod":
				st.User.Extra["authentication.kubernetes.io/pod-name"] = authenticationv1.ExtraValue{"stray"}
			case tok == "other":
				st.User.Username = "system:serviceaccount:team-a:default"
			default:
				st = authenticationv1.TokenReviewStatus{Error: "invalid token"}
			}
			tr.Status = st
			return nil
		},
	}).Build()
	return &tokenreview.Reviewer{Client: c, Audience: "prewarm-witness", ServiceAccount: agentSA}
}

// Only an agent's token bound to a node opens a model, and the node it names is the one asked.
func TestTheWitnessOpensForAnAgentsNodeOnly(t *testing.T) {
	var asked []string
	open := Open(reviewer(), func(_ context.Context, node, uid string) (source.Source, error) {
		asked = append(asked, node+"/"+uid)
		return standIn{}, nil
	})
	s := &witness.Server{Open: open}
	for tok, want := range map[string]int{
		"node-gpu-1": http.StatusOK,
		"":           http.StatusUnauthorized,
		"forged":     http.StatusUnauthorized,
		"pod":        http.StatusForbidden,
		"other":      http.StatusForbidden,
	} {
		req, _ := http.NewRequest(http.MethodGet, witness.Prefix+"uid-1/digests?revision=r", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		req.RemoteAddr = "10.0.0.1:5555"
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want || want == http.StatusOK && !strings.Contains(rec.Body.String(), `"seq"`) {
			t.Errorf("token %q: %d %q, want %d", tok, rec.Code, rec.Body, want)
		}
	}
	if fmt.Sprint(asked) != "[gpu-1/uid-1]" {
		t.Errorf("sources asked for %v; want only gpu-1's", asked)
	}
}

// The leader publishes its address as the Service's one endpoint, owned by the Service (so it
// goes with it), and moves it there when another replica's address is published. Without the
// Service nothing is published.
func TestTheLeaderPublishesItselfAsTheWitness(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).Build()
	ctx := context.Background()
	orphan := &Publisher{Reader: c, Client: c, Namespace: "prewarm-system", Port: 8444}
	if err := orphan.publish(ctx, netip.MustParseAddr("10.0.0.7")); err == nil {
		t.Fatal("published an endpoint for a Service that does not exist")
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "prewarm-system", Name: ServiceName}, &discoveryv1.EndpointSlice{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a slice without its Service: %v", err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "prewarm-system", Name: ServiceName, UID: "svc-1"}}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	owned := func(s *discoveryv1.EndpointSlice, uid types.UID) bool {
		return len(s.OwnerReferences) == 1 && s.OwnerReferences[0].Kind == "Service" && s.OwnerReferences[0].Name == ServiceName &&
			s.OwnerReferences[0].UID == uid && *s.OwnerReferences[0].Controller
	}
	read := func() *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "prewarm-system", Name: ServiceName}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := &Publisher{Reader: c, Client: c, Namespace: "prewarm-system", Port: 8444}
	if err := old.publish(ctx, netip.MustParseAddr("10.0.0.7")); err != nil {
		t.Fatal(err)
	}
	s := read()
	if s.Labels[discoveryv1.LabelServiceName] != ServiceName || len(s.Endpoints) != 1 || s.Endpoints[0].Addresses[0] != "10.0.0.7" || *s.Ports[0].Port != 8444 || *s.Ports[0].Name != PortName || !owned(s, "svc-1") {
		t.Fatalf("published %+v", s)
	}
	leader := &Publisher{Reader: c, Client: c, Namespace: "prewarm-system", Port: 8444}
	if err := leader.publish(ctx, netip.MustParseAddr("10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	if s := read(); len(s.Endpoints) != 1 || s.Endpoints[0].Addresses[0] != "10.0.0.9" {
		t.Errorf("after a new leader: %+v", s.Endpoints)
	}
	// An IPv6 cluster: the address type cannot change in place; the slice is made again.
	if err := leader.publish(ctx, netip.MustParseAddr("fd00::9")); err != nil {
		t.Fatal(err)
	}
	if s := read(); s.AddressType != discoveryv1.AddressTypeIPv6 || s.Endpoints[0].Addresses[0] != "fd00::9" || !owned(s, "svc-1") {
		t.Errorf("after moving to IPv6: %s %+v %+v", s.AddressType, s.Endpoints, s.OwnerReferences)
	}
	// The Service made again (another UID): the slice follows it.
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "prewarm-system", Name: ServiceName, UID: "svc-2"}}); err != nil {
		t.Fatal(err)
	}
	if err := leader.publish(ctx, netip.MustParseAddr("fd00::9")); err != nil {
		t.Fatal(err)
	}
	if s := read(); !owned(s, "svc-2") {
		t.Errorf("after the Service was made again: %+v", s.OwnerReferences)
	}
}

// standIn is a source never read: the test asks for digests only.
type standIn struct{ source.Source }
