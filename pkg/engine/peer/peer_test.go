package peer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

const partSize = 64 << 10

// memSource is a model in memory that counts the bytes it serves; List waits at barrier (when
// set), so that the nodes of a test start together.
type memSource struct {
	files   map[string][]byte
	order   []string
	served  atomic.Int64
	barrier *sync.WaitGroup
	delay   time.Duration // before each read
	// sums, when set, is what List vouches for (a SHA-256 otherwise).
	sums func(data []byte) source.Checksums
}

func newModel(t *testing.T, sizes ...int) *memSource {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	m := &memSource{files: map[string][]byte{}}
	for i, n := range sizes {
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(rng.Uint32())
		}
		name := fmt.Sprintf("model-%05d.safetensors", i)
		m.files[name], m.order = b, append(m.order, name)
	}
	return m
}

func (m *memSource) size() (n int64) {
	for _, b := range m.files {
		n += int64(len(b))
	}
	return n
}

func (m *memSource) List(context.Context) (source.Listing, error) {
	if m.barrier != nil {
		m.barrier.Done()
		m.barrier.Wait()
	}
	var l source.Listing
	for _, name := range m.order {
		sum := sha256.Sum256(m.files[name])
		sums := source.Checksums{SHA256: hex.EncodeToString(sum[:])}
		if m.sums != nil {
			sums = m.sums(m.files[name])
		}
		l.Files = append(l.Files, source.File{Path: name, Size: int64(len(m.files[name])), Version: "1", Checksums: sums})
	}
	return l, nil
}

