package serving

import (
	"regexp"
	"strings"
	"testing"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/placement"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestImageCacheName(t *testing.T) {
	g5 := placement.FromParent("ml.g5.24xlarge", nil, nil, nil)
	tests := []struct {
		image string
		p     inferencev1.Placement
		want  string // a regexp
	}{
		{"vllm/vllm-openai:latest", g5, `^iic-vllm-openai-ml-g5-24xlarge-[0-9a-f]{4}$`},
		{"public.ecr.aws/deep-learning-containers/vllm:0.8.5-gpu-py312", g5, `^iic-vllm-ml-g5-24xlarge-[0-9a-f]{4}$`},
		{"registry.example:5000/team/tgi@sha256:" + strings.Repeat("a", 64), g5, `^iic-tgi-ml-g5-24xlarge-[0-9a-f]{4}$`},
		{"Registry/UPPER_case.Image:1", placement.FromParent("", []string{"ml.g5.12xlarge", "ml.g5.24xlarge"}, nil, nil), `^iic-upper-case-image-multi-[0-9a-f]{4}$`},
		{"x/" + strings.Repeat("very-long-image-name-", 20) + ":1", g5, `^iic-very-long-image-name-.*-ml-g5-24xlarge-[0-9a-f]{4}$`},
		{"busybox", inferencev1.Placement{}, `^iic-busybox-any-[0-9a-f]{4}$`},
	}
	for _, tt := range tests {
		got := ImageCacheName(tt.image, tt.p)
		if !regexp.MustCompile(tt.want).MatchString(got) || len(got) > 63 || !dnsLabel.MatchString(got) {
			t.Errorf("ImageCacheName(%q) = %q (%d chars), want %s and a DNS label", tt.image, got, len(got), tt.want)
		}
	}
	// Same image, same placement: one name. Another placement or tag: another name.
	a := ImageCacheName("vllm/vllm-openai:latest", g5)
	if a != ImageCacheName("vllm/vllm-openai:latest", placement.FromParent("ml.g5.24xlarge", nil, nil, nil)) {
		t.Error("the name is not stable")
	}
	if a == ImageCacheName("vllm/vllm-openai:v0.6.3", g5) || a == ImageCacheName("vllm/vllm-openai:latest", placement.FromParent("ml.g5.48xlarge", nil, nil, nil)) {
		t.Error("different images or placements share a name")
	}
}
