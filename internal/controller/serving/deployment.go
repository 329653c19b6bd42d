package serving

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/placement"
	"github.com/prewarm/prewarm/pkg/engine"
)

// Paths inside inference pods.
const (
	// WorkMountPath is where the init container sees the model volume (an emptyDir).
	WorkMountPath = "/var/lib/prewarm/model"
	// modelSubPath is the directory of the model volume the inference container mounts.
	modelSubPath = "model"
	// PrepareContainerName is the name of the injected init container.
	PrepareContainerName = "prewarm-prepare"
	// WorkerContainerName is the name of the inference container.
	WorkerContainerName = "worker"
	fsxVolumeName       = "prewarm-fsx"
	// fsxSourcePath is where the init container of a pod without a weights cache sees the FSx
	// directory it reads the model from.
	fsxSourcePath = "/var/lib/prewarm/fsx"
	// cacheVolumeName is reserved: the name of the cache volume of earlier pod templates.
	cacheVolumeName = "prewarm-cache"
	// PrefetchVolumeName is the memory-backed volume the worker reads the model from with
	// prefetchEnabled, named as HyperPod names it.
	PrefetchVolumeName = "model-weights-copy"
	// PrefetchContainerName is the init container that fills it.
	PrefetchContainerName = "prewarm-prefetch"
	// prefetchFrom and prefetchTo are where that init container sees the two volumes.
	prefetchFrom, prefetchTo = "/var/lib/prewarm/model-source", "/var/lib/prewarm/model-copy"
	// prefetchMemory is what the prefetch init container needs besides the files it writes: its
	// memory request, and its memory limit above the volume's sizeLimit.
	prefetchMemory = 128 << 20
)

// selector is the label set that selects a parent's pods.
func selector(m *model) map[string]string {
	return map[string]string{controller.EndpointLabel: m.uid()}
}

// podTemplate builds the inference pods' template. cache is the weights cache the pods read
// (nil: no cache; the init container always downloads). A template the parent cannot have is a
// *problem with the reason that says why (SourceNotAllowed, InvalidSpec, PrefetchDoesNotFit).
func (r *Reconciler) podTemplate(m *model, cache *inferencev1.ModelDataCacheConfig, image *inferencev1.InferenceImageCache) (corev1.PodTemplateSpec, error) {
	labels := selector(m)
	labels["app.kubernetes.io/name"] = truncate(m.owner.GetName(), 63)
	labels[controller.ManagedByLabel] = controller.ManagedBy
	annotations := map[string]string{}
	worker := workerContainer(m)
	k := m.kubernetes
	spec := corev1.PodSpec{
		Tolerations:        m.placement.Tolerations,
		ServiceAccountName: k.ServiceAccountName,
		SchedulerName:      k.SchedulerName,
		// The parent's own init containers run first, then prewarm's.
		InitContainers: slices.Clone(k.InitContainers),
		Volumes:        slices.Clone(k.Volumes),
	}
	if m.source.ModelSourceType == inferencev1.ModelSourceKubernetesVolume {
		// The parent's volume of the model's name is mounted as it is; there is nothing to
		// prepare, and no cache.
		mountModelVolume(m, &worker)
		cache = nil
	} else if err := r.prepareModel(m, cache, &worker, &spec); err != nil {
		return corev1.PodTemplateSpec{}, err
	}
	if m.prefetch {
		if err := r.prefetchModel(m, cache, &worker, &spec); err != nil {
			return corev1.PodTemplateSpec{}, err
		}
	}
	if cache != nil {
		annotations[controller.WeightsCacheAnnotation] = cache.Name
	}
	if m.restricted {
		// The namespace enforces the restricted Pod Security level: the pods ask for what it
		// requires (the image must run as a non-root user).
		spec.SecurityContext = &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
		worker.SecurityContext = restrictedContainer()
	}
	spec.Containers = []corev1.Container{worker}
	spec.Affinity = affinity(r.Config.Rules(), m, cache, image)
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations}, Spec: spec}, nil
}

// workerContainer is the container that serves the model, as the parent describes it.
func workerContainer(m *model) corev1.Container {
	w := m.worker
	c := corev1.Container{
		Name: WorkerContainerName, Image: w.Image, Command: w.Command, Args: w.Args, WorkingDir: w.WorkingDir,
		Ports:     []corev1.ContainerPort{{Name: m.portName(), ContainerPort: w.ModelInvocationPort.ContainerPort, Protocol: corev1.ProtocolTCP}},
		Resources: w.Resources,
		Env:       slices.Clone(w.EnvironmentVariables),
	}
	if p := w.Probes; p != nil {
		c.ReadinessProbe, c.LivenessProbe, c.StartupProbe = p.ReadinessProbe, p.LivenessProbe, p.StartupProbe
	}
	return c
}