func (m *memSource) OpenRange(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	if m.delay > 0 {
		select {
		case <-time.After(m.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	m.served.Add(n)
	return io.NopCloser(bytes.NewReader(m.files[path][off : off+n])), nil
}

func (m *memSource) String() string { return "mem://model" }

// node is one node of a test swarm: a Server behind a real HTTP listener, and a destination.
type node struct {
	name   string
	server *peer.Server
	http   *httptest.Server
	dest   string
}

const goodToken = "peer-token"

func authorize(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || tok == "":
		return "", peer.ErrUnauthenticated
	case !strings.HasPrefix(tok, goodToken):
		return "", errors.New("not a prewarm agent")
	}
	return strings.TrimPrefix(tok, goodToken+":"), nil
}

func newNode(t *testing.T, name string, o peer.ServerOptions, wrap func(http.Handler) http.Handler) *node {
	t.Helper()
	o.Authorize = authorize
	n := &node{name: name, server: peer.NewServer(o), dest: filepath.Join(t.TempDir(), "model")}
	var h http.Handler = n.server
	if wrap != nil {
		h = wrap(h)
	}
	n.http = httptest.NewServer(h)
	t.Cleanup(n.http.Close)
	return n
}

func (n *node) swarm(peers []peer.Peer) *peer.Swarm {
	return peer.NewSwarm(peer.SwarmOptions{Self: n.name, Key: "cache-uid", Peers: peers, Server: n.server,
		Token: func() (string, error) { return goodToken + ":" + n.name, nil }, Wait: 20 * time.Second})
}

func newEngine() *engine.Engine {
	return engine.New(engine.WithPartSize(partSize), engine.WithConcurrency(4), engine.WithRetry(3, time.Millisecond, 10*time.Millisecond))
}

func checkDest(t *testing.T, m *memSource, dest string) {
	t.Helper()
	for name, want := range m.files {
		got, err := os.ReadFile(filepath.Join(dest, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the published file differs from the source", name)
		}
	}
}

// seed fetches the model on n alone and returns what it read from the source.
func seed(t *testing.T, n *node, m *memSource) {
	t.Helper()
	sw := n.swarm(nil)
	if _, err := newEngine().Fetch(context.Background(), engine.Request{Source: m, Dest: n.dest, Swarm: sw}); err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, n.dest)
}

func TestNodesStartingTogetherReadTheSourceAboutOnce(t *testing.T) {
	m := newModel(t, 3<<20, 2<<20+12345, 0, 700<<10)
	const count = 4
	m.barrier = &sync.WaitGroup{}
	m.barrier.Add(count)
	var nodes []*node
	for i := range count {
		nodes = append(nodes, newNode(t, fmt.Sprintf("node-%d", i), peer.ServerOptions{}, nil))
	}
	var wg sync.WaitGroup
	results := make([]engine.Result, count)
	errs := make([]error, count)
	for i, n := range nodes {
		var peers []peer.Peer
		for _, o := range nodes {
			peers = append(peers, peer.Peer{Name: o.name, URL: o.http.URL})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = newEngine().Fetch(context.Background(), engine.Request{Source: m, Dest: n.dest, Swarm: n.swarm(peers)})
		}()
	}
	wg.Wait()
	var fromSource, fromPeers int64
	for i, n := range nodes {
		if errs[i] != nil {
			t.Fatalf("%s: %v", n.name, errs[i])
		}
		checkDest(t, m, n.dest)
		fromSource += results[i].Fetched
		fromPeers += results[i].FromPeers
		if results[i].Fetched+results[i].FromPeers != m.size() {
			t.Errorf("%s took %d bytes from the source and %d from peers, for a model of %d", n.name, results[i].Fetched, results[i].FromPeers, m.size())
		}
	}
	ratio := float64(m.served.Load()) / float64(m.size())
	t.Logf("%d nodes: the source served %.2f× the model; peers %d bytes", count, ratio, fromPeers)
	if fromSource != m.served.Load() {
		t.Errorf("the nodes say they read %d bytes from the source, which served %d", fromSource, m.served.Load())
	}
	if ratio > 1.5 {
		t.Errorf("the source served %.2f× the model to %d nodes fetching it together; want about 1×", ratio, count)
	}
	// A published model is offered whole, with the part table its manifest records.
	plan, err := engine.OpenPublished(nodes[0].dest)
	if err != nil {
		t.Fatal(err)
	}
	held, _, _ := plan.Activity()
	for i := range plan.Parts() {
		if held[i/8]&(1<<(i%8)) == 0 {
			t.Fatalf("part %d of a published model is not offered", i)
		}
	}
}

// flipOnDisk changes one byte of a published file, as a failing disk would.
func flipOnDisk(t *testing.T, dest, name string, at int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dest, name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

func TestAFlippedByteFromAPeerIsCaughtAndThePartFetchedAgain(t *testing.T) {
	m := newModel(t, 1<<20)
	a := newNode(t, "a", peer.ServerOptions{}, nil)
	seed(t, a, m)
	flipOnDisk(t, a.dest, m.order[0], 5*partSize+17)
	plan, err := engine.OpenPublished(a.dest)
	if err != nil {
		t.Fatal(err)
	}
	a.server.Offer("cache-uid", plan)

	m.served.Store(0)
	res := fetchPastALiar(t, m, a, engine.Request{Source: m})
	if res.Fetched == 0 || res.FromPeers == 0 {
		t.Errorf("fetched %d from the source and %d from a: want the parts before the bad one from a, and the rest from the source", res.Fetched, res.FromPeers)
	}
}

// lie flips a byte of every part it sends and vouches for the flipped bytes: only the file's
// checksum from the source can catch it.
func lie(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/parts/") {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code == http.StatusOK && len(body) > 0 {
			body[len(body)/2] ^= 1
			w.Header().Set(peer.CRCHeader, fmt.Sprintf("%08x", crc32c(body)))
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	})
}

// fetchPastALiar fetches m on a new node b with req, whose peer is a (its upstream), which lies
// about some part: b publishes the model as m holds it, and drops a for the mismatch.
func fetchPastALiar(t *testing.T, m *memSource, a *node, req engine.Request) engine.Result {
	t.Helper()
	b := newNode(t, "b", peer.ServerOptions{}, nil)
	req.Dest, req.Swarm = b.dest, b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}})
	if c, ok := req.Source.(*witness.Client); ok {
		startLearning(t, c)
	}
	res, err := newEngine().Fetch(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	if got := req.Swarm.(*peer.Swarm).Dropped()["a"]; got != "mismatch" {
		t.Errorf("peer a dropped for %q, want mismatch", got)
	}
	return res
}

func TestAPeerVouchingForWrongBytesIsCaughtByTheSourcesChecksum(t *testing.T) {
	m := newModel(t, 1<<20+5)
	a := newNode(t, "a", peer.ServerOptions{}, lie)
	seed(t, a, m)
	m.served.Store(0)
	res := fetchPastALiar(t, m, a, engine.Request{Source: m})
	if res.FromPeers == 0 {
		t.Error("nothing was taken from the lying peer: the test shows nothing")
	}
	// Every part a sent is read again from the source.
	if m.served.Load() < res.FromPeers {
		t.Errorf("the source served %d bytes after %d came from the lying peer", m.served.Load(), res.FromPeers)
	}
}

// cut ends the connection after half of the first part a peer asks for.
func cut(h http.Handler) http.Handler {
	var once sync.Once
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cutNow := false
		if strings.Contains(r.URL.Path, "/parts/") {
			once.Do(func() { cutNow = true })
		}
		if !cutNow {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes()[:rec.Body.Len()/2])
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
}

