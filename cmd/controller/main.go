// Command controller is prewarm's operator: it reconciles InferenceEndpointConfigs and their
// weights caches, asks each node's agent for the caches it should hold, labels the nodes that
// hold them, and creates the Deployments that serve the models.
package main

import (
	// Root certificates for images without a system store (the images are built FROM scratch);
	// the system's are used where there are some.
	_ "golang.org/x/crypto/x509roots/fallback"

	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/catalog"
	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/controller/gateway"
	"github.com/prewarm/prewarm/internal/controller/hub"
	"github.com/prewarm/prewarm/internal/controller/imagecache"
	"github.com/prewarm/prewarm/internal/controller/preflight"
	"github.com/prewarm/prewarm/internal/controller/registration"
	"github.com/prewarm/prewarm/internal/controller/serving"
	"github.com/prewarm/prewarm/internal/controller/weightscache"
	"github.com/prewarm/prewarm/internal/controller/witness"
	"github.com/prewarm/prewarm/internal/jumpstart"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/internal/tokenreview"
	enginewitness "github.com/prewarm/prewarm/pkg/engine/witness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// options are the controller's flags.
type options struct {
	cfg controller.Config
	// gateTimeout, retention and agentImage override the configuration's.
	gateTimeout   time.Duration
	retention     time.Duration
	agentImage    string
	configFile    string
	kubeconfig    string
	metricsAddr   string
	probeAddr     string
	leaderElect   bool
	leaderElectNS string
	verbosity     int
	showVersion   bool
	catalogName   string
	witnessAddr   string
	agentSA       string
	// operatorNamespace overrides the configuration's.
	operatorNamespace string
}

func parseFlags(args []string) (*options, error) {
	var o options
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	fs.StringVar(&o.configFile, "config", "", "the operator configuration shared with the agents (cache roots, S3, Hugging Face, FSx mounts); empty: the defaults")
	fs.DurationVar(&o.gateTimeout, "gate-timeout", 0, fmt.Sprintf("overrides controller.gateTimeout (%s): longest a Deployment waits for its weights cache to settle", cli.Duration(config.DefaultGateTimeout)))
	fs.DurationVar(&o.retention, "retention", 0, fmt.Sprintf("overrides controller.retention (%s): how long a cordoned, tainted or unreachable node keeps a cache its placement still selects", cli.Duration(config.DefaultRetention)))
	fs.StringVar(&o.agentImage, "agent-image", "", "overrides controller.agentImage: image of the agent (the inference pods' init container)")
	fs.StringVar(&o.operatorNamespace, "operator-namespace", "", "overrides operatorNamespace ("+config.DefaultOperatorNamespace+"): namespace of prewarm's shared objects")
	fs.StringVar(&o.catalogName, "catalog-configmap", catalog.DefaultConfigMap, "ConfigMap, in the operator namespace, holding the JumpStart model catalog")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 turns it off)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints (0 turns it off)")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader, so that only one replica reconciles at a time")
	fs.StringVar(&o.leaderElectNS, "leader-election-namespace", "", "namespace of the leader election Lease (default: the operator namespace, where prewarm's Role grants it)")
	fs.StringVar(&o.witnessAddr, "witness-bind-address", "", "serve the agents' witness at this address (the chart sets :<peers.witness.port>; empty: none; peers.witness.disabled turns it off too)")
	fs.StringVar(&o.agentSA, "agent-service-account", "prewarm-agent", "the agents' service account, in the operator namespace: the witness serves only its tokens")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &o, nil
}

