package serving

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/keda"
)

// HyperPod's defaults of autoScalingSpec (its CRD's), for objects stored before a default
// existed: the ScaledObject always carries every value, so that KEDA's own defaults (no
// initial cooldown, at most 100 replicas) never apply.
const (
	defaultMinReplicas       = 1
	defaultMaxReplicas       = 5
	defaultPollingInterval   = 30
	defaultCooldown          = 300
	defaultInitialCooldown   = 300
	defaultScaleDownWindow   = 300
	defaultCollectionPeriod  = 300
	defaultCollectionStart   = 300
	defaultMetricStat        = "Average"
	maxStabilizationWindow   = 3600 // the HPA's bound (kubernetes' MaxStabilizationWindowSeconds)
	sageMakerMetricNamespace = "AWS/SageMaker"
)

// scaledObjectName is a parent's ScaledObject: HyperPod's name for it.
func scaledObjectName(parent string) string { return parent + "-scaled-object" }

// scalePlan is what a parent's autoScalingSpec asks of KEDA.
type scalePlan struct {
	// spec is the ScaledObject's spec; nil when no trigger is left to scale on.
	spec *keda.ScaledObjectSpec
	// left are the triggers that name a metric but cannot work here, each with why and what to
	// use instead.
	left []string
	// dead are the triggers written that read a metric this cluster never has (SageMaker's),
	// each with why and what to use instead; when every trigger is one, the floor is at least 1.
	dead []string
}

// planScaling maps a parent's autoScalingSpec (at spec.autoScalingSpec) onto a ScaledObject
// spec that scales Deployment target. Values HyperPod's schema accepts but KEDA or the HPA
// refuses are errors naming the field: KEDA would store the ScaledObject and then fail to make
// its HPA, out of the parent's sight.
func planScaling(a *inferencev1.AutoScalingSpec, target string, cfg config.OperatorConfiguration) (scalePlan, error) {
	at := field.NewPath("spec", "autoScalingSpec")
	spec, errs := scaledObjectBase(a, target, at)
	var plan scalePlan
	spec.Triggers, errs = plan.triggers(a, at, cfg, errs)
	seen := map[string]bool{}
	for _, t := range spec.Triggers {
		if t.Name != "" && seen[t.Name] {
			errs = append(errs, field.Duplicate(at.Child("triggers", "name"), t.Name))
		}
		seen[t.Name] = true
	}
	if len(errs) > 0 {
		return scalePlan{}, errs.ToAggregate()
	}
	if len(spec.Triggers) == 0 {
		return plan, nil
	}
	if len(plan.dead) == len(spec.Triggers) && *spec.MinReplicaCount == 0 {
		// No trigger can ever be active: at zero, nothing would wake the endpoint.
		spec.MinReplicaCount = ptr.To[int32](1)
		plan.dead = append(plan.dead, "minReplicaCount 0 is kept at 1: no trigger here could wake the endpoint from zero")
	}
	plan.spec = spec
	return plan, nil
}

// scaledObjectBase is the ScaledObject's spec but its triggers: the counts, intervals and the
// HPA's behaviour, with what KEDA or the HPA would refuse of them.
func scaledObjectBase(a *inferencev1.AutoScalingSpec, target string, at *field.Path) (*keda.ScaledObjectSpec, field.ErrorList) {
	var errs field.ErrorList
	spec := &keda.ScaledObjectSpec{
		ScaleTargetRef:        keda.ScaleTarget{APIVersion: "apps/v1", Kind: "Deployment", Name: target},
		MinReplicaCount:       ptr.To(ptr.Deref(a.MinReplicaCount, defaultMinReplicas)),
		MaxReplicaCount:       ptr.To(ptr.Deref(a.MaxReplicaCount, defaultMaxReplicas)),
		PollingInterval:       ptr.To(ptr.Deref(a.PollingInterval, defaultPollingInterval)),
		CooldownPeriod:        ptr.To(ptr.Deref(a.CooldownPeriod, defaultCooldown)),
		InitialCooldownPeriod: ptr.To(ptr.Deref(a.InitialCooldownPeriod, defaultInitialCooldown)),
	}
	up, down := ptr.Deref(a.ScaleUpStabilizationTime, 0), ptr.Deref(a.ScaleDownStabilizationTime, defaultScaleDownWindow)
	spec.Advanced = &keda.AdvancedConfig{HorizontalPodAutoscalerConfig: &keda.HorizontalPodAutoscalerConfig{
		Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
			ScaleUp:   &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(up)},
			ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(down)},
		},
	}}
	if *spec.MaxReplicaCount < 1 {
		errs = append(errs, field.Invalid(at.Child("maxReplicaCount"), *spec.MaxReplicaCount, "must be at least 1: KEDA scales between minReplicaCount and it"))
	}
	if *spec.MinReplicaCount > *spec.MaxReplicaCount {
		errs = append(errs, field.Invalid(at.Child("minReplicaCount"), *spec.MinReplicaCount, fmt.Sprintf("must not exceed maxReplicaCount (%d)", *spec.MaxReplicaCount)))
	}
	if *spec.PollingInterval < 1 {
		errs = append(errs, field.Invalid(at.Child("pollingInterval"), *spec.PollingInterval, "must be at least 1 second: KEDA polls the triggers that often"))
	}
	for _, w := range []struct {
		name string
		v    int32
	}{{"scaleUpStabilizationTime", up}, {"scaleDownStabilizationTime", down}} {
		if w.v > maxStabilizationWindow {
			errs = append(errs, field.Invalid(at.Child(w.name), w.v, "must be at most 3600 seconds: the HorizontalPodAutoscaler KEDA makes refuses a longer stabilization window"))
		}
	}
	return spec, errs
}