// mountModelVolume mounts the parent's volume of the model's name (from spec.kubernetes.volumes)
// as the model, read-only, at modelLocation inside it.
func mountModelVolume(m *model, worker *corev1.Container) {
	worker.VolumeMounts = append(worker.VolumeMounts, corev1.VolumeMount{
		Name: m.worker.ModelVolumeMount.Name, MountPath: m.mountPath(), SubPath: strings.Trim(m.source.ModelLocation, "/"), ReadOnly: true,
	})
}

// prepareModel makes the model appear in the pod. With a weights cache, the model volume is
// prewarm's CSI ephemeral volume: the node's agent mounts that one verified cache, read-only,
// for pods of the cache's namespace, downloading it first on a node that does not hold it yet
// (fill on a miss). Without one, an init container downloads the model into an emptyDir.
func (r *Reconciler) prepareModel(m *model, cache *inferencev1.ModelDataCacheConfig, worker *corev1.Container, spec *corev1.PodSpec) error {
	modelVolume := m.worker.ModelVolumeMount.Name
	if cache != nil {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: modelVolume, VolumeSource: corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{
					prewarmv1alpha1.VolumeAttributeCacheUID:  string(cache.UID),
					prewarmv1alpha1.VolumeAttributeCacheName: cache.Name,
				},
			},
		}})
		worker.VolumeMounts = append(worker.VolumeMounts, corev1.VolumeMount{Name: modelVolume, MountPath: m.mountPath(), ReadOnly: true})
		return nil
	}
	cs, err := r.Config.CacheSource(m.source)
	if err != nil {
		return sourceProblem(err)
	}
	prepare := corev1.Container{
		Name: PrepareContainerName, Image: r.Config.AgentImage(),
		Args: []string{"prepare", "--dest=" + filepath.Join(WorkMountPath, modelSubPath)},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: modelVolume, MountPath: WorkMountPath}},
	}
	if m.restricted {
		prepare.SecurityContext = restrictedContainer()
	}
	if err := r.prepareSource(m, cs, m.source, &prepare, spec); err != nil {
		return err
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: modelVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	worker.VolumeMounts = append(worker.VolumeMounts, corev1.VolumeMount{Name: modelVolume, MountPath: m.mountPath(), SubPath: modelSubPath, ReadOnly: true})
	spec.InitContainers = append(spec.InitContainers, prepare)
	// The agent image may be in a private registry (controller.imagePullSecrets: Secrets of
	// that name in the parent's namespace).
	spec.ImagePullSecrets = append(spec.ImagePullSecrets, r.Config.PullSecrets()...)
	return nil
}

// sourceProblem is why the pods cannot read the model's source (an error of CacheSource), as the
// weights cache reports the same source: a value no node's request holds is InvalidSpec; a source
// prewarm's configuration does not give (an FSx file system it does not list) SourceNotAllowed.
func sourceProblem(err error) *problem {
	if spec := (*controller.SpecError)(nil); errors.As(err, &spec) {
		return &problem{inferencev1.ReasonInvalidSpec, spec.Message}
	}
	return &problem{inferencev1.ReasonSourceNotAllowed, err.Error()}
}

