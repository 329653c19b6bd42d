package config_test

import (
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/config"
)

func TestImageCacheRegistries(t *testing.T) {
	op, err := config.Parse([]byte(`
imageCaches:
  allowedRegistries:
    - public.ecr.aws
    - "*.dkr.ecr.us-west-2.amazonaws.com"
    - docker.io/vllm
    - registry.example:5000/team-a
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		image string
		want  bool
	}{
		{"public.ecr.aws/deep-learning-containers/vllm:0.8.5-gpu-py312", true},
		{"123456789012.dkr.ecr.us-west-2.amazonaws.com/inference:1", true},
		{"dkr.ecr.us-west-2.amazonaws.com/inference:1", false},                   // the domain itself is not under it
		{"123456789012.dkr.ecr.us-west-2.amazonaws.com.evil.example/x:1", false}, // a suffix, not a substring
		{"vllm/vllm-openai:latest", true},                                        // Docker Hub, under vllm
		{"docker.io/vllm/vllm-openai:latest", true},
		{"index.docker.io/vllm/vllm-openai:latest", true},
		{"vllmx/vllm-openai:latest", false}, // a path prefix ends at a /
		{"busybox", false},                  // docker.io/library/busybox
		{"registry.example:5000/team-a/tgi@sha256:" + strings.Repeat("a", 64), true},
		{"registry.example:5000/team-b/tgi:1", false},
		{"registry.example/team-a/tgi:1", false}, // another port is another registry
		{"ghcr.io/someone/miner:latest", false},
	} {
		ok, why := op.ImageCaches.RegistryAllowed(tc.image)
		if ok != tc.want {
			t.Errorf("RegistryAllowed(%s) = %v (%s), want %v", tc.image, ok, why, tc.want)
		}
		if !ok && (!strings.Contains(why, "imageCaches.allowedRegistries") || !strings.Contains(why, tc.image)) {
			t.Errorf("RegistryAllowed(%s) says %q; want the image and the field named", tc.image, why)
		}
	}
	if _, why := op.ImageCaches.RegistryAllowed("busybox"); !strings.Contains(why, "registry docker.io/library/busybox") || !strings.Contains(why, "add docker.io") {
		t.Errorf("a Docker Hub image refused: %q; want its registry named as docker.io", why)
	}

	// No list: any registry.
	if ok, why := config.Default().ImageCaches.RegistryAllowed("ghcr.io/someone/miner:latest"); !ok {
		t.Errorf("with no allowedRegistries an image is refused: %s", why)
	}
	if got := config.Default().ImageCaches.MaxPerNamespace; got != 8 {
		t.Errorf("imageCaches.maxPerNamespace defaults to %d, want 8", got)
	}

	for _, tc := range []struct{ conf, want string }{
		{`imageCaches: {allowedRegistries: ["https://registry.example"]}`, "imageCaches.allowedRegistries[0]"},
		{`imageCaches: {allowedRegistries: ["docker.io/vllm/vllm-openai:latest"]}`, "imageCaches.allowedRegistries[0]"},
		{`imageCaches: {allowedRegistries: ["reg*.example"]}`, "imageCaches.allowedRegistries[0]"},
		{`imageCaches: {allowedRegistries: [""]}`, "imageCaches.allowedRegistries[0]"},
		{`imageCaches: {maxPerNamespace: -1}`, "imageCaches.maxPerNamespace"},
	} {
		if _, err := config.Parse([]byte(tc.conf)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", tc.conf, err, tc.want)
		}
	}
}
