package serving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
)

// reconcileModel does the work shared by every parent kind, writing what it finds into st. A
// problem that only a change of the spec or of the cluster can fix is reported on the parent
// (condition and event) rather than retried in a loop.
func (r *Reconciler) reconcileModel(ctx context.Context, m *model, st *inferencev1.ParentStatus) (ctrl.Result, error) {
	// The pods tolerate what the parent says, and what the operator configuration adds (its
	// own tolerations; those an extended-resource admission gives GPU pods): the caches are
	// for the nodes those pods may run on.
	m.placement.Tolerations = r.Config.Rules().Tolerations(m.placement.Tolerations, append(slices.Clone(m.kubernetes.InitContainers), workerContainer(m))...)
	res, err := r.applyModel(ctx, m, st)
	var p *problem
	if errors.As(err, &p) {
		r.fail(ctx, m, st, p)
		// What blocks may be another object (a Deployment of the same name): look again later.
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	return res, err
}

// applyModel runs the phases in order: what the API server would refuse, the image cache, the
// Hugging Face pin, the weights cache and its gate, the Deployment and Service, the old caches,
// the rollout's status. Each writes what it finds into st.
func (r *Reconciler) applyModel(ctx context.Context, m *model, st *inferencev1.ParentStatus) (ctrl.Result, error) {
	gen := m.owner.GetGeneration()
	st.Replicas = 0
	st.Selector = labels.SelectorFromSet(selector(m)).String()
	if p := r.checkDerived(m); p != nil {
		return ctrl.Result{}, p
	}
	if len(m.unsupported) > 0 {
		msg := "accepted and validated as HyperPod defines them, without effect here: " + joinNames(m.unsupported)
		if prev := apimeta.FindStatusCondition(st.Conditions, inferencev1.ConditionUnsupported); prev == nil || prev.Message != msg {
			transitionEvent(ctx, r.Recorder, m.owner, corev1.EventTypeWarning, controller.EventUnsupportedFields, "Validate", msg)
		}
		setCondition(st, gen, inferencev1.ConditionUnsupported, metav1.ConditionTrue, inferencev1.ReasonFieldsWithoutEffect, msg)
	} else {
		setCondition(st, gen, inferencev1.ConditionUnsupported, metav1.ConditionFalse, inferencev1.ReasonFieldsWithoutEffect, "every field set has its effect")
	}
	imageCache, err := r.imagePhase(ctx, m, st)
	if err != nil {
		return ctrl.Result{}, err
	}

	dep := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.owner.GetNamespace(), Name: m.owner.GetName()}, dep); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		dep = nil
	}
	owned, err := r.ownedCaches(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	if p := r.resolveHF(ctx, m, owned); p != nil {
		r.fail(ctx, m, st, p)
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	}

	use, result, hold, err := r.weightsPhase(ctx, m, st, dep, owned)
	if err != nil {
		return result, err
	}
	if hold {
		st.State = inferencev1.DeploymentPending
		st.DeploymentStatus = nil
		setCondition(st, gen, inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache,
			"the Deployment is created once the weights cache settles")
		return result, nil
	}

	if m.restricted, err = r.restrictedNamespace(ctx, m.owner.GetNamespace()); err != nil {
		return result, err
	}
	tmpl, err := r.podTemplate(m, use, imageCache)
	if err != nil {
		return result, &problem{inferencev1.ReasonSourceNotAllowed, err.Error()}
	}
	if dep, err = r.deploymentPhase(ctx, m, st, dep, tmpl, use); err != nil {
		return result, err
	}
	if err := r.ensureService(ctx, m); err != nil {
		return result, err
	}
	if err := r.removeOldCaches(ctx, m, dep, owned, use); err != nil {
		return result, err
	}
	deadline, err := r.rolloutStatus(ctx, m, st, dep, &tmpl)
	if deadline > 0 && (result.RequeueAfter == 0 || deadline < result.RequeueAfter) {
		result.RequeueAfter = deadline
	}
	return result, err
}

