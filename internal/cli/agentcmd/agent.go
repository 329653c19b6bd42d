// Package agentcmd is the command tree of the agent binary: the node agent, and "agent prepare",
// the init container of inference pods.
package agentcmd

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/csi"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/tokenreview"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/peer"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// agentFlags are the node agent's flags.
type agentFlags struct {
	opts        agent.Options
	eng         cli.EngineFlags
	configFile  string
	reserve     string
	verifyRate  string
	kubeconfig  string
	metricsAddr string
	probeAddr   string
	verbosity   int
	csi         csi.Options
	peers       peerFlags
}

// peerFlags say where the agent serves its parts to other agents, and how it proves to them
// that it is one.
type peerFlags struct {
	bind, address, tokenFile, serviceAccount string
	// witnessURL and witnessTokenFile: where the controller's witness is, and the token for it.
	witnessURL, witnessTokenFile string
}

// NewAgentCommand returns the command tree of the agent binary.
func NewAgentCommand() *cobra.Command { return newAgentCommand(&agentFlags{}) }

func newAgentCommand(af *agentFlags) *cobra.Command {
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
		RunE:          func(cmd *cobra.Command, _ []string) error { return runAgent(cmd, af) },
	}
	opts := &af.opts
	f := cmd.Flags()
	f.StringVar(&opts.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	f.StringVar(&af.configFile, "config", "", "the operator configuration shared with the controller (cache roots, S3, Hugging Face, FSx mounts); empty: the defaults")
	f.StringVar(&opts.HostPrefix, "host-prefix", "", "where the node's filesystem is seen from the agent (empty: the roots are mounted at their own paths)")
	f.StringVar(&af.reserve, "reserve", "", fmt.Sprintf("overrides agent.reserve (%s): free space kept under each root, never filled by caches", config.DefaultReserve))
	f.IntVar(&opts.MaxParallel, "max-parallel", 0, fmt.Sprintf("overrides agent.maxParallel (%d): caches downloading at once", config.DefaultMaxParallel))
	f.DurationVar(&opts.StatusInterval, "status-interval", 0, fmt.Sprintf("overrides agent.statusInterval (%s): least time between two status writes", cli.Duration(config.DefaultStatusInterval)))
	f.DurationVar(&opts.RecheckInterval, "recheck-interval", 0, fmt.Sprintf("overrides agent.recheckInterval (%s): how often a ready cache is re-checked (manifest and sizes)", cli.Duration(config.DefaultRecheckInterval)))
	f.DurationVar(&opts.VerifyInterval, "verify-interval", 0, fmt.Sprintf("overrides agent.verifyInterval (%s): how often a ready cache's content is read back and checked against its checksums (also once at start)", cli.Duration(config.DefaultVerifyInterval)))
	f.StringVar(&af.verifyRate, "verify-rate", "", fmt.Sprintf("overrides agent.verifyRate (%s): most bytes per second that re-verification reads from disk (0: no cap)", config.DefaultVerifyRate))
	f.DurationVar(&opts.RetryInterval, "retry-interval", 0, fmt.Sprintf("overrides agent.retryInterval (%s): first wait before a failed download is retried (doubles up to 5m)", cli.Duration(config.DefaultRetryInterval)))
	f.StringVar(&af.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&af.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 turns it off)")
	f.StringVar(&af.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints (0 turns it off)")
	f.IntVarP(&af.verbosity, "v", "v", 0, "log verbosity")
	f.StringVar(&af.csi.Endpoint, "csi-endpoint", "", "serve prewarm's CSI node plugin on this Unix socket (e.g. /var/lib/kubelet/plugins/"+prewarmv1alpha1.CSIDriverName+"/csi.sock; empty: no node plugin)")
	f.StringVar(&af.csi.Registration, "csi-registration", "", "register the node plugin with the kubelet through this socket in its plugins_registry directory (empty: do not register)")
	f.DurationVar(&opts.MountWait, "mount-wait", 0, fmt.Sprintf("overrides agent.mountWait (%s): how long the node plugin waits for a cache before telling the kubelet to call again (under the kubelet's 2m limit)", cli.Duration(config.DefaultMountWait)))
	f.StringVar(&af.csi.KubeletDir, "kubelet-dir", "/var/lib/kubelet", "the kubelet's root directory; the node plugin mounts only under its pods directory")
	f.StringVar(&af.peers.bind, "peer-bind-address", "", "where to serve this node's parts to other agents (default :<peers.port>; 0 turns sharing off for this node)")
	f.StringVar(&af.peers.address, "peer-address", "", "IP:port other agents reach the peer server at (default: the IP of --peer-bind-address, else $POD_IP, with the port it listens on)")
	f.StringVar(&af.peers.tokenFile, "peer-token-file", "/var/run/secrets/prewarm.io/peer/token", "the projected service account token (audience peers.audience) this agent presents to others")
	f.StringVar(&af.peers.serviceAccount, "peer-service-account", "", "the service account whose tokens other agents present (default system:serviceaccount:$POD_NAMESPACE:$SERVICE_ACCOUNT)")
	f.StringVar(&af.peers.witnessURL, "witness-url", "", "the controller's witness, which S3 files without a SHA-256 are read through so that peers share them (the chart sets http://"+config.WitnessService+".<namespace>.svc:<peers.witness.port>; empty: none)")
	f.StringVar(&af.peers.witnessTokenFile, "witness-token-file", "/var/run/secrets/prewarm.io/witness/token", "the projected service account token (audience peers.witness.audience) this agent presents to the witness")
	af.eng.Register(cmd)
	cmd.AddCommand(newPrepareCommand())
	cmd.AddCommand(newPrefetchCommand())
	return cmd
}

// runAgent runs the node agent until the command's context ends (SIGTERM).
func runAgent(cmd *cobra.Command, af *agentFlags) error {
	opts := &af.opts
	if err := af.load(cmd); err != nil {
		return err
	}
	opts.Connections, opts.Version = af.eng.Connections(), cli.Version()
	if af.csi.Endpoint != "" {
		opts.KubeletDir = af.csi.KubeletDir // the node's CSI plugin: the kubelet's directory is mounted
	}
	opts.Registerer = ctrlmetrics.Registry
	if err := opts.Validate(); err != nil {
		return err
	}
	log := cli.SetupLogging(af.verbosity)
	cfg, err := cli.RestConfig(af.kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.New(),
		Cache:                  agent.CacheOptions(opts.NodeName),
		Client:                 agent.ClientOptions(),
		Metrics:                metricsserver.Options{BindAddress: af.metricsAddr},
		HealthProbeBindAddress: af.probeAddr,
		Logger:                 log.WithValues("node", opts.NodeName),
	})
	if err != nil {
		return err
	}
	if opts.Peers, err = setupPeers(mgr, opts, af.peers); err != nil {
		return err
	}
	// The Lease is renewed in protobuf, as the kubelet renews its node's.
	leaseCfg := rest.CopyConfig(cfg)
	leaseCfg.ContentType = runtime.ContentTypeProtobuf
	if opts.Leases, err = kubernetes.NewForConfig(leaseCfg); err != nil {
		return err
	}
	opts.LeaseHolder = os.Getenv("POD_NAME")
	a, err := agent.New(mgr.GetClient(), *opts)
	if err != nil {
		return err
	}
	if err := a.SetupWithManager(mgr); err != nil {
		return err
	}
	// Ready once the agent has reported and, as the node's CSI plugin, the kubelet has
	// registered it: the node's pods can then have their model volumes.
	ready := map[string]healthz.Checker{"reported": a.Reported}
	if af.csi.Endpoint != "" {
		a.SetRecorder(mgr.GetEventRecorder("prewarm-agent"))
		af.csi.NodeName, af.csi.Version, af.csi.Log = opts.NodeName, opts.Version, log.WithName("csi")
		plugin := csi.New(af.csi, a)
		if err := mgr.Add(plugin); err != nil {
			return err
		}
		ready["csi-registered"] = plugin.Registered
	}
	if err := addHealthChecks(mgr, af.probeAddr, ready); err != nil {
		return err
	}
	log.Info("agent starting", "node", opts.NodeName, "roots", opts.Config.Roots(), "version", opts.Version)
	err = mgr.Start(cmd.Context())
	// Stopped: the directories of the agent's own that hold nothing go, so that an uninstall
	// leaves none on the node.
	if rmErr := a.RemoveEmptyDirs(); rmErr != nil {
		log.Error(rmErr, "leaving directories behind")
	}
	return err
}

