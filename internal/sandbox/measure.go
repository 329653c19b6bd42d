package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/csikubelet"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
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
			return s.printSharing(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// printSharing says what S3 sent the nodes that warmed the seed's S3 cache together, and what
// they took from each other (kwok runs, where the agents read S3 through a counter).
func (s *sandbox) printSharing(ctx context.Context) error {
	if s.s3Sent == nil {
		return nil
	}
	m := &inferencev1.ModelDataCacheConfig{}
	if err := s.cluster.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model-cache"}, m); err != nil {
		return err
	}
	size, sent := s.modelBytes(), s.s3Sent.Served.Load()
	s.say("\n  The %d nodes warmed example-model-cache together: S3 sent %s (%.2f× the model, listings included); they took %s from each other.",
		m.Status.TargetNodes, engine.HumanBytes(sent), float64(sent)/float64(size), engine.HumanBytes(m.Status.PeerBytes))
	return nil
}

func indent(text string) string {
	return "  | " + strings.ReplaceAll(strings.TrimRight(text, "\n"), "\n", "\n  | ")
}

// PodResult is one inference pod's measured start.
type PodResult struct {
	Pod, Node string
	// Warm says the node held the cache when the pods' volumes were asked for.
	Warm    bool
	Seconds float64
}

// measure scales the endpoint to 5 (as an HPA would) after a new node without the cache joins,
// then asks every pod's model volume of its node's agent at once, as the kubelets would (kwok's
// do not call CSI drivers), and prints how long each took and what S3 served.
func (s *sandbox) measure(ctx context.Context) error {
	c := s.cluster.Client
	if os.Geteuid() != 0 {
		s.say("\n  not root: the agents' CSI node plugin cannot mount, so the pods' volumes are not measured")
		return s.printTables()
	}
	proxy, err := shaper.Start(s.s3.Endpoint, shaper.Options{}) // counts the bytes S3 serves the new node
	if err != nil {
		return err
	}
	defer proxy.Close()
	// Room for the pods the warm nodes cannot take (each pod asks for 4 GPUs, each node has 4).
	if err := s.addNode(ctx, coldNode, "ml.g5.24xlarge", int64(4*(replicas-s.warmNodes()))); err != nil {
		return err
	}
	conf := filepath.Join(s.o.Dir, "config-"+coldNode+".yaml")
	op := s.op
	op.S3.Endpoint = proxy.URL
	if err := op.Write(conf); err != nil {
		return err
	}
	s.say("  node %s joined (ml.g5.24xlarge, no cache yet)", coldNode)
	iec := &inferencev1.InferenceEndpointConfig{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "example-model"}, iec); err != nil {
		return err
	}
	// As an autoscaler does: read the scale, set it, and again if the object changed meanwhile
	// (the controller writes the status).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
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
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Spec.NodeName+a.Name, b.Spec.NodeName+b.Name) })
	warm := map[string]bool{}
	for _, p := range pods {
		warm[p.Spec.NodeName] = s.holds(ctx, p.Spec.NodeName, realseed.CacheUIDOf(&corev1.PodTemplateSpec{Spec: p.Spec}))
	}
	// The new node's agent (a DaemonSet pod) comes up as its inference pods do.
	if err := s.startAgent(ctx, coldNode, conf); err != nil {
		return err
	}
	s.say("  %s's agent started with its pods; it reads S3 through a byte counter", coldNode)
	results, err := s.mountAll(ctx, pods, warm)
	if err != nil {
		return err
	}
	uid := realseed.CacheUIDOf(&corev1.PodTemplateSpec{Spec: pods[0].Spec})
	s.printResults(results, proxy.Served.Load(), s.peerBytes(ctx, coldNode, uid))
	if err := s.waitAllReady(ctx); err != nil {
		return err
	}
	return s.printTables()
}

