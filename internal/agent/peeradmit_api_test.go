package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/tokenreview"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// countingClient counts the reads and creates (TokenReviews) it passes to the API server.
type countingClient struct {
	client.Client
	gets, creates atomic.Int64
}

func (c *countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.creates.Add(1)
	return c.Client.Create(ctx, obj, opts...)
}

// Through the peer server as the agent wires it (TokenReviewer, TargetCheck), against a real
// API server: keys this node does not offer cost the API server nothing; an offered key costs
// one review per token and one read per asking node.
func TestPeerServerCostsTheAPIServerBoundedReads(t *testing.T) {
	ctx, api := startAPI(t)
	const cache1, cache2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	request := func(uid string) prewarmv1alpha1.CacheRequest {
		return prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: "m", Root: "/cache", Source: fsxSource("model")}
	}
	for _, node := range []string{"node-a", "node-b"} {
		if err := api.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, nc := range []*prewarmv1alpha1.NodeCache{{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{request(cache1)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{request(cache2)}}}} {
		if err := api.Client.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	tokens := map[string]string{}
	for _, node := range []string{"node-a", "node-b"} {
		tok, err := testutil.NodePeerToken(ctx, api.Client, node, testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		tokens[node] = tok
	}
	counted := &countingClient{Client: api.Client}
	reviewer := &tokenreview.Reviewer{Client: counted, Audience: testutil.PeerAudience,
		ServiceAccount: "system:serviceaccount:" + testutil.PeerNamespace + ":" + testutil.PeerServiceAccount}
	targets := &agent.TargetCheck{Reader: counted}
	server := peer.NewServer(peer.ServerOptions{Authorize: reviewer.Authorize, Admit: targets.Admit})
	// The plan's revision is not the one asked for below: an admitted request is answered 409.
	server.Offer(cache1, &engine.Plan{Revision: "r1"})
	srv := httptest.NewServer(server)
	t.Cleanup(srv.Close)
	get := func(node, key string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+peer.Prefix+key+"/have?revision=r0", nil)
		req.Header.Set("Authorization", "Bearer "+tokens[node])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	for range 1000 {
		if code := get("node-a", string(uuid.NewUUID())); code != http.StatusNotFound {
			t.Fatalf("a key not offered: HTTP %d; want 404", code)
		}
	}
	if g, c := counted.gets.Load(), counted.creates.Load(); g+c != 0 {
		t.Errorf("1,000 requests for keys not offered: %d NodeCache reads and %d TokenReviews; want none", g, c)
	}
	for range 100 {
		if code := get("node-a", cache1); code != http.StatusConflict {
			t.Fatalf("node-a, asked for cache-1: HTTP %d; want 409 (admitted, another revision)", code)
		}
		if code := get("node-b", cache1); code != http.StatusForbidden {
			t.Fatalf("node-b, not asked for cache-1: HTTP %d; want 403", code)
		}
	}
	if g, c := counted.gets.Load(), counted.creates.Load(); g != 2 || c != 2 {
		t.Errorf("200 requests of 2 nodes for an offered key: %d NodeCache reads and %d TokenReviews; want 2 and 2", g, c)
	}
}
