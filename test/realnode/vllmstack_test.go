package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

// vllmStackDeployment is the Deployment the vLLM production stack's chart renders from the
// docs' values (testdata/vllm-stack-llama.yaml), checked to carry the docs' volume and mount as
// they are, and changed only where this machine cannot run it: the model server in place of
// vLLM (its image and command: no GPU here), no RuntimeClass (none is installed), requests
// that fit the nodes, the image pulled if not present, the namespace and instance type of the
// run. The volume naming the cache stays as the chart rendered it.
func vllmStackDeployment(t *testing.T, instanceType string) *appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vllm-stack-llama.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	if err := yaml.UnmarshalStrict(b, d); err != nil {
		t.Fatal(err)
	}
	// The docs' values are what the chart rendered: their volume and mount are in the pod.
	spec := docValues(t, "values-vllm-stack.yaml")["servingEngineSpec"].(map[string]any)["modelSpec"].([]any)[0].(map[string]any)
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	for _, c := range []struct {
		from any
		into any
	}{{spec["extraVolumes"], &volumes}, {spec["extraVolumeMounts"], &mounts}} {
		j, err := json.Marshal(c.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(j, c.into); err != nil {
			t.Fatal(err)
		}
	}
	pod := &d.Spec.Template.Spec
	if !equality.Semantic.DeepEqual(pod.Volumes, volumes) || len(pod.Containers) != 1 || !equality.Semantic.DeepEqual(pod.Containers[0].VolumeMounts, mounts) {
		t.Fatalf("testdata/vllm-stack-llama.yaml is not what docs/operations.md's values render: volumes %+v, mounts %+v; the docs say %+v, %+v",
			pod.Volumes, pod.Containers[0].VolumeMounts, volumes, mounts)
	}

	d.Namespace = namedNS
	pod.RuntimeClassName = nil
	c := &pod.Containers[0]
	c.Image, c.ImagePullPolicy = serverImage, corev1.PullIfNotPresent
	c.Command = []string{"/modelserver", "--model=" + mounts[0].MountPath, "--port=8000"}
	c.Resources.Requests[corev1.ResourceCPU], c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse("10m"), resource.MustParse("32Mi")
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	terms[0].MatchExpressions[0].Values = []string{instanceType}
	pod.TerminationGracePeriodSeconds = new(int64)
	return d
}

// vllmStack runs the vLLM production stack's Deployment, as its chart renders it from the docs'
// values, naming the standalone cache mw by name: both its replicas (on the warm nodes of the
// cache's instance type) become Ready with their model servers having read every byte from the
// cache prewarm mounted.
func (e *env) vllmStack(t *testing.T, ctx context.Context, instanceType string, mw client.Object, cacheUID string) {
	t.Helper()
	d := vllmStackDeployment(t, instanceType)
	if got := d.Spec.Template.Spec.Volumes[0].CSI; got == nil || got.Driver != prewarmv1alpha1.CSIDriverName || got.VolumeAttributes[prewarmv1alpha1.VolumeAttributeCache] != mw.GetName() {
		t.Fatalf("the chart's volume %+v does not name the cache %s", d.Spec.Template.Spec.Volumes[0], mw.GetName())
	}
	e.serveByName(t, ctx, d, mw.GetName(), cacheUID)
	if err := e.C.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namedNS, Name: d.Name}}); err != nil {
		t.Fatal(err)
	}
}

// serveByName creates d, a Deployment of namedNS whose pods name the cache by name, and waits
// until every replica is Ready, its model server having read the whole model from the cache
// (uid) prewarm mounted; it logs where each runs and how it was mounted.
func (e *env) serveByName(t *testing.T, ctx context.Context, d *appsv1.Deployment, cache, uid string) {
	t.Helper()
	if err := e.C.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	err := testutil.Until(ctx, 5*time.Minute, func() error {
		pods := &corev1.PodList{}
		if err := e.C.Client.List(ctx, pods, client.InNamespace(namedNS), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
			return err
		}
		ready = ready[:0]
		for _, p := range pods.Items {
			if realseed.PodReady(&p) {
				ready = append(ready, p)
			}
		}
		if len(ready) != int(*d.Spec.Replicas) {
			return fmt.Errorf("%d of %s's %d replicas Ready", len(ready), d.Name, *d.Spec.Replicas)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, namedNS))
	}
	want := fmt.Sprintf("%d files, %d bytes verified", len(e.Model), realseed.ModelBytes(e.Model))
	for i := range ready {
		p := &ready[i]
		body := e.health(t, ctx, p)
		if !strings.Contains(body, want) || !strings.Contains(body, onlyTheModel) {
			t.Errorf("%s on %s: /health %q; want the whole model verified, nothing else", p.Name, p.Spec.NodeName, body)
		}
		note := e.waitEvent(t, ctx, p, agent.EventCacheMounted, cache+" ("+uid+")")
		t.Logf("%s's %s on %s: %s", d.Name, p.Name, p.Spec.NodeName, note)
	}
}