// triggers maps the triggers that name a metric, noting in p those that cannot work here.
func (p *scalePlan) triggers(a *inferencev1.AutoScalingSpec, at *field.Path, cfg config.OperatorConfiguration, errs field.ErrorList) ([]keda.ScaleTriggers, field.ErrorList) {
	var out []keda.ScaleTriggers
	cw, cwAt := triggerList(a.CloudWatchTriggerList, a.CloudWatchTrigger, at, "cloudWatchTriggerList", "cloudWatchTrigger")
	for i := range cw {
		t, path := &cw[i], cwAt(i)
		if ptr.Deref(t.MetricName, "") == "" {
			continue // HyperPod's CLI writes a trigger with no metric into every endpoint
		}
		trig, note, terrs := cloudWatchTrigger(t, path, cfg)
		errs = append(errs, terrs...)
		switch {
		case trig != nil && note != "":
			p.dead = append(p.dead, path.String()+": "+note)
			out = append(out, *trig)
		case note != "":
			p.left = append(p.left, path.String()+": "+note)
		case trig != nil:
			out = append(out, *trig)
		}
	}
	pr, prAt := triggerList(a.PrometheusTriggerList, a.PrometheusTrigger, at, "prometheusTriggerList", "prometheusTrigger")
	for i := range pr {
		t, path := &pr[i], prAt(i)
		if ptr.Deref(t.Query, "") == "" {
			continue
		}
		trig, note, terrs := prometheusTrigger(t, path, cfg)
		errs = append(errs, terrs...)
		switch {
		case note != "":
			p.left = append(p.left, path.String()+": "+note)
		case trig != nil:
			out = append(out, *trig)
		}
	}
	return out, errs
}

// triggerList is the triggers of one kind that apply, and each one's path: the list when it
// has any ("takes priority", as HyperPod's CRD says), else the single trigger.
func triggerList[T any](list []T, single *T, at *field.Path, listName, singleName string) ([]T, func(int) *field.Path) {
	if len(list) > 0 {
		return list, func(i int) *field.Path { return at.Child(listName).Index(i) }
	}
	if single != nil {
		return []T{*single}, func(int) *field.Path { return at.Child(singleName) }
	}
	return nil, nil
}

