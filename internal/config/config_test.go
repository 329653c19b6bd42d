package config_test

import (
	"strings"
	"testing"

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
	if def := config.Default(); len(def.CacheRoots) != 1 || def.CacheRoots[0] != config.DefaultCacheRoot {
		t.Errorf("default roots %v", def.CacheRoots)
	}

	for _, tc := range []struct{ conf, want string }{
		{"cacheRoot: [/x]", "unknown field"},
		{"kind: Something", "want kind OperatorConfiguration"},
		{"cacheRoots: [relative]", "clean absolute path"},
		{"cacheRoots: [/]", "clean absolute path"},
		{"fsx: [{fileSystemId: vol-1, mountPath: /fsx}]", "want an FSx file system id"},
		{"fsx: [{fileSystemId: fs-1, mountPath: /fsx}, {fileSystemId: fs-1, mountPath: /fsx2}]", "listed twice"},
		{"fsx: [{fileSystemId: fs-1, mountPath: /opt/dlami/nvme/fsx}]", "overlaps the cache root"},
	} {
		if _, err := config.Parse([]byte(tc.conf)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.conf, err, tc.want)
		}
	}
}
