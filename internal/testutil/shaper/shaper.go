// Package shaper is an HTTP proxy for tests and benchmarks that makes loopback behave like a
// network: a bandwidth cap per response (each ranged GET is its own connection's worth of
// bandwidth, as with S3), a first-byte latency, injected failures, and a count of bytes served.
package shaper

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Options shape the proxy.
type Options struct {
	// BytesPerSecond caps each response body; 0 for no cap.
	BytesPerSecond int64
	// TotalBytesPerSecond caps all response bodies together (the origin's own link); 0 for
	// no cap.
	TotalBytesPerSecond int64
	// FirstByteLatency delays each response.
	FirstByteLatency time.Duration
	// Fault, when set, is asked for each request whether to fail it: with a status code
	// (e.g. 503), or by cutting the connection after the given number of body bytes (-1: no).
	Fault func(req *http.Request, n int64) (status int, cutAfter int64)
}

// Proxy forwards to one upstream.
type Proxy struct {
	// URL is the proxy's address, to use as the endpoint.
	URL string
	// Served counts response body bytes sent to clients.
	Served atomic.Int64
	// Requests counts requests.
	Requests atomic.Int64

	opts   atomic.Pointer[Options]
	server *http.Server
	ln     net.Listener
	total  *rate.Limiter
}

// Start listens on a loopback port and forwards to upstream.
func Start(upstream string, opts Options) (*Proxy, error) {
	return StartOn("127.0.0.1:0", upstream, opts)
}

// StartOn is Start listening on addr.
func StartOn(addr, upstream string, opts Options) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{URL: "http://" + ln.Addr().String(), ln: ln, total: rate.NewLimiter(rate.Inf, slice)}
	p.SetOptions(opts)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	rp.FlushInterval = -1
	rp.BufferPool = newPool()
	rp.ErrorLog = log.New(io.Discard, "", 0) // an upstream that is down is what some tests want
	p.server = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.Requests.Add(1)
		o := p.opts.Load()
		cut := int64(-1)
		if o.Fault != nil {
			status, after := o.Fault(r, n)
			if status != 0 {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, "<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>")
				return
			}
			cut = after
		}
		if o.FirstByteLatency > 0 {
			select {
			case <-time.After(o.FirstByteLatency):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(&shapedWriter{ResponseWriter: w, p: p, rate: o.BytesPerSecond, cut: cut, start: time.Now(), ctx: r.Context()}, r)
	})}
	go func() { _ = p.server.Serve(ln) }()
	return p, nil
}

// SetOptions changes the shaping: the total cap at once, the rest for later requests.
func (p *Proxy) SetOptions(o Options) {
	p.opts.Store(&o)
	if o.TotalBytesPerSecond > 0 {
		p.total.SetLimit(rate.Limit(o.TotalBytesPerSecond))
	} else {
		p.total.SetLimit(rate.Inf)
	}
}

// Close stops the proxy.
func (p *Proxy) Close() error { return p.server.Close() }

// slice is the most bytes written at once: the total cap's burst.
const slice = 64 << 10

type shapedWriter struct {
	http.ResponseWriter
	p       *Proxy
	rate    int64
	cut     int64
	written int64
	start   time.Time
	ctx     context.Context
}

func (w *shapedWriter) Write(b []byte) (int, error) {
	if w.cut >= 0 && w.written+int64(len(b)) > w.cut {
		b = b[:max(0, w.cut-w.written)]
		n, _ := w.ResponseWriter.Write(b)
		w.written += int64(n)
		w.p.Served.Add(int64(n))
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler) // drops the connection mid-body
	}
	total := 0
	for len(b) > 0 {
		k := min(len(b), slice)
		n, err := w.ResponseWriter.Write(b[:k])
		total += n
		w.written += int64(n)
		w.p.Served.Add(int64(n))
		if err != nil {
			return total, err
		}
		b = b[k:]
		if err := w.p.total.WaitN(w.ctx, n); err != nil {
			return total, err
		}
		if w.rate > 0 {
			due := w.start.Add(time.Duration(float64(w.written) / float64(w.rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-w.ctx.Done():
					return total, w.ctx.Err()
				}
			}
		}
	}
	return total, nil
}

func (w *shapedWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// pool reuses the proxy's copy buffers (httputil.BufferPool over a sync.Pool).
type pool struct{ p *sync.Pool }

func newPool() pool {
	return pool{&sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}}
}

func (p pool) Get() []byte { return *p.p.Get().(*[]byte) }

func (p pool) Put(b []byte) { p.p.Put(&b) }
