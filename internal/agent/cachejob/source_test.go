package cachejob

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/witness"
)

// oneFile is a model of one file of 4 KiB, without a digest of its own.
type oneFile struct{}

func (oneFile) List(context.Context) (source.Listing, error) {
	return source.Listing{Files: []source.File{{Path: "f", Size: 4096}}}, nil
}

func (oneFile) OpenRange(_ context.Context, _ string, _, n int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(make([]byte, n))), nil
}

func (oneFile) String() string { return "mem://f" }

// An S3 cache's files without a digest go through the witness only while the node has peers to
// share their parts with: the cache's only node reads the origin directly, and once it is given
// a peer, reads through the witness.
func TestOnlyANodeWithPeersReadsThroughTheWitness(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(&witness.Server{Open: func(r *http.Request, _ string) (source.Source, error) {
		if strings.HasSuffix(r.URL.Path, "/read") { // (the client also asks for digests)
			asked.Add(1)
		}
		return oneFile{}, nil
	}})
	defer srv.Close()
	env := &Env{Now: time.Now, Witness: &Witness{URL: srv.URL}, Swarm: &peer.SwarmOptions{}}
	req := prewarmv1alpha1.CacheRequest{UID: "uid-1", Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3}}
	j := New(env, req, time.Now(), func() {})
	src, digests, stop := j.witnessed(context.Background(), oneFile{})
	defer stop()
	c, ok := src.(*witness.Client)
	if !ok || digests == nil {
		t.Fatalf("an S3 source is not wrapped in the witness's client: %T", src)
	}
	if _, err := c.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	read := func() {
		t.Helper()
		body, err := c.OpenRange(context.Background(), "f", 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, body)
		body.Close()
	}
	read()
	if via, _ := c.Read(); via != 0 || asked.Load() != 0 {
		t.Errorf("alone: %d bytes read through the witness, asked %d times; want none", via, asked.Load())
	}
	req.Peers = []prewarmv1alpha1.CachePeer{{Node: "gpu-2", Address: "10.0.0.2:9444"}}
	j.Update(req)
	read()
	if via, _ := c.Read(); via != 4096 || asked.Load() != 1 {
		t.Errorf("with a peer: %d bytes read through the witness, asked %d times; want 4096, once", via, asked.Load())
	}
}
