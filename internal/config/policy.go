package config

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Roots returns the cache roots' paths, as parents name them.
func (o OperatorConfiguration) Roots() []string {
	out := make([]string, len(o.CacheRoots))
	for i, r := range o.CacheRoots {
		out[i] = r.Path
	}
	return out
}

// Root returns the cache root parents name path.
func (o OperatorConfiguration) Root(path string) (CacheRoot, bool) {
	for _, r := range o.CacheRoots {
		if r.Path == path {
			return r, true
		}
	}
	return CacheRoot{}, false
}

// StandaloneNodes returns namespace ns's grant of nodes for its standalone caches (the first
// entry of standaloneCacheNodes naming it, or "*") and the field that holds it; ok is false
// when no entry names it.
func (o OperatorConfiguration) StandaloneNodes(ns string) (g NodeGrant, at string, ok bool) {
	for i, g := range o.StandaloneCacheNodes {
		if slices.Contains(g.Namespaces, ns) || slices.Contains(g.Namespaces, "*") {
			return g, fmt.Sprintf("standaloneCacheNodes[%d]", i), true
		}
	}
	return NodeGrant{}, "standaloneCacheNodes", false
}

// CacheSlots is how many caches of namespace ns one node may be asked for, and the setting that
// says so.
func (o OperatorConfiguration) CacheSlots(ns string) (int, string) {
	if n := o.QuotaFor(ns).MaxCachesPerNode; n != nil {
		return int(*n), o.quotaPath(ns) + ".maxCachesPerNode"
	}
	return DefaultCachesPerNode, o.quotaPath(ns) + ".maxCachesPerNode, unset: " + strconv.Itoa(DefaultCachesPerNode)
}

// QuotaFor returns the quota of namespace ns: the first that names it (or "*"), else the zero
// quota (no byte limits, priority at most 0, no pins).
func (o OperatorConfiguration) QuotaFor(ns string) NamespaceQuota {
	for _, q := range o.NamespaceQuotas {
		if slices.Contains(q.Namespaces, ns) || slices.Contains(q.Namespaces, "*") {
			return q
		}
	}
	return NamespaceQuota{}
}

// quotaPath names the quota of namespace ns in messages.
func (o OperatorConfiguration) quotaPath(ns string) string {
	for i, q := range o.NamespaceQuotas {
		if slices.Contains(q.Namespaces, ns) || slices.Contains(q.Namespaces, "*") {
			return fmt.Sprintf("namespaceQuotas[%d]", i)
		}
	}
	return "namespaceQuotas"
}

// Limit is one of a quota's byte limits, for messages: the value and the field that sets it.
type Limit struct {
	Bytes int64
	Field string
}

// PerNodeLimit is namespace ns's per-node byte limit (ok false: none).
func (o OperatorConfiguration) PerNodeLimit(ns string) (Limit, bool) {
	q := o.QuotaFor(ns).MaxBytesPerNode
	if q == nil {
		return Limit{}, false
	}
	return Limit{Bytes: q.Value(), Field: o.quotaPath(ns) + ".maxBytesPerNode"}, true
}

// ClusterLimit is namespace ns's cluster-wide byte limit (ok false: none).
func (o OperatorConfiguration) ClusterLimit(ns string) (Limit, bool) {
	q := o.QuotaFor(ns).MaxBytes
	if q == nil {
		return Limit{}, false
	}
	return Limit{Bytes: q.Value(), Field: o.quotaPath(ns) + ".maxBytes"}, true
}

// CachePolicy is the priority and pin of a cache of namespace ns whose object carries
// annotations, within ns's quota, and what of the annotations the quota did not allow (or that
// does not parse), for people ("": nothing).
func (o OperatorConfiguration) CachePolicy(ns string, annotations map[string]string) (priority int32, pinned bool, problem string) {
	g := o.QuotaFor(ns)
	priority, pinned = g.DefaultPriority, g.DefaultPinned && g.AllowPin
	var problems []string
	if v, ok := annotations[PriorityAnnotation]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s=%q is not a whole number; priority %d is used", PriorityAnnotation, v, priority))
		case int32(n) > g.MaxPriority:
			priority = g.MaxPriority
			problems = append(problems, fmt.Sprintf("%s=%d is above the %d the operator configuration grants namespace %s (%s.maxPriority); %d is used", PriorityAnnotation, n, g.MaxPriority, ns, o.quotaPath(ns), priority))
		default:
			priority = int32(n)
		}
	}
	if v, ok := annotations[PinnedAnnotation]; ok {
		want, err := strconv.ParseBool(strings.TrimSpace(v))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s=%q is not true or false; the cache is %s", PinnedAnnotation, v, map[bool]string{true: "pinned", false: "not pinned"}[pinned]))
		case want && !g.AllowPin:
			problems = append(problems, fmt.Sprintf("%s=true, but the operator configuration does not let namespace %s pin caches (%s.allowPin); the cache is not pinned", PinnedAnnotation, ns, o.quotaPath(ns)))
		default:
			pinned = want
		}
	}
	return priority, pinned, strings.Join(problems, "; ")
}