// imagePhase keeps the shared image cache of the parent's image and placement, and lets go of
// others. It never holds the Deployment back.
func (r *Reconciler) imagePhase(ctx context.Context, m *model, st *inferencev1.ParentStatus) (*inferencev1.InferenceImageCache, error) {
	gen := m.owner.GetGeneration()
	var imageCache *inferencev1.InferenceImageCache
	keep := ""
	if m.imageCache {
		if err := controller.AddFinalizer(ctx, r.Client, m.owner, inferencev1.ParentFinalizer); err != nil {
			return nil, err
		}
		ic, err := r.ensureImageCache(ctx, m)
		var p *problem
		switch {
		case errors.As(err, &p):
			// Not this parent's image cache: the parent does without one, and says why.
			st.ImageCacheStatus = nil
			setCondition(st, gen, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, p.reason, p.message)
		case err != nil:
			return nil, err
		default:
			imageCache, keep = ic, ic.Name
			st.ImageCacheStatus = imageRollup(ic)
			if c := apimeta.FindStatusCondition(ic.Status.Conditions, inferencev1.ConditionReady); c != nil {
				setCondition(st, gen, inferencev1.ConditionImageCacheReady, c.Status, c.Reason, c.Message)
			} else {
				setCondition(st, gen, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, inferencev1.ReasonPulling, "the image cache has not reported yet")
			}
		}
	} else {
		st.ImageCacheStatus = nil
		setCondition(st, gen, inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled,
			"modelCacheConfig.imageCache is not enabled; nodes pull the image when a pod lands")
	}
	// References to other image caches (an old image, or imageCache just disabled) go.
	return imageCache, r.releaseImageCaches(ctx, m.uid(), keep)
}

// weightsPhase keeps the parent's weights cache and decides, through its gate, which cache the
// pods read (use), and whether the Deployment waits (hold).
func (r *Reconciler) weightsPhase(ctx context.Context, m *model, st *inferencev1.ParentStatus, dep *appsv1.Deployment, owned []inferencev1.ModelDataCacheConfig) (use *inferencev1.ModelDataCacheConfig, result ctrl.Result, hold bool, err error) {
	gen := m.owner.GetGeneration()
	if m.weights == nil {
		st.WeightsCacheStatus = nil
		why := "modelCacheConfig.weightsCache is not enabled; pods download the model"
		if m.source.ModelSourceType == inferencev1.ModelSourceKubernetesVolume {
			why = "the model is the parent's own volume (modelSourceType kubernetesVolume), mounted as it is: there is nothing to cache"
		}
		setCondition(st, gen, inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled, why)
		setCondition(st, gen, inferencev1.ConditionGated, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled, "no weights cache to wait for")
		return nil, result, false, nil
	}
	if ok, why := r.Config.CacheRootAllowed(m.weights.HostPath); !ok {
		st.WeightsCacheStatus = nil
		setCondition(st, gen, inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonHostPathNotAllowed, why)
		return nil, result, false, &problem{inferencev1.ReasonHostPathNotAllowed,
			why + "; nothing is cached or deployed until modelCacheConfig.weightsCache.hostPath is an allowed root"}
	}
	cache, err := r.ensureCache(ctx, m, owned)
	if err != nil {
		return nil, result, false, err
	}
	if !slices.ContainsFunc(owned, func(c inferencev1.ModelDataCacheConfig) bool { return c.UID == cache.UID }) {
		controller.Event(r.Recorder, m.owner, corev1.EventTypeNormal, controller.EventCacheCreated, "Create",
			fmt.Sprintf("weights cache %s: %s under %s on every target node", cache.Name, sourceName(cache), cache.Spec.HostPath))
	}
	st.WeightsCacheStatus = &inferencev1.WeightsCacheRollup{
		Name: cache.Name, State: cache.Status.State, TargetNodes: cache.Status.TargetNodes, ReadyNodes: cache.Status.ReadyNodes,
	}
	if ready := apimeta.FindStatusCondition(cache.Status.Conditions, inferencev1.ConditionReady); ready != nil {
		status := metav1.ConditionFalse
		if cache.Status.State == inferencev1.CacheReady {
			status = metav1.ConditionTrue
		}
		setCondition(st, gen, inferencev1.ConditionWeightsCacheReady, status, ready.Reason, ready.Message)
	} else {
		setCondition(st, gen, inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache, "the cache has not reported yet")
	}

	g := r.gate(cache)
	active := activeCache(dep, owned)
	switch {
	case g.open:
		if prev := apimeta.FindStatusCondition(st.Conditions, inferencev1.ConditionGated); prev == nil || prev.Status != metav1.ConditionFalse {
			transitionEvent(ctx, r.Recorder, m.owner, corev1.EventTypeNormal, g.reason, "Gate", g.message)
		}
		setCondition(st, gen, inferencev1.ConditionGated, metav1.ConditionFalse, g.reason, g.message)
		return cache, result, false, nil
	case active != nil:
		// Keep serving from the old cache until the new one settles.
		setCondition(st, gen, inferencev1.ConditionGated, metav1.ConditionTrue, g.reason,
			fmt.Sprintf("the pods stay on cache %s until %s settles: %s", active.Name, cache.Name, g.message))
		result.RequeueAfter = g.wait
		return active, result, false, nil
	}
	// No Deployment yet: hold it back. A Deployment without a cache (weightsCache just
	// enabled) keeps downloading in its pods until the cache settles.
	setCondition(st, gen, inferencev1.ConditionGated, metav1.ConditionTrue, g.reason, g.message)
	result.RequeueAfter = g.wait
	return nil, result, dep == nil, nil
}

