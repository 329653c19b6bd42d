package peer_test

import (
	"context"
	"crypto/md5" //nolint:gosec // S3 ETags are MD5
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/minio/crc64nvme"

	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// forgeKeepingCRC64 returns data with "EVIL" written at off and 8 bytes at fix changed so that
// the whole's CRC64NVME is what it was: a CRC is linear over GF(2), so whoever can change bytes
// can keep it. It solves for the 64 bits of the fix with Gaussian elimination.
func forgeKeepingCRC64(t *testing.T, data []byte, off, fix int) []byte {
	t.Helper()
	zero := make([]byte, len(data))
	base := crc64nvme.Checksum(zero)
	lin := func(d []byte) uint64 { return crc64nvme.Checksum(d) ^ base } // linear in d
	delta := make([]byte, len(data))
	for i, c := range []byte("EVIL") {
		delta[off+i] = data[off+i] ^ c
	}
	target := lin(delta)
	// Column j is the effect of flipping bit j of the fix; row-reduce [columns | target].
	var cols [64]uint64
	for j := range 64 {
		e := make([]byte, len(data))
		e[fix+j/8] = 1 << (j % 8)
		cols[j] = lin(e)
	}
	// Solve sum x_j cols[j] = target: treat each bit position of the CRC as an equation.
	var rows [64]uint64 // rows[b] has bit j set when cols[j] has bit b
	var rhs [64]uint64
	for b := range 64 {
		for j := range 64 {
			rows[b] |= (cols[j] >> b & 1) << j
		}
		rhs[b] = target >> b & 1
	}
	var pivotOf [64]int // the row that solves for bit j
	var used [64]bool
	for j := range 64 {
		b := -1
		for k := range 64 {
			if !used[k] && rows[k]>>j&1 == 1 {
				b = k
				break
			}
		}
		if b < 0 {
			t.Fatalf("bit %d of the fix has no pivot: choose other fix bytes", j)
		}
		pivotOf[j], used[b] = b, true
		for o := range 64 {
			if o != b && rows[o]>>j&1 == 1 {
				rows[o] ^= rows[b]
				rhs[o] ^= rhs[b]
			}
		}
	}
	out := append([]byte(nil), data...)
	for i := range delta {
		out[i] ^= delta[i]
	}
	for j := range 64 {
		if rhs[pivotOf[j]] == 1 {
			out[fix+j/8] ^= 1 << (j % 8)
		}
	}
	if crc64nvme.Checksum(out) != crc64nvme.Checksum(data) {
		t.Fatal("the forgery does not keep the CRC64NVME")
	}
	return out
}

// forge serves forged bytes for the parts it names, vouching for them with their own CRC32C as
// a compromised node would.
func forge(parts map[int][]byte) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			i, err := strconv.Atoi(path.Base(r.URL.Path))
			body, ok := parts[i]
			if err != nil || !ok || path.Base(path.Dir(r.URL.Path)) != "parts" {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r) // authenticated like any request
			if rec.Code != http.StatusOK {
				w.WriteHeader(rec.Code)
				return
			}
			w.Header().Set(peer.CRCHeader, fmt.Sprintf("%08x", crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))))
			_, _ = w.Write(body)
		})
	}
}

