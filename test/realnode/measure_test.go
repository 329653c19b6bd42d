package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/pkg/engine"
)

// report is what the test measured: pod starts, side by side.
type report struct {
	rows  []row
	notes []string
	// model and image describe what was measured.
	model, image string
}

type row struct {
	what, node, condition string
	took                  time.Duration
	detail                string
}

func (r *report) add(t *testing.T, x row) {
	t.Logf("%s on %s: created → %s in %s (%s)", x.what, x.node, x.condition, x.took.Round(10*time.Millisecond), x.detail)
	r.rows = append(r.rows, x)
}

func (r *report) ratio(t *testing.T, what string, slow, fast time.Duration) {
	note := fmt.Sprintf("%s: %.1f× (%s against %s)", what, slow.Seconds()/fast.Seconds(), slow.Round(10*time.Millisecond), fast.Round(10*time.Millisecond))
	t.Log(note)
	r.notes = append(r.notes, note)
}

// write puts the figures into the file PREWARM_REALNODE_REPORT names (make bench-nodes), between
// its realnode markers.
func (r *report) write(t *testing.T) {
	path := os.Getenv("PREWARM_REALNODE_REPORT")
	if path == "" || t.Failed() {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Real nodes: pod start, warm against cold\n\n", beginMarker)
	fmt.Fprintf(&b, "`make bench-nodes` (%s, %d CPUs, load %s): three real kubelet nodes (containerd, runc, bridge CNI) on this machine, prewarm installed with its Helm chart from its own images, the seed's manifests unchanged. Times run from just before the pod's creation to the condition, polled every 100 ms. The model is %s from S3 (versitygw on the same machine); the image is %s from a loopback registry.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), loadAverage(), r.model, r.image)
	b.WriteString("| Pod | Node | Created → | Time | Detail |\n|---|---|---|---|---|\n")
	for _, x := range r.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f s | %s |\n", x.what, x.node, x.condition, x.took.Seconds(), x.detail)
	}
	b.WriteString("\n")
	for _, n := range r.notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	fmt.Fprintf(&b, "\n%s\n", endMarker)
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	text := string(old)
	if i, j := strings.Index(text, beginMarker), strings.Index(text, endMarker); i >= 0 && j > i {
		text = text[:i] + b.String() + strings.TrimPrefix(text[j+len(endMarker):], "\n")
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + b.String()
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("figures written to %s", path)
}

const (
	beginMarker = "<!-- realnode:begin (make bench-nodes writes this section) -->"
	endMarker   = "<!-- realnode:end -->"
)

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// deploymentNode is the node the parent's Deployment pod runs on.
func (e *env) deploymentNode(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	var pods corev1.PodList
	if err := e.c.Client.List(ctx, &pods, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, name+"-") && p.Spec.NodeName != "" {
			return p.Spec.NodeName
		}
	}
	t.Fatalf("no pod of %s", name)
	return ""
}

// imageStart times a container of the seed's image starting on a node the image cache filled
// against a node that has to pull the image.
func (e *env) imageStart(t *testing.T, ctx context.Context, rep *report) {
	ref := "docker.io/" + serverImage
	for _, n := range []string{warm1, warm2} {
		err := testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) { return e.c.Node(n).HasImage(ctx, ref) })
		if err != nil {
			t.Fatalf("the image cache did not pull %s on %s: %v", ref, n, err)
		}
	}
	if has, err := e.c.Node(cold).HasImage(ctx, ref); err != nil || has {
		t.Fatalf("%s on %s before any pod needed it (err %v): the image cache reached a node it does not target", ref, cold, err)
	}
	idle := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "server", Image: serverImage, Command: []string{"/modelserver", "--idle"}}},
			},
		}
	}
	cached := e.timePod(t, ctx, idle("image-cached", warm1), containerRunning)
	rep.add(t, row{"image cached by the image cache", warm1, "container running", cached, "no pull"})
	coldPod := idle("image-cold", cold)
	pull := e.timePod(t, ctx, coldPod, containerRunning)
	rep.add(t, row{"image not cached", cold, "container running", pull, e.pullEvent(t, ctx, coldPod)})
	rep.ratio(t, "image not cached against cached", pull, cached)
	ims, err := e.c.Node(cold).Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range ims {
		if slices.Contains(im.Tags, ref) {
			rep.image = fmt.Sprintf("%s, %s in 4 uncompressed layers, 3 of them 200 MiB of incompressible bytes", serverImage, engine.HumanBytes(int64(im.Size)))
		}
	}
	e.deletePods(t, ctx, "image-cached", "image-cold")
}