// cloudWatchTrigger maps a CloudWatch trigger onto KEDA's aws-cloudwatch scaler. A trigger
// that cannot work here gives a note instead of a trigger (no region configured); one that
// reads a metric this cluster never has gives both (a SageMaker metric: prewarm registers no
// SageMaker endpoint to publish it).
func cloudWatchTrigger(t *inferencev1.CloudWatchTrigger, at *field.Path, cfg config.OperatorConfiguration) (*keda.ScaleTriggers, string, field.ErrorList) {
	ns := ptr.Deref(t.Namespace, "")
	region := cfg.CloudWatchRegion()
	if region == "" {
		return nil, "no AWS region to read CloudWatch in: set autoscaling.aws.region in prewarm's configuration", nil
	}
	var errs field.ErrorList
	if ns == "" {
		errs = append(errs, field.Required(at.Child("namespace"), "KEDA's aws-cloudwatch scaler needs the metric's namespace"))
	}
	if len(t.Dimensions) == 0 {
		errs = append(errs, field.Required(at.Child("dimensions"), "KEDA's aws-cloudwatch scaler needs at least one dimension"))
	}
	names, values := make([]string, 0, len(t.Dimensions)), make([]string, 0, len(t.Dimensions))
	for i, d := range t.Dimensions {
		if strings.Contains(d.Name, ";") || strings.Contains(d.Value, ";") {
			errs = append(errs, field.Invalid(at.Child("dimensions").Index(i), d.Name+"="+d.Value, "must not contain ';': KEDA joins dimensions with it"))
		}
		names, values = append(names, d.Name), append(values, d.Value)
	}
	if t.TargetValue == nil {
		errs = append(errs, field.Required(at.Child("targetValue"), "the metric's value per replica (or in all) that KEDA scales to"))
	}
	period := ptr.Deref(t.MetricCollectionPeriod, defaultCollectionPeriod)
	if !slices.Contains([]int32{1, 5, 10, 30, 60}, period) && (period <= 0 || period%60 != 0) {
		errs = append(errs, field.Invalid(at.Child("metricCollectionPeriod"), period, "CloudWatch periods are 1, 5, 10, 30, 60 or a multiple of 60 seconds"))
	}
	start := ptr.Deref(t.MetricCollectionStartTime, defaultCollectionStart)
	if period > 0 && (start < 0 || start%period != 0) {
		errs = append(errs, field.Invalid(at.Child("metricCollectionStartTime"), start, fmt.Sprintf("must be a multiple of metricCollectionPeriod (%d)", period)))
	}
	if len(errs) > 0 {
		return nil, "", errs
	}
	trig := &keda.ScaleTriggers{
		Type: "aws-cloudwatch", Name: ptr.Deref(t.Name, ""), UseCachedMetrics: ptr.Deref(t.UseCachedMetrics, true),
		MetricType: metricType(t.MetricType),
		Metadata: map[string]string{
			"namespace":                   ns,
			"metricName":                  *t.MetricName,
			"dimensionName":               strings.Join(names, ";"),
			"dimensionValue":              strings.Join(values, ";"),
			"targetMetricValue":           formatFloat(*t.TargetValue),
			"activationTargetMetricValue": formatFloat(ptr.Deref(t.ActivationTargetValue, 0)),
			"minMetricValue":              formatFloat(ptr.Deref(t.MinValue, 0)),
			"metricStat":                  ptr.Deref(t.MetricStat, defaultMetricStat),
			"metricStatPeriod":            strconv.Itoa(int(period)),
			"metricCollectionTime":        strconv.Itoa(int(start)),
			"awsRegion":                   region,
		},
	}
	awsIdentity(trig, cfg.Autoscaling.AWS.AuthenticationRef)
	if ns == sageMakerMetricNamespace {
		return trig, "the " + sageMakerMetricNamespace + " metrics (" + *t.MetricName + ") exist only for endpoints registered with SageMaker, and these pods are not, " +
			"so KEDA reads no value and never scales up on it: scale on the model server's own metrics with a prometheusTrigger " +
			"(e.g. vllm:num_requests_running), or on a CloudWatch metric your own agent publishes", nil
	}
	return trig, "", nil
}

// prometheusTrigger maps a Prometheus trigger onto KEDA's prometheus scaler. HyperPod's schema
// allows only an Amazon Managed Prometheus workspace, or nothing: nothing is the server the
// operator configures, and a trigger with neither gives a note instead.
func prometheusTrigger(t *inferencev1.PrometheusTrigger, at *field.Path, cfg config.OperatorConfiguration) (*keda.ScaleTriggers, string, field.ErrorList) {
	server, auth := ptr.Deref(t.ServerAddress, ""), cfg.Autoscaling.Prometheus.AuthenticationRef
	region := ampRegion(server)
	if server == "" {
		server = cfg.Autoscaling.Prometheus.ServerAddress
	}
	if server == "" {
		return nil, "no serverAddress, and no Prometheus server to default to: set autoscaling.prometheus.serverAddress in prewarm's configuration", nil
	}
	if t.TargetValue == nil {
		return nil, "", field.ErrorList{field.Required(at.Child("targetValue"), "the query's value per replica (or in all) that KEDA scales to")}
	}
	trig := &keda.ScaleTriggers{
		Type: "prometheus", Name: ptr.Deref(t.Name, ""), UseCachedMetrics: ptr.Deref(t.UseCachedMetrics, true),
		MetricType: metricType(t.MetricType),
		Metadata: map[string]string{
			"serverAddress":       server,
			"query":               *t.Query,
			"threshold":           formatFloat(*t.TargetValue),
			"activationThreshold": formatFloat(ptr.Deref(t.ActivationTargetValue, 0)),
		},
	}
	if ns := ptr.Deref(t.Namespace, ""); ns != "" {
		trig.Metadata["namespace"] = ns
	}
	if h := ptr.Deref(t.CustomHeaders, ""); h != "" {
		trig.Metadata["customHeaders"] = h
	}
	switch {
	case region != "": // an Amazon Managed Prometheus workspace: requests signed with SigV4
		trig.Metadata["awsRegion"] = region
		awsIdentity(trig, cfg.Autoscaling.AWS.AuthenticationRef)
	case auth != nil:
		trig.AuthenticationRef = &keda.AuthenticationRef{Name: auth.Name, Kind: auth.Kind}
	}
	return trig, "", nil
}