func TestAPeerKilledMidTransferCostsTimeNotData(t *testing.T) {
	m := newModel(t, 1<<20)
	a := newNode(t, "a", peer.ServerOptions{}, cut)
	seed(t, a, m)
	c := newNode(t, "c", peer.ServerOptions{}, nil)
	seed(t, c, m)
	m.served.Store(0)
	b := newNode(t, "b", peer.ServerOptions{}, nil)
	sw := b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}, {Name: "c", URL: c.http.URL, Upstream: true}})
	res, err := newEngine().Fetch(context.Background(), engine.Request{Source: m, Dest: b.dest, Swarm: sw})
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	if got := sw.Dropped(); got["a"] != "transfer" || got["c"] != "" {
		t.Errorf("dropped %v, want a for its cut transfer only", got)
	}
	if res.FromPeers != m.size() || m.served.Load() != 0 {
		t.Errorf("%d bytes from peers and %d from the source: want the whole model from peers (c took a's place)", res.FromPeers, m.served.Load())
	}
}

func TestOnlyAuthenticatedPeersGetAnything(t *testing.T) {
	m := newModel(t, 256<<10)
	a := newNode(t, "a", peer.ServerOptions{}, nil)
	seed(t, a, m)
	plan, err := engine.OpenPublished(a.dest)
	if err != nil {
		t.Fatal(err)
	}
	a.server.Offer("cache-uid", plan)
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer ", http.StatusUnauthorized},
		{"Basic " + goodToken, http.StatusUnauthorized},
		{"Bearer someone-else", http.StatusForbidden},
		{"Bearer " + goodToken + ":b", http.StatusOK},
	} {
		for _, path := range []string{"/have?revision=" + plan.Revision, "/parts/0?revision=" + plan.Revision} {
			req, _ := http.NewRequest(http.MethodGet, a.http.URL+peer.Prefix+"cache-uid"+path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%q %s: HTTP %d, want %d", tc.auth, path, resp.StatusCode, tc.want)
			}
			if tc.want != http.StatusOK && bytes.Contains(m.files[m.order[0]], body) && len(body) > 16 {
				t.Errorf("%q %s: a refused request got model bytes", tc.auth, path)
			}
		}
	}
	// Read-only: nothing but GET.
	req, _ := http.NewRequest(http.MethodPut, a.http.URL+peer.Prefix+"cache-uid/parts/0?revision="+plan.Revision, strings.NewReader("x"))
	req.Header.Set("Authorization", "Bearer "+goodToken+":b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: HTTP %d, want 405", resp.StatusCode)
	}
}

// A key the server does not offer is answered 404 before the token or the peer is checked:
// asking for keys at random costs those checks (the API server, in the agent) nothing.
func TestAKeyNotOfferedIsAnsweredBeforeAnyCheck(t *testing.T) {
	var checks atomic.Int64
	s := peer.NewServer(peer.ServerOptions{
		Authorize: func(*http.Request) (string, error) { checks.Add(1); return "b", nil },
		Admit:     func(*http.Request, string, string) error { checks.Add(1); return nil },
	})
	s.Offer("cache-uid", &engine.Plan{Revision: "r1"})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	for i := range 100 {
		for _, auth := range []string{"", "Bearer " + goodToken + ":b"} {
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s%scache-%d/have?revision=r1", srv.URL, peer.Prefix, i), nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("a key not offered, %q: HTTP %d; want 404", auth, resp.StatusCode)
			}
		}
	}
	if n := checks.Load(); n != 0 {
		t.Errorf("200 requests for keys not offered: %d checks; want none", n)
	}
	// The offered key is checked (and answered 409: another revision than asked).
	resp, err := http.Get(srv.URL + peer.Prefix + "cache-uid/have?revision=r0")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || checks.Load() != 2 {
		t.Errorf("the offered key: HTTP %d after %d checks; want 409 after 2", resp.StatusCode, checks.Load())
	}
}

