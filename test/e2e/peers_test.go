package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/pkg/engine/peer"
)

// Four nodes warming one cache at once, each agent a process with its own disk, reading S3
// through a proxy that counts what S3 sends: the agents share their parts, so S3 sends about
// one model in all; every node holds it whole and verified; the cache's status and the
// controller's metrics say how many bytes came from S3 and how many from peers. Only prewarm's
// agents get anything from a peer server.
func TestNodesWarmingTogetherReadTheSourceAboutOnce(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	// 20 MB/s per ranged read: slow enough that the four nodes download together.
	counted, err := shaper.Start(s3srv.Endpoint, shaper.Options{BytesPerSecond: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = counted.Close() })
	nodes := []string{"fan-a", "fan-b", "fan-c", "fan-d"}
	for _, n := range nodes {
		e.addNode(n, "ml.g5.24xlarge", counted.URL)
	}
	metricsAddr := freeAddr(t)
	e.startController("--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false", "--metrics-bind-address="+metricsAddr,
		"--health-probe-bind-address=0", "--config="+e.config(counted.URL), "--gate-timeout=3m", "--agent-image=prewarm/agent:e2e")
	// Every agent reports where it serves its parts before the cache exists: the controller
	// puts the four in one group at once.
	e.eventually(60*time.Second, "the agents report their peer addresses", func() (bool, string) {
		for _, n := range nodes {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: n}, nc); err != nil || nc.Status.PeerAddress == "" {
				return false, n + " has no peer address yet"
			}
		}
		return true, ""
	})
	before := counted.Served.Load()
	iec := builders.MakeInferenceEndpointConfig("default", "fanout").Location(prefix).Obj()
	iec.Spec.ModelCacheConfig.ImageCache = nil
	if err := e.c.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	m := e.waitCacheIn("default", "fanout-cache", int32(len(nodes)))
	uid := string(m.UID)
	for _, n := range nodes {
		assertTree(t, e.cacheDir(n, uid), model)
	}
	served := counted.Served.Load() - before
	t.Logf("S3 sent %d bytes (%.2f× the model) to %d nodes; the cache's status: %d from the source, %d from peers",
		served, float64(served)/float64(total), len(nodes), m.Status.OriginBytes, m.Status.PeerBytes)
	if float64(served) > 1.5*float64(total) {
		t.Errorf("S3 sent %.2f× the model to %d nodes warming together; want about 1×", float64(served)/float64(total), len(nodes))
	}
	// The status counts what the agents read: every byte S3 sent but its listings.
	if m.Status.OriginBytes > served || float64(m.Status.OriginBytes) < 0.9*float64(min(served, total)) {
		t.Errorf("status.originBytes %d, S3 sent %d", m.Status.OriginBytes, served)
	}
	if got := m.Status.OriginBytes + m.Status.PeerBytes; got < int64(len(nodes))*total {
		t.Errorf("origin + peer bytes %d, want at least %d (each node holds the model)", got, int64(len(nodes))*total)
	}
	// The four are one swarm: each node is asked to share with other targets only, at the
	// addresses their agents report, and every node is linked to every other through the
	// swarm's links, whichever way each was listed. (Usually each lists the three others; a node
	// whose peer address the controller could not yet bear out when the swarm formed, its
	// informer behind the harness's address patch, is no one's peer at first and takes its
	// parts from the others as their upstream, until the controller bears it out and groups it
	// with them, if they are still downloading.)
	e.eventually(30*time.Second, "the four nodes are one swarm", func() (bool, string) {
		links := map[string][]string{}
		addrs := map[string]string{}
		layout := []string{}
		for _, n := range nodes {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: n}, nc); err != nil {
				return false, err.Error()
			}
			addrs[n] = nc.Status.PeerAddress
			for _, r := range nc.Spec.Caches {
				if r.UID != uid {
					continue
				}
				layout = append(layout, fmt.Sprintf("%s: %v", n, r.Peers))
				for _, p := range r.Peers {
					links[n] = append(links[n], p.Node)
					links[p.Node] = append(links[p.Node], n)
				}
			}
		}
		for _, n := range nodes {
			nc := &prewarmv1alpha1.NodeCache{}
			if err := e.c.Get(ctx, types.NamespacedName{Name: n}, nc); err != nil {
				return false, err.Error()
			}
			for _, r := range nc.Spec.Caches {
				for _, p := range r.Peers {
					if r.UID == uid && (!slices.Contains(nodes, p.Node) || p.Address != addrs[p.Node]) {
						return false, fmt.Sprintf("%s is asked to share with %s at %s, which is no target at its reported address %q", n, p.Node, p.Address, addrs[p.Node])
					}
				}
			}
		}
		seen := map[string]bool{nodes[0]: true}
		for queue := []string{nodes[0]}; len(queue) > 0; queue = queue[1:] {
			for _, next := range links[queue[0]] {
				if !seen[next] {
					seen[next] = true
					queue = append(queue, next)
				}
			}
		}
		return len(seen) == len(nodes), fmt.Sprintf("linked %d of %d: %s", len(seen), len(nodes), strings.Join(layout, "; "))
	})
	e.eventually(30*time.Second, "the origin bytes metric", func() (bool, string) {
		body, err := httpGet("http://" + metricsAddr + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		series := `prewarm_weights_cache_origin_bytes{cache="fanout-cache",namespace="default"} `
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, series); ok {
				got, err := strconv.ParseFloat(v, 64)
				return err == nil && int64(got) == m.Status.OriginBytes, line
			}
		}
		return false, "no " + series
	})

	t.Run("a peer server answers only the agents of the cache's nodes", func(t *testing.T) {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := e.c.Get(ctx, types.NamespacedName{Name: nodes[0]}, nc); err != nil {
			t.Fatal(err)
		}
		url := "http://" + nc.Status.PeerAddress + peer.Prefix + uid + "/parts/0?revision=" + m.Status.ResolvedRevision
		// The agents' service account, but bound to no node (as only a cluster admin can mint).
		unbound, err := testutil.PeerToken(ctx, e.c, testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		// A target's agent, and the agent of a node no cache asks for.
		target, err := testutil.NodePeerToken(ctx, e.c, nodes[1], testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.cluster.AddNode(ctx, "fan-bystander", testutil.NodeOptions{InstanceType: "ml.c5.xlarge"}); err != nil {
			t.Fatal(err)
		}
		bystander, err := testutil.NodePeerToken(ctx, e.c, "fan-bystander", testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		otherAudience, err := testutil.PeerToken(ctx, e.c, "https://kubernetes.default.svc")
		if err != nil {
			t.Fatal(err)
		}
		someoneElse, err := testutil.ServiceAccountToken(ctx, e.c, "default", "someone", testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			what, token string
			want        int
		}{
			{"no token", "", http.StatusUnauthorized},
			{"a token that is not one", "not-a-token", http.StatusUnauthorized},
			{"the agents' token for another audience", otherAudience, http.StatusUnauthorized},
			{"another service account's token", someoneElse, http.StatusForbidden},
			{"the agents' token bound to no node", unbound, http.StatusForbidden},
			{"the agent's token of a node the cache does not ask", bystander, http.StatusForbidden},
			{"the agent's token of a node the cache asks", target, http.StatusOK},
		} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s: HTTP %d, want %d", tc.what, resp.StatusCode, tc.want)
			}
			if tc.want != http.StatusOK && resp.Header.Get(peer.CRCHeader) != "" {
				t.Errorf("%s: a refused request got a part", tc.what)
			}
		}
	})
}
