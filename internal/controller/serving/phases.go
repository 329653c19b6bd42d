package serving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/pkg/engine"
)

// phases are the steps of a parent's reconcile, in order: what the API server would refuse,
// the image cache, what the parent owns, the Hugging Face pin, the weights cache and its gate,
// the pod template, the autoscaling asked, the Deployment and Service, the KEDA ScaledObject,
// the old caches, the rollout's status. Each
// writes what it finds into the state's status.
func (r *Reconciler) phases() []phase {
	return []phase{
		{r.validatePhase, time.Minute},
		{r.imagePhase, time.Minute},
		{r.readPhase, time.Minute},
		{r.pinPhase, 30 * time.Second},
		{r.weightsPhase, time.Minute},
		{r.templatePhase, time.Minute},
		{r.scalingPhase, time.Minute},
		{r.deploymentPhase, time.Minute},
		{r.servicePhase, time.Minute},
		{r.scaledObjectPhase, time.Minute},
		{r.cleanupPhase, time.Minute},
		{r.rolloutPhase, time.Minute},
	}
}

// complete adds to a serving parent's model what the operator configuration and the namespace
// decide of its pods, before any phase reads it: the pods tolerate what the parent says and what
// the configuration adds (its own tolerations; those an extended-resource admission gives GPU
// pods), and the caches are for the nodes those pods may run on; the pods ask for what the
// namespace's Pod Security level requires.
func (r *Reconciler) complete(ctx context.Context, m *model) error {
	m.placement.Tolerations = r.Config.Rules().Tolerations(m.placement.Tolerations, append(slices.Clone(m.kubernetes.InitContainers), workerContainer(m))...)
	var err error
	m.restricted, err = r.restrictedNamespace(ctx, m.owner.GetNamespace())
	return err
}

// validatePhase refuses what the API server would refuse of the derived objects, and says which
// fields have no effect here.
func (r *Reconciler) validatePhase(_ context.Context, s *state) error {
	m := s.m
	s.status.Replicas = 0
	s.status.Selector = labels.SelectorFromSet(selector(m)).String()
	if p := r.checkDerived(m); p != nil {
		return p
	}
	unsupported := m.unsupported
	if r.Config.Autoscaling.Disabled && scalingAsked(m.autoscaling) {
		unsupported = append(slices.Clone(unsupported), "autoScalingSpec (autoscaling.disabled in prewarm's configuration)")
		slices.Sort(unsupported)
	}
	if len(unsupported) == 0 {
		s.condition(inferencev1.ConditionUnsupported, metav1.ConditionFalse, inferencev1.ReasonFieldsWithoutEffect, "every field set has its effect")
		return nil
	}
	msg := "accepted and validated as HyperPod defines them, without effect here: " + joinNames(unsupported)
	if prev := apimeta.FindStatusCondition(s.status.Conditions, inferencev1.ConditionUnsupported); prev == nil || prev.Message != msg {
		s.events.Tell(corev1.EventTypeWarning, controller.EventUnsupportedFields, "Validate", msg)
	}
	s.condition(inferencev1.ConditionUnsupported, metav1.ConditionTrue, inferencev1.ReasonFieldsWithoutEffect, msg)
	return nil
}

