package realseed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/controller"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/pkg/engine"
)

// Report is what a run measured: pod starts, side by side.
type Report struct {
	Rows  []Row
	Notes []string
	// Model and Image describe what was measured.
	Model, Image string
}

// Row is one measured pod start.
type Row struct {
	What, Node, Condition string
	Took                  time.Duration
	Detail                string
}

func (r *Report) ratio(what string, slow, fast time.Duration) {
	r.Notes = append(r.Notes, fmt.Sprintf("%s: %.1f× (%s against %s)", what, slow.Seconds()/fast.Seconds(),
		slow.Round(10*time.Millisecond), fast.Round(10*time.Millisecond)))
}

// Table writes the rows as an aligned table, and the ratios.
func (r *Report) Table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POD\tNODE\tCREATED →\tTIME\tDETAIL")
	for _, x := range r.Rows {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.2f s\t%s\n", x.What, x.Node, x.Condition, x.Took.Seconds(), x.Detail)
	}
	_ = tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
}

const (
	beginMarker = "<!-- realnode:begin (make bench-nodes writes this section) -->"
	endMarker   = "<!-- realnode:end -->"
)

// WriteMarkdown puts the figures into the file at path, between its real-node markers (replacing
// what they held), or at its end.
func (r *Report) WriteMarkdown(path, command string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Real nodes: pod start, warm against cold\n\n", beginMarker)
	fmt.Fprintf(&b, "`%s` (%s, %d CPUs, load %s): three real kubelet nodes (containerd, runc, bridge CNI) on this machine, prewarm installed with its Helm chart from its own images, the seed's manifests unchanged. *The seed's pod* is its Deployment's pod template, pinned to the node and without its GPU request (the run's parents hold the nodes' GPUs; the stand-in server uses none); its model volume is prewarm's CSI volume. Times run from just before the pod's creation to the condition, polled every 100 ms. The model is %s from S3 (versitygw on the same machine); the image is %s from a loopback registry.\n\n",
		command, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), LoadAverage(), r.Model, r.Image)
	b.WriteString("| Pod | Node | Created → | Time | Detail |\n|---|---|---|---|---|\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f s | %s |\n", x.What, x.Node, x.Condition, x.Took.Seconds(), x.Detail)
	}
	b.WriteString("\n")
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	fmt.Fprintf(&b, "\n%s\n", endMarker)
	return WriteSection(path, beginMarker, endMarker, b.String())
}

// WriteSection puts section, which begins with the line begin and ends with the line end, into
// the file at path in place of what those lines enclose there, or at its end.
func WriteSection(path, begin, end, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	if i, j := strings.Index(text, begin), strings.Index(text, end); i >= 0 && j > i {
		text = text[:i] + section + strings.TrimPrefix(text[j+len(end):], "\n")
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + section
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// LoadAverage is the machine's load average over 1, 5 and 15 minutes.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// MeasureImage times a container of the seed's image starting on a node the image cache filled
// against a node that has to pull the image.
func (e *Env) MeasureImage(ctx context.Context, rep *Report) error {
	ref := "docker.io/" + ServerImage
	for _, n := range []string{Warm1, Warm2} {
		if err := testutil.Eventually(ctx, 3*time.Minute, func() (bool, error) { return e.C.Node(n).HasImage(ctx, ref) }); err != nil {
			return fmt.Errorf("the image cache did not pull %s on %s: %w", ref, n, err)
		}
	}
	if has, err := e.C.Node(Cold).HasImage(ctx, ref); err != nil || has {
		return errors.Join(err, fmt.Errorf("%s on %s before any pod needed it: the image cache reached a node it does not target", ref, Cold))
	}
	idle := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "server", Image: ServerImage, Command: []string{"/modelserver", "--idle"}}},
			},
		}
	}
	cached, err := e.TimePod(ctx, idle("image-cached", Warm1), ContainerRunning)
	if err != nil {
		return err
	}
	rep.Rows = append(rep.Rows, Row{"image cached by the image cache", Warm1, "container running", cached, "no pull"})
	coldPod := idle("image-cold", Cold)
	pull, err := e.TimePod(ctx, coldPod, ContainerRunning)
	if err != nil {
		return err
	}
	rep.Rows = append(rep.Rows, Row{"image not cached", Cold, "container running", pull, e.pullEvent(ctx, coldPod)})
	rep.ratio("image not cached against cached", pull, cached)
	ims, err := e.C.Node(Cold).Images(ctx)
	if err != nil {
		return err
	}
	for _, im := range ims {
		if slices.Contains(im.Tags, ref) {
			rep.Image = fmt.Sprintf("%s, %s in 4 uncompressed layers, 3 of them 200 MiB of incompressible bytes", ServerImage, engine.HumanBytes(int64(im.Size)))
		}
	}
	return e.DeletePods(ctx, "default", "image-cached", "image-cold")
}

