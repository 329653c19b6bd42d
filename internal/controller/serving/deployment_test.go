package serving

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/catalog"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

func TestGate(t *testing.T) {
	created := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	node := func(name string, state inferencev1.CacheState, reason string) inferencev1.NodeCacheStatus {
		return inferencev1.NodeCacheStatus{Name: name, CopyStatus: inferencev1.CopyStatus{State: state, Reason: reason, Message: "msg of " + name, BytesDone: 30, BytesTotal: 100}}
	}
	cache := func(gen, observed int64, target int32, nodes ...inferencev1.NodeCacheStatus) *inferencev1.ModelDataCacheConfig {
		c := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Generation: gen, CreationTimestamp: metav1.NewTime(created)}}
		c.Status = inferencev1.ModelDataCacheConfigStatus{ObservedGeneration: observed, TargetNodes: target, Nodes: nodes}
		for _, n := range nodes {
			switch {
			case n.Retained:
			case n.State == inferencev1.CacheReady:
				c.Status.ReadyNodes++
				c.Status.SettledNodes++
			case n.State == inferencev1.CacheFailed && prewarmv1alpha1.Terminal(n.Reason):
				c.Status.SettledNodes++
			}
		}
		return c
	}
	// A fleet's cache lists only some nodes (status.nodes is bounded); the counts cover all.
	fleet := cache(1, 1, 4000, node("slow-1", inferencev1.CacheDownloading, ""), node("slow-2", inferencev1.CacheDownloading, ""))
	fleet.Status.ReadyNodes, fleet.Status.SettledNodes = 3990, 3990
	tests := []struct {
		name     string
		cache    *inferencev1.ModelDataCacheConfig
		after    time.Duration
		open     bool
		reason   string
		contains string
		wait     time.Duration
	}{
		{"all ready", cache(1, 1, 2, node("a", inferencev1.CacheReady, ""), node("b", inferencev1.CacheReady, "")), time.Minute,
			true, inferencev1.ReasonGateOpen, "all 2 target nodes", 0},
		{"one cannot fit, the rest ready", cache(1, 1, 2, node("a", inferencev1.CacheReady, ""), node("b", inferencev1.CacheFailed, "InsufficientCapacity")), time.Minute,
			true, inferencev1.ReasonGateOpen, "b (InsufficientCapacity: msg of b)", 0},
		{"a fleet waits for the nodes it counts, naming those it lists", fleet, time.Minute,
			false, inferencev1.ReasonWaitingForCache, "on 10 of 4000 target nodes: slow-1 Downloading 30%, slow-2 Downloading 30% and 8 more", 29 * time.Minute},
		{"one downloading", cache(1, 1, 2, node("a", inferencev1.CacheReady, ""), node("b", inferencev1.CacheDownloading, "")), time.Minute,
			false, inferencev1.ReasonWaitingForCache, "b Downloading 30%", 29 * time.Minute},
		{"a failure waiting may fix", cache(1, 1, 2, node("a", inferencev1.CacheReady, ""), node("b", inferencev1.CacheFailed, "SourceUnreachable")), time.Minute,
			false, inferencev1.ReasonWaitingForCache, "b Failed 30%", 29 * time.Minute},
		{"timeout opens it", cache(1, 1, 2, node("a", inferencev1.CacheReady, ""), node("b", inferencev1.CacheDownloading, "")), 30 * time.Minute,
			true, inferencev1.ReasonGateTimeout, "1 of 2 target nodes ready", 0},
		{"a node not reported yet", cache(1, 1, 2, node("a", inferencev1.CacheReady, "")), time.Minute,
			false, inferencev1.ReasonWaitingForCache, "", 29 * time.Minute},
		{"status of an older generation", cache(2, 1, 1, node("a", inferencev1.CacheReady, "")), time.Minute,
			false, inferencev1.ReasonWaitingForCache, "to report its target nodes", 29 * time.Minute},
		{"no target nodes: pods may bring nodes up", cache(1, 1, 0), time.Second,
			true, inferencev1.ReasonNoTargetNodes, "no node matches", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{GateTimeout: metav1.Duration{Duration: 30 * time.Minute}}}}, Now: func() time.Time { return created.Add(tt.after) }}
			g := r.gate(tt.cache)
			if g.open != tt.open || g.reason != tt.reason || !strings.Contains(g.message, tt.contains) || g.wait != tt.wait {
				t.Errorf("gate = %+v; want open %v, reason %s, message with %q, wait %s", g, tt.open, tt.reason, tt.contains, tt.wait)
			}
		})
	}
}