// imagePhase keeps the shared image cache of the parent's image and placement, and lets go of
// others. It never holds the Deployment back.
func (r *Reconciler) imagePhase(ctx context.Context, s *state) error {
	m := s.m
	keep := ""
	if m.imageCache {
		if err := controller.AddFinalizer(ctx, r.Client, m.owner, inferencev1.ParentFinalizer); err != nil {
			return err
		}
		ic, refused, err := r.ensureImageCache(ctx, m)
		var p *problem
		switch {
		case errors.As(err, &p):
			// Not this parent's image cache: the parent does without one, and says why.
			s.condition(inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, p.reason, p.message)
		case err != nil:
			return err
		default:
			s.image, keep = ic, ic.Name
			status, reason, msg := metav1.ConditionFalse, inferencev1.ReasonPulling, "it has not reported yet"
			if c := apimeta.FindStatusCondition(ic.Status.Conditions, inferencev1.ConditionReady); c != nil {
				status, reason, msg = c.Status, c.Reason, c.Message
			}
			msg = imageSummary(ic) + ": " + msg
			if note := refusedNote(refused); note != "" {
				if prev := apimeta.FindStatusCondition(s.status.Conditions, inferencev1.ConditionImageCacheReady); prev == nil || !strings.Contains(prev.Message, note) {
					s.events.Tell(corev1.EventTypeWarning, controller.EventPullSecretRefused, "CopyPullSecrets", note)
				}
				msg += "; " + note
			}
			s.condition(inferencev1.ConditionImageCacheReady, status, reason, msg)
		}
	} else {
		s.condition(inferencev1.ConditionImageCacheReady, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled,
			"modelCacheConfig.imageCache is not enabled; nodes pull the image when a pod lands")
	}
	// References to other image caches (an old image, or imageCache just disabled) go.
	return r.releaseImageCaches(ctx, m.uid(), keep)
}

// readPhase reads the parent's Deployment, if there is one, and its weights caches.
func (r *Reconciler) readPhase(ctx context.Context, s *state) error {
	dep := &appsv1.Deployment{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.m.owner.GetNamespace(), Name: s.m.owner.GetName()}, dep); {
	case apierrors.IsNotFound(err):
		s.dep = nil
	case err != nil:
		return err
	default:
		s.dep = dep
	}
	owned, err := r.ownedCaches(ctx, s.m)
	s.owned = owned
	return err
}

// pinPhase checks a Hugging Face source's token and pins its revision (resolveHF): the phases
// after it read the model with the pinned source.
func (r *Reconciler) pinPhase(ctx context.Context, s *state) error {
	src, p := r.resolveHF(ctx, s.m, s.owned)
	if p != nil {
		return p
	}
	s.m = s.m.withSource(src)
	return nil
}

// weightsPhase keeps the parent's weights cache and decides, through its gate, which cache the
// pods read (s.use), and whether the Deployment waits (s.hold).
func (r *Reconciler) weightsPhase(ctx context.Context, s *state) error {
	m := s.m
	if m.weights == nil {
		why := "modelCacheConfig.weightsCache is not enabled; pods download the model"
		if m.source.ModelSourceType == inferencev1.ModelSourceKubernetesVolume {
			why = "the model is the parent's own volume (modelSourceType kubernetesVolume), mounted as it is: there is nothing to cache"
		}
		s.condition(inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled, why)
		s.condition(inferencev1.ConditionGated, metav1.ConditionFalse, inferencev1.ReasonCacheDisabled, "no weights cache to wait for")
		return nil
	}
	if ok, why := r.Config.CacheRootAllowed(m.weights.HostPath); !ok {
		s.condition(inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonHostPathNotAllowed, why)
		return &problem{inferencev1.ReasonHostPathNotAllowed,
			why + "; nothing is cached or deployed until modelCacheConfig.weightsCache.hostPath is an allowed root"}
	}
	if !hasCache(s.owned, cacheKey(m)) {
		// Nothing is downloaded for a Deployment that cannot be made.
		if err := r.deployable(ctx, s); err != nil {
			return err
		}
	}
	cache, err := r.ensureCache(ctx, m, s.owned)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(s.owned, func(c inferencev1.ModelDataCacheConfig) bool { return c.UID == cache.UID }) {
		s.record(controller.EventCacheCreated, "Create",
			fmt.Sprintf("weights cache %s: %s under %s on every target node", cache.Name, sourceName(cache), cache.Spec.HostPath))
	}
	if ready := apimeta.FindStatusCondition(cache.Status.Conditions, inferencev1.ConditionReady); ready != nil {
		status := metav1.ConditionFalse
		if cache.Status.State == inferencev1.CacheReady {
			status = metav1.ConditionTrue
		}
		s.condition(inferencev1.ConditionWeightsCacheReady, status, ready.Reason, weightsSummary(cache)+": "+ready.Message)
	} else {
		s.condition(inferencev1.ConditionWeightsCacheReady, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache, weightsSummary(cache)+": it has not reported yet")
	}
	carryCapacity(s, cache)
	if p := r.refuseShortfall(cache); p != nil {
		return p
	}
	r.gateCache(s, cache)
	return nil
}

