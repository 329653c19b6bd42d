package serving

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// The checks refuse only what cannot work: the seed's and HyperPod users' own endpoint
// manifests pass them.
func TestManifestsUsersWritePassTheSpecChecks(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join("..", "..", "..", "test", "compat", "testdata", "samples", "iec-*.yaml"))
	paths = append(paths, filepath.Join("..", "..", "..", "config", "samples", "inference-endpoint-config.yaml"))
	if len(paths) < 4 {
		t.Fatalf("only %v", paths)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		iec := &inferencev1.InferenceEndpointConfig{}
		if err := yaml.Unmarshal(data, iec); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if iec.Spec.Worker.Image == "" {
			t.Fatalf("%s: read no worker image", p)
		}
		if prob := checkSpec(fromEndpoint(iec)); prob != nil {
			t.Errorf("%s: refused: %s", filepath.Base(p), prob.message)
		}
	}
}