// awsIdentity makes KEDA sign a trigger's AWS requests with the configured
// TriggerAuthentication, or else with the keda-operator pod's own identity.
func awsIdentity(t *keda.ScaleTriggers, ref *config.TriggerAuthenticationRef) {
	if ref != nil {
		t.AuthenticationRef = &keda.AuthenticationRef{Name: ref.Name, Kind: ref.Kind}
		return
	}
	t.Metadata["identityOwner"] = "operator"
}

// ampRegion is the region of an Amazon Managed Prometheus workspace URL
// (https://aps-workspaces.<region>.amazonaws.com/workspaces/ws-…), or "".
func ampRegion(server string) string {
	u, err := url.Parse(server)
	if err != nil {
		return ""
	}
	region, ok := strings.CutPrefix(u.Hostname(), "aps-workspaces.")
	if !ok {
		return ""
	}
	region, _, _ = strings.Cut(region, ".")
	return region
}

// metricType is HyperPod's metricType as the HPA names it: "Average" (HyperPod's default) is
// the metric's value per replica, AverageValue.
func metricType(t *string) autoscalingv2.MetricTargetType {
	if ptr.Deref(t, "Average") == "Value" {
		return autoscalingv2.ValueMetricType
	}
	return autoscalingv2.AverageValueMetricType
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// scaling is what a reconcile found of the parent's autoscaling: what it asks, whether KEDA is
// there to do it, and the ScaledObject it has.
type scaling struct {
	// asked: a trigger names a metric or a query (and the configuration leaves autoscaling on).
	asked bool
	// noKEDA: the cluster serves no keda.sh ScaledObject.
	noKEDA bool
	plan   scalePlan
	// invalid is what KEDA or the HPA would refuse of the spec.
	invalid error
	// current is the parent's ScaledObject as stored (nil: none).
	current *keda.ScaledObject
}

// owns reports whether a ScaledObject of the parent's sets its Deployment's replicas: one is
// to be written, or one written before keeps scaling while the spec is refused.
func (sc *scaling) owns(owner metav1.Object) bool {
	switch {
	case !sc.asked || sc.noKEDA:
		return false
	case sc.invalid != nil:
		return sc.current != nil && metav1.IsControlledBy(sc.current, owner)
	}
	return sc.plan.spec != nil && (sc.current == nil || metav1.IsControlledBy(sc.current, owner))
}

// kedaServed reports whether the API server serves KEDA's ScaledObject. Once it has, it is
// remembered: a parent that asks for nothing then costs no discovery call, and only a parent
// that asks, in a cluster where KEDA was not seen yet, looks again (every five minutes).
func (r *Reconciler) kedaServed() (bool, error) {
	if r.kedaSeen.Load() {
		return true, nil
	}
	_, err := r.Client.RESTMapper().RESTMapping(keda.GroupVersion.WithKind("ScaledObject").GroupKind(), keda.GroupVersion.Version)
	switch {
	case apimeta.IsNoMatchError(err):
		return false, nil
	case err != nil:
		return false, err
	}
	r.kedaSeen.Store(true)
	return true, nil
}

// scalingPhase reads what the parent asks of autoscaling and the ScaledObject it has, before
// the Deployment is written: while a ScaledObject scales it, the Deployment's replicas are the
// HPA's, and spec.replicas only its count when it is created.
func (r *Reconciler) scalingPhase(ctx context.Context, s *state) error {
	m := s.m
	sc := &s.scaling
	*sc = scaling{asked: scalingAsked(m.autoscaling) && !r.Config.Autoscaling.Disabled}
	if !sc.asked && !r.kedaSeen.Load() {
		// prewarm writes a ScaledObject only once it has seen KEDA served: there is none to
		// delete, and nothing to look up.
		return nil
	}
	served, err := r.kedaServed()
	if err != nil {
		return err
	}
	sc.noKEDA = !served
	if served {
		so := &keda.ScaledObject{}
		switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.owner.GetNamespace(), Name: scaledObjectName(m.owner.GetName())}, so); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			sc.current = so
		}
	}
	if sc.asked {
		sc.plan, sc.invalid = planScaling(m.autoscaling, m.owner.GetName(), r.Config.OperatorConfiguration)
	}
	return nil
}

