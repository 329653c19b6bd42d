package serving

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/catalog"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/jumpstart"
	"github.com/prewarm/prewarm/internal/placement"
)

// JumpStartReconciler reconciles JumpStartModel objects: it resolves the model through the
// catalog, then caches and serves it exactly as an InferenceEndpointConfig.
type JumpStartReconciler struct {
	*Reconciler
	// CatalogName is the catalog ConfigMap in the operator namespace.
	CatalogName string
}

// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=jumpstartmodels,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=inference.sagemaker.aws.amazon.com,resources=jumpstartmodels/status;jumpstartmodels/finalizers,verbs=get;update;patch
// +kubebuilder:rbac:groups="",namespace=hyperpod-inference-system,resources=configmaps,verbs=list;watch

// SetupWithManager registers the reconciler with mgr.
func (r *JumpStartReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.CatalogName == "" {
		r.CatalogName = catalog.DefaultConfigMap
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("jumpstart").
		// Not its own status writes: they change nothing the reconcile reads.
		For(&inferencev1.JumpStartModel{}, builder.WithPredicates(ownChanges)).
		Watches(&inferencev1.ModelDataCacheConfig{}, controller.Coalesce(
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &inferencev1.JumpStartModel{}, handler.OnlyControllerOwner()), time.Second)).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Watches(&inferencev1.InferenceImageCache{}, controller.Coalesce(handler.EnqueueRequestsFromMapFunc(jumpStartParentsOf), time.Second)).
		Watches(&corev1.ConfigMap{}, controller.EnqueueAll(r.Client, func() client.ObjectList { return &inferencev1.JumpStartModelList{} },
			func(o client.Object) bool { // the catalog only
				return o.GetNamespace() == r.Config.OperatorNamespace && o.GetName() == r.CatalogName
			}))
	if err := r.ownScaledObjects(b); err != nil {
		return err
	}
	return b.Complete(r)
}

func jumpStartParentsOf(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*inferencev1.InferenceImageCache)
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, p := range c.Spec.ParentReferences {
		if p.Kind == "JumpStartModel" {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
		}
	}
	return reqs
}

// Reconcile resolves one JumpStartModel through the catalog and brings its caches, Deployment,
// Service and status to what it asks.
func (r *JumpStartReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return reconcileParent(ctx, r.Reconciler, req, servingKind(r.Reconciler, "jumpstart", "JumpStartModel",
		func(j *inferencev1.JumpStartModel) *inferencev1.ParentStatus { return &j.Status },
		func(ctx context.Context, j *inferencev1.JumpStartModel) (*model, *problem, error) {
			entry, p, err := r.lookupJumpStart(ctx, r.CatalogName, "spec.model", j.Spec.Model, j.Spec.Server.InstanceType, true)
			if err != nil || p != nil {
				return nil, p, err
			}
			return fromJumpStart(j, entry), nil, nil
		}))
}

// lookupJumpStart finds a JumpStart model's entry: in the catalog ConfigMap catalogName (the
// override, and all there is on an air-gapped cluster), else in JumpStart's own manifest of the
// configured region. A problem says why it cannot be used.
//
// field is where the object names the model (spec.model, spec.jumpStartModel), for messages.
func (r *Reconciler) lookupJumpStart(ctx context.Context, catalogName, field string, m inferencev1.JumpStartModelRef, instanceType string, needImage bool) (*catalog.Entry, *problem, error) {
	if catalogName == "" {
		catalogName = catalog.DefaultConfigMap
	}
	where := fmt.Sprintf("ConfigMap %s/%s (key %s)", r.Config.OperatorNamespace, catalogName, catalog.Key)
	var cat *catalog.Catalog
	cm := &corev1.ConfigMap{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Config.OperatorNamespace, Name: catalogName}, cm); {
	case apierrors.IsNotFound(err):
		if r.JumpStart == nil {
			return nil, &problem{inferencev1.ReasonModelNotInCatalog,
				fmt.Sprintf("the JumpStart catalog, %s, does not exist; install it: kubectl apply -f config/catalog/catalog.yaml", where)}, nil
		}
	case err != nil:
		return nil, nil, err
	default:
		if cat, err = catalog.Parse([]byte(cm.Data[catalog.Key])); err != nil {
			return nil, &problem{inferencev1.ReasonModelNotInCatalog, fmt.Sprintf("the JumpStart catalog, %s, cannot be read: %v", where, err)}, nil
		}
	}
	e, err := (*catalog.Entry)(nil), fmt.Errorf("model %s (hub %s) is %w", m.ModelID, cmp.Or(m.ModelHubName, catalog.DefaultHub), catalog.ErrNotInCatalog)
	if cat != nil {
		e, err = cat.Lookup(m.ModelID, m.ModelVersion, m.ModelHubName)
	}
	switch {
	case errors.Is(err, catalog.ErrNotInCatalog):
		var p *problem
		if e, p = r.resolveJumpStart(ctx, m, field, instanceType, where, err, needImage); p != nil {
			return nil, p, nil
		}
	case err != nil:
		return nil, nil, err
	}
	if e.Gated && !m.AcceptEula {
		return nil, &problem{inferencev1.ReasonEULANotAccepted, fmt.Sprintf(
			"%s is a gated model: accept its end-user licence by setting %s.acceptEula: true", m.ModelID, field)}, nil
	}
	return e, nil, nil
}

