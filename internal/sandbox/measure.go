package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	"github.com/prewarm/prewarm/pkg/engine"
)

// waitReady shows the parents' per-node progress until both are ready.
func (s *sandbox) waitReady(ctx context.Context) error {
	last := ""
	lastShown := time.Time{}
	for {
		text, ready, err := s.o.Status(ctx, s.kubeconfig())
		if err != nil {
			return err
		}
		if text != last && (ready || time.Since(lastShown) >= s.o.Interval) {
			s.say("%s", indent(text))
			last, lastShown = text, time.Now()
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func indent(text string) string {
	return "  | " + strings.ReplaceAll(strings.TrimRight(text, "\n"), "\n", "\n  | ")
}

// PodResult is one inference pod's measured start.
type PodResult struct {
	Pod, Node string
	Warm      bool
	Seconds   float64
	S3Bytes   int64
}

// measure scales the endpoint to 5 (as an HPA would) after a new node without the cache joins,
// runs each pod's init container step against its node's disk and prints what it took.
func (s *sandbox) measure(ctx context.Context) error {
	c := s.cluster.Client
	// Room for the pods the warm nodes cannot take (each pod asks for 4 GPUs, each node has 4).
	if err := s.addNode(ctx, coldNode, "ml.g5.24xlarge", int64(4*(replicas-s.warmNodes()))); err != nil {
		return err
	}
	s.say("  node %s joined (ml.g5.24xlarge, no cache yet: its agent has not started)", coldNode)
	iec := &inferencev1.InferenceEndpointConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, iec); err != nil {
		return err
	}
	// As an autoscaler does: read the scale, set it, and again if the object changed meanwhile
	// (the controller writes the status).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale := &autoscalingv1.Scale{}
		if err := c.SubResource("scale").Get(ctx, iec, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = replicas
		return c.SubResource("scale").Update(ctx, iec, client.WithSubResourceBody(scale))
	})
	if err != nil {
		return err
	}
	s.say("  scaled example-model from 1 to %d replicas through its scale subresource", replicas)

	var pods []corev1.Pod
	err = testutil.Eventually(ctx, 5*time.Minute, func() (bool, error) {
		list := &corev1.PodList{}
		if err := c.List(ctx, list, client.InNamespace("default"), client.MatchingLabels{"prewarm.io/endpoint-uid": string(iec.UID)}); err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" && p.DeletionTimestamp.IsZero() {
				pods = append(pods, p)
			}
		}
		return len(pods) == replicas, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d running pods: %w", replicas, err)
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, dep); err != nil {
		return err
	}
	cache := &inferencev1.ModelDataCacheConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: dep.Spec.Template.Annotations["prewarm.io/weights-cache"]}, cache); err != nil {
		return err
	}

	proxy, err := shaper.Start(s.s3.Endpoint, shaper.Options{}) // counts the bytes S3 serves
	if err != nil {
		return err
	}
	defer proxy.Close()
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Spec.NodeName+a.Name, b.Spec.NodeName+b.Name) })
	var results []PodResult
	for _, p := range pods {
		cacheDir := prewarmv1alpha1.ModelDir(filepath.Join(s.o.Dir, "nodes", p.Spec.NodeName, root), string(cache.UID))
		dest := filepath.Join(s.o.Dir, "pods", p.Name, "model")
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			return err
		}
		before := proxy.Served.Load()
		start := time.Now()
		out, err := s.runPrepare(ctx, cacheDir, dest, proxy.URL)
		if err != nil {
			return fmt.Errorf("agent prepare for pod %s on %s: %w\n%s", p.Name, p.Spec.NodeName, err, out)
		}
		results = append(results, PodResult{Pod: p.Name, Node: p.Spec.NodeName, Warm: strings.Contains(out, "warm:"),
			Seconds: time.Since(start).Seconds(), S3Bytes: proxy.Served.Load() - before})
		if err := os.RemoveAll(dest); err != nil { // a cold pod's copy is not needed after it is measured
			return err
		}
	}
	s.printResults(results)
	return s.printTables()
}

func (s *sandbox) printResults(results []PodResult) {
	size := s.modelBytes()
	s.say("\n  Each pod's init container (agent prepare), run against its node's disk, model %s:\n", engine.HumanBytes(size))
	tw := tabwriter.NewWriter(s.o.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POD\tNODE\tNODE CACHE\tWEIGHTS READY AFTER\tREAD FROM S3")
	var total int64
	for _, r := range results {
		word := "cold"
		if r.Warm {
			word = "warm"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.3f s\t%s\n", r.Pod, r.Node, word, r.Seconds, engine.HumanBytes(r.S3Bytes))
		total += r.S3Bytes
	}
	_ = tw.Flush()
	all := int64(len(results)) * size
	s.say("\n  Read from S3 for %d pods: %s; %d cold pods would have read %s (%.1fx more).",
		len(results), engine.HumanBytes(total), len(results), engine.HumanBytes(all), float64(all)/float64(max(total, 1)))
}

// table fetches an API path as a Table, from whichever cluster runs.
func (s *sandbox) table(path string) (*metav1.Table, error) {
	if s.real != nil {
		return testutil.Table(s.real.C.Config, path)
	}
	return s.cluster.Table(path)
}

// printTables prints what the seed's two kubectl get commands print.
func (s *sandbox) printTables() error {
	for _, q := range []struct{ cmd, path string }{
		{"kubectl get modeldatacacheconfig", "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/default/modeldatacacheconfigs"},
		{"kubectl get inferenceimagecache -n " + opNS, "/apis/inference.sagemaker.aws.amazon.com/v1/namespaces/" + opNS + "/inferenceimagecaches"},
	} {
		tab, err := s.table(q.path)
		if err != nil {
			return err
		}
		s.say("\n  $ %s", q.cmd)
		tw := tabwriter.NewWriter(s.o.Out, 0, 4, 3, ' ', 0)
		fmt.Fprintf(tw, "  %s\n", strings.Join(testutil.TableHeaders(tab), "\t"))
		for _, row := range tab.Rows {
			var cells []string
			for i, cell := range row.Cells {
				if i >= len(tab.ColumnDefinitions) || tab.ColumnDefinitions[i].Priority != 0 {
					continue
				}
				v := fmt.Sprint(cell)
				if tab.ColumnDefinitions[i].Type == "date" {
					if t, err := time.Parse(time.RFC3339, v); err == nil {
						v = time.Since(t).Round(time.Second).String()
					}
				}
				cells = append(cells, v)
			}
			fmt.Fprintf(tw, "  %s\n", strings.Join(cells, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