// scaledObjectPhase writes the parent's ScaledObject as its autoScalingSpec maps, or deletes it
// when the parent asks for no autoscaling, and reports how KEDA scales the Deployment.
func (r *Reconciler) scaledObjectPhase(ctx context.Context, s *state) error {
	m, sc := s.m, &s.scaling
	name := scaledObjectName(m.owner.GetName())
	mine := sc.current != nil && metav1.IsControlledBy(sc.current, m.owner)
	if !sc.asked || sc.noKEDA || (sc.invalid == nil && sc.plan.spec == nil) {
		return r.unscale(ctx, s, mine)
	}
	if sc.current != nil && !mine {
		s.scalingWarning(inferencev1.ReasonNameConflict,
			conflict("ScaledObject", sc.current, m).message+fmt.Sprintf("; until then spec.replicas (%d) is the count", m.replicas))
		return nil
	}
	if sc.invalid != nil {
		msg := "autoScalingSpec has values KEDA or the HPA would refuse: " + sc.invalid.Error()
		if mine {
			msg += fmt.Sprintf("; ScaledObject %s keeps scaling as it was", name)
		} else {
			msg += fmt.Sprintf("; spec.replicas (%d) is the count", m.replicas)
		}
		s.scalingWarning(inferencev1.ReasonInvalidAutoScaling, msg)
		return nil
	}
	switch {
	case sc.current == nil:
		so := &keda.ScaledObject{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.owner.GetNamespace(),
				Labels: map[string]string{controller.ManagedByLabel: controller.ManagedBy}},
			Spec: *sc.plan.spec,
		}
		if err := controllerutil.SetControllerReference(m.owner, so, r.Client.Scheme()); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, so); err != nil {
			return s.scaledObjectRefused(name, err)
		}
		s.record(controller.EventScaledObjectCreated, "Create", fmt.Sprintf("created ScaledObject %s: %s", name, scaleSummary(sc.plan.spec)))
		sc.current = so
	case !equality.Semantic.DeepEqual(sc.current.Spec, *sc.plan.spec):
		patch := client.MergeFrom(sc.current.DeepCopy())
		sc.current.Spec = *sc.plan.spec
		if err := r.Client.Patch(ctx, sc.current, patch); err != nil {
			return s.scaledObjectRefused(name, err)
		}
	}
	msg := fmt.Sprintf("ScaledObject %s: %s", name, scaleSummary(sc.plan.spec))
	if len(sc.plan.left) > 0 {
		msg += "; left out: " + strings.Join(sc.plan.left, "; ")
	}
	if warm := warmNodes(s.use, s.image); warm != nil && *sc.plan.spec.MaxReplicaCount > int32(len(warm)) {
		msg += fmt.Sprintf("; maxReplicaCount %d is more than the %d nodes that hold the model: replicas past what those nodes fit start on cold nodes", *sc.plan.spec.MaxReplicaCount, len(warm))
	}
	ready := sc.current.Status.Find(keda.ConditionReady)
	switch {
	case len(sc.plan.dead) > 0:
		s.scalingWarning(inferencev1.ReasonMetricUnavailable, msg+"; "+strings.Join(sc.plan.dead, "; "))
	case ready == nil:
		s.condition(inferencev1.ConditionAutoscaling, metav1.ConditionFalse, inferencev1.ReasonScaledObjectNotReady, msg+"; KEDA has not reported on it yet")
	case ready.Status != metav1.ConditionTrue:
		s.condition(inferencev1.ConditionAutoscaling, metav1.ConditionFalse, inferencev1.ReasonScaledObjectNotReady,
			msg+"; KEDA reports it not ready: "+ready.Reason+" "+ready.Message)
	default:
		if hpa := sc.current.Status.HpaName; hpa != "" {
			msg += " (HPA " + hpa + ")"
		}
		s.condition(inferencev1.ConditionAutoscaling, metav1.ConditionTrue, inferencev1.ReasonScaledObjectReady, msg)
	}
	return nil
}