func TestAServerSendsToAtMostKPeersAtOnce(t *testing.T) {
	m := newModel(t, 256<<10)
	// 1 peer at a time, slowly: the first transfer is still going when the second peer asks.
	a := newNode(t, "a", peer.ServerOptions{MaxPeers: 1, BytesPerSecond: 32 << 10}, nil)
	seed(t, a, m)
	plan, err := engine.OpenPublished(a.dest)
	if err != nil {
		t.Fatal(err)
	}
	a.server.Offer("cache-uid", plan)
	get := func(who string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, a.http.URL+peer.Prefix+"cache-uid/parts/0?revision="+plan.Revision, nil)
		req.Header.Set("Authorization", "Bearer "+goodToken+":"+who)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := get("b")
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first peer: HTTP %d", first.StatusCode)
	}
	second := get("c")
	second.Body.Close()
	if second.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a second peer while one is served: HTTP %d, want 429", second.StatusCode)
	}
	if _, err := io.Copy(io.Discard, first.Body); err != nil {
		t.Fatal(err)
	}
	first.Body.Close()
	// Once the first is done, the second is served. The server releases its slot after the
	// last byte is written: ask until it has.
	deadline := time.Now().Add(10 * time.Second)
	for {
		again := get("c")
		again.Body.Close()
		if again.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second peer is still refused (HTTP %d) after the first finished", again.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// A peer the controller lists after the download started is taken on: the rest of the parts come
// from it.
func TestPeersListedLaterAreTakenOn(t *testing.T) {
	m := newModel(t, 2<<20)
	a := newNode(t, "a", peer.ServerOptions{}, nil)
	seed(t, a, m)
	m.served.Store(0)
	m.delay = 20 * time.Millisecond // 32 parts, one at a time: over half a second from the source
	b := newNode(t, "b", peer.ServerOptions{}, nil)
	var calls atomic.Int64
	sw := peer.NewSwarm(peer.SwarmOptions{Self: "b", Key: "cache-uid", Server: b.server,
		Token: func() (string, error) { return goodToken + ":b", nil }, RefreshInterval: 10 * time.Millisecond,
		Refresh: func() []peer.Peer {
			if calls.Add(1) < 3 {
				return nil // not listed yet
			}
			return []peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}}
		}})
	e := engine.New(engine.WithPartSize(partSize), engine.WithConcurrency(1))
	res, err := e.Fetch(context.Background(), engine.Request{Source: m, Dest: b.dest, Swarm: sw})
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	t.Logf("%d bytes from the source, %d from the peer listed later", res.Fetched, res.FromPeers)
	if res.FromPeers == 0 || res.Fetched == 0 {
		t.Errorf("%d bytes from the source and %d from the peer: want the first parts from the source, the rest from the peer once listed", res.Fetched, res.FromPeers)
	}
}

func TestTimeWaitingOnPeersIsCounted(t *testing.T) {
	m := newModel(t, 1<<20) // 16 parts
	const delay = 40 * time.Millisecond
	slow := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/parts/") {
				time.Sleep(delay) // the peer answers each part late
			}
			h.ServeHTTP(w, r)
		})
	}
	a := newNode(t, "a", peer.ServerOptions{}, slow)
	seed(t, a, m)
	b := newNode(t, "b", peer.ServerOptions{}, nil)
	reg := prometheus.NewRegistry()
	e := engine.New(engine.WithPartSize(partSize), engine.WithConcurrency(2), engine.WithRegisterer(reg))
	res, err := e.Fetch(context.Background(), engine.Request{Source: m, Dest: b.dest,
		Swarm: b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}})})
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	parts := res.FromPeers / partSize
	waited := counterValue(t, reg, "prewarm_engine_peer_wait_seconds_total")
	t.Logf("%d parts from the peer, %.3f s waited on it", parts, waited)
	if parts == 0 {
		t.Fatal("nothing came from the peer")
	}
	if want := float64(parts) * delay.Seconds(); waited < want {
		t.Errorf("the workers waited %.3f s on the peer by the metric; each of its %d parts was %s late: at least %.3f s", waited, parts, delay, want)
	}
	// Each part is observed once, its wait at least the peer's delay, and its longest time
	// without a byte at least its wait.
	count, sum := histogram(t, reg, "prewarm_engine_part_wait_seconds", "peer")
	if count != uint64(parts) {
		t.Errorf("%d parts observed waited for; %d came from the peer", count, parts)
	}
	if want := float64(parts) * delay.Seconds(); sum < want {
		t.Errorf("the parts from the peer waited %.3f s for their first byte by the histogram; at least %.3f s", sum, want)
	}
	stallCount, stallSum := histogram(t, reg, "prewarm_engine_part_stall_seconds", "peer")
	if stallCount != count || stallSum < sum {
		t.Errorf("part stalls: %d parts, %.3f s; want %d parts and at least the waits' %.3f s", stallCount, stallSum, count, sum)
	}
}

// histogram is the count and sum of the histogram name's series whose from label is from.
func histogram(t *testing.T, g prometheus.Gatherer, name, from string) (uint64, float64) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "from" && l.GetValue() == from {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("%s{from=%q} is not registered", name, from)
	return 0, 0
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}

