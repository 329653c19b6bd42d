package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
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
	nodes := []string{"fan-a", "fan-b", "fan-c", "fan-d"}
	w := e.warmTogether(nodes, "fanout", prefix, nil)
	m, served, metricsAddr := w.cache, w.served, w.metricsAddr
	uid := string(m.UID)
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
			code, header := getAs(t, ctx, url, tc.token)
			if code != tc.want {
				t.Errorf("%s: HTTP %d, want %d", tc.what, code, tc.want)
			}
			if tc.want != http.StatusOK && header.Get(peer.CRCHeader) != "" {
				t.Errorf("%s: a refused request got a part", tc.what)
			}
		}
	})
}

// Three nodes warming a model whose safetensors were uploaded in parts (S3 keeps only a CRC of
// each: no digest of the source's own that a peer's bytes could be checked against), with the
// controller's witness as the chart runs it: the nodes read those files through the witness,
// which records each part's SHA-256, and take parts from each other checked against it. S3 sends
// about one model in all (without the witness, each node reads such files whole: 3×), every
// node holds the model whole and verified, and the witness answers only the agents of the
// cache's nodes, with their token for it.
func TestNodesShareFilesWithoutADigestThroughTheWitness(t *testing.T) {
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	const inParts = "models/example-model-in-parts"
	multipart := int64(0)
	for p, data := range model {
		var err error
		if strings.HasSuffix(p, ".safetensors") {
			err = s3srv.PutMultipart(ctx, bucket, inParts+"/"+p, data, 5<<20)
			multipart += int64(len(data))
		} else {
			err = s3srv.PutBytes(ctx, bucket, inParts+"/"+p, data) // an MD5 ETag: a digest
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	witnessAddr := freeAddr(t)
	witnessToken := func(node string) string {
		tok, err := testutil.NodePeerToken(ctx, e.c, node, config.DefaultWitnessAudience)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	nodes := []string{"wit-a", "wit-b", "wit-c"}
	agentMetrics := map[string]string{}
	w := e.warmTogether(nodes, "witnessed", inParts, func(n string) []string {
		file := filepath.Join(e.logDir, "witness-token-"+n)
		if err := os.WriteFile(file, []byte(witnessToken(n)), 0o600); err != nil {
			t.Fatal(err)
		}
		agentMetrics[n] = freeAddr(t)
		return []string{"--witness-url=http://" + witnessAddr, "--witness-token-file=" + file, "--metrics-bind-address=" + agentMetrics[n]}
	}, "--witness-bind-address="+witnessAddr)
	m, served, metricsAddr := w.cache, w.served, w.metricsAddr
	uid := string(m.UID)
	witnessed := metricValue(t, "http://"+metricsAddr+"/metrics", "prewarm_witness_source_bytes_total")
	t.Logf("S3 sent %d bytes (%.2f× the model) to %d nodes; the witness read %.0f of the %d bytes uploaded in parts; the cache's status: %d from the source, %d from peers",
		served, float64(served)/float64(total), len(nodes), witnessed, multipart, m.Status.OriginBytes, m.Status.PeerBytes)
	if float64(served) > 1.5*float64(total) {
		t.Errorf("S3 sent %.2f× the model to %d nodes; want about 1× (each would read the files uploaded in parts whole without the witness)", float64(served)/float64(total), len(nodes))
	}
	// The files without a digest were read through the witness, once or nearly.
	if witnessed < float64(multipart) || witnessed > 1.5*float64(multipart) {
		t.Errorf("the witness read %.0f bytes; want about the %d of the files uploaded in parts", witnessed, multipart)
	}
	// The agents say what they read through the witness: every byte uploaded in parts, by one
	// node or another, none of it from the origin directly.
	var via, direct float64
	for _, n := range nodes {
		url := "http://" + agentMetrics[n] + "/metrics"
		via += metricValue(t, url, `prewarm_agent_witness_read_bytes_total{path="witness"}`)
		direct += metricValue(t, url, `prewarm_agent_witness_read_bytes_total{path="origin"}`)
	}
	if via < float64(multipart) || via > witnessed || direct != 0 {
		t.Errorf("the agents read %.0f bytes through the witness and %.0f around it; want from %d (the files uploaded in parts) to %.0f (what the witness read), and none around it", via, direct, multipart, witnessed)
	}
	if got := m.Status.OriginBytes + m.Status.PeerBytes; got < int64(len(nodes))*total || m.Status.PeerBytes < multipart {
		t.Errorf("origin + peer bytes %d (peers %d), want at least %d, with at least the %d bytes uploaded in parts from peers", got, m.Status.PeerBytes, int64(len(nodes))*total, multipart)
	}

	t.Run("the witness answers only the agents of the cache's nodes, with their token for it", func(t *testing.T) {
		if _, err := e.cluster.AddNode(ctx, "wit-bystander", testutil.NodeOptions{InstanceType: "ml.c5.xlarge"}); err != nil {
			t.Fatal(err)
		}
		peerToken, err := testutil.NodePeerToken(ctx, e.c, nodes[1], testutil.PeerAudience)
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + witnessAddr + "/prewarm/witness/v1/" + uid + "/digests?revision=" + m.Status.ResolvedRevision
		for _, tc := range []struct {
			what, token string
			want        int
		}{
			{"no token", "", http.StatusUnauthorized},
			{"a target's token for its peers (a peer could replay it)", peerToken, http.StatusUnauthorized},
			{"the witness token of a node the cache does not ask", witnessToken("wit-bystander"), http.StatusForbidden},
			{"a target's witness token", witnessToken(nodes[1]), http.StatusOK},
		} {
			if code, _ := getAs(t, ctx, url, tc.token); code != tc.want {
				t.Errorf("%s: HTTP %d, want %d", tc.what, code, tc.want)
			}
		}
	})
}

// metricValue is the value of the series named name (with its labels, as exposed) at url.
func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	body, err := httpGet(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s has no %s", url, name)
	return 0
}

// warmed is what warmTogether saw.
type warmed struct {
	cache       *inferencev1.ModelDataCacheConfig
	served      int64  // bytes S3 sent from the cache's creation until every node was Ready
	metricsAddr string // the controller's metrics
}

// warmTogether starts nodes (their agents with agentArgs(node), when set) reading S3 through a
// proxy that counts what it sends, at 20 MB/s per ranged read (slow enough that they download
// together), and the controller with ctlArgs; once every agent reports its peer address (the
// controller then groups them at once), it makes endpoint name for the model at location and
// waits until every node holds it whole.
func (e *weightsEnv) warmTogether(nodes []string, name, location string, agentArgs func(node string) []string, ctlArgs ...string) warmed {
	t, ctx := e.t, e.ctx
	t.Helper()
	counted, err := shaper.Start(s3srv.Endpoint, shaper.Options{BytesPerSecond: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = counted.Close() })
	for _, n := range nodes {
		var args []string
		if agentArgs != nil {
			args = agentArgs(n)
		}
		e.addNode(n, "ml.g5.24xlarge", counted.URL, args...)
	}
	metricsAddr := freeAddr(t)
	e.startController(append([]string{"--kubeconfig=" + e.cluster.KubeconfigPath, "--leader-elect=false", "--metrics-bind-address=" + metricsAddr,
		"--health-probe-bind-address=0", "--config=" + e.config(counted.URL), "--gate-timeout=3m", "--agent-image=prewarm/agent:e2e"}, ctlArgs...)...)
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
	iec := builders.MakeInferenceEndpointConfig("default", name).Location(location).Obj()
	iec.Spec.ModelCacheConfig.ImageCache = nil
	if err := e.c.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	m := e.waitCacheIn("default", name+"-cache", int32(len(nodes)))
	for _, n := range nodes {
		assertTree(t, e.cacheDir(n, string(m.UID)), model)
	}
	return warmed{cache: m, served: counted.Served.Load() - before, metricsAddr: metricsAddr}
}

// getAs GETs url with token as its bearer ("": none): the answer's status and header.
func getAs(t *testing.T, ctx context.Context, url, token string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}
