package config

import (
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// Validate says everything that is wrong with o, each problem with the field it is in.
func (o OperatorConfiguration) Validate() error {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(o.OperatorNamespace) {
		errs = append(errs, field.Invalid(field.NewPath("operatorNamespace"), o.OperatorNamespace, msg))
	}
	errs = append(errs, o.validateRoots()...)
	errs = append(errs, o.Placement.validate()...)
	errs = append(errs, o.validateFSx()...)
	errs = append(errs, o.validateQuotas()...)
	errs = append(errs, o.ImageCaches.validate()...)
	errs = append(errs, o.validateStandaloneNodes()...)
	errs = append(errs, o.Autoscaling.validate()...)
	if js := o.JumpStart; js.Region != "" && !regionPattern.MatchString(js.Region) {
		errs = append(errs, field.Invalid(field.NewPath("jumpStart", "region"), js.Region, "want an AWS region such as us-west-2"))
	}
	if o.JumpStart.Refresh.Duration < 0 {
		errs = append(errs, positive(field.NewPath("jumpStart", "refresh"), o.JumpStart.Refresh)...)
	}
	c, a := o.Controller, o.Agent
	ctl, agent := field.NewPath("controller"), field.NewPath("agent")
	errs = append(errs, positive(ctl.Child("gateTimeout"), c.GateTimeout)...)
	errs = append(errs, positive(ctl.Child("deletionTimeout"), c.DeletionTimeout)...)
	errs = append(errs, positive(ctl.Child("retention"), c.Retention)...)
	errs = append(errs, positive(agent.Child("verifyInterval"), a.VerifyInterval)...)
	errs = append(errs, positive(agent.Child("progressInterval"), a.ProgressInterval)...)
	errs = append(errs, positive(agent.Child("statusInterval"), a.StatusInterval)...)
	if a.LeaseDuration.Duration < 15*time.Second {
		errs = append(errs, field.Invalid(agent.Child("leaseDuration"), a.LeaseDuration.Duration.String(), "must be at least 15s: the agents renew their Lease every third of it"))
	}
	errs = append(errs, positive(agent.Child("recheckInterval"), a.RecheckInterval)...)
	errs = append(errs, positive(agent.Child("retryInterval"), a.RetryInterval)...)
	errs = append(errs, positive(agent.Child("mountWait"), a.MountWait)...)
	errs = append(errs, atLeast(ctl.Child("prefetchSizeLimit"), c.PrefetchSizeLimit, 16<<20)...)
	errs = append(errs, atLeast(agent.Child("reserve"), a.Reserve, 0)...)
	errs = append(errs, atLeast(agent.Child("partSize"), a.PartSize, 1<<20)...)
	errs = append(errs, atLeast(agent.Child("verifyRate"), a.VerifyRate, 0)...)
	errs = append(errs, atLeast(agent.Child("maxScratchBytes"), a.MaxScratchBytes, 0)...)
	errs = append(errs, a.Kubelet.validate(agent.Child("kubelet"))...)
	errs = append(errs, notNegative(ctl.Child("clientBurst"), c.ClientBurst)...)
	errs = append(errs, notNegative(ctl.Child("concurrentReconciles"), c.ConcurrentReconciles)...)
	errs = append(errs, notNegative(agent.Child("maxParallel"), a.MaxParallel)...)
	errs = append(errs, notNegative(agent.Child("concurrency"), a.Concurrency)...)
	errs = append(errs, o.validateSharing()...)
	if c.ClientQPS < 0 {
		errs = append(errs, field.Invalid(ctl.Child("clientQPS"), c.ClientQPS, "must not be negative"))
	}
	if c.CapacityShortfall != "" && c.CapacityShortfall != CapacityShortfallWarn && c.CapacityShortfall != CapacityShortfallRefuse {
		errs = append(errs, field.NotSupported(ctl.Child("capacityShortfall"), c.CapacityShortfall, []string{CapacityShortfallWarn, CapacityShortfallRefuse}))
	}
	errs = append(errs, o.validateSourceAccess()...)
	return errs.ToAggregate()
}

// validateSharing checks the peers and the origin budgets.
func (o OperatorConfiguration) validateSharing() field.ErrorList {
	var errs field.ErrorList
	p := o.Peers
	peers := field.NewPath("peers")
	errs = append(errs, positive(peers.Child("wait"), p.Wait)...)
	errs = append(errs, positive(peers.Child("stall"), p.Stall)...)
	if p.Streams < 1 || p.Streams > 64 {
		errs = append(errs, field.Invalid(peers.Child("streams"), p.Streams, "want 1 to 64"))
	}
	errs = append(errs, atLeast(peers.Child("uploadRate"), p.UploadRate, 0)...)
	errs = append(errs, atLeast(field.NewPath("s3", "budget", "maxRate"), o.S3.Budget.MaxRate, 0)...)
	errs = append(errs, atLeast(field.NewPath("huggingFace", "budget", "maxRate"), o.HuggingFace.Budget.MaxRate, 0)...)
	errs = append(errs, notNegative(field.NewPath("s3", "budget", "maxConcurrency"), o.S3.Budget.MaxConcurrency)...)
	errs = append(errs, notNegative(field.NewPath("huggingFace", "budget", "maxConcurrency"), o.HuggingFace.Budget.MaxConcurrency)...)
	errs = append(errs, notNegative(peers.Child("maxPeers"), p.MaxPeers)...)
	if p.Port < 1 || p.Port > 65535 {
		errs = append(errs, field.Invalid(peers.Child("port"), p.Port, "want a TCP port"))
	}
	if w := p.Witness.Port; w < 1 || w > 65535 {
		errs = append(errs, field.Invalid(peers.Child("witness", "port"), w, "want a TCP port"))
	}
	if a := p.Witness.Audience; a == p.Audience {
		// A node receives its peers' tokens: with one audience it could read as them there.
		errs = append(errs, field.Invalid(peers.Child("witness", "audience"), a, "want another audience than peers.audience (agents send their peer tokens to each other)"))
	}
	if p.Trust != TrustSourceDigests && p.Trust != TrustAllNodes {
		errs = append(errs, field.NotSupported(peers.Child("trust"), p.Trust, []string{TrustSourceDigests, TrustAllNodes}))
	}
	if g := p.GroupSize; g < 2 || g > 32 {
		errs = append(errs, field.Invalid(peers.Child("groupSize"), g, "want 2 to 32 (a node lists its group and its upstream group, at most 64 peers)"))
	}
	return errs
}

func positive(path *field.Path, d metav1.Duration) field.ErrorList {
	if d.Duration <= 0 {
		return field.ErrorList{field.Invalid(path, d.Duration.String(), "want a positive duration such as 30s, 30m or 24h")}
	}
	return nil
}

func atLeast(path *field.Path, q *resource.Quantity, least int64) field.ErrorList {
	if q != nil && q.Value() < least {
		return field.ErrorList{field.Invalid(path, q.String(), fmt.Sprintf("want a size such as 16Mi or 20Gi, at least %d bytes", least))}
	}
	return nil
}

func notNegative(path *field.Path, n int) field.ErrorList {
	if n < 0 {
		return field.ErrorList{field.Invalid(path, n, "must not be negative")}
	}
	return nil
}

// regionPattern is an AWS region's name.
var regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]$`)

// validateQuotas checks the namespace quotas.
func (o OperatorConfiguration) validateQuotas() field.ErrorList {
	var errs field.ErrorList
	for i, q := range o.NamespaceQuotas {
		at := field.NewPath("namespaceQuotas").Index(i)
		if len(q.Namespaces) == 0 {
			errs = append(errs, field.Required(at.Child("namespaces"), "name the namespaces the quota is for, or \"*\""))
		}
		if q.DefaultPriority > q.MaxPriority {
			errs = append(errs, field.Invalid(at.Child("defaultPriority"), q.DefaultPriority, fmt.Sprintf("above maxPriority (%d)", q.MaxPriority)))
		}
		if q.DefaultPinned && !q.AllowPin {
			errs = append(errs, field.Invalid(at.Child("defaultPinned"), true, "needs allowPin"))
		}
		if q.AllowPin && q.MaxBytesPerNode == nil {
			// A pinned cache is never evicted: without a per-node limit, pins could take every
			// node's disk for good.
			errs = append(errs, field.Required(at.Child("maxBytesPerNode"), "allowPin needs a per-node limit: a pinned cache is never evicted, so maxBytesPerNode bounds what the namespace's pins keep on each node"))
		}
		if n := q.MaxCachesPerNode; n != nil && (*n < 1 || *n > prewarmv1alpha1.MaxCachesPerNode) {
			errs = append(errs, field.Invalid(at.Child("maxCachesPerNode"), *n, fmt.Sprintf("must be 1 to %d, the caches one node is asked for in all", prewarmv1alpha1.MaxCachesPerNode)))
		}
		errs = append(errs, atLeast(at.Child("maxBytesPerNode"), q.MaxBytesPerNode, 0)...)
		errs = append(errs, atLeast(at.Child("maxBytes"), q.MaxBytes, 0)...)
	}
	return errs
}

// validateFSx checks the FSx mounts: file system ids listed once, mount paths clean and apart
// from the cache roots.
func (o OperatorConfiguration) validateFSx() field.ErrorList {
	var errs field.ErrorList
	ids := map[string]bool{}
	for i, m := range o.FSx {
		at := field.NewPath("fsx").Index(i)
		if !strings.HasPrefix(m.FileSystemID, "fs-") || strings.ContainsAny(m.FileSystemID, "/ ") {
			errs = append(errs, field.Invalid(at.Child("fileSystemId"), m.FileSystemID, "want an FSx file system id, fs-…"))
		}
		if ids[m.FileSystemID] {
			errs = append(errs, field.Duplicate(at.Child("fileSystemId"), m.FileSystemID))
		}
		ids[m.FileSystemID] = true
		if err := nodePath(m.MountPath); err != nil {
			errs = append(errs, field.Invalid(at.Child("mountPath"), m.MountPath, err.Error()))
		}
		for _, r := range o.CacheRoots {
			if within(m.MountPath, r.OnNode()) || within(r.OnNode(), m.MountPath) {
				errs = append(errs, field.Invalid(at.Child("mountPath"), m.MountPath, "overlaps the cache root "+r.OnNode()))
			}
		}
	}
	return errs
}

// validateSourceAccess checks the rules of sources prewarm reads with its own identity.
func (o OperatorConfiguration) validateSourceAccess() field.ErrorList {
	var errs field.ErrorList
	for i, r := range o.SourceAccess {
		at := field.NewPath("sourceAccess").Index(i)
		switch {
		case len(r.Namespaces) == 0:
			errs = append(errs, field.Required(at.Child("namespaces"), `list the namespaces ("*" is every namespace)`))
		case (r.S3 == nil) == (r.FSx == nil):
			errs = append(errs, field.Invalid(at, "", "want exactly one of s3 and fsx"))
		case r.S3 != nil && (r.S3.Bucket == "" || strings.Contains(r.S3.Bucket, "/")):
			errs = append(errs, field.Invalid(at.Child("s3", "bucket"), r.S3.Bucket, "want a bucket name or pattern"))
		case r.S3 != nil:
			if _, err := path.Match(r.S3.Bucket, ""); err != nil {
				errs = append(errs, field.Invalid(at.Child("s3", "bucket"), r.S3.Bucket, err.Error()))
			}
		case r.FSx != nil && !slices.ContainsFunc(o.FSx, func(m FSxMount) bool { return m.FileSystemID == r.FSx.FileSystemID }):
			errs = append(errs, field.Invalid(at.Child("fsx", "fileSystemId"), r.FSx.FileSystemID, "not under fsx"))
		case r.FSx != nil && slices.Contains(strings.Split(r.FSx.Path, "/"), ".."):
			errs = append(errs, field.Invalid(at.Child("fsx", "path"), r.FSx.Path,
				`want a directory of the file system, relative to its mount, without ".." segments (team-a/models)`))
		}
	}
	return errs
}

// validateRoots checks the cache roots: clean absolute paths, none named twice, no two on one
// node directory or inside each other.
func (o OperatorConfiguration) validateRoots() field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, r := range o.CacheRoots {
		at := field.NewPath("cacheRoots").Index(i)
		if err := nodePath(r.Path); err != nil {
			errs = append(errs, field.Invalid(at.Child("path"), r.Path, err.Error()))
		}
		if r.NodePath != "" {
			if err := nodePath(r.NodePath); err != nil {
				errs = append(errs, field.Invalid(at.Child("nodePath"), r.NodePath, err.Error()))
			}
		}
		if r.HighWatermarkPercent < 1 || r.HighWatermarkPercent > 100 {
			errs = append(errs, field.Invalid(at.Child("highWatermarkPercent"), r.HighWatermarkPercent, "want a percent of the disk, 1 to 100"))
		}
		if r.LowWatermarkPercent < 1 || r.LowWatermarkPercent > r.HighWatermarkPercent {
			errs = append(errs, field.Invalid(at.Child("lowWatermarkPercent"), r.LowWatermarkPercent,
				fmt.Sprintf("want a percent of the disk from 1 to highWatermarkPercent (%d)", r.HighWatermarkPercent)))
		}
		if names[r.Path] {
			errs = append(errs, field.Duplicate(at.Child("path"), r.Path))
		}
		names[r.Path] = true
		for j, q := range o.CacheRoots[:i] {
			if within(r.OnNode(), q.OnNode()) || within(q.OnNode(), r.OnNode()) {
				errs = append(errs, field.Invalid(at, r.OnNode(), fmt.Sprintf("on the nodes, overlaps cacheRoots[%d] (%s)", j, q.OnNode())))
			}
		}
	}
	return errs
}

// validate checks the placement settings.
func (p Placement) validate() field.ErrorList {
	var errs field.ErrorList
	at := field.NewPath("placement")
	switch p.ExtendedResourceTolerations {
	case "", ExtendedResourceTolerationsAuto, ExtendedResourceTolerationsOn, ExtendedResourceTolerationsOff:
	default:
		errs = append(errs, field.NotSupported(at.Child("extendedResourceTolerations"), p.ExtendedResourceTolerations,
			[]string{ExtendedResourceTolerationsAuto, ExtendedResourceTolerationsOn, ExtendedResourceTolerationsOff}))
	}
	seen := map[string]bool{}
	for i, t := range p.InstanceTypes {
		it := at.Child("instanceTypes").Index(i)
		switch {
		case t.InstanceType == "":
			errs = append(errs, field.Required(it.Child("instanceType"), "the instance type parents name"))
		case seen[t.InstanceType]:
			errs = append(errs, field.Duplicate(it.Child("instanceType"), t.InstanceType))
		case len(t.NodeSelector) == 0 && len(t.MatchExpressions) == 0:
			errs = append(errs, field.Required(it, fmt.Sprintf("%s: want nodeSelector or matchExpressions, the labels its nodes carry", t.InstanceType)))
		}
		seen[t.InstanceType] = true
		errs = append(errs, validateSelection(it, t.NodeSelector, t.MatchExpressions)...)
	}
	errs = append(errs, validateTolerations(at.Child("tolerations"), p.Tolerations)...)
	return errs
}

// validateStandaloneNodes checks the grants of nodes to standalone caches.
func (o OperatorConfiguration) validateStandaloneNodes() field.ErrorList {
	var errs field.ErrorList
	for i, g := range o.StandaloneCacheNodes {
		at := field.NewPath("standaloneCacheNodes").Index(i)
		if len(g.Namespaces) == 0 {
			errs = append(errs, field.Required(at.Child("namespaces"), `list the namespaces the grant is for ("*" is every namespace)`))
		}
		errs = append(errs, validateSelection(at, g.NodeSelector, g.MatchExpressions)...)
		errs = append(errs, validateTolerations(at.Child("tolerations"), g.Tolerations)...)
	}
	return errs
}

// validateSelection checks a nodeSelector and matchExpressions under at.
func validateSelection(at *field.Path, selector map[string]string, exprs []corev1.NodeSelectorRequirement) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(at.Child("nodeSelector"), k, "key: "+msg))
		}
		for _, msg := range validation.IsValidLabelValue(selector[k]) {
			errs = append(errs, field.Invalid(at.Child("nodeSelector").Key(k), selector[k], msg))
		}
	}
	for j, e := range exprs {
		if _, err := nodeSelectorRequirement(e); err != nil {
			errs = append(errs, field.Invalid(at.Child("matchExpressions").Index(j), e.Key, err.Error()))
		}
	}
	return errs
}

// validateTolerations checks a list of tolerations at path at.
func validateTolerations(at *field.Path, list []corev1.Toleration) field.ErrorList {
	var errs field.ErrorList
	for i, t := range list {
		tl := at.Index(i)
		switch {
		case t.Operator != "" && t.Operator != corev1.TolerationOpExists && t.Operator != corev1.TolerationOpEqual:
			errs = append(errs, field.NotSupported(tl.Child("operator"), t.Operator, []corev1.TolerationOperator{corev1.TolerationOpExists, corev1.TolerationOpEqual}))
		case t.Operator == corev1.TolerationOpExists && t.Value != "":
			errs = append(errs, field.Invalid(tl.Child("value"), t.Value, "operator Exists takes no value"))
		case t.Key == "" && t.Operator != corev1.TolerationOpExists:
			errs = append(errs, field.Invalid(tl.Child("key"), t.Key, "an empty key needs operator Exists"))
		}
		switch t.Effect {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(tl.Child("effect"), t.Effect,
				[]corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}))
		}
	}
	return errs
}

// nodeSelectorRequirement checks one requirement as the scheduler reads it.
func nodeSelectorRequirement(e corev1.NodeSelectorRequirement) (labels.Requirement, error) {
	op := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
		corev1.NodeSelectorOpGt: selection.GreaterThan, corev1.NodeSelectorOpLt: selection.LessThan,
	}[e.Operator]
	if op == "" {
		return labels.Requirement{}, fmt.Errorf("operator %q: want In, NotIn, Exists, DoesNotExist, Gt or Lt", e.Operator)
	}
	r, err := labels.NewRequirement(e.Key, op, e.Values)
	if err != nil {
		return labels.Requirement{}, err
	}
	return *r, nil
}

func nodePath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("%q: want a clean absolute path other than /", p)
	}
	return nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}