// carryCapacity shows on the parent what its cache found of its target nodes' room and of its
// namespace's quota (CapacityAvailable, WithinBudget), with a Warning event when either turns
// false.
func carryCapacity(s *state, cache *inferencev1.ModelDataCacheConfig) {
	for _, typ := range []string{inferencev1.ConditionCapacityAvailable, inferencev1.ConditionWithinBudget} {
		c := apimeta.FindStatusCondition(cache.Status.Conditions, typ)
		if c == nil {
			apimeta.RemoveStatusCondition(&s.status.Conditions, typ)
			continue
		}
		if prev := apimeta.FindStatusCondition(s.status.Conditions, typ); c.Status == metav1.ConditionFalse && (prev == nil || prev.Status != metav1.ConditionFalse) {
			s.events.Tell(corev1.EventTypeWarning, c.Reason, "Check", fmt.Sprintf("weights cache %s: %s", cache.Name, c.Message))
		}
		s.condition(typ, c.Status, c.Reason, c.Message)
	}
}

// refuseShortfall stops the parent, when the configuration asks for it
// (controller.capacityShortfall: Refuse), while no target node of its cache may hold the model:
// every node that reported its disk is short of room or kept off by the namespace's quota. Its
// pods would all read the model from the source.
func (r *Reconciler) refuseShortfall(cache *inferencev1.ModelDataCacheConfig) *problem {
	c := cache.Status.Capacity
	if r.Config.Controller.CapacityShortfall != config.CapacityShortfallRefuse || c == nil || c.FitNodes > 0 || c.ShortNodes+c.OverBudgetNodes == 0 {
		return nil
	}
	reason, why := inferencev1.ReasonCapacityShortfall, inferencev1.ConditionCapacityAvailable
	if c.ShortNodes == 0 {
		reason, why = inferencev1.ReasonBudgetExceeded, inferencev1.ConditionWithinBudget
	}
	msg := fmt.Sprintf("no target node of weights cache %s may hold the model (%s): %d short of room, %d kept off by the namespace's quota, %d not reported; "+
		"the configuration refuses such parents (controller.capacityShortfall: Refuse): see the %s condition",
		cache.Name, engine.HumanBytes(c.ModelBytes), c.ShortNodes, c.OverBudgetNodes, c.UnknownNodes, why)
	return &problem{reason, msg}
}

// gateCache decides, through cache's gate, which cache the pods read and whether the Deployment
// waits for it.
func (r *Reconciler) gateCache(s *state, cache *inferencev1.ModelDataCacheConfig) {
	g := r.gate(cache)
	active := activeCache(s.dep, s.owned)
	switch {
	case g.open:
		if prev := apimeta.FindStatusCondition(s.status.Conditions, inferencev1.ConditionGated); prev == nil || prev.Status != metav1.ConditionFalse {
			s.events.Tell(corev1.EventTypeNormal, g.reason, "Gate", g.message)
		}
		s.condition(inferencev1.ConditionGated, metav1.ConditionFalse, g.reason, g.message)
		s.use = cache
		return
	case active != nil:
		// Keep serving from the old cache until the new one settles.
		s.condition(inferencev1.ConditionGated, metav1.ConditionTrue, g.reason,
			fmt.Sprintf("the pods stay on cache %s until %s settles: %s", active.Name, cache.Name, g.message))
		s.requeue(g.wait)
		s.use = active
		return
	}
	// No Deployment yet: hold it back. A Deployment without a cache (weightsCache just
	// enabled) keeps downloading in its pods until the cache settles.
	s.condition(inferencev1.ConditionGated, metav1.ConditionTrue, g.reason, g.message)
	s.requeue(g.wait)
	if s.dep == nil {
		s.hold = true
		s.status.State = inferencev1.DeploymentPending
		s.status.DeploymentStatus = nil
		s.condition(inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonWaitingForCache,
			"the Deployment is created once the weights cache settles")
	}
}

