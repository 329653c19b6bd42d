package realnode

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/ports"
)

// KEDA's namespace and the Service its metrics adapter serves external.metrics.k8s.io behind, as
// KEDA's chart names them.
const (
	KEDANamespace     = "keda"
	kedaMetricsServer = "keda-metrics-apiserver"
)

// Autoscaling is what a cluster autoscales pods with, run beside the control plane as a
// cluster's add-ons run: KEDA (its operator, which turns ScaledObjects into HPAs, and its
// metrics adapter, the external metrics API kube-controller-manager's HPA controller reads) and
// a Prometheus server that scrapes the targets SetTargets names, which KEDA's prometheus trigger
// queries. hack/testbin.sh keda prometheus builds them.
type Autoscaling struct {
	// PrometheusURL is the Prometheus server's address, reachable from the control plane's host
	// and from pods, for a trigger's serverAddress.
	PrometheusURL string

	targets string // Prometheus's file of targets (file_sd)
}

// AutoscalingBinaries are the binaries of KEDA and Prometheus hack/testbin.sh builds, and the
// folder of KEDA's CRDs; they return an error saying how to build them when they are not there.
func AutoscalingBinaries() (operator, adapter, prometheus, crds string, err error) {
	dir, err := testutil.TestBinDir()
	if err != nil {
		return "", "", "", "", err
	}
	keda, err := testutil.TestBinPin("KEDA_VERSION")
	if err != nil {
		return "", "", "", "", err
	}
	prom, err := testutil.TestBinPin("PROMETHEUS_VERSION")
	if err != nil {
		return "", "", "", "", err
	}
	operator, adapter = filepath.Join(dir, "keda-operator-"+keda), filepath.Join(dir, "keda-adapter-"+keda)
	prometheus, crds = filepath.Join(dir, "prometheus-"+prom), filepath.Join(dir, "keda-crds-"+keda)
	for _, p := range []string{operator, adapter, prometheus, crds} {
		if _, err := os.Stat(p); err != nil {
			return "", "", "", "", fmt.Errorf("%s is not built: run make testbin", p)
		}
	}
	return operator, adapter, prometheus, crds, nil
}

// StartAutoscaling installs KEDA's CRDs, starts KEDA and Prometheus, and waits until the API
// server serves external metrics through KEDA's adapter and Prometheus answers queries. They
// stop with the cluster.
func (c *Cluster) StartAutoscaling(ctx context.Context) (*Autoscaling, error) {
	operator, adapter, prometheus, crds, err := AutoscalingBinaries()
	if err != nil {
		return nil, err
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true}); err != nil {
		return nil, fmt.Errorf("installing KEDA's CRDs: %w", err)
	}
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KEDANamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	// One certificate for KEDA's two processes, as KEDA's own rotation makes it: the operator
	// serves its gRPC metrics service with it and the adapter presents it as its client (both
	// ask for the other's), and the adapter serves the external metrics API with it.
	certs := filepath.Join(c.Dir, "keda", "certs")
	ca, err := newCA(certs, "keda-ca")
	if err != nil {
		return nil, err
	}
	if err := ca.issue("tls", kedaMetricsServer, nil, []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(HostIP)},
		[]string{kedaMetricsServer + "." + KEDANamespace + ".svc", "keda-operator." + KEDANamespace + ".svc"},
		x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	// Ports: this run's network namespace holds only the run's own processes.
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	health, grpc, secure, prom := ports[0], ports[1], ports[2], ports[3]
	env := []string{"WATCH_NAMESPACE=", "KEDA_CLUSTER_OBJECT_NAMESPACE=" + KEDANamespace, "POD_NAMESPACE=" + KEDANamespace}
	if err := c.startProcessEnv("keda-operator", operator, env,
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--metrics-bind-address=0",
		"--health-probe-bind-address="+net.JoinHostPort("127.0.0.1", strconv.Itoa(health)),
		"--metrics-service-bind-address="+net.JoinHostPort("127.0.0.1", strconv.Itoa(grpc)),
		"--cert-dir="+certs); err != nil {
		return nil, err
	}
	if err := c.startProcessEnv("keda-adapter", adapter, env,
		"--kubeconfig="+c.Kubeconfig, "--lister-kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address="+HostIP, "--secure-port="+strconv.Itoa(secure), "--port=0",
		"--cert-dir="+certs, "--tls-cert-file="+filepath.Join(certs, "tls.crt"), "--tls-private-key-file="+filepath.Join(certs, "tls.key"),
		"--metrics-service-address="+net.JoinHostPort("127.0.0.1", strconv.Itoa(grpc)),
		"--requestheader-client-ca-file="+c.pki.path("front-proxy/ca.crt"), "--requestheader-allowed-names="+FrontProxyClient,
		"--authentication-skip-lookup"); err != nil {
		return nil, err
	}
	if err := c.registerMetricsAPI(ctx, secure, ca.path("ca.crt")); err != nil {
		return nil, err
	}
	a := &Autoscaling{PrometheusURL: "http://" + net.JoinHostPort(HostIP, strconv.Itoa(prom)), targets: filepath.Join(c.Dir, "prometheus", "targets.json")}
	if err := a.startPrometheus(c, prometheus, prom); err != nil {
		return nil, err
	}
	err = testutil.Until(ctx, 3*time.Minute, func() error {
		if err := c.CheckProcesses(); err != nil {
			return err
		}
		if err := httpOK("http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(health)) + "/readyz"); err != nil {
			return fmt.Errorf("keda-operator: %w", err)
		}
		if err := httpOK(a.PrometheusURL + "/-/ready"); err != nil {
			return fmt.Errorf("prometheus: %w", err)
		}
		return c.metricsAPIAvailable(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("autoscaling not ready: %w", err)
	}
	return a, nil
}

// registerMetricsAPI makes the external metrics API's APIService, as KEDA's chart does, and the
// Service behind it: with no selector, its one endpoint the adapter on this host (no pod runs it),
// reached at that address as the API server routes to endpoints (--enable-aggregator-routing).
func (c *Cluster) registerMetricsAPI(ctx context.Context, port int, caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: KEDANamespace, Name: kedaMetricsServer},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(int32(port)), Protocol: corev1.ProtocolTCP}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: KEDANamespace, Name: kedaMetricsServer + "-host",
			Labels: map[string]string{discoveryv1.LabelServiceName: kedaMetricsServer, discoveryv1.LabelManagedBy: "prewarm-realnode"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{HostIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	api := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1.external.metrics.k8s.io"},
		"spec": map[string]any{
			"service":              map[string]any{"namespace": KEDANamespace, "name": kedaMetricsServer, "port": int64(443)},
			"group":                "external.metrics.k8s.io",
			"version":              "v1beta1",
			"caBundle":             ca,
			"groupPriorityMinimum": int64(100),
			"versionPriority":      int64(100),
		},
	}}
	for _, obj := range []client.Object{svc, slice, api} {
		if err := c.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return nil
}

