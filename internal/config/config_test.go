package config_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

func TestParse(t *testing.T) {
	op, err := config.Parse([]byte(`
apiVersion: prewarm.io/v1alpha1
kind: OperatorConfiguration
cacheRoots: [/opt/dlami/nvme, /mnt/nvme]
s3: {endpoint: "http://s3.local", pathStyle: true}
fsx:
  - {fileSystemId: fs-0123456789abcdef0, mountPath: /fsx}
`))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := op.FSxMountPath("fs-0123456789abcdef0"); err != nil || m != "/fsx" {
		t.Errorf("FSxMountPath = %q, %v", m, err)
	}
	if _, err := op.FSxMountPath("fs-0123456789abcdef1"); err == nil || !strings.Contains(err.Error(), "it lists fs-0123456789abcdef0") {
		t.Errorf("an unknown file system: %v; want refused, naming the known ones", err)
	}
	if ok, why := op.CacheRootAllowed("/etc"); ok || !strings.Contains(why, "/opt/dlami/nvme, /mnt/nvme") {
		t.Errorf("CacheRootAllowed(/etc) = %v, %q", ok, why)
	}
	if def := config.Default(); len(def.CacheRoots) != 1 || def.CacheRoots[0].Path != config.DefaultCacheRoot ||
		def.Controller.GateTimeout.Duration != 30*time.Minute || def.Agent.PartSizeBytes() != 16<<20 || def.Agent.MaxParallel != 2 ||
		def.Controller.PrefetchSizeLimitBytes() != 64<<30 || def.Agent.MaxScratchBytesValue() != 100<<30 {
		t.Errorf("defaults %+v", def)
	}

	for _, tc := range []struct{ conf, want string }{
		{"cacheRoot: [/x]", "unknown field"},
		{"kind: Something", "want kind OperatorConfiguration"},
		{"cacheRoots: [relative]", "clean absolute path"},
		{"cacheRoots: [/]", "clean absolute path"},
		{"fsx: [{fileSystemId: vol-1, mountPath: /fsx}]", "want an FSx file system id"},
		{"fsx: [{fileSystemId: fs-1, mountPath: /fsx}, {fileSystemId: fs-1, mountPath: /fsx2}]", "fsx[1].fileSystemId: Duplicate value"},
		{"fsx: [{fileSystemId: fs-1, mountPath: /opt/dlami/nvme/fsx}]", "overlaps the cache root"},
		{"agent: {partSize: 1Ki}", "agent.partSize"},
		{"agent: {maxParallel: -1}", "agent.maxParallel"},
		{"controller: {gateTimeout: -5m}", "controller.gateTimeout"},
		{"controller: {gateTimeout: soon}", "controller.gateTimeout"},
		{"agent: {reserve: lots}", "agent.reserve"},
		{"agent: {maxScratchBytes: -1Gi}", "agent.maxScratchBytes"},
		{"controller: {prefetchSizeLimit: 1Mi}", "controller.prefetchSizeLimit"},
		{"operatorNamespace: Prewarm_NS", `operatorNamespace: Invalid value: "Prewarm_NS"`},
	} {
		if _, err := config.Parse([]byte(tc.conf)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.conf, err, tc.want)
		}
	}
}