func TestPodTemplate(t *testing.T) {
	r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{AgentImage: "agent:v1"}, Kind: config.Kind, CacheRoots: []config.CacheRoot{{Path: config.DefaultCacheRoot}}, S3: config.S3{Endpoint: "http://s3.local", PathStyle: true}}}}
	r.Config.Defaults()
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	iec.UID = types.UID("0000-parent")
	m := fromEndpoint(iec)
	cache := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Name: "m-cache", UID: "cafe-1"}}
	cache.Spec.HostPath = "/opt/dlami/nvme"
	cache.Spec.ModelSourceConfig = iec.Spec.ModelSourceConfig

	tmpl, err := r.podTemplate(m, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := tmpl.Spec
	// With a cache, the model volume is prewarm's CSI ephemeral volume naming this one cache;
	// nothing else is added: no init container, no host path (so the restricted and baseline
	// Pod Security levels admit the pods).
	if len(spec.InitContainers) != 0 {
		t.Errorf("init containers = %+v, want none: the node plugin serves the model", spec.InitContainers)
	}
	if len(spec.Volumes) != 1 {
		t.Fatalf("volumes = %+v, want the model volume only", spec.Volumes)
	}
	v := spec.Volumes[0]
	if v.Name != "model-weights" || v.CSI == nil || v.CSI.Driver != prewarmv1alpha1.CSIDriverName || v.CSI.ReadOnly == nil || !*v.CSI.ReadOnly ||
		v.CSI.VolumeAttributes[prewarmv1alpha1.VolumeAttributeCacheUID] != "cafe-1" || v.CSI.VolumeAttributes[prewarmv1alpha1.VolumeAttributeCacheName] != "m-cache" {
		t.Errorf("model volume = %+v, want a read-only %s volume of cache cafe-1", v, prewarmv1alpha1.CSIDriverName)
	}
	worker := spec.Containers[0]
	if !equality.Semantic.DeepEqual(worker.VolumeMounts, []corev1.VolumeMount{{Name: "model-weights", MountPath: "/opt/ml/model", ReadOnly: true}}) {
		t.Errorf("worker mounts %+v; want the model volume, read-only, at /opt/ml/model", worker.VolumeMounts)
	}
	if spec.SecurityContext != nil || worker.SecurityContext != nil {
		t.Errorf("security contexts %+v %+v in a namespace that enforces no level; want the parent's (none)", spec.SecurityContext, worker.SecurityContext)
	}
	if tmpl.Labels[controller.EndpointLabel] != "0000-parent" || tmpl.Annotations[controller.WeightsCacheAnnotation] != "m-cache" {
		t.Errorf("labels %v annotations %v", tmpl.Labels, tmpl.Annotations)
	}
	pref := spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	if len(pref) != 1 || pref[0].Weight != 100 || pref[0].Preference.MatchExpressions[0].Key != inferencev1.WeightsCacheReadyLabel("cafe-1") {
		t.Errorf("preferred affinity = %+v", pref)
	}

	// In a namespace that enforces the restricted level, the pods ask for what it requires.
	restricted := *m
	restricted.restricted = true
	tmpl, err = r.podTemplate(&restricted, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if psc, sc := tmpl.Spec.SecurityContext, tmpl.Spec.Containers[0].SecurityContext; psc == nil || !*psc.RunAsNonRoot ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || sc == nil || *sc.AllowPrivilegeEscalation ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("security contexts %+v %+v; want what the restricted level requires", psc, sc)
	}

	// Without a cache, an init container downloads the model: a key prefix is bytes, what
	// means something in a URI reaches it as is.
	hostile := *m
	hostile.source.ModelLocation = "/team/a#b?c=%41 é/"
	tmpl, err = r.podTemplate(&hostile, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	prep := tmpl.Spec.InitContainers[0]
	for _, want := range []string{"prepare", "--s3-bucket=example-bucket", "--s3-prefix=team/a#b?c=%41 é",
		"--region=us-west-2", "--s3-endpoint=http://s3.local", "--s3-path-style", "--dest=/var/lib/prewarm/model/model"} {
		if !slices.Contains(prep.Args, want) {
			t.Errorf("prepare args %v lack %s", prep.Args, want)
		}
	}
	if !slices.ContainsFunc(tmpl.Spec.Containers[0].VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.Name == "model-weights" && vm.MountPath == "/opt/ml/model" && vm.SubPath == "model" && vm.ReadOnly
	}) {
		t.Errorf("worker mounts %+v; want the downloaded model at /opt/ml/model", tmpl.Spec.Containers[0].VolumeMounts)
	}

	// FSx without a cache: the model's directory, as prewarm's CSI volume (which the node's agent
	// opens without following a link), read-only, and nothing when the file system is not
	// configured or no rule allows it. Never a hostPath: the kubelet would resolve the path on
	// the node, following any link a tenant put on the way (a directory of the rule's path
	// replaced by a link to the node's root).
	fsx := *m
	fsx.source = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceFSx, ModelLocation: "team-a/llama",
		FSxStorage: &inferencev1.FSxStorage{FileSystemID: "fs-0123456789abcdef1"}}
	if _, err := r.podTemplate(&fsx, nil, nil); reasonOf(err) != inferencev1.ReasonSourceNotAllowed || !strings.Contains(err.Error(), "fs-0123456789abcdef1 is not in prewarm's configuration") {
		t.Errorf("an FSx file system the configuration does not map: %v; want it refused (SourceNotAllowed), saying how to configure it", err)
	}
	withFSx := &Reconciler{Config: r.Config}
	withFSx.Config.FSx = []config.FSxMount{{FileSystemID: "fs-0123456789abcdef0", MountPath: "/fsx/a"}, {FileSystemID: "fs-0123456789abcdef1", MountPath: "/fsx/b"}}
	if _, err := withFSx.podTemplate(&fsx, nil, nil); reasonOf(err) != inferencev1.ReasonSourceNotAllowed || !strings.Contains(err.Error(), "for namespace ns") {
		t.Errorf("an FSx source no sourceAccess rule allows for the namespace: %v; want it refused (SourceNotAllowed)", err)
	}
	for _, rule := range []string{"", "team-a"} {
		withFSx.Config.SourceAccess = []config.SourceRule{{Namespaces: []string{"ns"}, FSx: &config.FSxRule{FileSystemID: "fs-0123456789abcdef1", Path: rule}}}
		tmpl, err = withFSx.podTemplate(&fsx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		prep = tmpl.Spec.InitContainers[0]
		want := corev1.Volume{Name: "prewarm-fsx", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
			VolumeAttributes: map[string]string{
				prewarmv1alpha1.VolumeAttributeFSxFileSystemID: "fs-0123456789abcdef1",
				prewarmv1alpha1.VolumeAttributeFSxPath:         "team-a/llama",
			},
		}}}
		i := slices.IndexFunc(tmpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "prewarm-fsx" })
		if i < 0 {
			t.Fatalf("rule %q: volumes %+v; want prewarm's CSI volume of the model's FSx directory", rule, tmpl.Spec.Volumes)
		}
		if diff := cmp.Diff(want, tmpl.Spec.Volumes[i]); diff != "" {
			t.Errorf("rule %q: the FSx volume (-want +got):\n%s", rule, diff)
		}
		for _, v := range tmpl.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("rule %q: hostPath volume %+v; the kubelet would follow links on the file system", rule, v)
			}
		}
		if !slices.ContainsFunc(prep.VolumeMounts, func(vm corev1.VolumeMount) bool {
			return vm.Name == "prewarm-fsx" && vm.MountPath == "/var/lib/prewarm/fsx" && vm.ReadOnly
		}) || !slices.Contains(prep.Args, "--source-dir=/var/lib/prewarm/fsx") {
			t.Errorf("rule %q: prepare mounts %+v args %v; want the FSx volume read-only, as the source directory", rule, prep.VolumeMounts, prep.Args)
		}
	}

	// Without a cache: the init container always downloads; no host path at all.
	tmpl, err = r.podTemplate(m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range tmpl.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("a pod without a cache mounts a host path: %+v", v)
		}
	}
	if slices.ContainsFunc(tmpl.Spec.InitContainers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--cache-dir") }) {
		t.Errorf("a pod without a cache is given a cache dir: %v", tmpl.Spec.InitContainers[0].Args)
	}
	if templateHash(&tmpl) == "" {
		t.Error("empty template hash")
	}
}