// weightsStart times the parent's own pod (its Deployment's template) on a node that holds the
// weights cache against a node that does not, where the init container downloads the model.
// The image is present on both, so the weights alone make the difference.
func (e *env) weightsStart(t *testing.T, ctx context.Context, key client.ObjectKey, rep *report) {
	dep := &appsv1.Deployment{}
	if err := e.c.Client.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	probe := func(name, node string) *corev1.Pod {
		tmpl := dep.Spec.Template.DeepCopy()
		// Not the Deployment's labels (its ReplicaSet would adopt the pod), and on the named
		// node: the template's placement would keep it off the node that is not a target.
		delete(tmpl.Labels, controller.EndpointLabel)
		tmpl.Spec.NodeName, tmpl.Spec.Affinity = node, nil
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: name, Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
	}
	var results [3]time.Duration
	for i, x := range []struct {
		name, node, what string
		rate             int64
	}{
		{"weights-warm", warm1, "the seed's pod, weights cached on the node", 0},
		{"weights-cold", cold, "the seed's pod, no cache on the node", 0},
		// The seed's own figure, 145 GB from S3 in 20+ minutes, is about 120 MB/s.
		{"weights-cold-120mbs", cold, "the seed's pod, no cache on the node, S3 at 120 MB/s", 120_000_000},
	} {
		if err := e.c.Node(x.node).Throttle(x.rate); err != nil {
			t.Fatal(err)
		}
		p := probe(x.name, x.node)
		ready := e.timePod(t, ctx, p, podReady)
		start := time.Now()
		body := e.health(t, ctx, p)
		served := ready + time.Since(start)
		if !strings.Contains(body, "verified") {
			t.Errorf("%s: /health %q", x.name, body)
		}
		rep.add(t, row{x.what, x.node, "Ready", ready, "init container " + initTime(p)})
		rep.add(t, row{x.what, x.node, "model verified by the server", served, strings.TrimSpace(strings.TrimPrefix(body, "ok: "))})
		results[i] = ready
	}
	if err := e.c.Node(cold).Throttle(0); err != nil {
		t.Fatal(err)
	}
	rep.ratio(t, "pod created → Ready, cold node against warm node", results[1], results[0])
	rep.ratio(t, "pod created → Ready, cold node with S3 at 120 MB/s against warm node", results[2], results[0])
	var size int64
	for _, f := range e.model {
		size += f.Size
	}
	rep.model = fmt.Sprintf("%s in %d files", engine.HumanBytes(size), len(e.model))
	e.deletePods(t, ctx, "weights-warm", "weights-cold", "weights-cold-120mbs")
}

// imageGC prunes every unused image on the nodes: the image the image cache holds stays on the
// node whose only user of it is the image cache, and goes from the node that merely pulled it.
func (e *env) imageGC(t *testing.T, ctx context.Context) {
	ref := "docker.io/" + serverImage
	// The node that runs no pod of the endpoint: only the image cache's container uses the image.
	witness := warm1
	if e.deploymentNode(t, ctx, "example-model") == warm1 {
		witness = warm2
	}
	if has, err := e.c.Node(cold).HasImage(ctx, ref); err != nil || !has {
		t.Fatalf("%s not on %s after its pod ran (err %v)", ref, cold, err)
	}
	// The kubelet removes a deleted pod's exited containers a little later; until then they
	// still use the image.
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		for _, n := range []string{witness, cold} {
			if _, err := e.c.Node(n).PruneImages(ctx); err != nil {
				return err
			}
		}
		if has, err := e.c.Node(cold).HasImage(ctx, ref); err != nil || has {
			return errors.Join(err, fmt.Errorf("%s still on %s, where no pod uses it any more", ref, cold))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if has, err := e.c.Node(witness).HasImage(ctx, ref); err != nil || !has {
		t.Errorf("%s pruned from %s, where the image cache holds it (err %v)", ref, witness, err)
	}
	t.Logf("after pruning every unused image: %s kept on %s (image cache), gone from %s", ref, witness, cold)
}

type podCondition func(*corev1.Pod) bool

func containerRunning(p *corev1.Pod) bool {
	return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil
}

// timePod creates the pod and returns the time until cond holds; p is updated.
func (e *env) timePod(t *testing.T, ctx context.Context, p *corev1.Pod, cond podCondition) time.Duration {
	t.Helper()
	start := time.Now()
	if err := e.c.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	err := testutil.Eventually(ctx, 5*time.Minute, func() (bool, error) {
		if err := e.c.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err
		}
		took = time.Since(start)
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("%s: %v\n%s", p.Name, err, e.podReport(ctx, p.Namespace))
	}
	return took
}

func initTime(p *corev1.Pod) string {
	for _, s := range p.Status.InitContainerStatuses {
		if x := s.State.Terminated; x != nil {
			return fmt.Sprintf("%s ran %s", s.Name, x.FinishedAt.Sub(x.StartedAt.Time))
		}
	}
	return "none"
}

// pullEvent is the kubelet's account of the pod's image pull.
func (e *env) pullEvent(t *testing.T, ctx context.Context, p *corev1.Pod) string {
	t.Helper()
	var events corev1.EventList
	if err := e.c.Client.List(ctx, &events, client.InNamespace(p.Namespace), client.MatchingFields{"involvedObject.name": p.Name}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if ev.Reason == "Pulled" {
			return "kubelet: " + ev.Message
		}
	}
	return "no Pulled event"
}

func (e *env) deletePods(t *testing.T, ctx context.Context, names ...string) {
	t.Helper()
	for _, n := range names {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: n}}
		if err := e.c.Client.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		err := testutil.Eventually(ctx, 2*time.Minute, func() (bool, error) {
			err := e.c.Client.Get(ctx, client.ObjectKeyFromObject(p), p)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err != nil {
			t.Fatalf("pod %s not gone: %v", n, err)
		}
	}
}
