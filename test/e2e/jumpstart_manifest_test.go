package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	appsv1 "k8s.io/api/apps/v1"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/jsfixture"
)

// JumpStart models the catalog does not list resolve from JumpStart's own manifest and spec
// files (a local S3 holding them in JumpStart's layout and format): every model id of AWS's
// published JumpStartModel examples, a gated one from the gated bucket, the latest version when
// none is named, each cached by real agents from the version's artifacts and served with the
// spec's image and environment. A version JumpStart does not have, and a gated model without
// acceptEula, say so.
func TestJumpStartFromJumpStartsManifestEndToEnd(t *testing.T) {
	if err := jsfixture.Publish(t.Context(), s3srv); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, testutil.ClusterOptions{})
	ctx, c := e.ctx, e.c
	e.configure = func(op *config.OperatorConfiguration) {
		op.JumpStart = config.JumpStart{Region: jsfixture.Region, Images: map[string]string{jsfixture.TGIFramework: "ghcr.io/huggingface/text-generation-inference:1.1.0"}}
		// The agents read JumpStart's buckets with their own identity.
		op.SourceAccess = append(op.SourceAccess,
			config.SourceRule{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: jsfixture.Bucket}},
			config.SourceRule{Namespaces: []string{"*"}, S3: &config.S3Rule{Bucket: jsfixture.GatedBucket}})
	}
	for _, n := range []string{"g5-a", "g5-b"} {
		e.addNode(n, "ml.g5.24xlarge", s3srv.Endpoint)
	}
	e.startController(
		"--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")

	served := []struct {
		name    string
		version jsfixture.Version
		asked   string // the JumpStartModel's modelVersion
		image   string
	}{
		{"deepseek", jsfixture.Find("deepseek-llm-r1-distill-qwen-1-5b", "2.0.4"), "2.0.4", jsfixture.DJLImage},
		{"flan", jsfixture.Find("huggingface-text2text-flan-t5-xl", "1.0.0"), "1.0.0", "ghcr.io/huggingface/text-generation-inference:1.1.0"},
		{"llama", jsfixture.Find("meta-textgeneration-llama-3-1-8b-instruct", "2.1.0"), "2.1.0", jsfixture.DJLImage},
		{"mistral", jsfixture.Find("huggingface-llm-mistral-7b-instruct", "3.20.1"), "", jsfixture.DJLImage},
	}
	for _, s := range served {
		j := newJumpStart("default", s.name, s.version.ModelID, true)
		j.Spec.Model.ModelVersion = s.asked
		if err := c.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	for name, spec := range map[string]struct {
		id, version string
		eula        bool
	}{
		"mistral-missing": {"huggingface-llm-mistral-7b-instruct", "9.9.9", true},
		"llama-no-eula":   {"meta-textgeneration-llama-3-1-8b-instruct", "", false},
	} {
		j := newJumpStart("default", name, spec.id, spec.eula)
		j.Spec.Model.ModelVersion = spec.version
		if err := c.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	for _, s := range served {
		t.Run(s.version.ModelID, func(t *testing.T) {
			m := e.waitCache(s.name+"-cache", 2)
			src := m.Spec.ModelSourceConfig
			if src.S3Storage == nil || src.S3Storage.BucketName != s.version.Bucket() || src.ModelLocation != s.version.Prefix {
				t.Errorf("cache source %+v %+v, want s3://%s/%s", src, src.S3Storage, s.version.Bucket(), s.version.Prefix)
			}
			for _, n := range []string{"g5-a", "g5-b"} {
				assertTree(t, e.cacheDir(n, string(m.UID)), s.version.Files)
			}
			dep := &appsv1.Deployment{}
			e.eventually(2*time.Minute, "Deployment "+s.name, func() (bool, string) {
				err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: s.name}, dep)
				return err == nil, "not yet"
			})
			worker := dep.Spec.Template.Spec.Containers[0]
			if worker.Image != s.image {
				t.Errorf("image %s, want the spec's %s", worker.Image, s.image)
			}
			if !slices.Contains(worker.Env, corev1.EnvVar{Name: "ENDPOINT_SERVER_TIMEOUT", Value: "3600"}) ||
				slices.ContainsFunc(worker.Env, func(v corev1.EnvVar) bool { return v.Name == "SAGEMAKER_MODEL_SERVER_WORKERS" }) {
				t.Errorf("environment %v: want the spec's container variables, not its algorithm's", worker.Env)
			}
		})
	}
	for name, want := range map[string]struct{ reason, says string }{
		"mistral-missing": {inferencev1.ReasonModelVersionNotFound, "it has 3.18.0, 3.19.0, 3.20.1"},
		"llama-no-eula":   {inferencev1.ReasonEULANotAccepted, "acceptEula: true"},
	} {
		e.eventually(time.Minute, name+" says why", func() (bool, string) {
			j := e.jumpStart("default", name)
			ready := apimeta.FindStatusCondition(j.Status.Conditions, inferencev1.ConditionReady)
			if ready == nil {
				return false, "no Ready condition"
			}
			return ready.Reason == want.reason && strings.Contains(ready.Message, want.says), ready.Reason + ": " + ready.Message
		})
	}
}
