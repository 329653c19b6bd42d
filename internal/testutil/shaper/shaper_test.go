package shaper

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A total cap set after the proxy started holds from then on: a benchmark that slows its
// origin between runs gets the slower origin (a lower bound on the time, which a busy machine
// only lengthens).
func TestSetOptionsChangesTheTotalCap(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 256<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(up.Close)
	p, err := Start(up.URL, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	get := func() time.Duration {
		t.Helper()
		start := time.Now()
		resp, err := http.Get(p.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != int64(len(body)) {
			t.Fatalf("read %d bytes of %d: %v", n, len(body), err)
		}
		return time.Since(start)
	}
	get()
	p.SetOptions(Options{TotalBytesPerSecond: 128 << 10})
	// 64 KiB of burst, then 192 KiB at 128 KiB/s: 1.5 s at least.
	if d := get(); d < time.Second {
		t.Errorf("256 KiB through a total cap of 128 KiB/s set after the start took %s", d)
	}
	if p.Served.Load() != 2*int64(len(body)) {
		t.Errorf("served %d bytes, want %d", p.Served.Load(), 2*len(body))
	}
}