// templatePhase builds the pod template of the parent's Deployment.
// A template the parent cannot have is a problem with its own reason (podTemplate); another error
// is retried.
func (r *Reconciler) templatePhase(_ context.Context, s *state) error {
	var err error
	s.tmpl, err = r.podTemplate(s.m, s.use, s.image)
	return err
}

// deploymentPhase creates the Deployment with the pod template, or brings the parent's own
// Deployment to it; it never touches one the parent does not own.
func (r *Reconciler) deploymentPhase(ctx context.Context, s *state) error {
	m, dep, log := s.m, s.dep, ctrl.LoggerFrom(ctx)
	want := r.deployment(m, s.tmpl)
	// While a ScaledObject scales the Deployment, its replicas are the HPA's: spec.replicas is
	// only the count it is created with.
	scaled := s.scaling.owns(m.owner)
	switch {
	case dep == nil:
		if err := controllerutil.SetControllerReference(m.owner, want, r.Client.Scheme()); err != nil {
			return err
		}
		want.Annotations[controller.RolloutStartedAnnotation] = r.Now().UTC().Format(time.RFC3339)
		if err := r.Client.Create(ctx, want); err != nil {
			return refused("Deployment", want.Name, err)
		}
		log.Info("created Deployment", "deployment", want.Name, "weightsCache", want.Spec.Template.Annotations[controller.WeightsCacheAnnotation])
		if s.use != nil {
			r.Metrics.GateOpened(r.Now().Sub(s.use.CreationTimestamp.Time).Seconds())
		}
		s.record(controller.EventDeploymentCreated, "Create",
			fmt.Sprintf("created Deployment %s (%s)", want.Name, gateNote(s.status)))
		s.dep = want
	case !metav1.IsControlledBy(dep, m.owner):
		return conflict("Deployment", dep, m)
	case dep.Annotations[controller.TemplateHashAnnotation] != want.Annotations[controller.TemplateHashAnnotation] ||
		(!scaled && ptr.Deref(dep.Spec.Replicas, 1) != m.replicas):
		patch := client.MergeFrom(dep.DeepCopy())
		before := dep.Spec.Template.Annotations[controller.WeightsCacheAnnotation]
		if dep.Annotations == nil {
			dep.Annotations = map[string]string{}
		}
		if dep.Annotations[controller.TemplateHashAnnotation] != want.Annotations[controller.TemplateHashAnnotation] {
			dep.Annotations[controller.RolloutStartedAnnotation] = r.Now().UTC().Format(time.RFC3339)
		}
		dep.Annotations[controller.TemplateHashAnnotation] = want.Annotations[controller.TemplateHashAnnotation]
		if !scaled {
			dep.Spec.Replicas = want.Spec.Replicas
		}
		dep.Spec.Template = want.Spec.Template
		if err := r.Client.Patch(ctx, dep, patch); err != nil {
			return refused("Deployment", dep.Name, err)
		}
		log.Info("updated Deployment", "deployment", dep.Name, "replicas", ptr.Deref(dep.Spec.Replicas, 1), "scaledByKEDA", scaled, "weightsCache", s.tmpl.Annotations[controller.WeightsCacheAnnotation])
		if after := s.tmpl.Annotations[controller.WeightsCacheAnnotation]; after != before {
			s.record(controller.EventRollStarted, "Update",
				fmt.Sprintf("Deployment %s rolls from weights cache %q to %q", dep.Name, before, after))
		}
	}
	return nil
}

