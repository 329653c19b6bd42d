package config_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
)

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

// S3 is addressed with the bucket in the path when the configuration asks for it, and whenever
// an endpoint is set (an S3-compatible store); at AWS's own endpoint, by virtual-hosted names.
func TestUsePathStyle(t *testing.T) {
	for _, tc := range []struct {
		s3   config.S3
		want bool
	}{
		{config.S3{}, false},
		{config.S3{PathStyle: true}, true},
		{config.S3{Endpoint: "http://s3.local"}, true},
		{config.S3{Endpoint: "http://s3.local", PathStyle: true}, true},
	} {
		if got := tc.s3.UsePathStyle(); got != tc.want {
			t.Errorf("%+v: UsePathStyle() = %v, want %v", tc.s3, got, tc.want)
		}
	}
}