// MeasureWeights times the parent's own pod (its Deployment's template) on a node that holds the
// weights cache against a node that does not, where the node's agent downloads the cache for the
// pod's model volume (fill on a miss), at this machine's speed and with S3 at 120 MB/s. The image
// is present on both (MeasureImage ran first), so the weights alone make the difference. After
// each cold pod, the cache leaves the cold node again (no pod there asks for it any more).
func (e *Env) MeasureWeights(ctx context.Context, key client.ObjectKey, rep *Report) error {
	dep := &appsv1.Deployment{}
	if err := e.C.Client.Get(ctx, key, dep); err != nil {
		return err
	}
	probe := func(name, node string) *corev1.Pod { return ProbePod(dep, name, node) }
	var results [4]time.Duration
	for i, x := range []struct {
		name, node, what string
		rate             int64
		// full: the node's disk is full of other things, the cache cannot be kept there and
		// the pod reads a copy from the source (runs cold).
		full bool
	}{
		{"weights-warm", Warm1, "the seed's pod, weights cached on the node", 0, false},
		{"weights-cold", Cold, "the seed's pod, no cache on the node", 0, false},
		// The seed's own figure, 145 GB from S3 in 20+ minutes, is about 120 MB/s.
		{"weights-cold-120mbs", Cold, "the seed's pod, no cache on the node, S3 at 120 MB/s", 120_000_000, false},
		{"weights-no-room", Cold, "the seed's pod, no room for the cache on the node (a copy from the source)", 0, true},
	} {
		if err := e.C.Node(x.node).Throttle(x.rate); err != nil {
			return err
		}
		unfill := func() error { return nil }
		if x.full {
			// Beside the agent's reserve, room for half the model.
			reserve := resource.MustParse(AgentReserve)
			var err error
			if unfill, err = e.C.Node(x.node).Fill(CacheRoot, reserve.Value()+ModelBytes(e.Model)/2); err != nil {
				return err
			}
		}
		p := probe(x.name, x.node)
		ready, answer, err := e.timeServed(ctx, p)
		if uerr := unfill(); err == nil {
			err = uerr
		}
		if err != nil {
			return err
		}
		mounted := e.MountEvent(ctx, p)
		if x.full && !strings.Contains(mounted, "running cold") {
			return fmt.Errorf("%s on a full disk: %s; want a copy from the source, running cold", x.name, mounted)
		}
		rep.Rows = append(rep.Rows, Row{x.what, x.node, "Ready", ready, mounted},
			Row{x.what, x.node, "model verified by the server", answer.took, answer.body})
		results[i] = ready
		if x.node == Cold {
			if err := e.DeletePods(ctx, key.Namespace, x.name); err != nil {
				return err
			}
			if err := e.WaitCacheGone(ctx, Cold, CacheUIDOf(&dep.Spec.Template)); err != nil {
				return err
			}
		}
	}
	if err := e.C.Node(Cold).Throttle(0); err != nil {
		return err
	}
	rep.ratio("pod created → Ready, cold node against warm node", results[1], results[0])
	rep.ratio("pod created → Ready, cold node with S3 at 120 MB/s against warm node", results[2], results[0])
	rep.ratio("pod created → Ready, node with no room for the cache (reading a copy from the source) against warm node", results[3], results[0])
	rep.Model = fmt.Sprintf("%s in %d files", engine.HumanBytes(ModelBytes(e.Model)), len(e.Model))
	return e.DeletePods(ctx, key.Namespace, "weights-warm")
}

// served is a model server's answer to /health and the time from its pod's creation to it.
type served struct {
	took time.Duration
	body string
}

// timeServed creates p and times it to Ready, then to its server's /health, which answers once
// the server has verified the whole model.
func (e *Env) timeServed(ctx context.Context, p *corev1.Pod) (time.Duration, served, error) {
	ready, err := e.TimePod(ctx, p, PodReady)
	if err != nil {
		return 0, served{}, err
	}
	start := time.Now()
	body, err := e.Health(ctx, p)
	if err != nil {
		return 0, served{}, err
	}
	if !strings.Contains(body, "verified") {
		return 0, served{}, fmt.Errorf("%s: /health %q", p.Name, body)
	}
	return ready, served{ready + time.Since(start), strings.TrimSpace(strings.TrimPrefix(body, "ok: "))}, nil
}