// A node that lies about parts, keeping every checksum but a cryptographic digest, gets
// nothing of a file without such a digest onto another node: those files are read from the
// source. With TrustPeers (nodes trusted) the same forgery is published, which is the risk the
// option states.
func TestALyingPeerCannotForgeAFileWithoutADigest(t *testing.T) {
	crc64 := engine.CRC64NVME
	for _, tc := range []struct {
		name string
		sums func([]byte) source.Checksums
		// trustedForgeryPublished: with TrustPeers, the forgery passes verification.
		trustedForgeryPublished bool
	}{
		{"no checksum (a filesystem or FSx)", func([]byte) source.Checksums { return source.Checksums{} }, true},
		{"S3 with CRC64NVME only", func(d []byte) source.Checksums { return source.Checksums{CRC64NVME: crc64(d)} }, true},
		{"S3 with CRC64NVME and an MD5 ETag", func(d []byte) source.Checksums {
			sum := md5.Sum(d) //nolint:gosec // S3 ETag
			return source.Checksums{CRC64NVME: crc64(d), MD5: hex.EncodeToString(sum[:])}
		}, false},
	} {
		for _, trust := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/trustPeers=%v", tc.name, trust), func(t *testing.T) {
				m := newModel(t, 4*partSize)
				m.sums = tc.sums
				name := m.order[0]
				orig := m.files[name]
				forged := forgeKeepingCRC64(t, orig, partSize+100, partSize+1000)
				a := newNode(t, "a", peer.ServerOptions{}, forge(map[int][]byte{1: forged[partSize : 2*partSize]}))
				seed(t, a, m)
				m.served.Store(0)
				b := newNode(t, "b", peer.ServerOptions{}, nil)
				sw := b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}})
				res, err := newEngine().Fetch(context.Background(), engine.Request{Source: m, Dest: b.dest, Swarm: sw, TrustPeers: trust})
				digest := tc.sums(orig).Cryptographic()
				switch {
				case !trust && !digest:
					if err != nil {
						t.Fatal(err)
					}
					checkDest(t, m, b.dest)
					if res.FromPeers != 0 {
						t.Errorf("%d bytes came from a peer for a file with no digest", res.FromPeers)
					}
				case !trust && digest, trust && !tc.trustedForgeryPublished:
					if err != nil {
						t.Fatal(err)
					}
					checkDest(t, m, b.dest) // the digest caught it; the parts were read again
					if got := sw.Dropped()["a"]; got != "mismatch" {
						t.Errorf("peer a dropped for %q, want mismatch", got)
					}
				default: // trusted, no digest that the forgery breaks
					if err != nil {
						t.Fatal(err)
					}
					if res.FromPeers == 0 {
						t.Fatal("nothing was taken from the peer: the forgery was not tried")
					}
					if digest {
						checkDest(t, m, b.dest) // the MD5 still decides where there is one
						return
					}
					got := readFile(t, b.dest, name)
					if string(got[partSize+100:partSize+104]) != "EVIL" {
						t.Errorf("with trusted peers the forgery was not published: the test shows nothing")
					}
				}
			})
		}
	}
}

// A part taken from a peer is not offered to others before its file is verified by the
// source's digest: a lying peer's bytes do not spread through this node.
func TestPeerPartsAreOfferedOnlyOnceTheirFileIsVerified(t *testing.T) {
	m := newModel(t, 6*partSize)
	a := newNode(t, "a", peer.ServerOptions{}, nil)
	seed(t, a, m)
	b := newNode(t, "b", peer.ServerOptions{}, nil)
	sw := b.swarm([]peer.Peer{{Name: "a", URL: a.http.URL, Upstream: true}})
	watch := &watchingSwarm{Swarm: sw, t: t}
	res, err := newEngine().Fetch(context.Background(), engine.Request{Source: m, Dest: b.dest, Swarm: watch})
	if err != nil {
		t.Fatal(err)
	}
	checkDest(t, m, b.dest)
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if res.FromPeers == 0 || watch.checked == 0 {
		t.Fatalf("%d bytes from peers, %d parts checked: the test shows nothing", res.FromPeers, watch.checked)
	}
	for i := range watch.plan.Parts() {
		if _, ok := watch.plan.Held(i); !ok {
			t.Errorf("part %d is not offered after the file was verified", i)
		}
	}
}

// watchingSwarm checks, each time a part is asked of a peer, that no part a peer supplied is
// offered yet: the file's last part is not written before this call returns, so the file
// cannot have been verified.
type watchingSwarm struct {
	*peer.Swarm
	t       *testing.T
	plan    *engine.Plan
	mu      sync.Mutex
	given   []int
	checked int
}

func (w *watchingSwarm) Join(ctx context.Context, p *engine.Plan) { w.plan = p; w.Swarm.Join(ctx, p) }

func (w *watchingSwarm) Part(ctx context.Context, i int) (engine.PeerPart, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.given {
		if _, ok := w.plan.Held(g); ok {
			w.t.Errorf("part %d from a peer is offered before its file is verified", g)
		}
		w.checked++
	}
	pp, err := w.Swarm.Part(ctx, i)
	if err == nil {
		w.given = append(w.given, i)
	}
	return pp, err
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