// unscale deletes the parent's ScaledObject when nothing is to scale the Deployment (the parent
// asks for nothing, KEDA is not installed, no trigger can work), and says why.
func (r *Reconciler) unscale(ctx context.Context, s *state, mine bool) error {
	m, sc := s.m, &s.scaling
	name := scaledObjectName(m.owner.GetName())
	if mine && sc.current.DeletionTimestamp.IsZero() {
		if err := r.Client.Delete(ctx, sc.current); client.IgnoreNotFound(err) != nil {
			return err
		}
		s.record(controller.EventScaledObjectDeleted, "Delete",
			fmt.Sprintf("deleted ScaledObject %s: spec.replicas (%d) is the count again", name, m.replicas))
	}
	switch {
	case !sc.asked:
		apimeta.RemoveStatusCondition(&s.status.Conditions, inferencev1.ConditionAutoscaling)
	case sc.noKEDA:
		s.requeue(5 * time.Minute) // KEDA may be installed
		s.scalingWarning(inferencev1.ReasonKEDANotInstalled,
			"autoScalingSpec is scaled by KEDA, which this cluster does not serve (no keda.sh/v1alpha1 ScaledObject): install KEDA "+
				"(helm install keda kedacore/keda --namespace keda --create-namespace, or prewarm's chart with keda.enabled=true); "+
				fmt.Sprintf("until then spec.replicas (%d) is the count", m.replicas))
	default:
		s.scalingWarning(inferencev1.ReasonNoUsableTrigger,
			fmt.Sprintf("no trigger can scale here, so spec.replicas (%d) is the count: %s", m.replicas, strings.Join(sc.plan.left, "; ")))
	}
	return nil
}

// scaleSummary says how a ScaledObject scales, for a condition or an event.
func scaleSummary(spec *keda.ScaledObjectSpec) string {
	types := make([]string, 0, len(spec.Triggers))
	for _, t := range spec.Triggers {
		types = append(types, t.Type)
	}
	return fmt.Sprintf("scales Deployment %s between %d and %d replicas on %d trigger(s) (%s)",
		spec.ScaleTargetRef.Name, *spec.MinReplicaCount, *spec.MaxReplicaCount, len(spec.Triggers), strings.Join(types, ", "))
}

// scaledObjectRefused reports a ScaledObject the API server or KEDA's admission webhook refuses
// on the parent (the spec it maps from must change); any other error is retried.
func (s *state) scaledObjectRefused(name string, err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || (apierrors.IsForbidden(err) && strings.Contains(err.Error(), "admission webhook")) {
		s.scalingWarning(inferencev1.ReasonInvalidAutoScaling,
			fmt.Sprintf("ScaledObject %s is refused: %v; spec.replicas (%d) is the count", name, err, s.m.replicas))
		return nil
	}
	return err
}

// ownScaledObjects has the controller watch its parents' ScaledObjects (KEDA's status on them)
// when KEDA is installed as it starts; installed later, a parent's ScaledObject is read at its
// reconciles (a parent waiting for KEDA is looked at again every five minutes), and watched
// from the controller's next start.
func (r *Reconciler) ownScaledObjects(b *builder.Builder) error {
	served, err := r.kedaServed()
	if err != nil {
		return err
	}
	if served {
		b.Owns(&keda.ScaledObject{}, builder.WithPredicates(scaledObjectChanged))
	}
	return nil
}

// scaledObjectChanged lets through the ScaledObject changes the parent reports: its spec, and
// KEDA's Ready condition and HPA, not the activity times KEDA writes at every poll.
var scaledObjectChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	before, ok1 := e.ObjectOld.(*keda.ScaledObject)
	after, ok2 := e.ObjectNew.(*keda.ScaledObject)
	if !ok1 || !ok2 {
		return true
	}
	return before.Generation != after.Generation || before.Status.HpaName != after.Status.HpaName ||
		!equality.Semantic.DeepEqual(before.Status.Find(keda.ConditionReady), after.Status.Find(keda.ConditionReady)) ||
		!after.DeletionTimestamp.Equal(before.DeletionTimestamp)
}}
