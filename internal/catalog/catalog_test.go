package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const sample = `
models:
- modelId: m
  version: 1.2.0
  image: img:1
  source: {modelSourceType: s3, s3Storage: {bucketName: b, region: us-west-2}, modelLocation: m/1.2.0}
- modelId: m
  version: 1.10.0
  gated: true
  image: img:2
  source: {modelSourceType: huggingface, huggingFaceModel: {modelId: org/m, commitSHA: 0123456789abcdef0123456789abcdef01234567}}
- modelId: m
  version: 9.0.0
  modelHubName: PrivateHub
  image: img:9
  source: {modelSourceType: s3, s3Storage: {bucketName: b, region: us-west-2}, modelLocation: private}
`

func TestLookup(t *testing.T) {
	c, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id, version, hub string
		image            string
		err              string
	}{
		{"m", "", "", "img:2", ""}, // newest by semantic order, not string order
		{"m", "*", "SageMakerPublicHub", "img:2", ""},
		{"m", "1.2.0", "", "img:1", ""},
		{"m", "", "PrivateHub", "img:9", ""},
		{"m", "3.0.0", "", "", "model m version 3.0.0 is not in the catalog (it has 1.2.0, 1.10.0)"},
		{"other", "", "", "", "model other (hub SageMakerPublicHub) is not in the catalog"},
	}
	for _, tt := range tests {
		e, err := c.Lookup(tt.id, tt.version, tt.hub)
		switch {
		case tt.err != "":
			if err == nil || err.Error() != tt.err || !errors.Is(err, ErrNotInCatalog) {
				t.Errorf("Lookup(%s, %s, %s) error = %v, want %q", tt.id, tt.version, tt.hub, err, tt.err)
			}
		case err != nil || e.Image != tt.image:
			t.Errorf("Lookup(%s, %s, %s) = %+v, %v; want image %s", tt.id, tt.version, tt.hub, e, err, tt.image)
		}
	}
}

func TestParseRefusesBadEntries(t *testing.T) {
	for _, bad := range []string{
		"models: [{modelId: m, version: 1.0.0, source: {modelSourceType: s3, s3Storage: {bucketName: b, region: r}}}]", // no image
		"models: [{modelId: m, version: 1.0, image: i, source: {modelSourceType: s3, s3Storage: {bucketName: b, region: r}}}]",
		"models: [{modelId: m, version: 1.0.0, image: i, source: {modelSourceType: fsx}}]",
		"models: [{modelId: m, version: 1.0.0, image: i, source: {modelSourceType: s3}}]",
		"models: [{modelId: m, version: 1.0.0, image: i, typo: 1, source: {modelSourceType: s3, s3Storage: {bucketName: b, region: r}}}]",
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse accepted %s", bad)
		}
	}
}

// The shipped default catalog parses and holds the seed's model.
func TestDefaultCatalog(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "catalog", "catalog.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.UnmarshalStrict(data, cm); err != nil {
		t.Fatal(err)
	}
	if cm.Name != DefaultConfigMap || cm.Namespace != "hyperpod-inference-system" {
		t.Errorf("ConfigMap %s/%s", cm.Namespace, cm.Name)
	}
	c, err := Parse([]byte(cm.Data[Key]))
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Lookup("meta-textgeneration-llama-3-1-8b-instruct", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if !e.Gated || !strings.Contains(e.Image, "vllm") {
		t.Errorf("seed model entry %+v, want gated with a vLLM image", e)
	}
}

func TestSelectVersionAsTheSDKDoes(t *testing.T) {
	available := []string{"1.0.0", "2.0.4", "2.1.0", "2.10.1", "3.0"}
	for _, tc := range []struct{ want, got string }{
		{"", "3.0"},
		{"*", "3.0"},
		{"2.*", "2.10.1"}, // semantic, not lexical: 2.10 > 2.1
		{"2.1.*", "2.1.0"},
		{"2.0.4", "2.0.4"},
		{"3.0.0", "3.0"}, // 3.0 and 3.0.0 are one version
		{"1", "1.0.0"},
		{"4.*", ""},
		{"2.0.5", ""},
		{"latest", ""},
	} {
		got, err := SelectVersion(available, tc.want)
		if tc.got == "" {
			if !errors.Is(err, ErrVersionNotFound) {
				t.Errorf("%q: %q %v, want no version", tc.want, got, err)
			}
			continue
		}
		if err != nil || got != tc.got {
			t.Errorf("%q: %q %v, want %q", tc.want, got, err, tc.got)
		}
	}
}