// SourceAllowed says whether prewarm may read src with its own identity on behalf of namespace
// ns, and if not, why. A Hugging Face source is read with the parent's token or anonymously,
// never with prewarm's identity: it is always allowed.
func (o OperatorConfiguration) SourceAllowed(ns string, src prewarmv1alpha1.CacheSource) (bool, string) {
	if src.Type == inferencev1.ModelSourceHuggingFace {
		return true, ""
	}
	for _, r := range o.SourceAccess {
		if !slices.Contains(r.Namespaces, ns) && !slices.Contains(r.Namespaces, "*") {
			continue
		}
		switch {
		case src.Type == inferencev1.ModelSourceS3 && r.S3 != nil:
			if ok, _ := path.Match(r.S3.Bucket, src.Bucket); ok && under(src.Prefix, r.S3.Prefix) {
				return true, ""
			}
		case src.Type == inferencev1.ModelSourceFSx && r.FSx != nil:
			if r.FSx.FileSystemID == src.FileSystemID && under(src.Path, r.FSx.Path) {
				return true, ""
			}
		}
	}
	return false, fmt.Sprintf("%s is not among the sources prewarm reads with its own identity for namespace %s: the cluster admin allows it with config.sourceAccess in the chart's values (%s)", src, ns, ruleFor(ns, src))
}

// FSxAllowedDir is the directory of FSx source src's file system that the broadest
// sourceAccess rule allowing it for namespace ns opens ("" for the whole file system): the
// agents read src inside it, so that no link under an allowed path leads out of what the
// rule allows (a rule is matched on the path as written). ok is false when no rule allows src.
func (o OperatorConfiguration) FSxAllowedDir(ns string, src prewarmv1alpha1.CacheSource) (dir string, ok bool) {
	for _, r := range o.SourceAccess {
		if r.FSx == nil || r.FSx.FileSystemID != src.FileSystemID || !under(src.Path, r.FSx.Path) ||
			!slices.Contains(r.Namespaces, ns) && !slices.Contains(r.Namespaces, "*") {
			continue
		}
		if d := strings.Trim(r.FSx.Path, "/"); !ok || len(d) < len(dir) {
			dir, ok = d, true
		}
	}
	return dir, ok
}

// ruleFor is the sourceAccess rule that would allow src for namespace ns, as chart values.
func ruleFor(ns string, src prewarmv1alpha1.CacheSource) string {
	switch src.Type {
	case inferencev1.ModelSourceFSx:
		return fmt.Sprintf("- {namespaces: [%s], fsx: {fileSystemId: %s}}", ns, src.FileSystemID)
	default:
		return fmt.Sprintf("- {namespaces: [%s], s3: {bucket: %s}}", ns, src.Bucket)
	}
}

// under reports whether key prefix p lies under rule prefix r, on path boundaries.
func under(p, r string) bool {
	r = strings.Trim(r, "/")
	p = strings.Trim(p, "/")
	return r == "" || p == r || strings.HasPrefix(p, r+"/")
}

// CacheRootAllowed says whether hostPath is one of the cache roots, and if not, why.
func (o OperatorConfiguration) CacheRootAllowed(hostPath string) (bool, string) {
	if _, ok := o.Root(hostPath); ok {
		return true, ""
	}
	return false, fmt.Sprintf("hostPath %s is not an allowed cache root; the cluster admin allows %s (config.cacheRoots in the chart's values)",
		hostPath, strings.Join(o.Roots(), ", "))
}

// FSxMountPath returns where the file system id is mounted on the nodes.
func (o OperatorConfiguration) FSxMountPath(id string) (string, error) {
	for _, m := range o.FSx {
		if m.FileSystemID == id {
			return m.MountPath, nil
		}
	}
	if len(o.FSx) == 0 {
		return "", fmt.Errorf("FSx file system %s is not in prewarm's configuration (none is): the cluster admin lists it, with where it is mounted on the nodes, under fsx in the prewarm-config ConfigMap", id)
	}
	known := make([]string, len(o.FSx))
	for i, m := range o.FSx {
		known[i] = m.FileSystemID
	}
	return "", fmt.Errorf("FSx file system %s is not in prewarm's configuration (it lists %s): the cluster admin adds it, with where it is mounted on the nodes, under fsx in the prewarm-config ConfigMap", id, strings.Join(known, ", "))
}

// UsePathStyle says whether S3 at s.Endpoint is addressed with the bucket in the path: when
// PathStyle asks for it, and whenever an endpoint is set (sources.DefaultPathStyle: the
// S3-compatible stores want it). The agents, the init container, the controller's listing and
// JumpStart's resolver all address S3 by this rule.
func (s S3) UsePathStyle() bool { return s.PathStyle || sources.DefaultPathStyle(s.Endpoint) }