// prefetchModel makes the worker read the model from memory (HyperPod's prefetchEnabled): a
// memory-backed emptyDir, model-weights-copy, that an init container fills from the model volume
// (the node's cache, or the download of a cold pod) before the worker starts; the worker mounts
// it where it would have mounted the model. A model larger than the worker's memory limit cannot
// be held there (the copy counts against the pod's memory): the parent says so and nothing is
// deployed.
//
// The volume always has a sizeLimit: the model's size and a margin, or, when the model's size is
// not known yet, controller.prefetchSizeLimit (or the worker's memory limit, when lower); the
// init container refuses a model larger than that, naming what set it. The init container's
// memory limit is that sizeLimit and what the copy itself needs: the files it writes into the
// volume count against its own memory while it runs.
func (r *Reconciler) prefetchModel(m *model, cache *inferencev1.ModelDataCacheConfig, worker *corev1.Container, spec *corev1.PodSpec) error {
	i := slices.IndexFunc(worker.VolumeMounts, func(v corev1.VolumeMount) bool { return v.MountPath == m.mountPath() })
	if i < 0 {
		return fmt.Errorf("prefetch: the worker mounts no model at %s", m.mountPath())
	}
	model := worker.VolumeMounts[i]
	var size int64
	if cache != nil {
		size = cache.Status.TotalBytes
		if c := cache.Status.Capacity; size == 0 && c != nil {
			size = c.ModelBytes
		}
	}
	workerLimit, limited := worker.Resources.Limits[corev1.ResourceMemory]
	var sizeLimit int64
	var sizeLimitFrom string
	switch {
	case size > 0:
		if limited && size >= workerLimit.Value() {
			return &problem{inferencev1.ReasonPrefetchDoesNotFit, fmt.Sprintf(
				"prefetchEnabled copies the model (%s) into the pod's memory, which the worker's memory limit (%s) cannot hold: raise worker.resources.limits.memory above the model's size, or turn prefetchEnabled off",
				engine.HumanBytes(size), workerLimit.String())}
		}
		// The files, and tmpfs's own bookkeeping.
		sizeLimit = size + size/100 + 16<<20
		sizeLimitFrom = fmt.Sprintf("sized from the model's size as its weights cache reported it, %s", engine.HumanBytes(size))
	case limited && workerLimit.Value() < r.Config.Controller.PrefetchSizeLimitBytes():
		sizeLimit = workerLimit.Value()
		sizeLimitFrom = "the model's size was not known when the pod was made, so the limit is the worker's memory limit, which the copy shares with the server: raise worker.resources.limits.memory above the model's size, or turn prefetchEnabled off"
	default:
		sizeLimit = r.Config.Controller.PrefetchSizeLimitBytes()
		sizeLimitFrom = "the model's size was not known when the pod was made, so the limit is controller.prefetchSizeLimit of the operator configuration: raise it above the model's size, or give the parent a weights cache, whose size then sizes the volume"
	}
	limit := resource.NewQuantity(sizeLimit, resource.BinarySI)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: PrefetchVolumeName, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: limit},
	}})
	prefetch := corev1.Container{
		Name: PrefetchContainerName, Image: r.Config.AgentImage(),
		Args: []string{"prefetch", "--from=" + prefetchFrom, "--to=" + prefetchTo, "--size-limit=" + limit.String(), "--size-limit-from=" + sizeLimitFrom},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: *resource.NewQuantity(prefetchMemory, resource.BinarySI)},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(sizeLimit+prefetchMemory, resource.BinarySI)},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: model.Name, MountPath: prefetchFrom, SubPath: model.SubPath, ReadOnly: true},
			{Name: PrefetchVolumeName, MountPath: prefetchTo},
		},
	}
	if m.restricted {
		prefetch.SecurityContext = restrictedContainer()
	}
	spec.InitContainers = append(spec.InitContainers, prefetch)
	for _, ps := range r.Config.PullSecrets() {
		if !slices.Contains(spec.ImagePullSecrets, ps) {
			spec.ImagePullSecrets = append(spec.ImagePullSecrets, ps)
		}
	}
	worker.VolumeMounts[i] = corev1.VolumeMount{Name: PrefetchVolumeName, MountPath: m.mountPath(), ReadOnly: true}
	return nil
}

// restrictedNamespace reports whether namespace ns enforces the restricted Pod Security level.
func (r *Reconciler) restrictedNamespace(ctx context.Context, ns string) (bool, error) {
	n := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ns}, n); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return n.Labels[podSecurityLevelLabel] == "restricted", nil
}

// restrictedContainer is what the restricted Pod Security level asks of a container.
func restrictedContainer() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// affinity is the placement's required terms, and preferences (never requirements): first for
// the nodes that hold the weights cache, then the parent's own, then for the nodes that hold
// the image (which takes far less time to fetch than the weights).
func affinity(rules placement.Rules, m *model, cache *inferencev1.ModelDataCacheConfig, image *inferencev1.InferenceImageCache) *corev1.Affinity {
	aff := &corev1.NodeAffinity{}
	if terms := rules.RequiredTerms(m.placement); len(terms) > 0 {
		aff.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
	}
	prefer := func(weight int32, label string) {
		aff.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.PreferredDuringSchedulingIgnoredDuringExecution, corev1.PreferredSchedulingTerm{
			Weight: weight,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{inferencev1.LabelTrue},
			}}},
		})
	}
	if cache != nil {
		prefer(100, inferencev1.WeightsCacheReadyLabel(string(cache.UID)))
	}
	aff.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.PreferredDuringSchedulingIgnoredDuringExecution, m.preferred...)
	if image != nil {
		prefer(50, inferencev1.ImageCacheReadyLabel(string(image.UID)))
	}
	if aff.RequiredDuringSchedulingIgnoredDuringExecution == nil && len(aff.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		return nil
	}
	return &corev1.Affinity{NodeAffinity: aff}
}

