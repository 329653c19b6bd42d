package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/keda"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

// The load at which the endpoint runs 3 replicas: its trigger asks for one replica per
// queueTarget requests waiting.
const queueTarget, queueOf3 = 5, 15

// autoscale runs the endpoint's autoScalingSpec as HyperPod's users write it, on KEDA and a
// Prometheus server as a cluster runs them. The platform points prewarm at its Prometheus
// (config.autoscaling.prometheus.serverAddress, a helm upgrade, as operations.md says); the
// endpoint asks for 1 to 3 replicas on its model servers' queue (vllm:num_requests_waiting,
// queueTarget a replica). A queue of queueOf3 scales it to 3, every pod Ready on a node that
// holds the model and serving it verified; the Deployment's replicas are then the HPA's, the
// parent's spec.replicas untouched; an empty queue brings it back to 1 after the scale-down
// window; and removing autoScalingSpec removes the ScaledObject, spec.replicas governing again.
func (e *env) autoscale(t *testing.T, ctx context.Context, key client.ObjectKey) {
	as := e.startAutoscaling(t, ctx)
	iec := &inferencev1.InferenceEndpointConfig{}
	if err := e.C.Client.Get(ctx, key, iec); err != nil {
		t.Fatal(err)
	}
	before := iec.DeepCopy()
	iec.Spec.AutoScalingSpec = queueScaling("sum(vllm:num_requests_waiting)")
	if err := e.C.Client.Patch(ctx, iec, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	so := e.waitScaledObject(t, ctx, as, iec)

	pods := e.parentPods(t, ctx, iec)
	start := time.Now()
	if err := setLoad(ctx, &pods[0], queueOf3); err != nil {
		t.Fatal(err)
	}
	ready := e.waitReplicas(t, ctx, iec, 3)
	t.Logf("a queue of %d: 3 pods Ready %s after the load rose", queueOf3, time.Since(start).Round(100*time.Millisecond))
	dep := e.deployment(t, ctx, key)
	if err := e.C.Client.Get(ctx, key, iec); err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 || ptr.Deref(iec.Spec.Replicas, 1) != 1 {
		t.Errorf("Deployment replicas %d, the endpoint's spec.replicas %d; want 3 (the HPA's) and 1 (as written)", *dep.Spec.Replicas, ptr.Deref(iec.Spec.Replicas, 1))
	}
	uid := realseed.CacheUIDOf(&dep.Spec.Template)
	for _, p := range ready {
		if st, err := e.nodeCache(ctx, p.Spec.NodeName, uid); err != nil || st == nil || st.State != inferencev1.CacheReady {
			t.Errorf("%s runs on %s, which does not hold the model (%+v, %v)", p.Name, p.Spec.NodeName, st, err)
		}
		if body := e.health(t, ctx, &p); !strings.Contains(body, "verified") {
			t.Errorf("%s on %s: /health %q", p.Name, p.Spec.NodeName, body)
		}
	}
	if c := meta.FindStatusCondition(iec.Status.Conditions, inferencev1.ConditionReady); c == nil || !strings.Contains(c.Message, "pods on warm nodes 3, on cold nodes 0") {
		t.Errorf("the endpoint's Ready condition: %+v; want it to count 3 pods on warm nodes", c)
	}

	for i := range ready {
		if err := setLoad(ctx, &ready[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	e.waitReplicas(t, ctx, iec, 1)
	t.Logf("an empty queue: back to 1 pod %s later", time.Since(start).Round(100*time.Millisecond))

	before = iec.DeepCopy()
	iec.Spec.AutoScalingSpec = nil
	if err := e.C.Client.Patch(ctx, iec, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	err := testutil.Until(ctx, time.Minute, func() error {
		err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(so), &keda.ScaledObject{})
		if err == nil {
			return fmt.Errorf("ScaledObject %s still there", so.Name)
		}
		return client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startAutoscaling starts KEDA and Prometheus beside the cluster and points prewarm at that
// Prometheus (config.autoscaling.prometheus.serverAddress, a helm upgrade, as operations.md says).
func (e *env) startAutoscaling(t *testing.T, ctx context.Context) *realnode.Autoscaling {
	t.Helper()
	if _, _, _, _, err := realnode.AutoscalingBinaries(); err != nil {
		t.Fatalf("KEDA and Prometheus: %v", err)
	}
	as, err := e.C.StartAutoscaling(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Helm(ctx, "upgrade", "prewarm", e.Root+"/charts/prewarm", "--namespace", opNS, "--reuse-values",
		"--set", "config.autoscaling.prometheus.serverAddress="+as.PrometheusURL, "--wait", "--timeout", "5m"); err != nil {
		t.Fatal(err)
	}
	return as
}

// queueScaling is the autoScalingSpec of 1 to 3 replicas on the model servers' queue (query, of
// vllm:num_requests_waiting; queueTarget a replica), as HyperPod's users write it.
func queueScaling(query string) *inferencev1.AutoScalingSpec {
	return &inferencev1.AutoScalingSpec{
		MinReplicaCount: ptr.To[int32](1), MaxReplicaCount: ptr.To[int32](3),
		PollingInterval: ptr.To[int32](5), CooldownPeriod: ptr.To[int32](30),
		ScaleUpStabilizationTime: ptr.To[int32](0), ScaleDownStabilizationTime: ptr.To[int32](15),
		PrometheusTrigger: &inferencev1.PrometheusTrigger{
			Name: ptr.To("queue"), Query: ptr.To(query),
			TargetValue: ptr.To[float64](queueTarget), MetricType: ptr.To("Average"),
		},
	}
}

// waitScaledObject has Prometheus scrape the endpoint's model servers (as a pod monitor would)
// until the test ends, and waits until the endpoint's ScaledObject is ready and Prometheus
// answers its query; it returns the ScaledObject.
func (e *env) waitScaledObject(t *testing.T, ctx context.Context, as *realnode.Autoscaling, iec *inferencev1.InferenceEndpointConfig) *keda.ScaledObject {
	t.Helper()
	scrapeCtx, stopScraping := context.WithCancel(ctx)
	t.Cleanup(stopScraping)
	go e.scrapeEndpointPods(scrapeCtx, as, iec.Namespace, iec.Name, string(iec.UID))
	key := client.ObjectKeyFromObject(iec)
	so := &keda.ScaledObject{}
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		if err := e.C.CheckProcesses(); err != nil {
			return err
		}
		if err := e.C.Client.Get(ctx, key, iec); err != nil {
			return err
		}
		c := meta.FindStatusCondition(iec.Status.Conditions, "Autoscaling")
		if c == nil || c.Reason != "ScaledObjectReady" {
			return fmt.Errorf("the endpoint's Autoscaling condition: %+v", c)
		}
		if _, ok, err := as.Query(ctx, *iec.Spec.AutoScalingSpec.PrometheusTrigger.Query); err != nil {
			return err
		} else if !ok {
			return errors.New("prometheus has not scraped the model servers yet")
		}
		return e.C.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-scaled-object"}, so)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, key.Namespace))
	}
	return so
}

// waitReplicas waits until the parent's Deployment runs exactly n pods, each Ready, and returns
// them.
func (e *env) waitReplicas(t *testing.T, ctx context.Context, parent client.Object, n int) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	err := testutil.Until(ctx, 5*time.Minute, func() error {
		dep := &appsv1.Deployment{}
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(parent), dep); err != nil {
			return err
		}
		var pods corev1.PodList
		if err := e.C.Client.List(ctx, &pods, client.InNamespace(parent.GetNamespace()),
			client.MatchingLabels{controller.EndpointLabel: string(parent.GetUID())}); err != nil {
			return err
		}
		ready = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return !realseed.PodReady(&p) || p.DeletionTimestamp != nil })
		if len(pods.Items) != n || len(ready) != n || ptr.Deref(dep.Spec.Replicas, 1) != int32(n) {
			return fmt.Errorf("Deployment %s asks for %d replicas; %d pods, %d Ready; want %d", dep.Name, ptr.Deref(dep.Spec.Replicas, 1), len(pods.Items), len(ready), n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, e.PodReport(ctx, parent.GetNamespace()))
	}
	return ready
}

// scrapeEndpointPods keeps Prometheus's targets the endpoint's running model servers, labelled
// endpoint=<its name> as a pod monitor would label them, until ctx ends.
func (e *env) scrapeEndpointPods(ctx context.Context, as *realnode.Autoscaling, namespace, name, uid string) {
	var last []string
	for {
		var pods corev1.PodList
		if err := e.C.Client.List(ctx, &pods, client.InNamespace(namespace),
			client.MatchingLabels{controller.EndpointLabel: uid}); err == nil {
			var addrs []string
			for _, p := range pods.Items {
				if p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning {
					addrs = append(addrs, net.JoinHostPort(p.Status.PodIP, "8000"))
				}
			}
			slices.Sort(addrs)
			if !slices.Equal(addrs, last) && as.SetTargets(addrs, map[string]string{"endpoint": name}) == nil {
				last = addrs
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// setLoad sets the number of requests waiting at the pod's model server.
func setLoad(ctx context.Context, p *corev1.Pod, waiting int) error {
	url := fmt.Sprintf("http://%s/load?waiting=%d", net.JoinHostPort(p.Status.PodIP, "8000"), waiting)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	return nil
}
