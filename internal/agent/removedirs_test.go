package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
)

// An agent that has stopped removes the directories of its own that hold nothing, and only
// those: a root's prewarm directory that holds a cache, and the node plugin's directory whose
// scratch directory holds a copy, stay whole, as does the kubelet's plugins directory above it.
func TestRemoveEmptyDirsRemovesOnlyEmptyOnes(t *testing.T) {
	host, kubelet := t.TempDir(), t.TempDir()
	const uid = "aaaaaaaa-0000-4000-8000-000000000001"
	emptyRoot := filepath.Join(host, "/cache-a", prewarmv1alpha1.Directory)
	model := prewarmv1alpha1.ModelDir(filepath.Join(host, "/cache-b"), uid)
	plugin := filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName)
	scratch := filepath.Join(plugin, "scratch")
	for _, d := range []string{emptyRoot, model, scratch} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(nil, agent.Options{NodeName: "node-1", Config: testConfig("/cache-a", "/cache-b"), HostPrefix: host, KubeletDir: kubelet})
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool {
		_, err := os.Lstat(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}

	// A copy in the scratch directory: the node plugin's directory stays.
	copyFile := filepath.Join(scratch, uid, "config.json")
	if err := os.MkdirAll(filepath.Dir(copyFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyFile, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveEmptyDirs(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{emptyRoot: false, filepath.Join(model, "config.json"): true, copyFile: true} {
		if exists(p) != want {
			t.Errorf("%s exists: %t, want %t", p, !want, want)
		}
	}

	// The copy gone, the scratch and plugin directories go; the kubelet's plugins directory
	// stays.
	if err := os.RemoveAll(filepath.Join(scratch, uid)); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveEmptyDirs(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{plugin: false, filepath.Join(kubelet, "plugins"): true, filepath.Join(model, "config.json"): true} {
		if exists(p) != want {
			t.Errorf("%s exists: %t, want %t", p, !want, want)
		}
	}
}