// reasonOf is the reason of the problem err is ("": err is none).
func reasonOf(err error) string {
	var p *problem
	if errors.As(err, &p) {
		return p.reason
	}
	return ""
}

// A template the parent cannot have stops it with the reason of what is wrong, not one reason for
// every error.
func TestTemplateErrorsKeepTheirReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a value no node's request holds", &controller.SpecError{Field: "modelLocation", Message: "modelSourceConfig.modelLocation is too long"}, inferencev1.ReasonInvalidSpec},
		{"a file system the configuration does not list", errors.New("FSx file system fs-1 is not in prewarm's configuration"), inferencev1.ReasonSourceNotAllowed},
	} {
		if got := reasonOf(sourceProblem(tc.err)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	// The model is mounted where prefetch looks for it; a template that breaks that is a fault
	// of prewarm's, retried, not a problem of the parent's.
	r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{AgentImage: "agent:v1"}, Kind: config.Kind, CacheRoots: []config.CacheRoot{{Path: config.DefaultCacheRoot}}}}}
	r.Config.Defaults()
	m := fromEndpoint(builders.MakeInferenceEndpointConfig("ns", "m").Obj())
	if err := r.prefetchModel(m, nil, &corev1.Container{}, &corev1.PodSpec{}); err == nil || reasonOf(err) != "" {
		t.Errorf("prefetch with no model mounted: %v; want an error that is no problem of the parent's", err)
	}
}

