package config

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ImageCaches bounds what the image caches do for the namespaces. Their pods run in the operator
// namespace, outside the admission policies of the namespaces whose parents ask for them: these
// are the operator's own limits on them.
type ImageCaches struct {
	// AllowedRegistries are the registries image caches may pull from (empty: any). An entry is
	// a registry host, with its port if it has one (registry.example:5000), or a pattern
	// *.suffix matching the hosts under a domain (*.dkr.ecr.us-west-2.amazonaws.com); either
	// may be followed by a repository path, which then limits the entry to the repositories
	// under it (docker.io/vllm). Docker Hub is docker.io. An image from elsewhere gets no image
	// cache: its parent says why (RegistryNotAllowed).
	AllowedRegistries []string `json:"allowedRegistries,omitempty"`
	// MaxPerNamespace is how many image caches (one per image and placement) the parents of
	// one namespace may use at once
	// ([DefaultImageCachesPerNamespace]): each one pins its image on every target node, out of
	// the reach of the kubelet's image garbage collection. A parent past it gets no image cache
	// (ImageCacheQuotaExceeded); a parent already in a cache keeps it.
	MaxPerNamespace int `json:"maxPerNamespace,omitempty"`
}

// dockerHub is Docker Hub's registry as image references resolve it.
const dockerHub = name.DefaultRegistry

// registryEntry is an allowedRegistries entry: a host or *.domain pattern, with an optional
// repository path prefix.
var registryEntry = regexp.MustCompile(`^(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._/-][a-z0-9]+)*)?$`)

func (c ImageCaches) validate() field.ErrorList {
	var errs field.ErrorList
	at := field.NewPath("imageCaches")
	for i, e := range c.AllowedRegistries {
		if !registryEntry.MatchString(e) {
			errs = append(errs, field.Invalid(at.Child("allowedRegistries").Index(i), e,
				"want a registry host in lower case, with its port if any (registry.example:5000), or *.domain, optionally followed by a repository path (docker.io/vllm); no scheme, tag or digest"))
		}
	}
	errs = append(errs, notNegative(at.Child("maxPerNamespace"), c.MaxPerNamespace)...)
	return errs
}

// RegistryAllowed says whether an image cache may pull image, and if not, why: the image's
// registry and the entries that do not allow it, naming the field.
func (c ImageCaches) RegistryAllowed(image string) (bool, string) {
	if len(c.AllowedRegistries) == 0 {
		return true, ""
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return false, fmt.Sprintf("image %q is not an image reference (%v): no registry allows it", image, err)
	}
	host, repo := strings.ToLower(ref.Context().RegistryStr()), ref.Context().RepositoryStr()
	for _, e := range c.AllowedRegistries {
		if registryMatches(e, host, repo) {
			return true, ""
		}
	}
	shown := host
	if host == dockerHub {
		shown = "docker.io"
	}
	return false, fmt.Sprintf("image %s is from registry %s, which the operator configuration does not let image caches pull from (imageCaches.allowedRegistries: %s): use an image from one of them, or ask the cluster admin to add %s",
		image, shown+"/"+repo, strings.Join(c.AllowedRegistries, ", "), shown)
}

// registryMatches reports whether entry e allows repository repo of registry host.
func registryMatches(e, host, repo string) bool {
	h, prefix, _ := strings.Cut(e, "/")
	if h == "docker.io" || h == "registry-1.docker.io" {
		h = dockerHub
	}
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		if !strings.HasSuffix(host, "."+rest) {
			return false
		}
	} else if host != h {
		return false
	}
	return prefix == "" || repo == prefix || strings.HasPrefix(repo, prefix+"/")
}