// waitAllReady waits until the seed's caches count every target node ready: their status follows
// the nodes' reports within a moment, and the tables printed next should show the new node.
func (s *sandbox) waitAllReady(ctx context.Context) error {
	err := testutil.Until(ctx, time.Minute, func() error {
		for _, name := range []string{"example-model-cache", "example-jumpstart-model-cache"} {
			m := &inferencev1.ModelDataCacheConfig{}
			if err := s.cluster.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: name}, m); err != nil {
				return err
			}
			if m.Status.ReadyNodes != m.Status.TargetNodes {
				return fmt.Errorf("%s: %d of %d nodes ready", name, m.Status.ReadyNodes, m.Status.TargetNodes)
			}
		}
		return nil
	})
	if err != nil {
		// Say which nodes are not ready, and what their agents report.
		if text, _, serr := s.o.Status(ctx, s.kubeconfig()); serr == nil {
			return fmt.Errorf("%w; now:\n%s", err, indent(text))
		}
	}
	return err
}

// mountAll asks, at once, for every pod's model volume of its node's agent, waiting while it
// says to, and checks that each volume shows the whole model; then it unmounts them. warm says
// which nodes held the cache before.
func (s *sandbox) mountAll(ctx context.Context, pods []corev1.Pod, warm map[string]bool) ([]PodResult, error) {
	results := make([]PodResult, len(pods))
	errs := make([]error, len(pods))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			p := &pods[i]
			k, err := csikubelet.New(s.kubeletDir(p.Spec.NodeName))
			if err != nil {
				errs[i] = err
				return
			}
			defer k.Close()
			target, answers, err := k.Mount(ctx, p, 5*time.Minute)
			if err != nil {
				errs[i] = fmt.Errorf("pod %s on %s: %w (answers %v)", p.Name, p.Spec.NodeName, err, answers)
				return
			}
			results[i] = PodResult{Pod: p.Name, Node: p.Spec.NodeName, Warm: warm[p.Spec.NodeName], Seconds: time.Since(start).Seconds()}
			errs[i] = s.checkModel(target)
			if err := k.Unmount(ctx, p, target); err != nil && errs[i] == nil {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// holds reports whether node's agent reports cache uid Ready.
func (s *sandbox) holds(ctx context.Context, node, uid string) bool {
	nc := &prewarmv1alpha1.NodeCache{}
	if err := s.cluster.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
		return false
	}
	return slices.ContainsFunc(nc.Status.Caches, func(c prewarmv1alpha1.CacheStatus) bool { return c.UID == uid && c.State == inferencev1.CacheReady })
}

// checkModel checks that a mounted volume holds every file of the model, at its size.
func (s *sandbox) checkModel(dir string) error {
	for name, size := range s.files {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if info.Size() != size {
			return fmt.Errorf("%s: %d bytes through the volume, want %d", name, info.Size(), size)
		}
	}
	return nil
}

// peerBytes is what node's agent took from its peers for cache uid.
func (s *sandbox) peerBytes(ctx context.Context, node, uid string) int64 {
	var n int64
	_ = testutil.Until(ctx, 10*time.Second, func() error {
		nc := &prewarmv1alpha1.NodeCache{}
		if err := s.cluster.Client.Get(ctx, types.NamespacedName{Name: node}, nc); err != nil {
			return err
		}
		rep, ok := nc.Report(uid)
		if !ok || rep.State != inferencev1.CacheReady {
			return errors.New("not reported Ready yet")
		}
		n = rep.PeerBytes
		return nil
	})
	return n
}

func (s *sandbox) printResults(results []PodResult, s3Bytes, peerBytes int64) {
	size := s.modelBytes()
	s.say("\n  Each pod's model volume, served by its node's agent (prewarm's CSI node plugin), all asked at once, model %s:\n", engine.HumanBytes(size))
	tw := tabwriter.NewWriter(s.o.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  POD\tNODE\tNODE CACHE\tWEIGHTS READY AFTER")
	cold := 0
	for _, r := range results {
		word := "warm"
		if !r.Warm {
			word, cold = "cold", cold+1
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.3f s\n", r.Pod, r.Node, word, r.Seconds)
	}
	_ = tw.Flush()
	s.say("\n  The %d cold pods on %s share one download: %s from S3 and %s from the warm nodes; had each cold pod read the model itself, S3 would have sent %s.",
		cold, coldNode, engine.HumanBytes(s3Bytes), engine.HumanBytes(peerBytes), engine.HumanBytes(int64(cold)*size))
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
