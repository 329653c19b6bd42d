// Package cli holds what prewarm's command-line binaries share: running a command tree as main,
// the version, logging, the kubeconfig, byte sizes and the engine flags. The binaries'
// own commands live in the packages below it (agentcmd, kubectl), so that each binary links only
// what it runs.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	prewarmversion "github.com/prewarm/prewarm/internal/version"
	"github.com/prewarm/prewarm/pkg/engine"
)

// EngineFlags tune the download engine.
type EngineFlags struct {
	concurrency int
	partSize    string
	limitRate   string
	directIO    bool
}

// Register adds the flags to cmd.
func (f *EngineFlags) Register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.IntVar(&f.concurrency, "concurrency", engine.DefaultConcurrency, "ranged reads in flight at once, per cache")
	fs.StringVar(&f.partSize, "part-size", "16MiB", "size of each ranged read")
	fs.StringVar(&f.limitRate, "limit-rate", "", "cap each download's rate, in bytes per second (e.g. 500MB)")
	fs.BoolVar(&f.directIO, "direct-io", true, "write files verified as they stream in with O_DIRECT, past the page cache (the page cache where the filesystem refuses it)")
}

// Prefer takes concurrency and part size from a configuration, for the flags not set on the
// command line.
func (f *EngineFlags) Prefer(cmd *cobra.Command, concurrency int, partSize int64) {
	if !cmd.Flags().Changed("concurrency") && concurrency > 0 {
		f.concurrency = concurrency
	}
	if !cmd.Flags().Changed("part-size") && partSize > 0 {
		f.partSize = strconv.FormatInt(partSize, 10)
	}
}

// Connections is how many connections a source should keep for the engine.
func (f *EngineFlags) Connections() int { return f.concurrency }

// EngineOptions returns the engine options the flags ask for.
func (f *EngineFlags) EngineOptions() ([]engine.Option, error) {
	if f.concurrency < 1 {
		return nil, fmt.Errorf("--concurrency must be at least 1")
	}
	part, err := ParseBytes(f.partSize)
	if err != nil {
		return nil, fmt.Errorf("--part-size: %w", err)
	}
	opts := []engine.Option{engine.WithConcurrency(f.concurrency), engine.WithPartSize(part), engine.WithDirectIO(f.directIO)}
	if f.limitRate != "" {
		limit, err := ParseBytes(f.limitRate)
		if err != nil {
			return nil, fmt.Errorf("--limit-rate: %w", err)
		}
		opts = append(opts, engine.WithRateLimit(limit))
	}
	return opts, nil
}

// Duration writes d as flag help and the docs write durations: 5m and 24h, not time.Duration's
// 5m0s and 24h0m0s.
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// SetupLogging makes the JSON logger prewarm's daemons write to stderr the logger of
// controller-runtime and of klog, and returns it: client-go's own lines (leader election,
// watches, throttling) come out as the same JSON objects, not klog's text between them.
func SetupLogging(verbosity int) logr.Logger {
	log := newLogger(os.Stderr, verbosity)
	ctrl.SetLogger(log)
	routeKlog(log, verbosity)
	return log
}

// newLogger returns a JSON logger writing to w, at verbosity (a V(n) line is written when n is at
// most verbosity).
func newLogger(w io.Writer, verbosity int) logr.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(-verbosity)})
	return logr.FromSlogHandler(h)
}

// routeKlog sends klog's lines to log, klog's V(n) lines up to verbosity as the logger's own.
func routeKlog(log logr.Logger, verbosity int) {
	klog.SetLogger(log)
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", strconv.Itoa(max(verbosity, 0))) // a well-formed number: cannot fail
}

// RestConfig loads a kubeconfig file, or the in-cluster / $KUBECONFIG configuration.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

// version is set at link time by image builds (-X), to the version the image is tagged with.
var version string

// Version is the version this binary was built as: the one an image build stamped, else the
// module version, else the release of the source it was built from, marked as a development
// build.
func Version() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return prewarmversion.Tag + "-devel"
}

// ParseBytes reads a size such as 16MiB, 500MB, 1.5G or 1048576.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 16MiB, 500MB)", s)
	}
	mult := map[string]float64{
		"": 1, "b": 1,
		"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
		"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q (use B, kB, MB, GB, KiB, MiB, GiB)", s, unit)
	}
	return int64(v * mult), nil
}

// HTTPServer is a manager.Runnable serving handler on addr until the manager stops; it runs on
// every replica (no leader election).
func HTTPServer(addr string, handler http.Handler) manager.Runnable {
	return httpServer{addr: addr, handler: handler}
}

// HTTPServerOn is HTTPServer on a listener already open.
func HTTPServerOn(ln net.Listener, handler http.Handler) manager.Runnable {
	return httpServer{ln: ln, handler: handler}
}

type httpServer struct {
	addr    string
	ln      net.Listener
	handler http.Handler
}

func (httpServer) NeedLeaderElection() bool { return false }

func (s httpServer) Start(ctx context.Context) error {
	ln := s.ln
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.addr); err != nil {
			return fmt.Errorf("listening on %s: %w", s.addr, err)
		}
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
		return nil
	}
}