// A part whose owner reads the source slowly is still taken from the owner, not read from the
// source again: the waiting node sees that the owner is reading it (its /have says which parts,
// and how far) and waits on. Stall is longer than the run here, so that the fast node, with
// nothing of its own left to read, does not take the slow owner's last parts (work stealing,
// TestSimulatedSwarms) and the test sees waiting alone.
func TestAPartIsWaitedForWhileItsOwnerIsStillReadingIt(t *testing.T) {
	slow, fast := newModel(t, 1<<20), newModel(t, 1<<20) // the same 16 parts
	slow.delay = 400 * time.Millisecond                  // each of a's parts: b has all of its own long before
	barrier := &sync.WaitGroup{}
	barrier.Add(2)
	slow.barrier, fast.barrier = barrier, barrier
	a, b := newNode(t, "a", peer.ServerOptions{}, nil), newNode(t, "b", peer.ServerOptions{}, nil)
	peers := []peer.Peer{{Name: "a", URL: a.http.URL}, {Name: "b", URL: b.http.URL}}
	fetch := func(n *node, m *memSource, concurrency int) (engine.Result, error) {
		sw := peer.NewSwarm(peer.SwarmOptions{Self: n.name, Key: "cache-uid", Peers: peers, Server: n.server,
			Token: func() (string, error) { return goodToken + ":" + n.name, nil }, Stall: 10 * time.Second})
		e := engine.New(engine.WithPartSize(partSize), engine.WithConcurrency(concurrency))
		return e.Fetch(context.Background(), engine.Request{Source: m, Dest: n.dest, Swarm: sw})
	}
	var wg sync.WaitGroup
	var resA engine.Result
	var errA error
	wg.Add(1)
	go func() {
		defer wg.Done()
		resA, errA = fetch(a, slow, 2) // one worker for the parts a reads for both
	}()
	resB, errB := fetch(b, fast, 4) // four workers asking a for its parts
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("a: %v; b: %v", errA, errB)
	}
	checkDest(t, slow, a.dest)
	checkDest(t, fast, b.dest)
	read := slow.served.Load() + fast.served.Load()
	t.Logf("a read %d bytes from the source and %d from b; b read %d from the source and %d from a",
		slow.served.Load(), resA.FromPeers, fast.served.Load(), resB.FromPeers)
	if resB.FromPeers == 0 || resA.FromPeers == 0 {
		t.Fatalf("a took %d bytes from b and b %d from a: the two did not share the parts", resA.FromPeers, resB.FromPeers)
	}
	if read != slow.size() {
		t.Errorf("the two nodes read %d bytes from the source for a model of %d: a part a was still reading was read again by b", read, slow.size())
	}
}

// An owner that answers but gains no part is not waited for long: one that reads nothing, once
// this node has had nothing of its own to read for Stall; one that says it reads everything (a
// stuck source, or a node that only claims to read) but whose reads do not move, after Stall.
// The node reads the owner's parts from the source itself and completes.
func TestAnOwnerThatGainsNothingIsNotWaitedForLong(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reading byte
	}{{"idle", 0}, {"claims to read every part", 0xff}} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t, 1<<20) // 16 parts
			owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "/have") {
					http.NotFound(w, r)
					return
				}
				if r.URL.Query().Get("after") != "" {
					select { // nothing ever changes
					case <-r.Context().Done():
						return
					case <-time.After(15 * time.Second):
					}
				}
				_ = json.NewEncoder(w).Encode(peer.HaveResponse{PartSize: partSize, Parts: 16, Held: make([]byte, 2),
					Reading: []byte{tc.reading, tc.reading}})
			}))
			t.Cleanup(owner.Close)
			b := newNode(t, "b", peer.ServerOptions{}, nil)
			sw := peer.NewSwarm(peer.SwarmOptions{Self: "b", Key: "cache-uid", Server: b.server,
				Stall: 300 * time.Millisecond,
				Peers: []peer.Peer{{Name: "owner", URL: owner.URL}}, Token: func() (string, error) { return goodToken + ":b", nil }})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := newEngine().Fetch(ctx, engine.Request{Source: m, Dest: b.dest, Swarm: sw})
			if err != nil {
				t.Fatalf("the fetch did not complete beside an owner that gains nothing: %v", err)
			}
			checkDest(t, m, b.dest)
			if res.Fetched != m.size() {
				t.Errorf("%d bytes from the source, %d from peers: want the whole model from the source", res.Fetched, res.FromPeers)
			}
		})
	}
}
