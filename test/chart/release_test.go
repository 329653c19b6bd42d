package chart

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/version"
)

// What a release publishes is what the chart pulls: `make push` and `make chart-push` (what the
// release workflow runs, to ghcr.io/prewarm) push images and a chart to a registry, and the
// chart pulled from there, with its default values, names exactly the images pushed — tagged with
// the VERSION file's version, never latest; with image.registry set (the air-gapped install),
// the images of that registry.
func TestReleaseIsWhatTheChartPulls(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images")
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	dest := host + "/prewarm"

	workflow, err := os.ReadFile(root + "/.github/workflows/release.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(workflow), "make release RELEASE_REGISTRY="+version.Registry) {
		t.Errorf(".github/workflows/release.yaml does not run make release to %s, the registry the chart pulls from", version.Registry)
	}
	number, err := os.ReadFile(root + "/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(number)) != version.Number {
		t.Fatalf("VERSION %q and internal/version %q differ: run make manifests", number, version.Number)
	}

	home := t.TempDir()
	make := func(target string, args ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"--no-print-directory", target}, args...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home, "DOCKER_CONFIG="+home)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s %v: %v\n%s", target, args, err, out)
		}
	}
	make("push", "REGISTRY="+dest, "IMAGES_OUT="+home+"/images") // its own: the real-node suite may push beside it
	make("chart-push", "REGISTRY="+dest, "HELM_PUSH_FLAGS=--plain-http")

	var pushed []string
	for _, repo := range []string{"controller", "agent"} {
		r, err := name.NewRepository(dest+"/"+repo, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		tags, err := remote.List(r)
		if err != nil {
			t.Fatalf("listing %s: %v", r, err)
		}
		for _, tag := range tags {
			pushed = append(pushed, r.String()+":"+tag)
		}
	}
	want := []string{dest + "/agent:" + version.Tag, dest + "/controller:" + version.Tag}
	slices.Sort(pushed)
	if !slices.Equal(pushed, want) {
		t.Fatalf("make push pushed %v; want %v", pushed, want)
	}

	chart := "oci://" + dest + "/charts/prewarm"
	fromRelease := func(args ...string) []string {
		out := runHelm(t, append([]string{"template", "prewarm", chart, "--version", version.Number, "--plain-http",
			"--namespace", namespace, "--kube-version", kubeVersion}, args...)...)
		return prewarmImages(t, decode(t, out))
	}
	// The defaults: the release registry's images, which the release pushed there.
	for _, ref := range fromRelease() {
		if strings.HasSuffix(ref, ":latest") || !strings.HasPrefix(ref, version.Registry+"/") {
			t.Errorf("the chart pulls %s by default; want %s/...:%s", ref, version.Registry, version.Tag)
			continue
		}
		if mirrored := dest + strings.TrimPrefix(ref, version.Registry); !slices.Contains(pushed, mirrored) {
			t.Errorf("the chart pulls %s by default, which a release does not publish (it publishes %v, at %s)", ref, pushed, version.Registry)
		}
	}
	// The air-gapped install: one value, and every image is one the push put there.
	airGapped := fromRelease("--set", "image.registry="+dest)
	if len(airGapped) == 0 {
		t.Fatal("the chart names no image of prewarm's")
	}
	for _, ref := range airGapped {
		if !slices.Contains(pushed, ref) {
			t.Errorf("with image.registry=%s the chart pulls %s; the push put %v there", dest, ref, pushed)
		}
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Head(r); err != nil {
			t.Errorf("%s: %v", ref, err)
		}
	}
}

// prewarmImages are the images of prewarm's own that objects name: their containers' images,
// and the agent image of the operator configuration.
func prewarmImages(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	re := regexp.MustCompile(`(?m)^\s*(?:image|agentImage): *"?(\S+/(?:controller|agent):[^"\s]+)"?\s*$`)
	for _, u := range objs {
		text, err := yamlOf(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}
	slices.Sort(out)
	return out
}

func yamlOf(u *unstructured.Unstructured) (string, error) {
	b, err := yaml.Marshal(u.Object)
	return string(b), err
}