// cleanupPhase deletes the parent's caches that no pod of the Deployment reads any more.
func (r *Reconciler) cleanupPhase(ctx context.Context, s *state) error {
	if !rolledOut(s.dep) {
		return nil
	}
	m := s.m
	for i := range s.owned {
		c := &s.owned[i]
		if (s.use != nil && c.UID == s.use.UID) || (m.weights != nil && c.Labels[controller.CacheKeyLabel] == cacheKey(m)) || !c.DeletionTimestamp.IsZero() {
			continue
		}
		ctrl.LoggerFrom(ctx).Info("removing a cache the pods no longer read", "cache", c.Name)
		s.record(controller.EventOldCacheRemoved, "Delete",
			fmt.Sprintf("every pod runs the new template; removing weights cache %s from every node", c.Name))
		if err := r.Client.Delete(ctx, c, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// rolloutPhase reports the Deployment's rollout, and why its pods cannot start when that is
// known. A rollout that takes longer than maxDeployTimeInSeconds is reported failed; until then,
// the parent is looked at again when the time is up.
func (r *Reconciler) rolloutPhase(ctx context.Context, s *state) error {
	m, dep := s.m, s.dep
	s.status.Replicas = dep.Status.Replicas
	s.rollout = true
	// The Deployment's count: spec.replicas, or the HPA's while a ScaledObject scales it.
	want := ptr.Deref(dep.Spec.Replicas, 1)
	// Where the pods run, warm or cold: whether the caches cover where they land.
	w, err := r.podWarmth(ctx, s)
	if err != nil {
		return err
	}
	r.recordWarmth(m, w)
	where := ""
	if w != nil && w.warm+w.cold+w.unscheduled > 0 {
		where = "; " + w.String()
	}
	if rolledOut(dep) && dep.Status.AvailableReplicas >= want {
		s.status.State = inferencev1.DeploymentComplete
		s.condition(inferencev1.ConditionReady, metav1.ConditionTrue, inferencev1.ReasonDeploymentCreated,
			fmt.Sprintf("Deployment %s has %d of %d pods available%s", dep.Name, dep.Status.AvailableReplicas, want, where))
		return nil
	}
	s.status.State = inferencev1.DeploymentInProgress
	s.condition(inferencev1.ConditionReady, metav1.ConditionFalse, inferencev1.ReasonDeploymentCreated,
		fmt.Sprintf("Deployment %s is rolling out: %d of %d pods updated, %d available%s",
			dep.Name, dep.Status.UpdatedReplicas, want, dep.Status.AvailableReplicas, where))
	switch p, err := r.rolloutProblem(ctx, dep, &s.tmpl); {
	case err != nil:
		return err
	case p != nil:
		return p
	}
	started, err := time.Parse(time.RFC3339, dep.Annotations[controller.RolloutStartedAnnotation])
	if err != nil {
		return nil // a Deployment of an earlier version: its next template change starts the clock
	}
	if left := started.Add(m.maxDeployTime).Sub(r.Now()); left > 0 {
		s.requeue(left)
		return nil
	}
	return &problem{inferencev1.ReasonDeploymentTimeout, fmt.Sprintf(
		"Deployment %s has not rolled out within maxDeployTimeInSeconds (%s since %s): %d of %d pods updated, %d available",
		dep.Name, m.maxDeployTime, started.UTC().Format(time.RFC3339), dep.Status.UpdatedReplicas, want, dep.Status.AvailableReplicas)}
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

// weightsSummary names the parent's weights cache with its state, as the WeightsCacheReady
// condition's message begins; the cache's own message, with the counts, follows. (HyperPod's
// clients read conditions; a status field of prewarm's own would make them read no status.)
func weightsSummary(c *inferencev1.ModelDataCacheConfig) string {
	state := c.Status.State
	if state == "" {
		state = inferencev1.CachePending
	}
	return fmt.Sprintf("weights cache %s %s", c.Name, state)
}

// imageSummary names the parent's image cache with its phase, as the
// ImageCacheReady condition's message begins.
func imageSummary(ic *inferencev1.InferenceImageCache) string {
	phase := ic.Status.Phase
	if phase == "" {
		phase = inferencev1.ImagePending
	}
	return fmt.Sprintf("image cache %s/%s %s", ic.Namespace, ic.Name, phase)
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

// servicePhase creates the parent's Service, or brings its own to the port it serves on; it
// never touches one the parent does not own.
func (r *Reconciler) servicePhase(ctx context.Context, s *state) error {
	m := s.m
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