func run() error {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		return err
	}
	if o.showVersion {
		fmt.Println(cli.Version())
		return nil
	}
	op, err := config.Load(o.configFile)
	if err != nil {
		return err
	}
	if o.gateTimeout > 0 {
		op.Controller.GateTimeout = metav1.Duration{Duration: o.gateTimeout}
	}
	if o.retention > 0 {
		op.Controller.Retention = metav1.Duration{Duration: o.retention}
	}
	if o.agentImage != "" {
		op.Controller.AgentImage = o.agentImage
	}
	if o.operatorNamespace != "" {
		op.OperatorNamespace = o.operatorNamespace
	}
	o.cfg.OperatorConfiguration = op
	o.cfg.Defaults()

	log := cli.SetupLogging(o.verbosity)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mgr, err := newManager(o)
	if err != nil {
		return err
	}
	if err := checkCluster(ctx, mgr, o); err != nil {
		return err
	}
	if err := setupReconcilers(ctx, mgr, o); err != nil {
		return err
	}
	log.Info("controller starting", "version", cli.Version(), "allowedRoots", o.cfg.Roots(), "gateTimeout", o.cfg.GateTimeout().String())
	return mgr.Start(ctx)
}

func newManager(o *options) (ctrl.Manager, error) {
	cfg := o.cfg
	imageCachePods, err := labels.Parse(controller.ImageCacheLabel)
	if err != nil {
		return nil, err
	}
	agentLeases := labels.SelectorFromSet(labels.Set{prewarmv1alpha1.AgentLeaseLabel: "true"})
	restCfg, err := cli.RestConfig(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	restCfg.QPS, restCfg.Burst = cfg.Controller.ClientQPS, cfg.Controller.ClientBurst
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:     scheme.New(),
		Controller: ctrlconfig.Controller{MaxConcurrentReconciles: cfg.Controller.ConcurrentReconciles},
		// The kinds prewarm's Role grants only in the operator namespace are watched only there
		// (a cluster-wide watch would be forbidden).
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only its own image cache pods, not every pod of the cluster.
			&corev1.Pod{}: {
				Namespaces: map[string]cache.Config{cfg.OperatorNamespace: {}},
				Label:      imageCachePods,
			},
			// ConfigMaps and Secrets: the catalog, prewarm's copies.
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{cfg.OperatorNamespace: {}}},
			&corev1.Secret{}:    {Namespaces: map[string]cache.Config{cfg.OperatorNamespace: {}}},
			// DaemonSets: the image caches' pullers.
			&appsv1.DaemonSet{}: {Namespaces: map[string]cache.Config{cfg.OperatorNamespace: {}}},
			// Leases: only the agents' (controller.Liveness), not the cluster's node leases.
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{cfg.OperatorNamespace: {}}, Label: agentLeases},
		}},
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        controller.LeaderElectionID,
		LeaderElectionNamespace: cmp.Or(o.leaderElectNS, cfg.OperatorNamespace),
		// Leaving the Lease on shutdown lets a new replica take over at once.
		LeaderElectionReleaseOnCancel: true,
		Logger:                        ctrl.Log,
	})
	if err != nil {
		return nil, err
	}
	if o.probeAddr != "0" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// checkCluster settles, before the reconcilers start, what depends on the cluster: that the API
// prewarm serves is its own (not the HyperPod inference operator's), and how the API server
// admits pods (placement.extendedResourceTolerations auto).
func checkCluster(ctx context.Context, mgr ctrl.Manager, o *options) error {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	if err := preflight.CheckAPIOwnership(ctx, c); err != nil {
		return err
	}
	log := ctrl.Log.WithName("preflight")
	decided, err := preflight.ResolveExtendedResourceTolerations(ctx, c, &o.cfg)
	if err != nil {
		log.Error(err, "could not tell how the API server admits pods")
	}
	log.Info("extended resource tolerations", "placement.extendedResourceTolerations", decided)
	return nil
}

