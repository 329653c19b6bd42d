// Package catalog maps JumpStart model ids to what prewarm needs to serve them: a concrete source,
// the default inference image and its arguments. The catalog is a ConfigMap in the operator
// namespace (config/catalog holds the default), so a cluster admin can add models or point
// them at a mirror without a new release.
package catalog

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// Key is the ConfigMap key that holds the catalog.
const Key = "catalog.yaml"

// DefaultConfigMap is the catalog ConfigMap's name.
const DefaultConfigMap = "prewarm-jumpstart-catalog"

// DefaultHub is the hub a JumpStartModel names when it names none.
const DefaultHub = "SageMakerPublicHub"

// Entry is one model version in the catalog.
type Entry struct {
	// ModelID is the JumpStart model id.
	ModelID string `json:"modelId"`
	// Version is the model's semantic version.
	Version string `json:"version"`
	// ModelHubName is the hub; empty means SageMakerPublicHub.
	ModelHubName string `json:"modelHubName,omitempty"`
	// Gated models need acceptEula: true.
	Gated bool `json:"gated,omitempty"`
	// Source is where the weights are: S3 or a Hugging Face repository at a pinned commit. A
	// Hugging Face tokenSecretRef names a Secret in the JumpStartModel's namespace.
	Source inferencev1.ModelSourceConfig `json:"source"`
	// Image is the default inference image.
	Image string `json:"image"`
	// Command and Args are the inference container's.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// EnvironmentVariables are the inference container's (the JumpStartModel can add more).
	EnvironmentVariables []corev1.EnvVar `json:"environmentVariables,omitempty"`
	// Port is the inference server's port; default 8080.
	Port int32 `json:"port,omitempty"`
	// MountPath is where the server reads the model; default /opt/ml/model.
	MountPath string `json:"mountPath,omitempty"`
	// Resources are the inference container's requests and limits.
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// Catalog is the list of models.
type Catalog struct {
	Models []Entry `json:"models"`
}

// ErrNotInCatalog says a model id (or version, or hub) is not in the catalog.
var ErrNotInCatalog = errors.New("not in the catalog")

// Parse reads and checks a catalog.
func Parse(data []byte) (*Catalog, error) {
	c := &Catalog{}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		return nil, fmt.Errorf("the catalog is not valid YAML of the expected shape: %w", err)
	}
	for i, e := range c.Models {
		where := fmt.Sprintf("models[%d] (%s)", i, e.ModelID)
		switch {
		case e.ModelID == "":
			return nil, fmt.Errorf("%s: modelId is empty", where)
		case e.Image == "":
			return nil, fmt.Errorf("%s: image is empty", where)
		case parseVersion(e.Version) == nil:
			return nil, fmt.Errorf("%s: version %q is not a semantic version like 1.2.3", where, e.Version)
		}
		switch e.Source.ModelSourceType {
		case inferencev1.ModelSourceS3:
			if e.Source.S3Storage == nil {
				return nil, fmt.Errorf("%s: source s3 needs s3Storage", where)
			}
		case inferencev1.ModelSourceHuggingFace:
			if e.Source.HuggingFaceModel == nil {
				return nil, fmt.Errorf("%s: source huggingface needs huggingFaceModel", where)
			}
		default:
			return nil, fmt.Errorf("%s: source type %q: want s3 or huggingface", where, e.Source.ModelSourceType)
		}
	}
	return c, nil
}

// Lookup finds a model's version as SelectVersion picks it: the newest when version is empty or
// "*", the newest with a prefix ("2.*"), or exactly that version.
func (c *Catalog) Lookup(modelID, version, hub string) (*Entry, error) {
	if hub == "" {
		hub = DefaultHub
	}
	var matching []*Entry
	var versions []string
	for i := range c.Models {
		e := &c.Models[i]
		eh := e.ModelHubName
		if eh == "" {
			eh = DefaultHub
		}
		if e.ModelID != modelID || eh != hub {
			continue
		}
		matching = append(matching, e)
		versions = append(versions, e.Version)
	}
	if len(versions) == 0 {
		return nil, fmt.Errorf("model %s (hub %s) is %w", modelID, hub, ErrNotInCatalog)
	}
	picked, err := SelectVersion(versions, version)
	if err != nil {
		SortVersions(versions)
		return nil, fmt.Errorf("model %s version %s is %w (it has %s)", modelID, version, ErrNotInCatalog, strings.Join(versions, ", "))
	}
	return matching[slices.Index(versions, picked)], nil
}

// ErrVersionNotFound says no version of a model matches the one asked for.
var ErrVersionNotFound = errors.New("no such version")

// SelectVersion picks, among available, the version want names as the SageMaker SDK does: empty
// or "*" is the latest; "2.*" or "2.1.*" the latest with that prefix; otherwise exactly that
// version (1.0 and 1.0.0 are the same).
func SelectVersion(available []string, want string) (string, error) {
	var best []int
	pick := ""
	for _, v := range available {
		parsed, ok := parseLoose(v)
		if !ok || !matches(parsed, want) {
			continue
		}
		if best == nil || slices.Compare(parsed, best) > 0 {
			best, pick = parsed, v
		}
	}
	if pick == "" {
		return "", ErrVersionNotFound
	}
	return pick, nil
}

func matches(v []int, want string) bool {
	want = strings.TrimSpace(want)
	if want == "" || want == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(want, ".*"); ok {
		p, ok := parseLoose(prefix)
		return ok && len(p) <= len(v) && slices.Equal(v[:len(p)], p)
	}
	w, ok := parseLoose(want)
	if !ok {
		return false
	}
	n := max(len(v), len(w))
	return slices.Equal(pad(v, n), pad(w, n))
}

func pad(v []int, n int) []int {
	out := slices.Clone(v)
	for len(out) < n {
		out = append(out, 0)
	}
	return out
}

func parseLoose(v string) ([]int, bool) {
	var out []int
	for _, part := range strings.Split(v, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		out = append(out, n)
	}
	return out, len(out) > 0
}

// SortVersions sorts versions semantically (2.10 after 2.9).
func SortVersions(versions []string) {
	slices.SortFunc(versions, func(a, b string) int {
		pa, _ := parseLoose(a)
		pb, _ := parseLoose(b)
		return slices.Compare(pa, pb)
	})
}

// parseVersion is a catalog entry's version, which must have exactly three parts (1.2.3).
func parseVersion(v string) []int {
	if p, ok := parseLoose(v); ok && len(p) == 3 {
		return p
	}
	return nil
}