// resolveJumpStart resolves a model the catalog does not list (notInCatalog says how) through
// JumpStart's manifest, when a region is configured.
func (r *Reconciler) resolveJumpStart(ctx context.Context, m inferencev1.JumpStartModelRef, field, instanceType, where string, notInCatalog error, needImage bool) (*catalog.Entry, *problem) {
	hub := m.ModelHubName
	if r.JumpStart == nil || (hub != "" && hub != catalog.DefaultHub) {
		or := ""
		if r.JumpStart == nil {
			or = "; or set jumpStart.region to resolve public models from JumpStart's own manifest"
		}
		return nil, &problem{inferencev1.ReasonModelNotInCatalog, fmt.Sprintf(
			"%v; add an entry (source, image, version) to the catalog, %s — see docs/operations.md, JumpStart models%s", notInCatalog, where, or)}
	}
	// A weights cache alone (a ModelWeightsCacheConfig, which names no server) needs no image.
	e, err := r.JumpStart.Resolve(ctx, m.ModelID, m.ModelVersion, instanceType, needImage)
	var nf *jumpstart.NotFoundError
	switch {
	case errors.As(err, &nf) && len(nf.Versions) > 0:
		return nil, &problem{inferencev1.ReasonModelVersionNotFound, nf.Error() + "; set " + field + ".modelVersion to one of them, or leave it empty for the latest"}
	case errors.As(err, &nf):
		return nil, &problem{inferencev1.ReasonModelNotInCatalog, nf.Error() + fmt.Sprintf(", nor is it in the catalog, %s", where)}
	case err != nil:
		return nil, &problem{inferencev1.ReasonJumpStartUnavailable, err.Error()}
	}
	return e, nil
}

// fromJumpStart builds the model to serve from a JumpStartModel and its catalog entry.
func fromJumpStart(j *inferencev1.JumpStartModel, e *catalog.Entry) *model {
	s := &j.Spec
	port := e.Port
	if port == 0 {
		port = 8080
	}
	mount := e.MountPath
	if mount == "" {
		mount = inferencev1.DefaultModelMountPath
	}
	// The catalog's variables, then additionalConfigs, then environmentVariables: a later one
	// of the same name wins.
	env := slices.Clone(e.EnvironmentVariables)
	for _, v := range slices.Concat(s.Model.AdditionalConfigs, s.EnvironmentVariables) {
		ev := corev1.EnvVar{Name: v.Name, Value: v.Value}
		if i := slices.IndexFunc(env, func(x corev1.EnvVar) bool { return x.Name == v.Name }); i >= 0 {
			env[i] = ev
		} else {
			env = append(env, ev)
		}
	}
	resources := *e.Resources.DeepCopy()
	if p := s.Server.AcceleratorPartitionType; p != "" {
		// A MIG slice in place of whole GPUs, as the NVIDIA device plugin's mixed strategy names it.
		resources = withPartition(resources, p)
	}
	m := &model{
		owner:         j,
		kind:          "JumpStartModel",
		source:        *e.Source.DeepCopy(),
		placement:     placement.FromParent(s.Server.InstanceType, nil, nil, s.Tolerations),
		replicas:      ptr.Deref(s.Replicas, 1),
		maxDeployTime: deployTime(s.MaxDeployTimeInSeconds),
		autoscaling:   s.AutoScalingSpec,
		worker: inferencev1.Worker{
			Image: e.Image, Command: e.Command, Args: e.Args, EnvironmentVariables: env, Resources: resources,
			ModelInvocationPort: inferencev1.ModelInvocationPort{ContainerPort: port},
			ModelVolumeMount:    inferencev1.ModelVolumeMount{Name: "model-weights", MountPath: mount},
		},
	}
	m.weights, m.imageCache = caches(s.ModelCacheConfig)
	m.unsupported = unsupportedFields(map[string]bool{
		"sageMakerEndpoint":            s.SageMakerEndpoint != nil && ptr.Deref(s.SageMakerEndpoint.Name, "") != "",
		"server.executionRole":         s.Server.ExecutionRole != "",
		"model.gatedModelDownloadRole": s.Model.GatedModelDownloadRole != "",
	}, &s.HyperPodFeatures)
	return m
}

// withPartition makes the container ask for one MIG slice of the profile (nvidia.com/<profile>)
// in place of whole GPUs.
func withPartition(res corev1.ResourceRequirements, profile string) corev1.ResourceRequirements {
	mig := corev1.ResourceName("nvidia.com/" + profile)
	for _, list := range []*corev1.ResourceList{&res.Limits, &res.Requests} {
		if *list == nil {
			continue
		}
		delete(*list, "nvidia.com/gpu")
	}
	if res.Limits == nil {
		res.Limits = corev1.ResourceList{}
	}
	res.Limits[mig] = resource.MustParse("1")
	if res.Requests != nil {
		res.Requests[mig] = resource.MustParse("1")
	}
	return res
}