func TestCacheKeyChangesWithContentNotPlacement(t *testing.T) {
	base := fromEndpoint(builders.MakeInferenceEndpointConfig("ns", "m").Obj())
	moved := fromEndpoint(builders.MakeInferenceEndpointConfig("ns", "m").Location("models/other").Obj())
	rooted := fromEndpoint(builders.MakeInferenceEndpointConfig("ns", "m").HostPath("/mnt/nvme").Obj())
	placed := fromEndpoint(builders.MakeInferenceEndpointConfig("ns", "m").InstanceType("ml.p4d.24xlarge").Obj())
	if cacheKey(base) == cacheKey(moved) || cacheKey(base) == cacheKey(rooted) {
		t.Error("a new location or hostPath must give a new cache key")
	}
	if cacheKey(base) != cacheKey(placed) {
		t.Error("a placement change must keep the cache (it is updated in place)")
	}
}

// What prewarm honours of HyperPod's spec reaches the pods as HyperPod's docs describe:
// spec.kubernetes (init containers before prewarm's, volumes, service account, scheduler),
// worker.probes and workingDir, and a kubernetesVolume source mounted from spec.kubernetes.volumes.
func TestPodTemplateHonoursHyperPodFields(t *testing.T) {
	r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{AgentImage: "agent:v1"}, Kind: config.Kind, CacheRoots: []config.CacheRoot{{Path: config.DefaultCacheRoot}}}}}
	r.Config.Defaults()
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8000)}}}
	iec.Spec.Worker.Probes = &inferencev1.Probes{ReadinessProbe: probe, StartupProbe: probe}
	iec.Spec.Worker.WorkingDir = "/srv"
	tuner := corev1.Container{Name: "tune-nccl", Image: "busybox"}
	scratch := corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	iec.Spec.Kubernetes = &inferencev1.KubernetesSpec{InitContainers: []corev1.Container{tuner}, Volumes: []corev1.Volume{scratch},
		ServiceAccountName: "inference", SchedulerName: "gang"}

	tmpl, err := r.podTemplate(fromEndpoint(iec), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := tmpl.Spec
	var inits []string
	for _, c := range spec.InitContainers {
		inits = append(inits, c.Name)
	}
	if diff := cmp.Diff([]string{"tune-nccl", PrepareContainerName}, inits); diff != "" {
		t.Errorf("init containers, in order (-want +got):\n%s", diff)
	}
	if spec.ServiceAccountName != "inference" || spec.SchedulerName != "gang" {
		t.Errorf("service account %q, scheduler %q; want inference, gang", spec.ServiceAccountName, spec.SchedulerName)
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "scratch" && v.EmptyDir != nil }) {
		t.Errorf("volumes %+v lack the parent's scratch volume", spec.Volumes)
	}
	w := spec.Containers[0]
	if diff := cmp.Diff(probe, w.ReadinessProbe); diff != "" || w.LivenessProbe != nil || !equality.Semantic.DeepEqual(w.StartupProbe, probe) {
		t.Errorf("probes: readiness %+v, liveness %+v, startup %+v; want worker.probes", w.ReadinessProbe, w.LivenessProbe, w.StartupProbe)
	}
	if w.WorkingDir != "/srv" {
		t.Errorf("workingDir %q, want /srv", w.WorkingDir)
	}

	// kubernetesVolume: the worker mounts the parent's volume of the model's name at
	// modelLocation, read-only; nothing is prepared.
	pvc := corev1.Volume{Name: "model-weights", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models"}}}
	iec.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceKubernetesVolume, ModelLocation: "/llama/"}
	iec.Spec.Kubernetes = &inferencev1.KubernetesSpec{Volumes: []corev1.Volume{pvc}}
	tmpl, err = r.podTemplate(fromEndpoint(iec), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.Spec.InitContainers) != 0 {
		t.Errorf("init containers %+v for a volume source; want none", tmpl.Spec.InitContainers)
	}
	if diff := cmp.Diff([]corev1.Volume{pvc}, tmpl.Spec.Volumes); diff != "" {
		t.Errorf("volumes (-want +got):\n%s", diff)
	}
	want := []corev1.VolumeMount{{Name: "model-weights", MountPath: "/opt/ml/model", SubPath: "llama", ReadOnly: true}}
	if diff := cmp.Diff(want, tmpl.Spec.Containers[0].VolumeMounts); diff != "" {
		t.Errorf("worker mounts (-want +got):\n%s", diff)
	}
}

