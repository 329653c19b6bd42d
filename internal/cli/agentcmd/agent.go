// Package agentcmd is the command tree of the agent binary: the node agent, and "agent prepare",
// the init container of inference pods.
package agentcmd

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine"
)

// NewAgentCommand returns the command tree of the agent binary.
func NewAgentCommand() *cobra.Command {
	var (
		opts        agent.Options
		src         cli.SourceFlags
		roots       []string
		fileRoots   []string
		reserve     string
		verifyRate  string
		kubeconfig  string
		metricsAddr string
		probeAddr   string
		verbosity   int
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "prewarm's node agent: keeps the node's weights caches on local disk",
		Long: `The agent runs on every node that can hold caches (a DaemonSet). It reads the node's
NodeCache (prewarm.io/v1alpha1, named after the node), downloads each cache listed there into
<root>/prewarm/<cache UID>, verifies it, publishes it atomically, reports progress and disk space
in the NodeCache status, and removes caches that are no longer listed. Caches are kept only under
the allowed roots.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Reserve, err = cli.ParseBytes(reserve); err != nil {
				return fmt.Errorf("--reserve: %w", err)
			}
			if opts.VerifyRate, err = cli.ParseBytes(verifyRate); err != nil {
				return fmt.Errorf("--verify-rate: %w", err)
			}
			if opts.Engine, err = src.EngineOptions(); err != nil {
				return err
			}
			opts.Roots, opts.FileSourceRoots, opts.Version = roots, fileRoots, cli.Version()
			opts.Registerer = ctrlmetrics.Registry
			opts.Sources = src.SourceOptions("s3://", "")
			opts.HFEndpoint = src.HFEndpoint
			if err := opts.Validate(); err != nil {
				return err
			}
			log := cli.NewLogger(verbosity)
			ctrl.SetLogger(log)
			cfg, err := cli.RestConfig(kubeconfig)
			if err != nil {
				return err
			}
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                 scheme.New(),
				Cache:                  agent.CacheOptions(opts.NodeName),
				Metrics:                metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress: probeAddr,
				Logger:                 log.WithValues("node", opts.NodeName),
			})
			if err != nil {
				return err
			}
			if err := addHealthChecks(mgr, probeAddr); err != nil {
				return err
			}
			if err := agent.New(mgr.GetClient(), mgr.GetAPIReader(), opts).SetupWithManager(mgr); err != nil {
				return err
			}
			log.Info("agent starting", "node", opts.NodeName, "roots", opts.Roots, "version", opts.Version)
			return mgr.Start(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	f.StringVar(&opts.Namespace, "namespace", envOr("POD_NAMESPACE", "hyperpod-inference-system"), "prewarm's namespace, where the controller puts token Secrets for the agents (default $POD_NAMESPACE)")
	f.StringSliceVar(&roots, "roots", []string{"/opt/dlami/nvme"}, "node directories caches may be kept under (the cluster admin's allow-list)")
	f.StringVar(&opts.HostPrefix, "host-prefix", "", "where the node's filesystem is seen from the agent (empty: the roots are mounted at their own paths)")
	f.StringSliceVar(&fileRoots, "file-source-roots", []string{"/fsx"}, "node directories a file source (a mounted FSx) may be read from")
	f.StringVar(&reserve, "reserve", "2GiB", "free space kept under each root, never filled by caches")
	f.IntVar(&opts.MaxParallel, "max-parallel", 2, "caches downloading at once")
	f.DurationVar(&opts.StatusInterval, "status-interval", 2*time.Second, "least time between two status writes")
	f.DurationVar(&opts.RecheckInterval, "recheck-interval", 5*time.Minute, "how often a ready cache is re-checked (manifest and sizes)")
	f.DurationVar(&opts.VerifyInterval, "verify-interval", 24*time.Hour, "how often a ready cache's content is read back and checked against its checksums (also once at start)")
	f.StringVar(&verifyRate, "verify-rate", "200MiB", "most bytes per second that re-verification reads from disk (0: no cap)")
	f.DurationVar(&opts.RetryInterval, "retry-interval", 10*time.Second, "first wait before a failed download is retried (doubles up to 5m)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 turns it off)")
	f.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints (0 turns it off)")
	f.IntVarP(&verbosity, "v", "v", 0, "log verbosity")
	src.Register(cmd)
	cmd.AddCommand(newPrepareCommand())
	return cmd
}

func newPrepareCommand() *cobra.Command {
	var (
		o      agent.PrepareOptions
		src    cli.SourceFlags
		region string
	)
	cmd := &cobra.Command{
		Use:   "prepare",
		Short: "Make the model appear at --dest: linked from the node's cache, or downloaded",
		Long: `prepare is the init container of inference pods. On a node that holds the cache (--cache-dir
is whole and verified) it links every file into --dest, copying nothing. On a node without it,
it downloads the model from --source into --dest, so a pod on a cold node still starts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Engine, err = src.EngineOptions(); err != nil {
				return err
			}
			o.Sources = src.SourceOptions(o.Source, region)
			if strings.HasPrefix(o.Source, "hf://") {
				o.Sources.Token = os.Getenv("HF_TOKEN") // from the parent's tokenSecretRef, set by the pod template
			}
			start := time.Now()
			res, err := agent.Prepare(cmd.Context(), o)
			if err != nil {
				return err
			}
			how := "warm: linked from the node's cache"
			if !res.Warm {
				how = fmt.Sprintf("cold (%s): downloaded %s from %s", res.Reason, engine.HumanBytes(res.Fetched), o.Source)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "model ready at %s in %s: %d files, %s; %s\n",
				o.Dest, time.Since(start).Round(time.Millisecond), res.Files, engine.HumanBytes(res.Bytes), how)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.CacheDir, "cache-dir", "", "the node's cache of this model (read-only)")
	f.StringVar(&o.Dest, "dest", "", "where the inference container reads the model")
	f.StringVar(&o.Source, "source", "", "the model's original address, for a node without the cache ($HF_TOKEN is the Hugging Face token)")
	f.StringVar(&region, "region", "", "S3 region of the source")
	src.Register(cmd)
	_ = cmd.MarkFlagRequired("dest")
	return cmd
}

func addHealthChecks(mgr ctrl.Manager, addr string) error {
	if addr == "0" || addr == "" {
		return nil
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("readyz", healthz.Ping)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