func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// deployment builds the parent's Deployment.
func (r *Reconciler) deployment(m *model, tmpl corev1.PodTemplateSpec) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.owner.GetName(), Namespace: m.owner.GetNamespace(),
			Labels:      map[string]string{controller.ManagedByLabel: controller.ManagedBy},
			Annotations: map[string]string{controller.TemplateHashAnnotation: templateHash(&tmpl)},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(m.replicas),
			Selector: &metav1.LabelSelector{MatchLabels: selector(m)},
			Template: tmpl,
		},
	}
}

// service builds the parent's Service on the model invocation port.
func (r *Reconciler) service(m *model) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.owner.GetName(), Namespace: m.owner.GetNamespace(),
			Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy},
		},
		Spec: corev1.ServiceSpec{
			Selector: selector(m),
			Ports: []corev1.ServicePort{{
				Name: m.portName(), Port: m.worker.ModelInvocationPort.ContainerPort, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromString(m.portName()),
			}},
		},
	}
}

// prepareSource gives the init container its source, as typed flags (a key prefix or a path is
// passed byte for byte), with the credentials and mounts it reads it with.
func (r *Reconciler) prepareSource(m *model, cs prewarmv1alpha1.CacheSource, src inferencev1.ModelSourceConfig, prepare *corev1.Container, spec *corev1.PodSpec) error {
	switch cs.Type {
	case inferencev1.ModelSourceS3:
		prepare.Args = append(prepare.Args, "--s3-bucket="+cs.Bucket, "--s3-prefix="+cs.Prefix)
		if cs.Revision != "" {
			prepare.Args = append(prepare.Args, "--content-revision="+cs.Revision)
		}
		if cs.Region != "" {
			prepare.Args = append(prepare.Args, "--region="+cs.Region)
		}
		if r.Config.S3.Endpoint != "" {
			prepare.Args = append(prepare.Args, "--s3-endpoint="+r.Config.S3.Endpoint)
		}
		if r.Config.S3.PathStyle {
			prepare.Args = append(prepare.Args, "--s3-path-style")
		}
		if s := r.Config.S3.CredentialsSecret; s != "" {
			for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
				prepare.Env = append(prepare.Env, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: s}, Key: k, Optional: ptr.To(true),
				}}})
			}
		}
	case inferencev1.ModelSourceHuggingFace:
		prepare.Args = append(prepare.Args, "--hf-repo="+cs.RepoID)
		if cs.Revision != "" {
			prepare.Args = append(prepare.Args, "--hf-revision="+cs.Revision)
		}
		if r.Config.HuggingFace.Endpoint != "" {
			prepare.Args = append(prepare.Args, "--hf-endpoint="+r.Config.HuggingFace.Endpoint)
		}
		if ref := src.HuggingFaceModel.TokenSecretRef; ref != nil {
			key := ref.Key
			if key == "" {
				key = "token"
			}
			prepare.Env = append(prepare.Env, corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name}, Key: key, Optional: ref.Optional,
			}}})
		}
	case inferencev1.ModelSourceFSx:
		if _, err := r.Config.FSxMountPath(cs.FileSystemID); err != nil {
			return &problem{inferencev1.ReasonSourceNotAllowed, err.Error()}
		}
		// The file system's mount is prewarm's access, not the namespace's: the pod gets only
		// the model's directory, and only when a rule allows it for the namespace. It comes as
		// prewarm's CSI volume, not a hostPath: the node's agent opens the directory through real
		// directories only (no link on the way, which a tenant could have put there) and mounts
		// it as opened, read-only; the kubelet resolves no path of the file system.
		if ok, why := r.Config.SourceAllowed(m.owner.GetNamespace(), cs); !ok {
			return &problem{inferencev1.ReasonSourceNotAllowed, why}
		}
		prepare.Args = append(prepare.Args, "--source-dir="+fsxSourcePath)
		if cs.Revision != "" {
			prepare.Args = append(prepare.Args, "--content-revision="+cs.Revision)
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: fsxVolumeName, VolumeSource: corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{
				Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
				VolumeAttributes: map[string]string{
					prewarmv1alpha1.VolumeAttributeFSxFileSystemID: cs.FileSystemID,
					prewarmv1alpha1.VolumeAttributeFSxPath:         cs.Path,
				},
			},
		}})
		prepare.VolumeMounts = append(prepare.VolumeMounts, corev1.VolumeMount{Name: fsxVolumeName, MountPath: fsxSourcePath, ReadOnly: true})
	}
	return nil
}
