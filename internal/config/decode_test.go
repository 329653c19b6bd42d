package config_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

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
