package jumpstart

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/jsfixture"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
)

var where = Where{Region: jsfixture.Region, Bucket: jsfixture.Bucket, GatedBucket: jsfixture.GatedBucket,
	Images: map[string]string{jsfixture.TGIFramework: "ghcr.io/huggingface/text-generation-inference:1.1.0"}}

// A spec in JumpStart's format, with its prepacked artifacts, its image as a regional alias of
// its instance family, its environment (numbers as JumpStart writes them, the algorithm's left
// out, the instance family's added) and its accelerators.
func TestSpecEntry(t *testing.T) {
	s, err := ParseSpecs([]byte(`{
 "model_id": "m", "version": "1.2.3",
 "hosting_artifact_key": "m/artifacts/inference/v1/", "hosting_prepacked_artifact_key": "m/artifacts/inference-prepack/v1/",
 "hosting_artifact_s3_data_type": "S3Prefix", "hosting_artifact_compression_type": "None",
 "gated_bucket": null, "hosting_eula_key": null,
 "hosting_ecr_specs": {"framework": "djl-lmi", "framework_version": "0.29.0", "py_version": "py310"},
 "inference_environment_variables": [
  {"name": "ENDPOINT_SERVER_TIMEOUT", "type": "int", "default": 3600, "scope": "container"},
  {"name": "HF_MODEL_ID", "type": "text", "default": "/opt/ml/model", "scope": "container"},
  {"name": "SAGEMAKER_MODEL_SERVER_WORKERS", "type": "int", "default": 1, "scope": "algorithm"}],
 "hosting_instance_type_variants": {
  "regional_aliases": {"us-west-2": {"img": "djl:us-west-2"}, "eu-west-1": {"img": "djl:eu-west-1"}},
  "variants": {"ml.g5": {"regional_properties": {"image_uri": "$img"}},
   "ml.g5.48xlarge": {"properties": {"environment_variables": {"OPTION_TENSOR_PARALLEL_DEGREE": 8}}}}},
 "hosting_resource_requirements": {"num_accelerators": 2, "min_memory_mb": 1024}
}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Entry(where, "ml.g5.48xlarge", true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Image != "djl:us-west-2" || e.Gated || e.Source.ModelLocation != "m/artifacts/inference-prepack/v1/" ||
		e.Source.S3Storage.BucketName != jsfixture.Bucket || e.Source.S3Storage.Region != "us-west-2" || e.Source.ModelSourceType != inferencev1.ModelSourceS3 {
		t.Errorf("entry %+v", e)
	}
	if diff := cmp.Diff([]corev1.EnvVar{{Name: "ENDPOINT_SERVER_TIMEOUT", Value: "3600"}, {Name: "HF_MODEL_ID", Value: "/opt/ml/model"},
		{Name: "OPTION_TENSOR_PARALLEL_DEGREE", Value: "8"}}, e.EnvironmentVariables); diff != "" {
		t.Errorf("environment (-want +got):\n%s", diff)
	}
	if gpus := e.Resources.Limits["nvidia.com/gpu"]; gpus.Value() != 2 {
		t.Errorf("resources %+v, want 2 GPUs", e.Resources)
	}
	// Another region's alias; an instance type with no variant has no image of the spec's, and
	// the configuration names none for djl-lmi.
	if e, err := s.Entry(Where{Region: "eu-west-1"}, "ml.g5.2xlarge", true); err != nil || e.Image != "djl:eu-west-1" {
		t.Errorf("eu-west-1: %+v %v", e, err)
	}
	_, err = s.Entry(where, "ml.p4d.24xlarge", true)
	if err == nil || !strings.Contains(err.Error(), `jumpStart.images["djl-lmi:0.29.0"]`) {
		t.Errorf("no image: %v, want the configuration key to set", err)
	}
	if e, err := s.Entry(where, "ml.p4d.24xlarge", false); err != nil || e.Image != "" {
		t.Errorf("a weights cache needs no image: %+v %v", e, err)
	}
	s.HostingPrepackedArtifactKey, s.HostingArtifactCompressionType = "", "Gzip"
	if _, err := s.Entry(where, "ml.g5.2xlarge", true); err == nil || !strings.Contains(err.Error(), "compressed") {
		t.Errorf("compressed artifacts: %v", err)
	}
}

func TestParseRefusesWhatIsNotJumpStarts(t *testing.T) {
	for _, bad := range []string{`{}`, `[{"model_id": "m"}]`, `not json`} {
		if _, err := ParseManifest([]byte(bad)); err == nil {
			t.Errorf("manifest %s accepted", bad)
		}
	}
	if _, err := ParseSpecs([]byte(`{"model_id": "m"}`)); err == nil {
		t.Error("a spec without artifacts accepted")
	}
}

// Against JumpStart's layout on a real S3 server: every published model resolves; an unknown id
// names the nearest; an unknown version lists those there are; the manifest is revalidated with
// its ETag (a 304 costs no body) and read again when it changed.
func TestResolverReadsJumpStartsBuckets(t *testing.T) {
	testutil.NeedsTestBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := s3fixture.Start(filepath.Join(t.TempDir(), "s3"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := jsfixture.Publish(ctx, srv); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", s3fixture.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3fixture.SecretKey)
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	r, err := New(ctx, Options{Where: where, Endpoint: srv.Endpoint, PathStyle: true, Refresh: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.now = func() time.Time { return now }
	for _, v := range jsfixture.Versions {
		e, err := r.Resolve(ctx, v.ModelID, v.Version, "ml.g5.8xlarge", true)
		if err != nil {
			t.Errorf("%s %s: %v", v.ModelID, v.Version, err)
			continue
		}
		if e.Source.S3Storage.BucketName != v.Bucket() || e.Source.ModelLocation != v.Prefix || e.Gated != v.Gated || e.Image == "" {
			t.Errorf("%s %s: %+v %+v", v.ModelID, v.Version, e, e.Source.S3Storage)
		}
	}
	if e, err := r.Resolve(ctx, "huggingface-llm-mistral-7b-instruct", "", "ml.g5.8xlarge", true); err != nil || e.Version != "3.20.1" {
		t.Errorf("no version: %+v %v, want the latest, 3.20.1", e, err)
	}
	if e, err := r.Resolve(ctx, "huggingface-llm-mistral-7b-instruct", "3.19.*", "ml.g5.8xlarge", true); err != nil || e.Version != "3.19.0" {
		t.Errorf("3.19.*: %+v %v", e, err)
	}
	var nf *NotFoundError
	if _, err := r.Resolve(ctx, "huggingface-llm-mistral-7b-instruct", "9.9.9", "ml.g5.8xlarge", true); !errors.As(err, &nf) ||
		!strings.Contains(err.Error(), `no version "9.9.9" of huggingface-llm-mistral-7b-instruct; it has 3.18.0, 3.19.0, 3.20.1`) {
		t.Errorf("missing version: %v", err)
	}
	if _, err := r.Resolve(ctx, "huggingface-llm-mistral-7b", "", "ml.g5.8xlarge", true); !errors.As(err, &nf) ||
		!strings.Contains(err.Error(), "did you mean huggingface-llm-mistral-7b-instruct?") {
		t.Errorf("unknown id: %v", err)
	}
	if st := r.Stats(); st.ManifestGets != 1 || st.ManifestNotModified != 0 {
		t.Errorf("within the refresh interval: %+v, want one read", st)
	}
	now = now.Add(2 * time.Minute)
	if _, err := r.Resolve(ctx, "huggingface-llm-mistral-7b-instruct", "", "ml.g5.8xlarge", true); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.ManifestGets != 1 || st.ManifestNotModified != 1 {
		t.Errorf("revalidated unchanged: %+v, want a 304", st)
	}
	// JumpStart publishes a version: the next revalidation reads it.
	next := jsfixture.Find("huggingface-llm-mistral-7b-instruct", "3.20.1")
	next.Version = "3.21.0"
	manifest, err := jsfixture.Manifest(append(append([]jsfixture.Version{}, jsfixture.Versions...), next))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.PutBytes(ctx, jsfixture.Bucket, ManifestKey, manifest); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	_, err = r.Resolve(ctx, "huggingface-llm-mistral-7b-instruct", "", "ml.g5.8xlarge", true)
	if st := r.Stats(); st.ManifestGets != 2 || err == nil || !strings.Contains(err.Error(), "specs_v3.21.0.json") {
		t.Errorf("after a change: %+v %v; want the manifest read again, naming 3.21.0 (whose spec is not published)", st, err)
	}
}
