// Command modelserver stands in for an inference server in the real-node tests: it reads every
// file of the model under its mount, checks each against the source's listing (sizes and
// SHA-256), and only then reports healthy on /health. /invocations answers with what it read.
// A pod that serves is therefore a pod that saw the whole model, byte for byte.
//
//	modelserver --model /opt/ml/model --port 8000 [--expect /etc/modelserver/listing.json]
//
// --model and --port are vLLM's flags, with vLLM's defaults, so that the image stands in for
// vllm/vllm-openai under the arguments a JumpStart catalog entry passes. The listing is a JSON
// array of {"path", "size", "sha256"} (hex), paths relative to --model; the test image carries
// its model's listing at the default path. "modelserver --idle" only waits for SIGTERM (to time
// a container's start on its own).
//
// /metrics serves the load gauges vLLM exports and autoscalers scale on,
// vllm:num_requests_waiting and vllm:num_requests_running. A stand-in serves no real requests:
// "POST /load?waiting=N&running=M" sets them, as a burst of traffic would, for the autoscaling
// tests and the scale-out benchmark (a Prometheus server scrapes them; KEDA queries it).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// File is one entry of the listing.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// server is the model server's state: verifying, then verified or failed.
type server struct {
	mu     sync.Mutex
	done   bool
	err    error
	files  int
	bytes  int64
	took   time.Duration
	model  string
	expect []File
	// others are the entries under the model's directory that its listing does not name;
	// writable says whether a file could be made there.
	others   []string
	writable bool
	// fs names the filesystem the model is read from (tmpfs: from memory).
	fs string
	// waiting and running are the load the server reports, as vLLM does.
	waiting, running prometheus.Gauge
	metrics          *prometheus.Registry
}

// newServer returns a server for the model at model, its load gauges registered.
func newServer(model string) *server {
	s := &server{model: model, metrics: prometheus.NewRegistry(),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", Help: "Requests waiting to be processed."}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "Requests being processed."}),
	}
	s.metrics.MustRegister(s.waiting, s.running)
	return s
}

func main() {
	model := flag.String("model", "/opt/ml/model", "the model's directory")
	expect := flag.String("expect", "/etc/modelserver/listing.json", "the source's listing (JSON)")
	port := flag.Int("port", 8000, "port of /health and /invocations")
	idle := flag.Bool("idle", false, "do nothing until SIGTERM")
	flag.Parse()
	if *idle {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		return
	}
	b, err := os.ReadFile(*expect)
	if err != nil {
		log.Fatal(err)
	}
	s := newServer(*model)
	if err := json.Unmarshal(b, &s.expect); err != nil {
		log.Fatalf("%s: %v", *expect, err)
	}
	go s.verify()
	srv := &http.Server{Addr: fmt.Sprintf(":%d", *port), Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func (s *server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", s.health)
	mux.HandleFunc("/invocations", s.invoke)
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /load", s.load)
	return mux
}

// verify reads every expected file and checks its size and digest.
func (s *server) verify() {
	start := time.Now()
	var files int
	var total int64
	err := func() error {
		for _, f := range s.expect {
			n, sum, err := digest(filepath.Join(s.model, filepath.FromSlash(f.Path)))
			if err != nil {
				return err
			}
			if n != f.Size {
				return fmt.Errorf("%s: %d bytes, want %d", f.Path, n, f.Size)
			}
			if sum != f.SHA256 {
				return fmt.Errorf("%s: sha256 %s, want %s", f.Path, sum, f.SHA256)
			}
			files++
			total += n
		}
		return nil
	}()
	others := s.unlisted()
	probe := filepath.Join(s.model, ".modelserver-write-probe")
	f, werr := os.Create(probe)
	if werr == nil {
		f.Close()
		os.Remove(probe)
	}
	s.mu.Lock()
	s.done, s.err, s.files, s.bytes, s.took = true, err, files, total, time.Since(start)
	s.others, s.writable, s.fs = others, werr == nil, fsName(s.model)
	s.mu.Unlock()
	if err != nil {
		log.Printf("the model does not match its source: %v", err)
		return
	}
	log.Printf("verified %d files, %d bytes, in %s", files, total, time.Since(start).Round(time.Millisecond))
}

// unlisted returns the files and directories under the model's directory that the listing
// does not name (nor lead to).
func (s *server) unlisted() []string {
	named := map[string]bool{}
	for _, f := range s.expect {
		for p := f.Path; p != "." && p != "/"; p = filepath.Dir(p) {
			named[p] = true
		}
	}
	var out []string
	_ = filepath.WalkDir(s.model, func(path string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(s.model, path)
		if err != nil || rel == "." {
			return nil
		}
		if !named[filepath.ToSlash(rel)] {
			out = append(out, filepath.ToSlash(rel))
			if d.IsDir() {
				return filepath.SkipDir
			}
		}
		return nil
	})
	return out
}

func digest(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// fsName names the filesystem dir is on, by its statfs magic.
func fsName(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown filesystem (" + err.Error() + ")"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs"
	case 0x794c7630:
		return "overlayfs"
	case 0xef53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	}
	return fmt.Sprintf("filesystem 0x%x", st.Type)
}

func (s *server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.done:
		http.Error(w, "reading the model", http.StatusServiceUnavailable)
	case s.err != nil:
		http.Error(w, s.err.Error(), http.StatusInternalServerError)
	default:
		access := "read-only"
		if s.writable {
			access = "writable"
		}
		fmt.Fprintf(w, "ok: %d files, %d bytes verified in %s; %d other entries %v; %s; on %s\n",
			s.files, s.bytes, s.took.Round(time.Millisecond), len(s.others), s.others, access, s.fs)
	}
}

func (s *server) invoke(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done || s.err != nil {
		err := s.err
		if err == nil {
			err = errors.New("reading the model")
		}
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"files": s.files, "bytes": s.bytes, "verifySeconds": s.took.Seconds()})
}

// load sets the load gauges from the query's waiting and running (each optional, at least 0).
func (s *server) load(w http.ResponseWriter, r *http.Request) {
	set := map[string]prometheus.Gauge{"waiting": s.waiting, "running": s.running}
	values := map[string]float64{}
	for name := range set {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("%s=%q: want a number of requests, at least 0", name, v), http.StatusBadRequest)
			return
		}
		values[name] = n
	}
	if len(values) == 0 {
		http.Error(w, "give waiting=N, running=M or both", http.StatusBadRequest)
		return
	}
	for name, n := range values {
		set[name].Set(n)
	}
	w.WriteHeader(http.StatusNoContent)
}