// deploymentPhase creates the Deployment with tmpl, or brings the parent's own Deployment to it;
// it never touches one the parent does not own.
func (r *Reconciler) deploymentPhase(ctx context.Context, m *model, st *inferencev1.ParentStatus, dep *appsv1.Deployment, tmpl corev1.PodTemplateSpec, use *inferencev1.ModelDataCacheConfig) (*appsv1.Deployment, error) {
	log := ctrl.LoggerFrom(ctx)
	want := r.deployment(m, tmpl)
	switch {
	case dep == nil:
		if err := controllerutil.SetControllerReference(m.owner, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		want.Annotations[controller.RolloutStartedAnnotation] = r.Now().UTC().Format(time.RFC3339)
		if err := r.Client.Create(ctx, want); err != nil {
			return nil, refused("Deployment", want.Name, err)
		}
		log.Info("created Deployment", "deployment", want.Name, "weightsCache", want.Spec.Template.Annotations[controller.WeightsCacheAnnotation])
		if use != nil {
			r.Metrics.GateOpened(r.Now().Sub(use.CreationTimestamp.Time).Seconds())
		}
		controller.Event(r.Recorder, m.owner, corev1.EventTypeNormal, controller.EventDeploymentCreated, "Create",
			fmt.Sprintf("created Deployment %s (%s)", want.Name, gateNote(st)))
		return want, nil
	case !metav1.IsControlledBy(dep, m.owner):
		return nil, conflict("Deployment", dep, m)
	case dep.Annotations[controller.TemplateHashAnnotation] != want.Annotations[controller.TemplateHashAnnotation] ||
		ptr.Deref(dep.Spec.Replicas, 1) != m.replicas:
		patch := client.MergeFrom(dep.DeepCopy())
		before := dep.Spec.Template.Annotations[controller.WeightsCacheAnnotation]
		if dep.Annotations == nil {
			dep.Annotations = map[string]string{}
		}
		if dep.Annotations[controller.TemplateHashAnnotation] != want.Annotations[controller.TemplateHashAnnotation] {
			dep.Annotations[controller.RolloutStartedAnnotation] = r.Now().UTC().Format(time.RFC3339)
		}
		dep.Annotations[controller.TemplateHashAnnotation] = want.Annotations[controller.TemplateHashAnnotation]
		dep.Spec.Replicas = want.Spec.Replicas
		dep.Spec.Template = want.Spec.Template
		if err := r.Client.Patch(ctx, dep, patch); err != nil {
			return nil, refused("Deployment", dep.Name, err)
		}
		log.Info("updated Deployment", "deployment", dep.Name, "replicas", m.replicas, "weightsCache", tmpl.Annotations[controller.WeightsCacheAnnotation])
		if after := tmpl.Annotations[controller.WeightsCacheAnnotation]; after != before {
			controller.Event(r.Recorder, m.owner, corev1.EventTypeNormal, controller.EventRollStarted, "Update",
				fmt.Sprintf("Deployment %s rolls from weights cache %q to %q", dep.Name, before, after))
		}
	}
	return dep, nil
}

// removeOldCaches deletes the parent's caches that no pod of the Deployment reads any more.
func (r *Reconciler) removeOldCaches(ctx context.Context, m *model, dep *appsv1.Deployment, owned []inferencev1.ModelDataCacheConfig, use *inferencev1.ModelDataCacheConfig) error {
	if !rolledOut(dep) {
		return nil
	}
	for i := range owned {
		c := &owned[i]
		if (use != nil && c.UID == use.UID) || (m.weights != nil && c.Labels[controller.CacheKeyLabel] == cacheKey(m)) || !c.DeletionTimestamp.IsZero() {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("removing a cache the pods no longer read", "cache", c.Name)
		controller.Event(r.Recorder, m.owner, corev1.EventTypeNormal, controller.EventOldCacheRemoved, "Delete",
			fmt.Sprintf("every pod runs the new template; removing weights cache %s from every node", c.Name))
		if err := r.Client.Delete(ctx, c, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// rolloutStatus reports the Deployment's rollout, and why its pods cannot start when that is
// known. A rollout that takes longer than maxDeployTimeInSeconds is reported failed; until then,
// deadline is the time left.
func (r *Reconciler) rolloutStatus(ctx context.Context, m *model, st *inferencev1.ParentStatus, dep *appsv1.Deployment, tmpl *corev1.PodTemplateSpec) (deadline time.Duration, err error) {
	gen := m.owner.GetGeneration()
	st.Replicas = dep.Status.Replicas
	defer func() { st.DeploymentStatus = deploymentRollup(dep, st.State, st.DeploymentStatus, r.Now()) }()
	if rolledOut(dep) && dep.Status.AvailableReplicas >= m.replicas {
		st.State = inferencev1.DeploymentComplete
		setCondition(st, gen, inferencev1.ConditionReady, metav1.ConditionTrue, inferencev1.ReasonDeploymentCreated,
			fmt.Sprintf("Deployment %s has %d of %d pods available", dep.Name, dep.Status.AvailableReplicas, m.replicas))
		return 0, nil
	}
	st.State = inferencev1.DeploymentInProgress
	setCondition(st, gen, inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonDeploymentCreated,
		fmt.Sprintf("Deployment %s is rolling out: %d of %d pods updated, %d available",
			dep.Name, dep.Status.UpdatedReplicas, m.replicas, dep.Status.AvailableReplicas))
	p, err := r.rolloutProblem(ctx, dep, tmpl)
	if err != nil {
		return 0, err
	}
	if p != nil {
		r.fail(ctx, m, st, p)
		return 0, nil
	}
	started, err := time.Parse(time.RFC3339, dep.Annotations[controller.RolloutStartedAnnotation])
	if err != nil {
		return 0, nil // a Deployment of an earlier version: its next template change starts the clock
	}
	left := started.Add(m.maxDeployTime).Sub(r.Now())
	if left > 0 {
		return left, nil
	}
	r.fail(ctx, m, st, &problem{inferencev1.ReasonDeploymentTimeout, fmt.Sprintf(
		"Deployment %s has not rolled out within maxDeployTimeInSeconds (%s since %s): %d of %d pods updated, %d available",
		dep.Name, m.maxDeployTime, started.UTC().Format(time.RFC3339), dep.Status.UpdatedReplicas, m.replicas, dep.Status.AvailableReplicas)})
	return 0, nil
}

// deploymentRollup is the Deployment in HyperPod's deploymentStatus shape: its status, and its
// latest condition's reason and message. lastUpdated moves only when something else does, so
// that an unchanged Deployment costs no status write.
func deploymentRollup(dep *appsv1.Deployment, state inferencev1.DeploymentState, prev *inferencev1.DeploymentStatus, now time.Time) *inferencev1.DeploymentStatus {
	s := dep.Status
	ds := &inferencev1.DeploymentStatus{
		Name: dep.Name, LastUpdated: metav1.NewTime(now), DeploymentObjectOverallState: string(state),
		Status: &inferencev1.DeploymentObjectStatus{
			ObservedGeneration: s.ObservedGeneration, Replicas: s.Replicas, UpdatedReplicas: s.UpdatedReplicas,
			ReadyReplicas: s.ReadyReplicas, AvailableReplicas: s.AvailableReplicas, UnavailableReplicas: s.UnavailableReplicas,
			TerminatingReplicas: s.TerminatingReplicas, CollisionCount: s.CollisionCount,
		},
	}
	var latest *appsv1.DeploymentCondition
	for i := range s.Conditions {
		c := &s.Conditions[i]
		ds.Status.Conditions = append(ds.Status.Conditions, inferencev1.DeploymentObjectCondition{
			Type: string(c.Type), Status: string(c.Status), LastUpdateTime: ptr.To(c.LastUpdateTime), LastTransitionTime: ptr.To(c.LastTransitionTime),
			Reason: c.Reason, Message: c.Message,
		})
		if latest == nil || c.LastUpdateTime.After(latest.LastUpdateTime.Time) {
			latest = c
		}
	}
	if latest != nil {
		ds.Reason, ds.Message = latest.Reason, latest.Message
	}
	if prev != nil {
		was := prev.DeepCopy()
		was.LastUpdated = ds.LastUpdated
		if equality.Semantic.DeepEqual(was, ds) {
			ds.LastUpdated = prev.LastUpdated
		}
	}
	return ds
}

// imageRollup is the image cache in HyperPod's imageCacheStatus shape.
func imageRollup(ic *inferencev1.InferenceImageCache) *inferencev1.ImageCacheRollup {
	r := &inferencev1.ImageCacheRollup{Name: ic.Name, Namespace: ic.Namespace,
		ReadyNodes: ic.Status.CachedNodes, TargetNodes: ic.Status.TargetNodes}
	switch ic.Status.Phase {
	case inferencev1.ImageComplete:
		r.State = inferencev1.ImageCacheStateReady
	case inferencev1.ImagePulling:
		r.State = inferencev1.ImageCacheStateDownloading
	case inferencev1.ImageFailed:
		r.State = inferencev1.ImageCacheStateFailed
		if ic.Status.CachedNodes > 0 {
			r.State = inferencev1.ImageCacheStatePartiallyReady
		}
	default:
		r.State = inferencev1.ImageCacheStatePending
	}
	if c := apimeta.FindStatusCondition(ic.Status.Conditions, inferencev1.ConditionReady); c != nil {
		r.Message = c.Message
	}
	return r
}

// activeCache is the cache the Deployment's pod template reads, if it is one of owned.
func activeCache(dep *appsv1.Deployment, owned []inferencev1.ModelDataCacheConfig) *inferencev1.ModelDataCacheConfig {
	if dep == nil {
		return nil
	}
	name := dep.Spec.Template.Annotations[controller.WeightsCacheAnnotation]
	for i := range owned {
		if owned[i].Name == name && owned[i].DeletionTimestamp.IsZero() {
			return &owned[i]
		}
	}
	return nil
}

// rolledOut reports whether every pod of the Deployment runs its current template.
func rolledOut(dep *appsv1.Deployment) bool {
	want := ptr.Deref(dep.Spec.Replicas, 1)
	s := dep.Status
	return s.ObservedGeneration >= dep.Generation && s.UpdatedReplicas == want && s.Replicas == want
}

func (r *Reconciler) ensureService(ctx context.Context, m *model) error {
	want := r.service(m)
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), svc)
	if apierrors.IsNotFound(err) {
		if err := controllerutil.SetControllerReference(m.owner, want, r.Client.Scheme()); err != nil {
			return err
		}
		return refused("Service", want.Name, r.Client.Create(ctx, want))
	}
	if err != nil {
		return err
	}
	if !metav1.IsControlledBy(svc, m.owner) {
		return conflict("Service", svc, m)
	}
	if len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Port == want.Spec.Ports[0].Port && svc.Spec.Ports[0].Name == want.Spec.Ports[0].Name {
		return nil
	}
	patch := client.MergeFrom(svc.DeepCopy())
	svc.Spec.Ports = want.Spec.Ports
	svc.Spec.Selector = want.Spec.Selector
	return refused("Service", svc.Name, r.Client.Patch(ctx, svc, patch))
}

// gateNote says, for an event, why the gate let the Deployment through.
func gateNote(st *inferencev1.ParentStatus) string {
	if c := apimeta.FindStatusCondition(st.Conditions, inferencev1.ConditionGated); c != nil {
		return c.Reason + ": " + c.Message
	}
	return "no weights cache"
}

// sourceName names a cache's source for people.
func sourceName(c *inferencev1.ModelDataCacheConfig) string {
	s := c.Spec.ModelSourceConfig
	switch {
	case s.S3Storage != nil:
		return "s3://" + s.S3Storage.BucketName + "/" + s.ModelLocation
	case s.HuggingFaceModel != nil:
		return "hf://" + s.HuggingFaceModel.ModelID + "@" + s.HuggingFaceModel.CommitSHA
	}
	return string(s.ModelSourceType) + " " + s.ModelLocation
}
