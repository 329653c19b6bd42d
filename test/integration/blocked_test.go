package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// Objects the API accepts but that prewarm can never serve as written say why on the parent,
// with a reason, instead of only in the controller's log, and nothing of someone else's is
// overwritten: reconciled against the real API server, whose own validation of the derived
// Deployment and Service is the reference.
func TestParentsThatCannotWorkSayWhy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := server.Client
	rc := newReconcilers(t, ctx, "blocked-operator", "blocked")

	pss := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "blocked-pss", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}
	if err := c.Create(ctx, pss); err != nil {
		t.Fatal(err)
	}
	// Someone else's Deployment, named like a parent.
	theirs := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "blocked", Name: "taken"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "theirs"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "theirs"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "theirs:v1"}}},
			},
		},
	}
	if err := c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}

	// Environment variable names beginning with a digit: Kubernetes 1.32 and later take them,
	// older servers refuse them, and the refusal is quoted on the parent.
	envDigitReason, envDigitMessage, envDigitDeployment := inferencev1.ReasonDeploymentCreated, "rolling out", true
	if kubeMinor(t) < 32 {
		envDigitReason, envDigitMessage, envDigitDeployment = inferencev1.ReasonInvalidSpec, `env[0].name: Invalid value: "1FOO"`, false
	}

	for _, tc := range []struct {
		name, ns   string
		mutate     func(*inferencev1.InferenceEndpointConfig)
		reason     string
		inMessage  string
		deployment bool // the Deployment is created nonetheless
	}{
		{name: "llama.v1", reason: inferencev1.ReasonInvalidSpec, inMessage: `"llama.v1" is not a valid Service name`},
		{name: strings.Repeat("a", 64), reason: inferencev1.ReasonInvalidSpec, inMessage: "not a valid Service name"},
		{name: "taken", reason: inferencev1.ReasonNameConflict, inMessage: "Deployment blocked/taken exists and is not this InferenceEndpointConfig's"},
		{name: "volume", reason: inferencev1.ReasonInvalidSpec, inMessage: `"prewarm-cache" is the name of a volume prewarm adds`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.Worker.ModelVolumeMount.Name = "prewarm-cache" }},
		{name: "toleration", reason: inferencev1.ReasonInvalidSpec, inMessage: `tolerations[0].operator "Sometimes"`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: "Sometimes", Effect: corev1.TaintEffectNoSchedule}}
			}},
		{name: "affinity", reason: inferencev1.ReasonInvalidSpec, inMessage: "the node affinity is invalid",
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.InstanceType = ""
				i.Spec.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: "Near", Values: []string{"a"}}}}},
				}}
			}},
		{name: "no-volume", reason: inferencev1.ReasonInvalidSpec, inMessage: `mounts the volume named like worker.modelVolumeMount.name ("model-weights") from spec.kubernetes.volumes, and there is none`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceKubernetesVolume}
			}},
		{name: "init-name", reason: inferencev1.ReasonInvalidSpec, inMessage: `"prewarm-prepare", the name of a container prewarm adds to the pods`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{InitContainers: []corev1.Container{{Name: "prewarm-prepare", Image: "busybox"}}}
			}},
		// The FSx mount prewarm adds is prewarm's access, not the tenant's containers'.
		{name: "init-fsx-mount", reason: inferencev1.ReasonInvalidSpec, inMessage: `mounts "prewarm-fsx", a volume prewarm adds to the pods for its own container`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{InitContainers: []corev1.Container{{Name: "peek", Image: "busybox",
					VolumeMounts: []corev1.VolumeMount{{Name: "prewarm-fsx", MountPath: "/fsx"}}}}}
			}},
		// What HyperPod's schema accepts and no source or node can serve: refused before any
		// Deployment, naming the field and the fix.
		{name: "bad-bucket", reason: inferencev1.ReasonInvalidSpec, inMessage: `s3Storage.bucketName "My_Models" is not an S3 bucket name`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig.S3Storage.BucketName = "My_Models"
			}},
		{name: "url-location", reason: inferencev1.ReasonInvalidSpec, inMessage: `modelLocation "s3://example-bucket/models/x" is a URL`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig.ModelLocation = "s3://example-bucket/models/x"
			}},
		{name: "abs-location", reason: inferencev1.ReasonInvalidSpec, inMessage: `starts with /: an S3 key prefix does not; write "models/x"`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.ModelSourceConfig.ModelLocation = "/models/x" }},
		{name: "dotdot-location", reason: inferencev1.ReasonInvalidSpec, inMessage: `has a .. segment`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig.ModelLocation = "models/../../etc"
			}},
		{name: "fsx-escape", reason: inferencev1.ReasonInvalidSpec, inMessage: `leads out of the file system`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{ModelSourceType: inferencev1.ModelSourceFSx, ModelLocation: "/team-a",
					FSxStorage: &inferencev1.FSxStorage{FileSystemID: "fs-0123456789abcdef0"}}
			}},
		{name: "bad-image", reason: inferencev1.ReasonInvalidSpec, inMessage: `worker.image "vLLM/OpenAI:latest" is not an image reference`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.Worker.Image = "vLLM/OpenAI:latest" }},
		{name: "bad-env", reason: inferencev1.ReasonInvalidSpec, inMessage: `worker.environmentVariables name "A=B"`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Worker.EnvironmentVariables = append(i.Spec.Worker.EnvironmentVariables, corev1.EnvVar{Name: "A=B", Value: "x"})
			}},
		{name: "volume-clash", reason: inferencev1.ReasonInvalidSpec, inMessage: `spec.kubernetes.volumes has a volume named "model-weights"`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{Volumes: []corev1.Volume{{Name: "model-weights",
					VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}}
			}},
		{name: "both-types", reason: inferencev1.ReasonInvalidSpec, inMessage: `instanceType "ml.p5.48xlarge" and instanceTypes ["ml.g5.24xlarge"] are both set`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.InstanceTypes = []string{"ml.g5.24xlarge"} }},
		{name: "ip-bucket", reason: inferencev1.ReasonInvalidSpec, inMessage: `bucketName "192.168.5.4" is formatted as an IP address`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig.S3Storage.BucketName = "192.168.5.4"
			}},
		{name: "root-mount", reason: inferencev1.ReasonInvalidSpec, inMessage: `mountPath "/" would mount the model over the container's root`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.Worker.ModelVolumeMount.MountPath = "/" }},
		{name: "volume-name", reason: inferencev1.ReasonInvalidSpec, inMessage: `worker.modelVolumeMount.name "Model_Weights" is not a volume name Kubernetes accepts`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) { i.Spec.Worker.ModelVolumeMount.Name = "Model_Weights" }},
		{name: "kube-volume-name", reason: inferencev1.ReasonInvalidSpec, inMessage: `spec.kubernetes.volumes[0].name "Scratch_Space" is not a volume name`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{Volumes: []corev1.Volume{{Name: "Scratch_Space",
					VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}}
			}},
		{name: "init-worker", reason: inferencev1.ReasonInvalidSpec, inMessage: `"worker", the name of a container prewarm adds to the pods`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{InitContainers: []corev1.Container{{Name: "worker", Image: "busybox"}}}
			}},
		{name: "prefetch-volume", reason: inferencev1.ReasonInvalidSpec, inMessage: `spec.kubernetes.volumes[0] is named "model-weights-copy", the name of a volume prewarm adds`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.ModelSourceConfig.PrefetchEnabled = ptr.To(true)
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{Volumes: []corev1.Volume{{Name: "model-weights-copy",
					VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}}
			}},
		// What else the API server refuses of the pods is asked of it (a dry run of the
		// Deployment) before the weights cache is made, and quoted.
		{name: "init-mount", reason: inferencev1.ReasonInvalidSpec, inMessage: `initContainers[0].volumeMounts[0].name: Not found: "scratch"`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Kubernetes = &inferencev1.KubernetesSpec{InitContainers: []corev1.Container{{Name: "warm", Image: "busybox",
					VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}}}}
			}},
		{name: "limits", reason: inferencev1.ReasonInvalidSpec, inMessage: `must be less than or equal to cpu limit`,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Worker.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
				i.Spec.Worker.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
			}},
		// What this API server accepts in a pod is not refused, and what it refuses is quoted.
		{name: "env-digit", reason: envDigitReason, inMessage: envDigitMessage, deployment: envDigitDeployment,
			mutate: func(i *inferencev1.InferenceEndpointConfig) {
				i.Spec.Worker.EnvironmentVariables = []corev1.EnvVar{{Name: "1FOO", Value: "x"}}
			}},
		// A namespace that enforces the baseline level admits the pods: their model volume is
		// prewarm's CSI volume, not a hostPath.
		{name: "pss", ns: "blocked-pss", reason: inferencev1.ReasonDeploymentCreated, inMessage: "rolling out", deployment: true},
	} {
		t.Run(tc.reason+"/"+tc.name[:min(len(tc.name), 12)], func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = "blocked"
			}
			iec := builders.MakeInferenceEndpointConfig(ns, tc.name).Obj()
			iec.Spec.ModelName = "m"
			iec.Spec.InstanceType = "ml.p5.48xlarge" // no node of the API server matches: the gate opens
			if tc.mutate != nil {
				tc.mutate(iec)
			}
			if err := c.Create(ctx, iec); err != nil {
				t.Fatalf("the API accepts what HyperPod accepts: %v", err)
			}
			got := rc.endpoint(t, ctx, client.ObjectKeyFromObject(iec))
			cond := meta.FindStatusCondition(got.Status.Conditions, inferencev1.ConditionReady)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != tc.reason || !strings.Contains(cond.Message, tc.inMessage) {
				t.Errorf("Ready condition %+v; want False, %s, saying %q", cond, tc.reason, tc.inMessage)
			}
			dep := &appsv1.Deployment{}
			err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tc.name}, dep)
			switch {
			case tc.name == "taken":
				if err != nil || dep.Spec.Template.Spec.Containers[0].Image != "theirs:v1" || len(dep.OwnerReferences) != 0 {
					t.Errorf("someone else's Deployment was changed: %+v, %v", dep.Spec.Template.Spec.Containers, err)
				}
			case tc.deployment:
				if err != nil {
					t.Errorf("the Deployment was not created: %v", err)
				}
			case !apierrors.IsNotFound(err):
				t.Errorf("a Deployment was made for a parent that cannot work: %v", err)
			}
			// Nor is anything downloaded for it: no weights cache is made.
			caches := &inferencev1.ModelDataCacheConfigList{}
			if err := c.List(ctx, caches, client.InNamespace(ns), client.MatchingLabels{controller.ParentUIDLabel: string(got.UID)}); err != nil {
				t.Fatal(err)
			}
			if !tc.deployment && len(caches.Items) > 0 {
				t.Errorf("weights cache %s was made for a parent that cannot work", caches.Items[0].Name)
			}
		})
	}
}
