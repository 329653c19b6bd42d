package serving

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// bucketName is S3's rule for bucket names: 3 to 63 lower-case letters, digits, dots and
// hyphens, starting and ending with a letter or digit.
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// checkSpec refuses, before anything is made, what HyperPod's schema accepts but no source or
// node can serve: the problem names the field and what to write instead.
func checkSpec(m *model) *problem {
	invalid := func(format string, args ...any) *problem {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(format, args...)}
	}
	src := m.source
	loc := src.ModelLocation
	if strings.Contains(loc, "://") {
		return invalid("modelSourceConfig.modelLocation %q is a URL; it is the model's place inside the source: write only the path (for s3://bucket/models/llama, bucketName bucket and modelLocation models/llama)", loc)
	}
	switch src.ModelSourceType {
	case inferencev1.ModelSourceS3:
		if s := src.S3Storage; s != nil {
			if b := s.BucketName; !bucketName.MatchString(b) || strings.Contains(b, "..") {
				return invalid("modelSourceConfig.s3Storage.bucketName %q is not an S3 bucket name: 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit (the bucket alone, no s3:// or path)", b)
			}
		}
		if strings.HasPrefix(loc, "/") {
			return invalid("modelSourceConfig.modelLocation %q starts with /: an S3 key prefix does not; write %q", loc, strings.TrimLeft(loc, "/"))
		}
		if slices.Contains(strings.Split(loc, "/"), "..") {
			return invalid("modelSourceConfig.modelLocation %q has a .. segment: the model's files would be written outside its cache; name the prefix as it is in the bucket", loc)
		}
	case inferencev1.ModelSourceFSx:
		if loc != "" && !filepath.IsLocal(loc) {
			return invalid("modelSourceConfig.modelLocation %q leads out of the file system (absolute, or through ..): write the model's directory relative to the file system's root", loc)
		}
	}
	if img := m.worker.Image; img != "" {
		if _, err := name.ParseReference(img); err != nil {
			return invalid("worker.image %q is not an image reference (%v): write registry/repository:tag or @sha256:digest", img, err)
		}
	}
	for _, e := range m.worker.EnvironmentVariables {
		if errs := validation.IsRelaxedEnvVarName(e.Name); len(errs) > 0 {
			return invalid("worker.environmentVariables name %q: %s", e.Name, strings.Join(errs, "; "))
		}
	}
	mv := m.worker.ModelVolumeMount.Name
	if m.source.ModelSourceType != inferencev1.ModelSourceKubernetesVolume &&
		slices.ContainsFunc(m.kubernetes.Volumes, func(v corev1.Volume) bool { return v.Name == mv }) {
		return invalid("spec.kubernetes.volumes has a volume named %q, the name of the model volume prewarm adds (worker.modelVolumeMount.name): rename one of them", mv)
	}
	return nil
}