func setupReconcilers(ctx context.Context, mgr ctrl.Manager, o *options) error {
	cfg := o.cfg
	recorder := mgr.GetEventRecorder("prewarm-controller")
	metrics := controller.NewMetrics(ctrlmetrics.Registry)
	hubChecker := &hub.Checker{Endpoint: cfg.HuggingFace.Endpoint}
	// Users' Secrets and service accounts are read as needed, each at most every 30 s.
	userObjects := controller.NewRecentReader(mgr.GetAPIReader(), 30*time.Second)
	// The reconcilers read nodes and NodeCaches through these indexes.
	if err := controller.RegisterIndexes(ctx, mgr, append(weightscache.Indexes, controller.NodeIndexes...)...); err != nil {
		return err
	}
	// Every cache's ready labels of a node go in one patch, weights and image caches alike.
	labels := &controller.Labeller{}
	// Every cache's requests of a node go in one write of its NodeCache.
	requests := &weightscache.Requests{Client: mgr.GetClient()}
	if err := mgr.Add(requests); err != nil {
		return err
	}
	caches := &weightscache.Reconciler{Client: mgr.GetClient(), APIReader: userObjects, Config: cfg, Recorder: recorder, Metrics: metrics, Labels: labels,
		Requests: requests, Sizer: weightscache.SourceSizer{Config: cfg.OperatorConfiguration}}
	if err := caches.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := setupWitness(mgr, o, caches); err != nil {
		return err
	}
	if err := (&weightscache.OrphanCollector{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Requests: requests}).SetupWithManager(mgr); err != nil {
		return err
	}
	parents := &serving.Reconciler{Client: mgr.GetClient(), APIReader: userObjects, Live: mgr.GetAPIReader(), Config: cfg, Hub: hubChecker, Recorder: recorder, Metrics: metrics}
	if js := cfg.JumpStart; js.Region != "" {
		s3 := config.S3{Endpoint: cmp.Or(js.Endpoint, cfg.S3.Endpoint), PathStyle: cfg.S3.PathStyle}
		resolver, err := jumpstart.New(ctx, jumpstart.Options{
			Where:    jumpstart.Where{Region: js.Region, Bucket: js.Bucket, GatedBucket: js.GatedBucket, Images: js.Images},
			Endpoint: s3.Endpoint, PathStyle: s3.UsePathStyle(), Refresh: js.Refresh.Duration,
		})
		if err != nil {
			return err
		}
		parents.JumpStart = resolver
	}
	if err := parents.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&serving.JumpStartReconciler{Reconciler: parents, CatalogName: o.catalogName}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&serving.ModelWeightsCacheConfigReconciler{Reconciler: parents, CatalogName: o.catalogName}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&serving.ModelImageCacheReconciler{Reconciler: parents}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&registration.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&gateway.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&imagecache.Reconciler{Client: mgr.GetClient(), Config: cfg, Metrics: metrics, Labels: labels}).SetupWithManager(mgr)
}

// setupWitness serves the agents' witness (internal/controller/witness), unless it is off.
func setupWitness(mgr ctrl.Manager, o *options, caches *weightscache.Reconciler) error {
	w := o.cfg.Peers.Witness
	addr := o.witnessAddr
	if !o.cfg.Peers.Witnessed() || addr == "" || addr == "0" {
		return nil
	}
	reviewer := &tokenreview.Reviewer{Client: mgr.GetClient(), Audience: w.Audience,
		ServiceAccount: "system:serviceaccount:" + o.cfg.OperatorNamespace + ":" + o.agentSA}
	served := &enginewitness.Server{Open: witness.Open(reviewer, caches.WitnessSource)}
	if err := ctrlmetrics.Registry.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "prewarm_witness_source_bytes_total",
		Help: "Bytes the witness read from sources for the agents (the parts of S3 files without a SHA-256).",
	}, func() float64 { return float64(served.BytesRead()) })); err != nil {
		return err
	}
	// Every replica serves (the Service's endpoint may lag a change of leader); listening now
	// tells the port the leader publishes.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serving the witness: %w", err)
	}
	if err := mgr.Add(cli.HTTPServerOn(ln, served)); err != nil {
		return err
	}
	podIP := os.Getenv("POD_IP")
	if podIP == "" {
		ctrl.Log.WithName("witness").Info("POD_IP is not set: this replica serves the witness but does not publish itself as the prewarm-witness Service's endpoint")
		return nil
	}
	return mgr.Add(&witness.Publisher{Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Namespace: o.cfg.OperatorNamespace,
		PodIP: podIP, Port: ln.Addr().(*net.TCPAddr).Port})
}