func TestSourceAllowed(t *testing.T) {
	op, err := config.Parse([]byte(`
fsx: [{fileSystemId: fs-0123456789abcdef0, mountPath: /fsx}]
sourceAccess:
  - namespaces: ["*"]
    s3: {bucket: "jumpstart-cache-prod-*"}
  - namespaces: [team-a]
    s3: {bucket: team-a-models, prefix: llama/}
  - namespaces: [team-a, team-b]
    fsx: {fileSystemId: fs-0123456789abcdef0, path: shared}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, kind, bucket, prefix string
		want                     bool
	}{
		{"anyone", "s3", "jumpstart-cache-prod-us-west-2", "meta-textgeneration/x", true},
		{"anyone", "s3", "jumpstart-cache-prod", "x", false},
		{"team-a", "s3", "team-a-models", "llama", true},
		{"team-a", "s3", "team-a-models", "llama/3.1-8b", true},
		{"team-a", "s3", "team-a-models", "llama-private", false}, // a prefix ends at a path boundary
		{"team-a", "s3", "team-a-models", "mistral", false},
		{"team-b", "s3", "team-a-models", "llama", false}, // another namespace
		{"team-b", "fsx", "fs-0123456789abcdef0", "shared/llama", true},
		{"team-b", "fsx", "fs-0123456789abcdef0", "sharedx", false},
		{"team-c", "fsx", "fs-0123456789abcdef0", "shared/llama", false},
		{"team-a", "fsx", "fs-0123456789abcdef1", "shared", false},
	} {
		src := prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceS3, Bucket: tc.bucket, Prefix: tc.prefix}
		if tc.kind == "fsx" {
			src = prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: tc.bucket, Path: tc.prefix}
		}
		ok, why := op.SourceAllowed(tc.ns, src)
		if ok != tc.want || (!ok && !strings.Contains(why, "namespace "+tc.ns)) {
			t.Errorf("SourceAllowed(%s, %s, %s, %s) = %v, %q; want %v", tc.ns, tc.kind, tc.bucket, tc.prefix, ok, why, tc.want)
		}
	}
	// The directory the agents read an FSx source inside: the broadest rule's that allows it.
	wide, err := config.Parse([]byte(`
fsx: [{fileSystemId: fs-0123456789abcdef0, mountPath: /fsx}]
sourceAccess:
  - namespaces: [team-a, team-b]
    fsx: {fileSystemId: fs-0123456789abcdef0, path: /shared/}
  - namespaces: [team-a]
    fsx: {fileSystemId: fs-0123456789abcdef0, path: shared/llama}
  - namespaces: [admin]
    fsx: {fileSystemId: fs-0123456789abcdef0}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, path, dir string
		ok            bool
	}{
		{"team-a", "shared/llama/8b", "shared", true},
		{"team-b", "shared/x", "shared", true},
		{"admin", "team-a/x", "", true},
		{"team-b", "team-a/x", "", false},
	} {
		src := prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: "fs-0123456789abcdef0", Path: tc.path}
		if dir, ok := wide.FSxAllowedDir(tc.ns, src); dir != tc.dir || ok != tc.ok {
			t.Errorf("FSxAllowedDir(%s, %s) = %q, %v; want %q, %v", tc.ns, tc.path, dir, ok, tc.dir, tc.ok)
		}
	}
	for _, bad := range []string{
		"sourceAccess: [{namespaces: [], s3: {bucket: b}}]",
		"sourceAccess: [{namespaces: ['*']}]",
		"sourceAccess: [{namespaces: ['*'], s3: {bucket: 'a/b'}}]",
		"sourceAccess: [{namespaces: ['*'], s3: {bucket: '[x'}}]",
		"sourceAccess: [{namespaces: ['*'], fsx: {fileSystemId: fs-9}}]",
		"fsx: [{fileSystemId: fs-0123456789abcdef0, mountPath: /fsx}]\nsourceAccess: [{namespaces: ['*'], fsx: {fileSystemId: fs-0123456789abcdef0, path: shared/../../etc}}]",
	} {
		if _, err := config.Parse([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestSharingSettingsAreValidated(t *testing.T) {
	for _, tc := range []struct {
		conf, want string
	}{
		{"peers: {groupSize: 1}", "peers.groupSize: Invalid value: 1: want 2 to 32"},
		{"peers: {groupSize: 40}", "peers.groupSize: Invalid value: 40: want 2 to 32"},
		{"peers: {port: 70000}", "peers.port: Invalid value: 70000: want a TCP port"},
		{"peers: {wait: soon}", `peers.wait: Invalid value: "soon": want a duration`},
		{"peers: {maxPeers: -1}", "peers.maxPeers: Invalid value: -1: must not be negative"},
		{"peers: {wait: -1s}", `peers.wait: Invalid value: "-1s": want a positive duration`},
		{"s3: {budget: {maxRate: fast}}", `s3.budget.maxRate: Invalid value: "fast": want a size`},
		{"huggingFace: {budget: {maxConcurrency: -2}}", "huggingFace.budget.maxConcurrency: Invalid value: -2: must not be negative"},
	} {
		_, err := config.Parse([]byte(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.conf, err, tc.want)
		}
	}
	o, err := config.Parse([]byte("peers: {groupSize: 8, uploadRate: 500Mi}\ns3: {budget: {maxConcurrency: 32, maxRate: 1Gi}}"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Peers.GroupSize != 8 || o.Peers.UploadRateBytes() != 500<<20 || o.S3.Budget.MaxRateBytes() != 1<<30 || o.Peers.Port != 9444 || o.Peers.Wait.Duration != 30*time.Second {
		t.Errorf("parsed %+v %+v", o.Peers, o.S3.Budget)
	}
}

// Sizes and durations are typed: a zero the file sets is kept (no reserve, no verification rate
// cap, no scratch copies), one it leaves out takes the default, and a value that does not parse
// names its field.
func TestTypedValues(t *testing.T) {
	o, err := config.Parse([]byte("agent: {reserve: 0, verifyRate: 0, maxScratchBytes: 0, partSize: 32Mi, verifyInterval: 90m}\ncontroller: {gateTimeout: 45s}"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Agent.ReserveBytes() != 0 || o.Agent.VerifyRateBytes() != 0 || o.Agent.MaxScratchBytesValue() != 0 || o.Agent.PartSizeBytes() != 32<<20 ||
		o.Agent.VerifyInterval.Duration != 90*time.Minute || o.Controller.GateTimeout.Duration != 45*time.Second ||
		o.Controller.Retention.Duration != 24*time.Hour || o.Agent.ProgressInterval.Duration != 10*time.Second ||
		o.OperatorNamespace != "hyperpod-inference-system" {
		t.Errorf("parsed %+v %+v", o.Agent, o.Controller)
	}
	for conf, want := range map[string]string{
		"agent: {verifyInterval: daily}":                     `agent.verifyInterval: Invalid value: "daily"`,
		"peers: {uploadRate: 5 MB}":                          `peers.uploadRate: Invalid value: "5 MB"`,
		"cacheRoots: [{path: /a}, {path: /b, nodePath: /a}]": "cacheRoots[1]: Invalid value",
		"controller: {deletionTimeout: -1m}":                 `controller.deletionTimeout: Invalid value: "-1m0s": want a positive duration`,
	} {
		if _, err := config.Parse([]byte(conf)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", conf, err, want)
		}
	}
	// What Write writes, Parse reads back the same.
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := o.Write(file); err != nil {
		t.Fatal(err)
	}
	again, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(again, o) {
		t.Errorf("written and read back:\n%+v\nwant\n%+v", again, o)
	}
}

// A namespace's caches get the eviction priority and pin they ask for in annotations only within
// what its quota grants; what it does not grant is said. Byte limits are the first quota's
// naming the namespace, with the field that sets them.
func TestNamespaceQuotas(t *testing.T) {
	perNode, total := resource.MustParse("100Gi"), resource.MustParse("1Ti")
	o := config.Default()
	o.NamespaceQuotas = []config.NamespaceQuota{
		{Namespaces: []string{"prod"}, DefaultPriority: 10, MaxPriority: 100, AllowPin: true},
		{Namespaces: []string{"batch"}, AllowPin: true, DefaultPinned: true, MaxBytesPerNode: &perNode, MaxBytes: &total},
		{Namespaces: []string{"*"}, MaxPriority: 5},
	}
	for _, tc := range []struct {
		ns          string
		annotations map[string]string
		priority    int32
		pinned      bool
		problem     string
	}{
		{"prod", nil, 10, false, ""},
		{"prod", map[string]string{config.PriorityAnnotation: "50", config.PinnedAnnotation: "true"}, 50, true, ""},
		{"prod", map[string]string{config.PriorityAnnotation: "500"}, 100, false, "above the 100 the operator configuration grants namespace prod (namespaceQuotas[0].maxPriority)"},
		{"batch", nil, 0, true, ""},
		{"batch", map[string]string{config.PinnedAnnotation: "false"}, 0, false, ""},
		{"dev", map[string]string{config.PriorityAnnotation: "-3"}, -3, false, ""},
		{"dev", map[string]string{config.PriorityAnnotation: "9", config.PinnedAnnotation: "true"}, 5, false, "does not let namespace dev pin caches (namespaceQuotas[2].allowPin)"},
		{"dev", map[string]string{config.PriorityAnnotation: "high"}, 0, false, `"high" is not a whole number`},
		{"dev", map[string]string{config.PinnedAnnotation: "yes please"}, 0, false, "is not true or false"},
	} {
		p, pinned, problem := o.CachePolicy(tc.ns, tc.annotations)
		if p != tc.priority || pinned != tc.pinned || (tc.problem == "") != (problem == "") || !strings.Contains(problem, tc.problem) {
			t.Errorf("%s %v: priority %d pinned %v problem %q; want %d %v %q", tc.ns, tc.annotations, p, pinned, problem, tc.priority, tc.pinned, tc.problem)
		}
	}
	if l, ok := o.PerNodeLimit("batch"); !ok || l.Bytes != 100<<30 || l.Field != "namespaceQuotas[1].maxBytesPerNode" {
		t.Errorf("batch's per-node limit: %+v %v", l, ok)
	}
	if l, ok := o.ClusterLimit("batch"); !ok || l.Bytes != 1<<40 || l.Field != "namespaceQuotas[1].maxBytes" {
		t.Errorf("batch's cluster limit: %+v %v", l, ok)
	}
	if _, ok := o.PerNodeLimit("prod"); ok {
		t.Error("prod has no per-node limit")
	}
	if got := config.Default().QuotaFor("any"); got.MaxPriority != 0 || got.AllowPin || got.MaxBytes != nil {
		t.Errorf("no quota: %+v, want none", got)
	}
	bad := config.Default()
	negative := resource.MustParse("-1")
	bad.NamespaceQuotas = []config.NamespaceQuota{{DefaultPriority: 3, DefaultPinned: true, MaxBytes: &negative},
		{Namespaces: []string{"x"}, AllowPin: true, MaxCachesPerNode: ptr.To[int32](257)}}
	err := bad.Validate()
	for _, want := range []string{"namespaceQuotas[0].namespaces", "namespaceQuotas[0].defaultPriority", "namespaceQuotas[0].defaultPinned", "namespaceQuotas[0].maxBytes",
		"namespaceQuotas[1].maxBytesPerNode: Required value: allowPin needs a per-node limit", "namespaceQuotas[1].maxCachesPerNode"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a quota without namespaces, its default above its maximum, pinned without allowPin, a negative size, pins without a per-node limit, 257 slots: %v; want %s named", err, want)
		}
	}
	// A namespace's share of a node's cache slots: its quota's, else the default.
	o.NamespaceQuotas[0].MaxCachesPerNode = ptr.To[int32](8)
	if n, setting := o.CacheSlots("prod"); n != 8 || setting != "namespaceQuotas[0].maxCachesPerNode" {
		t.Errorf("prod's slots: %d (%s); want 8", n, setting)
	}
	if n, setting := o.CacheSlots("dev"); n != config.DefaultCachesPerNode || !strings.Contains(setting, "namespaceQuotas[2].maxCachesPerNode") {
		t.Errorf("dev's slots: %d (%s); want the default %d", n, setting, config.DefaultCachesPerNode)
	}
}

// Which nodes standalone caches may reach: by default every node but the control plane's, for
// every namespace; a list of the admin's replaces it, the first entry naming a namespace its
// own, and every problem in it is named by its field.
func TestStandaloneCacheNodes(t *testing.T) {
	def := config.Default()
	if g, at, ok := def.StandaloneNodes("any"); !ok || at != "standaloneCacheNodes[0]" || len(g.Tolerations) != 0 ||
		len(g.MatchExpressions) != 1 || g.MatchExpressions[0].Key != config.ControlPlaneLabel || g.MatchExpressions[0].Operator != corev1.NodeSelectorOpDoesNotExist {
		t.Errorf("default grant = %+v at %s (%v); want every node but the control plane's, no tolerations", g, at, ok)
	}
	o, err := config.Parse([]byte(`
standaloneCacheNodes:
  - namespaces: [team-b]
    nodeSelector: {pool: team-b}
    tolerations: [{key: dedicated, operator: Equal, value: team-b, effect: NoSchedule}]
  - namespaces: ["*"]
    matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: DoesNotExist}]
  - namespaces: [team-c]
    nodeSelector: {pool: team-c}
`))
	if err != nil {
		t.Fatal(err)
	}
	if g, at, ok := o.StandaloneNodes("team-b"); !ok || at != "standaloneCacheNodes[0]" || g.NodeSelector["pool"] != "team-b" || len(g.Tolerations) != 1 {
		t.Errorf("team-b's grant = %+v at %s", g, at)
	}
	if _, at, ok := o.StandaloneNodes("team-c"); !ok || at != "standaloneCacheNodes[1]" {
		t.Errorf("team-c's grant is at %s; want the first entry naming it (\"*\"), standaloneCacheNodes[1]", at)
	}
	o.StandaloneCacheNodes = o.StandaloneCacheNodes[:1]
	if _, at, ok := o.StandaloneNodes("team-a"); ok || at != "standaloneCacheNodes" {
		t.Errorf("a namespace no entry names has a grant (%s)", at)
	}
	for conf, want := range map[string]string{
		"standaloneCacheNodes: [{nodeSelector: {pool: x}}]":                                        "standaloneCacheNodes[0].namespaces: Required value",
		"standaloneCacheNodes: [{namespaces: [a], nodeSelector: {'bad key!': x}}]":                 "standaloneCacheNodes[0].nodeSelector: Invalid value: \"bad key!\"",
		"standaloneCacheNodes: [{namespaces: [a], matchExpressions: [{key: k, operator: Near}]}]":  "standaloneCacheNodes[0].matchExpressions[0]: Invalid value: \"k\"",
		"standaloneCacheNodes: [{namespaces: [a], tolerations: [{key: k, operator: Lt}]}]":         "standaloneCacheNodes[0].tolerations[0].operator: Unsupported value: \"Lt\"",
		"standaloneCacheNodes: [{namespaces: [a], tolerations: [{key: k, effect: NoScheduling}]}]": "standaloneCacheNodes[0].tolerations[0].effect: Unsupported value: \"NoScheduling\"",
		"standaloneCacheNodes: [{namespaces: [a], tolerate: [{key: k}]}]":                          "unknown field",
	} {
		if _, err := config.Parse([]byte(conf)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", conf, err, want)
		}
	}
}