// Every field prewarm cannot honour, when it asks for something, is named; a block that turns
// its feature off, and the defaults the API server fills in, are not.
func TestUnsupportedFieldsAreNamed(t *testing.T) {
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	if got := fromEndpoint(iec).unsupported; len(got) != 0 {
		t.Errorf("a plain parent: unsupported %v; want none", got)
	}
	iec.Spec.ModelSourceConfig.PrefetchEnabled = ptr.To(false)                         // the default
	iec.Spec.Metrics = &inferencev1.Metrics{Enabled: ptr.To(false)}                    // off
	iec.Spec.IntelligentRoutingSpec = &inferencev1.IntelligentRoutingSpec{}            // enabled defaults to false
	iec.Spec.MaxDeployTimeInSeconds = ptr.To[int32](600)                               // honoured
	iec.Spec.Kubernetes = &inferencev1.KubernetesSpec{ServiceAccountName: "inference"} // honoured
	if got := fromEndpoint(iec).unsupported; len(got) != 0 {
		t.Errorf("fields that ask for nothing unsupported: %v; want none", got)
	}
	iec.Spec.AutoScalingSpec = &inferencev1.AutoScalingSpec{PrometheusTrigger: &inferencev1.PrometheusTrigger{Query: ptr.To("sum(rate(requests_total[1m]))")}}
	iec.Spec.LoadBalancer = &inferencev1.LoadBalancer{}
	iec.Spec.PDSpec = &inferencev1.PDSpec{}
	iec.Spec.Worker.RequestLimits = &inferencev1.RequestLimits{MaxConcurrentRequests: ptr.To[int32](8)}
	iec.Spec.EndpointName = "llama"
	iec.Spec.Metrics.Enabled = ptr.To(true)
	want := []string{"endpointName", "loadBalancer", "metrics", "pdSpec", "worker.requestLimits"} // autoScalingSpec: KEDA scales by it
	if diff := cmp.Diff(want, fromEndpoint(iec).unsupported); diff != "" {
		t.Errorf("unsupported (-want +got):\n%s", diff)
	}

	j := builders.MakeJumpStartModel("ns", "j").Obj()
	j.Spec.SageMakerEndpoint = &inferencev1.SageMakerEndpoint{Name: ptr.To("")} // the default: no endpoint
	j.Spec.Server.ExecutionRole = "arn:aws:iam::123456789012:role/x"
	if diff := cmp.Diff([]string{"server.executionRole"}, fromJumpStart(j, &catalog.Entry{}).unsupported); diff != "" {
		t.Errorf("JumpStartModel unsupported (-want +got):\n%s", diff)
	}
}

