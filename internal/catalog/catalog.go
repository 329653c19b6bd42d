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

// Lookup finds a model: the given version, or the newest when version is empty or "*".
func (c *Catalog) Lookup(modelID, version, hub string) (*Entry, error) {
	if hub == "" {
		hub = DefaultHub
	}
	var best *Entry
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
		versions = append(versions, e.Version)
		if version != "" && version != "*" {
			if e.Version == version {
				return e, nil
			}
			continue
		}
		if best == nil || compareVersions(parseVersion(e.Version), parseVersion(best.Version)) > 0 {
			best = e
		}
	}
	switch {
	case best != nil:
		return best, nil
	case len(versions) > 0:
		slices.Sort(versions)
		return nil, fmt.Errorf("model %s version %s is %w (it has %s)", modelID, version, ErrNotInCatalog, strings.Join(versions, ", "))
	}
	return nil, fmt.Errorf("model %s (hub %s) is %w", modelID, hub, ErrNotInCatalog)
}

func parseVersion(v string) []int {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return nil
	}
	out := make([]int, 3)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil
		}
		out[i] = n
	}
	return out
}

func compareVersions(a, b []int) int { return slices.Compare(a, b) }
