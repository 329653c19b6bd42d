package peer_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// newWitness serves m to agents with the test's peer token, as "model".
func newWitness(t *testing.T, m *memSource) (*witness.Server, *httptest.Server) {
	t.Helper()
	w := &witness.Server{Open: func(r *http.Request, model string) (source.Source, error) {
		if _, err := authorize(r); err != nil {
			return nil, witness.ErrUnauthenticated
		}
		if model != "model" {
			return nil, witness.ErrForbidden
		}
		return m, nil
	}}
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	return w, srv
}

// throughWitness returns n's client of the witness at url, learning its digests until the test
// ends.
func throughWitness(t *testing.T, n *node, url string, m *memSource) *witness.Client {
	t.Helper()
	c := witness.NewClient(witness.ClientOptions{URL: url, Model: "model", Origin: m,
		Token: func() (string, error) { return goodToken + ":" + n.name, nil }})
	startLearning(t, c)
	return c
}

// startLearning runs c until the test ends.
func startLearning(t *testing.T, c *witness.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Files the source vouches for with no digest, or only a CRC, are shared through a witness: a
// lying peer's forged part (which keeps the file's CRC64NVME) is caught by the witness's SHA-256,
// never published, and the liar dropped; the other parts still come from the peer; the origin is
// read about once for both nodes.
func TestAWitnessLetsFilesWithoutADigestBeSharedAndCatchesALiar(t *testing.T) {
	for _, tc := range []struct {
		name string
		sums func([]byte) source.Checksums
	}{
		{"no checksum (a filesystem or FSx)", func([]byte) source.Checksums { return source.Checksums{} }},
		{"S3 with CRC64NVME only", func(d []byte) source.Checksums { return source.Checksums{CRC64NVME: engine.CRC64NVME(d)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t, 6*partSize)
			m.sums = tc.sums
			orig := m.files[m.order[0]]
			forged := forgeKeepingCRC64(t, orig, partSize+100, partSize+1000)
			wit, url := newWitness(t, m)

			a := newNode(t, "a", peer.ServerOptions{}, forge(map[int][]byte{1: forged[partSize : 2*partSize]}))
			ca := throughWitness(t, a, url.URL, m)
			if _, err := newEngine().Fetch(context.Background(), engine.Request{Source: ca, Dest: a.dest, Swarm: a.swarm(nil), Digests: ca}); err != nil {
				t.Fatal(err)
			}
			checkDest(t, m, a.dest)
			if via, direct := ca.Read(); via != m.size() || direct != 0 {
				t.Fatalf("a read %d bytes through the witness and %d from the origin; want %d and 0", via, direct, m.size())
			}

			cb := witness.NewClient(witness.ClientOptions{URL: url.URL, Model: "model", Origin: m,
				Token: func() (string, error) { return goodToken + ":b", nil }})
			res := fetchPastALiar(t, m, a, engine.Request{Source: cb, Digests: cb})
			if res.FromPeers == 0 {
				t.Error("nothing came from the peer: the files were not shared")
			}
			// Once a lied, b read through the witness every part it had not taken from a yet (how
			// many depends on timing): the witness read each byte once for a and once for those.
			via, direct := cb.Read()
			if direct != 0 || via+res.FromPeers != m.size() {
				t.Errorf("b read %d bytes through the witness, %d from the origin and took %d from a peer; want the model's %d from the witness and the peer", via, direct, res.FromPeers, m.size())
			}
			if got, want := wit.BytesRead(), m.size()+via; got != want {
				t.Errorf("the witness read %d bytes from the origin for two nodes; want %d (a's model, and what b did not take from a)", got, want)
			}
		})
	}
}

// A node whose witness cannot be reached reads the origin itself, and what it reads there is
// vouched for to no one: its peer takes none of those parts from it, and both publish the model
// as the origin holds it.
func TestWithoutTheWitnessNodesReadTheOriginThemselves(t *testing.T) {
	m := newModel(t, 4*partSize)
	m.sums = func(d []byte) source.Checksums { return source.Checksums{CRC64NVME: engine.CRC64NVME(d)} }
	_, url := newWitness(t, m)
	url.Close() // the witness is gone

	a := newNode(t, "a", peer.ServerOptions{}, nil)
	ca := throughWitness(t, a, url.URL, m)
	if _, err := newEngine().Fetch(context.Background(), engine.Request{Source: ca, Dest: a.dest, Swarm: a.swarm(nil), Digests: ca}); err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, a.dest)
	if via, direct := ca.Read(); via != 0 || direct != m.size() {
		t.Errorf("a read %d bytes through a witness that is gone and %d from the origin; want 0 and %d", via, direct, m.size())
	}

	b := newNode(t, "b", peer.ServerOptions{}, nil)
	cb := throughWitness(t, b, url.URL, m)
	sw := b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL}})
	res, err := newEngine().Fetch(context.Background(), engine.Request{Source: cb, Dest: b.dest, Swarm: sw, Digests: cb})
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	if res.FromPeers != 0 {
		t.Errorf("b took %d bytes from a peer with nothing to check them by", res.FromPeers)
	}
}

// A witness answers only those its Open admits, and for the model it names.
func TestAWitnessServesOnlyWhomItsOpenAdmits(t *testing.T) {
	m := newModel(t, partSize)
	_, srv := newWitness(t, m)
	for _, tc := range []struct {
		name, token, model string
		want               int
	}{
		{"no token", "", "model", http.StatusUnauthorized},
		{"another model", goodToken + ":a", "other", http.StatusForbidden},
		{"an agent", goodToken + ":a", "model", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+witness.Prefix+tc.model+"/read?revision=r&path="+m.order[0]+"&off=0&n=10", nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("got %s, want %d", resp.Status, tc.want)
			}
		})
	}
}