// A MIG partition replaces whole GPUs with one slice of the profile; additionalConfigs and
// environmentVariables are added to the catalog's variables, the later winning.
func TestJumpStartPartitionAndConfigs(t *testing.T) {
	j := builders.MakeJumpStartModel("ns", "j").Obj()
	j.Spec.Server.AcceleratorPartitionType = "mig-1g.10gb"
	j.Spec.Model.AdditionalConfigs = []inferencev1.NameValue{{Name: "MAX_MODEL_LEN", Value: "4096"}, {Name: "DTYPE", Value: "half"}}
	j.Spec.EnvironmentVariables = []inferencev1.NameValue{{Name: "DTYPE", Value: "bfloat16"}}
	e := &catalog.Entry{Image: "vllm", EnvironmentVariables: []corev1.EnvVar{{Name: "SM_NUM_GPUS", Value: "1"}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("16Gi")}}}
	m := fromJumpStart(j, e)
	wantLimits := corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("16Gi")}
	if !equality.Semantic.DeepEqual(wantLimits, m.worker.Resources.Limits) {
		t.Errorf("limits %v; want %v", m.worker.Resources.Limits, wantLimits)
	}
	wantEnv := []corev1.EnvVar{{Name: "SM_NUM_GPUS", Value: "1"}, {Name: "MAX_MODEL_LEN", Value: "4096"}, {Name: "DTYPE", Value: "bfloat16"}}
	if diff := cmp.Diff(wantEnv, m.worker.EnvironmentVariables); diff != "" {
		t.Errorf("environment (-want +got):\n%s", diff)
	}
	if len(e.Resources.Limits) != 2 || e.Resources.Limits["nvidia.com/gpu"] == (resource.Quantity{}) {
		t.Errorf("the catalog entry was changed: %v", e.Resources.Limits)
	}
}