func newPrefetchCommand() *cobra.Command {
	var (
		o         agent.PrefetchOptions
		sizeLimit string
	)
	cmd := &cobra.Command{
		Use:   "prefetch",
		Short: "Copy the model from the pod's model volume into memory (HyperPod's prefetchEnabled)",
		Long: `prefetch is the init container of the pods of a parent with modelSourceConfig.prefetchEnabled:
it copies every file of --from (the pod's model volume) into --to (the memory-backed volume
model-weights-copy), from which the inference server reads the model. It first empties --to of
whatever an earlier attempt left there, so a restarted prefetch starts over. A model larger
than --size-limit is refused before anything is copied, the error quoting --size-limit-from.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sizeLimit != "" {
				q, err := resource.ParseQuantity(sizeLimit)
				if err != nil || q.Sign() < 0 {
					return fmt.Errorf("--size-limit %q: want a size such as 16Gi", sizeLimit)
				}
				o.SizeLimit = q.Value()
			}
			start := time.Now()
			res, err := agent.Prefetch(o)
			if err != nil {
				return err
			}
			took := time.Since(start)
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "model copied into memory at %s in %s: %d files, %s (%s/s)\n",
				o.To, took.Round(time.Millisecond), res.Files, engine.HumanBytes(res.Bytes), engine.HumanBytes(int64(float64(res.Bytes)/max(took.Seconds(), 1e-3))))
			return err
		},
	}
	cmd.Flags().StringVar(&o.From, "from", "", "the pod's model volume (read-only)")
	cmd.Flags().StringVar(&o.To, "to", "", "the memory-backed volume the inference server reads")
	cmd.Flags().StringVar(&sizeLimit, "size-limit", "", "the memory volume's size limit (a quantity such as 16Gi; empty: none)")
	cmd.Flags().StringVar(&o.SizeLimitFrom, "size-limit-from", "", "what set --size-limit and how to raise it, quoted by the error of a model that does not fit")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func newPrepareCommand() *cobra.Command {
	var (
		o          agent.PrepareOptions
		eng        cli.EngineFlags
		srcOpts    sources.Options
		hfEndpoint string
	)
	cmd := &cobra.Command{
		Use:   "prepare",
		Short: "Make the model appear at --dest: linked from the node's cache, or downloaded",
		Long: `prepare is the init container of inference pods. On a node that holds the cache (--cache-dir
is whole and verified) it links every file into --dest, copying nothing. On a node without it,
it downloads the model from its source (--s3-bucket and --s3-prefix, --hf-repo, or --source-dir;
each value is taken byte for byte) into --dest, so a pod on a cold node still starts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Engine, err = eng.EngineOptions(); err != nil {
				return err
			}
			if o.Source, err = prepareSource(cmd); err != nil {
				return err
			}
			o.Sources = srcOpts
			o.Sources.Connections = eng.Connections()
			switch o.Source.Kind {
			case sources.S3:
				// --s3-endpoint and --s3-path-style carry the configuration's s3 settings.
				o.Sources.PathStyle = config.S3{Endpoint: o.Sources.Endpoint, PathStyle: o.Sources.PathStyle}.UsePathStyle()
			case sources.HuggingFace:
				o.Sources.Endpoint = hfEndpoint
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
	f.String("s3-bucket", "", "S3 bucket of the model's source, for a node without the cache")
	f.String("s3-prefix", "", "S3 key prefix of the model, byte for byte")
	f.String("region", "", "S3 region of the source")
	f.StringVar(&srcOpts.Endpoint, "s3-endpoint", "", "S3 endpoint of an S3-compatible store (default: AWS)")
	f.BoolVar(&srcOpts.PathStyle, "s3-path-style", false, "address S3 buckets in the path")
	f.String("hf-repo", "", "Hugging Face repository (org/name) of the model ($HF_TOKEN is the token)")
	f.String("hf-revision", "", "Hugging Face commit of the model")
	f.StringVar(&hfEndpoint, "hf-endpoint", "", "Hugging Face Hub endpoint (a mirror)")
	f.String("source-dir", "", "a mounted directory (FSx for Lustre) holding the model")
	f.String("content-revision", "", "the only content revision of an S3 or directory source to download (the one the nodes' caches hold); another fails")
	eng.Register(cmd)
	_ = cmd.MarkFlagRequired("dest")
	cmd.MarkFlagsMutuallyExclusive("s3-bucket", "hf-repo", "source-dir")
	return cmd
}

// prepareSource returns the source prepare's typed flags name; Kind is empty when they name none.
func prepareSource(cmd *cobra.Command) (sources.Spec, error) {
	f := cmd.Flags()
	get := func(name string) string { v, _ := f.GetString(name); return v }
	s := sources.Spec{
		Bucket: get("s3-bucket"), Prefix: get("s3-prefix"), Region: get("region"),
		Repo: get("hf-repo"), Revision: get("hf-revision"), Path: get("source-dir"),
	}
	content := get("content-revision")
	switch {
	case s.Bucket != "":
		s.Kind, s.Revision = sources.S3, content
	case s.Repo != "":
		s.Kind = sources.HuggingFace
	case s.Path != "":
		s.Kind, s.Revision = sources.Dir, content
	case s.Prefix != "" || s.Revision != "":
		return s, fmt.Errorf("--s3-prefix needs --s3-bucket, and --hf-revision needs --hf-repo")
	default:
		return s, nil
	}
	return s, s.Validate()
}

func addHealthChecks(mgr ctrl.Manager, addr string, ready map[string]healthz.Checker) error {
	if addr == "0" || addr == "" {
		return nil
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	for name, c := range ready {
		if err := mgr.AddReadyzCheck(name, c); err != nil {
			return err
		}
	}
	return nil
}

// load reads the operator configuration and takes the agent's settings from it and the flags.
func (af *agentFlags) load(cmd *cobra.Command) error {
	var err error
	if af.opts.Config, err = config.Load(af.configFile); err != nil {
		return err
	}
	return settings(cmd, &af.opts, &af.eng, af.reserve, af.verifyRate)
}

// settings takes the agent's settings from the operator configuration, unless a flag overrides
// them.
func settings(cmd *cobra.Command, opts *agent.Options, eng *cli.EngineFlags, reserve, verifyRate string) error {
	var err error
	ac, flags := opts.Config.Agent, cmd.Flags()
	opts.Reserve, opts.VerifyRate = ac.ReserveBytes(), ac.VerifyRateBytes()
	if flags.Changed("reserve") {
		if opts.Reserve, err = cli.ParseBytes(reserve); err != nil {
			return fmt.Errorf("--reserve: %w", err)
		}
	}
	if flags.Changed("verify-rate") {
		if opts.VerifyRate, err = cli.ParseBytes(verifyRate); err != nil {
			return fmt.Errorf("--verify-rate: %w", err)
		}
	}
	// The durations and counts left at zero take the configuration's values (Options.Defaults).
	eng.Prefer(cmd, ac.Concurrency, ac.PartSizeBytes())
	opts.Engine, err = eng.EngineOptions()
	return err
}

// setupPeers makes the agent's peer server (run by mgr) and what its downloads share parts
// with; nil when sharing is off.
func setupPeers(mgr ctrl.Manager, opts *agent.Options, pf peerFlags) (*agent.Peers, error) {
	pc := opts.Config.Peers
	if pc.Disabled || pf.bind == "0" {
		return nil, nil
	}
	if pf.bind == "" {
		pf.bind = ":" + strconv.Itoa(pc.Port)
	}
	// Listening now tells the port a bind address with port 0 got, and holds it.
	ln, err := net.Listen("tcp", pf.bind)
	if err != nil {
		return nil, fmt.Errorf("listening for peers on %s: %w", pf.bind, err)
	}
	if pf.address == "" {
		bound := ln.Addr().(*net.TCPAddr)
		ip := os.Getenv("POD_IP")
		if !bound.IP.IsUnspecified() {
			ip = bound.IP.String()
		}
		if ip == "" {
			ln.Close()
			return nil, errors.New("peer sharing needs --peer-address, $POD_IP or an IP in --peer-bind-address (or peers.disabled, or --peer-bind-address=0)")
		}
		pf.address = net.JoinHostPort(ip, strconv.Itoa(bound.Port))
	}
	if pf.serviceAccount == "" {
		ns, sa := os.Getenv("POD_NAMESPACE"), os.Getenv("SERVICE_ACCOUNT")
		if ns == "" || sa == "" {
			return nil, errors.New("peer sharing needs --peer-service-account or $POD_NAMESPACE and $SERVICE_ACCOUNT")
		}
		pf.serviceAccount = "system:serviceaccount:" + ns + ":" + sa
	}
	reviewer := &tokenreview.Reviewer{Client: mgr.GetClient(), Audience: pc.Audience, ServiceAccount: pf.serviceAccount}
	targets := &agent.TargetCheck{Reader: mgr.GetAPIReader()}
	server := peer.NewServer(peer.ServerOptions{Authorize: reviewer.Authorize, Admit: targets.Admit, MaxPeers: pc.MaxPeers,
		BytesPerSecond: pc.UploadRateBytes(), Registerer: opts.Registerer})
	if err := mgr.Add(cli.HTTPServerOn(ln, server)); err != nil {
		return nil, err
	}
	witness, err := setupWitness(pc, pf, opts.Registerer)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return &agent.Peers{
		Witness:    witness,
		Server:     server,
		Address:    pf.address,
		Token:      agent.TokenFile(pf.tokenFile),
		Client:     &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}},
		Wait:       pc.Wait.Duration,
		Stall:      pc.Stall.Duration,
		Streams:    pc.Streams,
		TrustPeers: pc.TrustsAllNodes(),
		Metrics:    peer.NewMetrics(opts.Registerer),
	}, nil
}

// setupWitness says where the controller's witness is, or nil when the agents use none.
func setupWitness(pc config.Peers, pf peerFlags, reg prometheus.Registerer) (*cachejob.Witness, error) {
	if !pc.Witnessed() || pf.witnessURL == "" {
		return nil, nil
	}
	u, err := url.Parse(pf.witnessURL)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || strings.Trim(u.Path, "/") != "" {
		return nil, fmt.Errorf("--witness-url %q: want http(s)://host:port", pf.witnessURL)
	}
	// A witness that is gone (its node failed, the Service's endpoint not moved yet) is given
	// up on in seconds, not the system's connect timeout: the node then reads the origin itself.
	// An answer's header may wait out the 15 s long poll of the digests.
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prewarm_agent_witness_read_bytes_total",
		Help: "Bytes of S3 files without a digest of their own this agent read for its group, by path: witness (through the controller's witness: its peers take them) or origin (directly, while the witness was away or busy: its peers read them too).",
	}, []string{"path"})
	if reg != nil {
		if err := reg.Register(bytes); err != nil {
			return nil, err
		}
	}
	return &cachejob.Witness{URL: strings.TrimSuffix(pf.witnessURL, "/"), Token: agent.TokenFile(pf.witnessTokenFile), Bytes: bytes,
		Client: &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 16,
			IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: 30 * time.Second}}}, nil
}