// MeasureSharedFill starts n copies of the parent's pod together on the cold node, which does
// not hold the cache: its agent downloads the cache once for all of them (fill on a miss). It
// reports the time until every pod is Ready and the bytes the node received from S3 against the
// model's size, checks that every pod's server verified the whole model and that the node is
// labelled warm, then deletes the pods and waits until the cache has left the node again. It
// returns the bytes received from S3.
func (e *Env) MeasureSharedFill(ctx context.Context, key client.ObjectKey, n int, rep *Report) (int64, error) {
	dep := &appsv1.Deployment{}
	if err := e.C.Client.Get(ctx, key, dep); err != nil {
		return 0, err
	}
	uid := CacheUIDOf(&dep.Spec.Template)
	port, err := portOf(e.S3.Endpoint)
	if err != nil {
		return 0, err
	}
	read, stop, err := e.C.Node(Cold).CountFrom(port)
	if err != nil {
		return 0, err
	}
	defer func() { _ = stop() }()
	var pods []*corev1.Pod
	var names []string
	start := time.Now()
	for i := range n {
		p := ProbePod(dep, fmt.Sprintf("shared-fill-%d", i), Cold)
		if err := e.C.Client.Create(ctx, p); err != nil {
			return 0, err
		}
		pods, names = append(pods, p), append(names, p.Name)
	}
	err = testutil.Until(ctx, 5*time.Minute, func() error {
		for _, p := range pods {
			if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			if !PodReady(p) {
				return fmt.Errorf("%s is not Ready", p.Name)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w\n%s", err, e.PodReport(ctx, key.Namespace))
	}
	took := time.Since(start)
	got, err := read()
	if err != nil {
		return 0, err
	}
	for _, p := range pods {
		body, err := e.Health(ctx, p)
		if err != nil {
			return 0, err
		}
		if !strings.Contains(body, "verified") {
			return 0, fmt.Errorf("%s: /health %q", p.Name, body)
		}
	}
	node := &corev1.Node{}
	if err := e.C.Client.Get(ctx, client.ObjectKey{Name: Cold}, node); err != nil {
		return 0, err
	}
	if node.Labels[inferencev1.WeightsCacheReadyLabel(uid)] != inferencev1.LabelTrue {
		return 0, fmt.Errorf("%s holds cache %s for its pods but is not labelled %s", Cold, uid, inferencev1.WeightsCacheReadyLabel(uid))
	}
	size := ModelBytes(e.Model)
	rep.Rows = append(rep.Rows, Row{fmt.Sprintf("%d of the seed's pods together, no cache on the node", n), Cold, "all Ready", took,
		fmt.Sprintf("one fill for all: %s from S3 for a %s model (%.2f×)", engine.HumanBytes(got), engine.HumanBytes(size), float64(got)/float64(size))})
	if err := e.DeletePods(ctx, key.Namespace, names...); err != nil {
		return got, err
	}
	return got, e.WaitCacheGone(ctx, Cold, uid)
}

// ProbePod is a pod of the Deployment's template, named name, on node: not with the Deployment's
// selector labels (its ReplicaSet would adopt it), without the template's placement (which would
// keep it off a node that is no target), and without the GPUs the template asks for (the parents
// of a run take the nodes' GPUs; the stand-in server uses none).
func ProbePod(dep *appsv1.Deployment, name, node string) *corev1.Pod {
	tmpl := dep.Spec.Template.DeepCopy()
	delete(tmpl.Labels, controller.EndpointLabel)
	tmpl.Spec.NodeName, tmpl.Spec.Affinity = node, nil
	for c := range tmpl.Spec.Containers {
		delete(tmpl.Spec.Containers[c].Resources.Limits, "nvidia.com/gpu")
		delete(tmpl.Spec.Containers[c].Resources.Requests, "nvidia.com/gpu")
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: dep.Namespace, Name: name, Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
}

// portOf is the port of an http URL.
func portOf(endpoint string) (int, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// Health waits until the pod's model server has finished reading its model and returns what
// /health says.
func (e *Env) Health(ctx context.Context, p *corev1.Pod) (string, error) {
	port := p.Spec.Containers[0].Ports[0].ContainerPort
	url := fmt.Sprintf("http://%s:%d/health", p.Status.PodIP, port)
	var body string
	err := testutil.Eventually(ctx, 2*time.Minute, func() (bool, error) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode != http.StatusServiceUnavailable, err
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w (last: %q)", url, err, body)
	}
	return body, nil
}

// PodCondition is what TimePod waits for.
type PodCondition func(*corev1.Pod) bool

// ContainerRunning holds once the pod's first container runs.
func ContainerRunning(p *corev1.Pod) bool {
	return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil
}

// PodReady holds once the pod is Ready.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// TimePod creates the pod and returns the time until cond holds; p is updated.
func (e *Env) TimePod(ctx context.Context, p *corev1.Pod, cond PodCondition) (time.Duration, error) {
	start := time.Now()
	if err := e.C.Client.Create(ctx, p); err != nil {
		return 0, err
	}
	var took time.Duration
	err := testutil.Eventually(ctx, 5*time.Minute, func() (bool, error) {
		if err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err
		}
		took = time.Since(start)
		return cond(p), nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w\n%s", p.Name, err, e.PodReport(ctx, p.Namespace))
	}
	return took, nil
}

// MountEvent is how the pod's model volume was served: the agent's events on the pod.
func (e *Env) MountEvent(ctx context.Context, p *corev1.Pod) string {
	var list eventsv1.EventList
	if err := e.C.Client.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
		return err.Error()
	}
	waits := 0
	mounted := ""
	for _, ev := range list.Items {
		if ev.Regarding.UID != p.UID {
			continue
		}
		switch ev.Reason {
		case agent.EventCacheFilling, agent.EventCacheWaiting:
			waits++
		case agent.EventCacheMounted:
			mounted = ev.Note
		}
	}
	if mounted == "" {
		return "no CacheMounted event"
	}
	if waits == 0 {
		return "agent: " + mounted
	}
	return fmt.Sprintf("agent: %s, after %d waiting events", mounted, waits)
}

// CacheUIDOf is the cache a pod template's prewarm volume names.
func CacheUIDOf(t *corev1.PodTemplateSpec) string {
	for _, v := range t.Spec.Volumes {
		if uid := prewarmv1alpha1.VolumeCacheUID(v); uid != "" {
			return uid
		}
	}
	return ""
}

// WaitCacheGone waits until node neither is asked for cache uid nor reports it, and its
// directory is gone from the node's disk.
func (e *Env) WaitCacheGone(ctx context.Context, node, uid string) error {
	dir := e.C.Node(node).HostPath(prewarmv1alpha1.CacheDir(CacheRoot, uid))
	return testutil.Until(ctx, 3*time.Minute, func() error {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := e.C.Client.Get(ctx, client.ObjectKey{Name: node}, nc); client.IgnoreNotFound(err) != nil {
			return err
		}
		for _, r := range nc.Spec.Caches {
			if r.UID == uid {
				return fmt.Errorf("%s is still asked for cache %s", node, uid)
			}
		}
		for _, c := range nc.Status.Caches {
			if c.UID == uid {
				return fmt.Errorf("%s still reports cache %s: %s %s", node, uid, c.State, c.Message)
			}
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("%s is still on %s's disk (%w)", dir, node, err)
		}
		return nil
	})
}

// pullEvent is the kubelet's account of the pod's image pull.
func (e *Env) pullEvent(ctx context.Context, p *corev1.Pod) string {
	return "kubelet: " + e.PullEvent(ctx, p, p.Spec.Containers[0].Name)
}

// PullEvent is the message of the kubelet's Pulled event on the pod's container: the image
// pulled and how long that took, or present.
func (e *Env) PullEvent(ctx context.Context, p *corev1.Pod, container string) string {
	var events corev1.EventList
	if err := e.C.Client.List(ctx, &events, client.InNamespace(p.Namespace), client.MatchingFields{"involvedObject.name": p.Name}); err != nil {
		return err.Error()
	}
	for _, ev := range events.Items {
		if ev.Reason == "Pulled" && ev.InvolvedObject.FieldPath == "spec.containers{"+container+"}" {
			return ev.Message
		}
	}
	return "no Pulled event"
}

// DeletePods deletes the pods of namespace ns and waits until they are gone.
func (e *Env) DeletePods(ctx context.Context, ns string, names ...string) error {
	for _, n := range names {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n}}
		if err := e.C.Client.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
			return err
		}
		err := testutil.Eventually(ctx, 2*time.Minute, func() (bool, error) {
			err := e.C.Client.Get(ctx, client.ObjectKeyFromObject(p), p)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err != nil {
			return fmt.Errorf("pod %s/%s not gone: %w", ns, n, err)
		}
	}
	return nil
}
