package realnode

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

const namedNS = "tenant-named"

// namedDeployment is a Deployment as a user writes one for a model server of their own stack,
// not prewarm's: one replica on node, the model from prewarm's CSI volume naming the cache by
// its ModelWeightsCacheConfig's name, the server given the model's path as an argument.
func namedDeployment(name, node, cache string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namedNS, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{corev1.LabelHostname: node},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: "server", Image: serverImage, Command: []string{"/modelserver"}, Args: []string{"--model=/models/llama"},
						Ports:        []corev1.ContainerPort{{ContainerPort: 8000}},
						VolumeMounts: []corev1.VolumeMount{{Name: "model", MountPath: "/models/llama", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "model", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
						Driver: prewarmv1alpha1.CSIDriverName, ReadOnly: ptr.To(true),
						VolumeAttributes: map[string]string{prewarmv1alpha1.VolumeAttributeCache: cache},
					}}}},
				},
			},
		},
	}
}

// deploymentsByName warms the seed's model with a standalone ModelWeightsCacheConfig on the
// seed's instance type, and serves it from Deployments written by hand that name the cache by
// name: on a node it warmed, and on the node of another instance type, which its pod's demand
// makes a target (the kubelet's real mount, the model server reading every byte); a pod of
// another namespace naming it is refused, saying why. The cold node lets the cache go with its
// Deployment.
func (e *env) deploymentsByName(t *testing.T, ctx context.Context) {
	t.Helper()
	seed := &inferencev1.InferenceEndpointConfig{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "example-model"}, seed); err != nil {
		t.Fatal(err)
	}
	if err := e.C.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namedNS}}); err != nil {
		t.Fatal(err)
	}
	mw := &inferencev1.ModelWeightsCacheConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: namedNS, Name: "llama-warm"},
		Spec: inferencev1.ModelWeightsCacheConfigSpec{
			ModelSourceConfig: *seed.Spec.ModelSourceConfig.DeepCopy(),
			NodeSelector:      map[string]string{corev1.LabelInstanceTypeStable: seed.Spec.InstanceType},
		},
	}
	if err := e.C.Client.Create(ctx, mw); err != nil {
		t.Fatal(err)
	}
	err := testutil.Until(ctx, 5*time.Minute, func() error {
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(mw), mw); err != nil {
			return err
		}
		if mw.Status.State != string(inferencev1.CacheReady) || mw.Status.ReadyNodes != 2 {
			return fmt.Errorf("ModelWeightsCacheConfig %s: %+v, want Ready on the 2 warm nodes", mw.Name, mw.Status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Namespace: namedNS, Name: mw.Status.CacheName}, cache); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*appsv1.Deployment{namedDeployment("server-warm", warm1, mw.Name), namedDeployment("server-cold", cold, mw.Name)} {
		e.serveByName(t, ctx, d, mw.Name, string(cache.UID))
	}

	// The vLLM production stack's Deployment, as its chart renders it from the docs' values.
	e.vllmStack(t, ctx, seed.Spec.InstanceType, mw, string(cache.UID))

	// Another namespace's pod naming the cache: its own namespace has none of that name.
	intruder := namedDeployment("intruder", warm1, mw.Name).Spec.Template
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: "named-intruder"}, Spec: intruder.Spec}
	if err := e.C.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	note := e.waitEvent(t, ctx, p, agent.EventCacheRefused, "namespace "+otherNS+" has no ModelWeightsCacheConfig "+mw.Name)
	if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	if realseed.ContainerRunning(p) {
		t.Errorf("%s/%s runs with another namespace's cache", p.Namespace, p.Name)
	}
	t.Logf("pod of %s naming %s's cache by name: %s", otherNS, namedNS, note)
	e.deletePod(t, ctx, p)

	// The cold node held the cache for its pod only.
	if err := e.C.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namedNS, Name: "server-cold"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitCacheGone(ctx, cold, string(cache.UID)); err != nil {
		t.Fatal(err)
	}
	if err := e.C.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namedNS, Name: "server-warm"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.C.Client.Delete(ctx, mw); err != nil {
		t.Fatal(err)
	}
}