// With prefetchEnabled the worker reads the model from model-weights-copy, a memory-backed
// volume sized from the model that an init container fills from the model volume; a model the
// worker's memory limit cannot hold stops the parent with a reason.
func TestPrefetchTemplate(t *testing.T) {
	r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{AgentImage: "agent:v1"}, Kind: config.Kind, CacheRoots: []config.CacheRoot{{Path: config.DefaultCacheRoot}}}}}
	r.Config.Defaults()
	iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
	iec.Spec.ModelSourceConfig.PrefetchEnabled = ptr.To(true)
	iec.Spec.Worker.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Gi")
	m := fromEndpoint(iec)
	if len(m.unsupported) != 0 {
		t.Errorf("unsupported %v: prefetchEnabled has its effect", m.unsupported)
	}
	cache := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Name: "m-cache", UID: "cafe-1"}}
	cache.Status.TotalBytes = 16 << 30
	tmpl, err := r.podTemplate(m, cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := tmpl.Spec
	var copyVol *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == PrefetchVolumeName {
			copyVol = &spec.Volumes[i]
		}
	}
	if copyVol == nil || copyVol.EmptyDir == nil || copyVol.EmptyDir.Medium != corev1.StorageMediumMemory || copyVol.EmptyDir.SizeLimit == nil ||
		copyVol.EmptyDir.SizeLimit.Value() < 16<<30 || copyVol.EmptyDir.SizeLimit.Value() > 17<<30 {
		t.Fatalf("volumes %+v: want model-weights-copy, in memory, sized from the 16 GiB model", spec.Volumes)
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != PrefetchContainerName ||
		!slices.Equal(spec.InitContainers[0].Args[:3], []string{"prefetch", "--from=" + prefetchFrom, "--to=" + prefetchTo}) {
		t.Fatalf("init containers %+v", spec.InitContainers)
	}
	mounts := spec.InitContainers[0].VolumeMounts
	if mounts[0].Name != "model-weights" || !mounts[0].ReadOnly || mounts[1].Name != PrefetchVolumeName {
		t.Errorf("prefetch mounts %+v: the model volume read-only, the copy writable", mounts)
	}
	worker := spec.Containers[0]
	if diff := cmp.Diff([]corev1.VolumeMount{{Name: PrefetchVolumeName, MountPath: "/opt/ml/model", ReadOnly: true}}, worker.VolumeMounts); diff != "" {
		t.Errorf("worker mounts (-want +got):\n%s", diff)
	}

	// A cold pod (no cache): the copy is filled from the downloaded model, subPath and all.
	tmpl, err = r.podTemplate(m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ic := tmpl.Spec.InitContainers; len(ic) != 2 || ic[0].Name != PrepareContainerName || ic[1].Name != PrefetchContainerName || ic[1].VolumeMounts[0].SubPath != modelSubPath {
		t.Errorf("cold pod init containers %+v: prepare, then prefetch from its model directory", ic)
	}

	// Too big for the worker's memory.
	iec.Spec.Worker.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("8Gi")
	_, err = r.podTemplate(fromEndpoint(iec), cache, nil)
	var p *problem
	if !errors.As(err, &p) || p.reason != inferencev1.ReasonPrefetchDoesNotFit || !strings.Contains(p.message, "17.2 GB") || !strings.Contains(p.message, "8Gi") {
		t.Errorf("a model beyond the memory limit: %v", err)
	}
}

// The memory volume of prefetchEnabled always has a sizeLimit, and the init container that fills
// it a memory request and a limit: the volume's sizeLimit (the files it writes count against its
// memory) and what the copy itself needs. The sizeLimit is the model's size and a margin; when
// the size is not known, controller.prefetchSizeLimit, or the worker's memory limit when lower.
// The init container is told the limit and what set it, for its error.
func TestPrefetchBounds(t *testing.T) {
	const gi = int64(1) << 30
	for _, tc := range []struct {
		name        string
		modelBytes  int64 // 0: not known
		cache       bool
		workerLimit string // "": none
		configLimit string // "": the default
		want        int64
		wantFrom    string
	}{
		{name: "known size", cache: true, modelBytes: 16 * gi, workerLimit: "64Gi", want: 16*gi + 16*gi/100 + 16<<20, wantFrom: "weights cache reported it, 17.2 GB"},
		{name: "cold pod", workerLimit: "128Gi", want: 64 * gi, wantFrom: "controller.prefetchSizeLimit"},
		{name: "cold pod, no worker limit", configLimit: "32Gi", want: 32 * gi, wantFrom: "controller.prefetchSizeLimit"},
		{name: "size not reported yet, worker limit lower", cache: true, workerLimit: "8Gi", want: 8 * gi, wantFrom: "worker.resources.limits.memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{Config: controller.Config{OperatorConfiguration: config.OperatorConfiguration{Controller: config.Controller{AgentImage: "agent:v1"}, Kind: config.Kind}}}
			if tc.configLimit != "" {
				r.Config.Controller.PrefetchSizeLimit = ptr.To(resource.MustParse(tc.configLimit))
			}
			r.Config.Defaults()
			iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
			iec.Spec.ModelSourceConfig.PrefetchEnabled = ptr.To(true)
			delete(iec.Spec.Worker.Resources.Limits, corev1.ResourceMemory)
			if tc.workerLimit != "" {
				iec.Spec.Worker.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(tc.workerLimit)
			}
			var cache *inferencev1.ModelDataCacheConfig
			if tc.cache {
				cache = &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Name: "m-cache", UID: "cafe-1"}}
				cache.Status.TotalBytes = tc.modelBytes
			}
			tmpl, err := r.podTemplate(fromEndpoint(iec), cache, nil)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(tmpl.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == PrefetchVolumeName })
			if i < 0 || tmpl.Spec.Volumes[i].EmptyDir == nil || tmpl.Spec.Volumes[i].EmptyDir.SizeLimit == nil {
				t.Fatalf("volume %s missing or without a sizeLimit (%d of %d volumes)", PrefetchVolumeName, i, len(tmpl.Spec.Volumes))
			}
			if got := tmpl.Spec.Volumes[i].EmptyDir.SizeLimit.Value(); got != tc.want {
				t.Errorf("sizeLimit %d; want %d", got, tc.want)
			}
			j := slices.IndexFunc(tmpl.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == PrefetchContainerName })
			if j < 0 {
				t.Fatalf("init containers %+v: no %s", tmpl.Spec.InitContainers, PrefetchContainerName)
			}
			c := tmpl.Spec.InitContainers[j]
			limit, request := c.Resources.Limits[corev1.ResourceMemory], c.Resources.Requests[corev1.ResourceMemory]
			if limit.Value() != tc.want+prefetchMemory || request.Value() != prefetchMemory {
				t.Errorf("prefetch memory limit %s, request %s; want the sizeLimit and %d bytes, and %d bytes", limit.String(), request.String(), prefetchMemory, prefetchMemory)
			}
			args := strings.Join(c.Args, " ")
			if !strings.Contains(args, "--size-limit="+resource.NewQuantity(tc.want, resource.BinarySI).String()+" ") || !strings.Contains(args, tc.wantFrom) {
				t.Errorf("prefetch args %q: want the size limit and what set it (%q)", args, tc.wantFrom)
			}
		})
	}
}