// metricsAPIAvailable says why the external metrics APIService is not Available yet (nil: it is).
func (c *Cluster) metricsAPIAvailable(ctx context.Context) error {
	api := &unstructured.Unstructured{}
	api.SetAPIVersion("apiregistration.k8s.io/v1")
	api.SetKind("APIService")
	if err := c.Client.Get(ctx, client.ObjectKey{Name: "v1beta1.external.metrics.k8s.io"}, api); err != nil {
		return err
	}
	conds, _, _ := unstructured.NestedSlice(api.Object, "status", "conditions")
	for _, x := range conds {
		cond, _ := x.(map[string]any)
		if cond["type"] == "Available" {
			if cond["status"] == "True" {
				return nil
			}
			return fmt.Errorf("APIService v1beta1.external.metrics.k8s.io: %v: %v", cond["reason"], cond["message"])
		}
	}
	return errors.New("APIService v1beta1.external.metrics.k8s.io: no Available condition yet")
}

// startPrometheus starts Prometheus on port, scraping every second the targets in a.targets
// (none until SetTargets), its data under the cluster's directory.
func (a *Autoscaling) startPrometheus(c *Cluster, bin string, port int) error {
	dir := filepath.Dir(a.targets)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	if err := a.SetTargets(nil, nil); err != nil {
		return err
	}
	conf := filepath.Join(dir, "prometheus.yml")
	// YAML is a superset of JSON: the configuration is written as JSON.
	b, err := json.Marshal(map[string]any{
		"global": map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"scrape_configs": []any{map[string]any{
			"job_name":        "model-servers",
			"file_sd_configs": []any{map[string]any{"files": []string{a.targets}, "refresh_interval": "1s"}},
		}},
	})
	if err != nil {
		return err
	}
	if err := os.WriteFile(conf, b, 0o644); err != nil {
		return err
	}
	return c.startProcessEnv("prometheus", bin, nil, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+net.JoinHostPort(HostIP, strconv.Itoa(port)), "--log.level=warn")
}

// SetTargets makes Prometheus scrape exactly these host:port addresses (the model servers'
// pods), their series labelled with labels, from its next look at its file of targets (within a
// second or two).
func (a *Autoscaling) SetTargets(addrs []string, labels map[string]string) error {
	if addrs == nil {
		addrs = []string{}
	}
	b, err := json.Marshal([]any{map[string]any{"targets": addrs, "labels": labels}})
	if err != nil {
		return err
	}
	tmp := a.targets + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, a.targets)
}

// Query is the value of a Prometheus query that gives one number (the sum over the targets, say),
// and false when it gives none yet.
func (a *Autoscaling) Query(ctx context.Context, query string) (float64, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.PrometheusURL+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, false, fmt.Errorf("prometheus %q: %s: %w", query, resp.Status, err)
	}
	if out.Status != "success" {
		return 0, false, fmt.Errorf("prometheus %q: %s", query, out.Error)
	}
	if len(out.Data.Result) == 0 {
		return 0, false, nil
	}
	text, _ := out.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(text, 64)
	return v, err == nil, err
}

// freePorts returns n TCP ports free on every address at the time of the call (ports.Listen).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := ports.Listen("")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// httpOK says why url does not answer 200 (nil: it does).
func httpOK(url string) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
