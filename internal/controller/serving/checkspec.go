package serving

import (
	"fmt"
	"path"
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

// ipShaped is a name formatted as an IPv4 address, which S3 refuses as a bucket name.
var ipShaped = regexp.MustCompile(`^[0-9]+(\.[0-9]+){3}$`)

// checkSpec refuses, before anything is made, what HyperPod's schema accepts but no source or
// node can serve: the problem names the field and what to write instead.
func checkSpec(m *model) *problem {
	invalid := func(format string, args ...any) *problem {
		return &problem{inferencev1.ReasonInvalidSpec, fmt.Sprintf(format, args...)}
	}
	src := m.source
	loc := src.ModelLocation
	if iec, ok := m.owner.(*inferencev1.InferenceEndpointConfig); ok && iec.Spec.InstanceType != "" && len(iec.Spec.InstanceTypes) > 0 {
		return invalid("instanceType %q and instanceTypes %q are both set, and HyperPod holds them mutually exclusive: list every type in instanceTypes and remove instanceType, or keep one type in instanceType", iec.Spec.InstanceType, iec.Spec.InstanceTypes)
	}
	if strings.Contains(loc, "://") {
		return invalid("modelSourceConfig.modelLocation %q is a URL; it is the model's place inside the source: write only the path (for s3://bucket/models/llama, bucketName bucket and modelLocation models/llama)", loc)
	}
	switch src.ModelSourceType {
	case inferencev1.ModelSourceS3:
		if s := src.S3Storage; s != nil {
			if b := s.BucketName; !bucketName.MatchString(b) || strings.Contains(b, "..") {
				return invalid("modelSourceConfig.s3Storage.bucketName %q is not an S3 bucket name: 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit (the bucket alone, no s3:// or path)", b)
			}
			if ipShaped.MatchString(s.BucketName) {
				return invalid("modelSourceConfig.s3Storage.bucketName %q is formatted as an IP address, which no S3 bucket is: write the bucket's name (an endpoint goes in the operator configuration, s3.endpoint)", s.BucketName)
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
	if p := m.worker.ModelVolumeMount.MountPath; p != "" && path.Clean("/"+p) == "/" {
		return invalid("worker.modelVolumeMount.mountPath %q would mount the model over the container's root: write another directory, e.g. %s", p, inferencev1.DefaultModelMountPath)
	}
	for i, v := range append([]corev1.Volume{{Name: mv}}, m.kubernetes.Volumes...) {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			field := "worker.modelVolumeMount.name"
			if i > 0 {
				field = fmt.Sprintf("spec.kubernetes.volumes[%d].name", i-1)
			}
			return invalid("%s %q is not a volume name Kubernetes accepts (%s): write lower-case letters, digits and '-', e.g. model-weights", field, v.Name, strings.Join(errs, "; "))
		}
	}
	if m.source.ModelSourceType != inferencev1.ModelSourceKubernetesVolume &&
		slices.ContainsFunc(m.kubernetes.Volumes, func(v corev1.Volume) bool { return v.Name == mv }) {
		return invalid("spec.kubernetes.volumes has a volume named %q, the name of the model volume prewarm adds (worker.modelVolumeMount.name): rename one of them", mv)
	}
	return nil
}