// HyperPod's CLI (hyp create hyp-custom-endpoint, templates v1_0 to v1_2) writes this
// autoScalingSpec into every endpoint it makes when no metric is given: a cloudWatchTrigger
// whose metricName, name, namespace and targetValue are empty. It asks for no autoscaling (no
// ScaledObject, no Autoscaling condition); a trigger that names a metric or a query does. No
// autoScalingSpec is ever Unsupported: KEDA scales by it.
func TestAnAutoScalingSpecWithNoMetricAsksForNothing(t *testing.T) {
	const cliTemplate = `
cloudWatchTrigger:
  metricCollectionPeriod: 300
  metricCollectionStartTime: 300
  metricName:
  metricStat: Average
  metricType: Average
  minValue: 0
  name:
  namespace:
  targetValue:
  useCachedMetrics: false
`
	for _, tc := range []struct {
		name, spec string
		asked      bool
	}{
		{"the CLI's template with no metric", cliTemplate, false},
		{"an empty metricName", "cloudWatchTrigger: {metricName: \"\", namespace: AWS/SageMaker}", false},
		{"no trigger at all", "{minReplicaCount: 1, maxReplicaCount: 4}", false},
		{"a Prometheus trigger with no query", "prometheusTrigger: {serverAddress: \"\", targetValue: 10}", false},
		{"a CloudWatch metric", "cloudWatchTrigger: {metricName: Invocations, namespace: AWS/SageMaker, targetValue: 10}", true},
		{"a CloudWatch metric in the list", "cloudWatchTriggerList: [{metricName: \"\"}, {metricName: ApproximateBacklogSize}]", true},
		{"a metric in the single trigger only, beside a list (the list takes priority)", "cloudWatchTriggerList: [{metricName: \"\"}]\ncloudWatchTrigger: {metricName: X}", false},
		{"a Prometheus query", "prometheusTrigger: {query: 'sum(rate(requests_total[1m]))', targetValue: 10}", true},
		{"a Prometheus query in the list", "prometheusTriggerList: [{query: 'avg(queue_size)'}]", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &inferencev1.AutoScalingSpec{}
			if err := yaml.UnmarshalStrict([]byte(tc.spec), s); err != nil {
				t.Fatal(err)
			}
			iec := builders.MakeInferenceEndpointConfig("ns", "m").Obj()
			iec.Spec.AutoScalingSpec = s
			m := fromEndpoint(iec)
			if got := scalingAsked(m.autoscaling); got != tc.asked {
				t.Errorf("autoScalingSpec %s: asks for autoscaling %v; want %v", tc.spec, got, tc.asked)
			}
			if slices.Contains(m.unsupported, "autoScalingSpec") {
				t.Errorf("autoScalingSpec %s: Unsupported", tc.spec)
			}
		})
	}
}
