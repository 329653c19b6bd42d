package agentsim_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	prewarmconfig "github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/agentsim"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/harness"
	"github.com/prewarm/prewarm/pkg/engine"
)

const uid = "77777777-7777-4777-8777-777777777777"

// The simulated agents of make bench-scale write what the real agent writes: one cache is asked
// of a node with the real agent and of a node with a simulated one, and every status each
// writes is recorded. Both go through the same states with the same reasons, and every report
// of a state has the same fields, in the same shape, as the real agent's.
func TestSimulatedAgentWritesTheRealAgentsShape(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := testutil.APIServerFor(t)

	// A model on a mounted file system, large enough for the real agent to report progress.
	host := t.TempDir()
	root := "/opt/dlami/nvme"
	src := filepath.Join(host, "fsx", "model")
	for _, d := range []string{src, filepath.Join(host, root)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, size := range map[string]int{"config.json": 100, "model-00001-of-00002.safetensors": 96 << 20, "model-00002-of-00002.safetensors": 96 << 20} {
		if err := os.WriteFile(filepath.Join(src, name), gen.Bytes(uint64(size), size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := prewarmconfig.OperatorConfiguration{CacheRoots: testutil.DirRoots(root),
		FSx:          []prewarmconfig.FSxMount{{FileSystemID: "fs-0123456789abcdef0", MountPath: "/fsx"}},
		SourceAccess: []prewarmconfig.SourceRule{{Namespaces: []string{"*"}, FSx: &prewarmconfig.FSxRule{FileSystemID: "fs-0123456789abcdef0"}}},
		Agent:        prewarmconfig.Agent{Kubelet: testutil.NoKubelet()}}
	cfg.SetDefaults()
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.OperatorNamespace}}); err != nil {
		t.Fatal(err)
	}
	req := prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "default", Name: "shape", Root: root,
		Source: prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: "fs-0123456789abcdef0", Path: "model"}}

	rec := &recorder{written: map[string][]prewarmv1alpha1.NodeCacheStatus{}}
	go rec.watch(ctx, t, api)
	for _, node := range []string{"real", "simulated"} {
		nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{req}}}
		if err := api.Client.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	policy := agent.WritePolicy{Interval: 100 * time.Millisecond, ProgressInterval: 100 * time.Millisecond}
	harness.RunAgent(t, ctx, api, "real", agent.Options{Config: cfg, HostPrefix: host, StatusInterval: policy.Interval,
		ProgressInterval: policy.ProgressInterval, RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second, Version: "v-test",
		// Two seconds for the copy, as the simulated one takes: a local disk is fast enough to
		// copy it between two status writes otherwise, and there would be no progress to compare.
		Engine: []engine.Option{engine.WithRateLimit(96 << 20)}})
	if _, err := agentsim.Start(ctx, api.Config, []string{"simulated"}, agentsim.Options{Policy: policy, Download: 2 * time.Second,
		ModelBytes: 192<<20 + 100, Files: 3, Root: root, Version: "v-test", LeaseNamespace: cfg.OperatorNamespace}); err != nil {
		t.Fatal(err)
	}
	if err := testutil.Until(ctx, time.Minute, func() error { return rec.bothReady() }); err != nil {
		t.Fatal(err)
	}

	real, sim := rec.reports("real"), rec.reports("simulated")
	// The same states, in the same order (the real agent may go from queued to downloading
	// before its first write: a free download slot is taken at once).
	if rs, ss := transitions(real), transitions(sim); !slices.Equal(trimQueued(rs), trimQueued(ss)) {
		t.Errorf("states written: real agent %v, simulated %v", rs, ss)
	}
	// Every state's reports carry the same fields. A Pending (queued) report may be missing on
	// either side, as above: a busy machine may let a download start before the first write.
	for state, fields := range fieldsByState(real) {
		got, ok := fieldsByState(sim)[state]
		if !ok && state == string(inferencev1.CachePending) {
			continue
		}
		if !slices.Equal(got, fields) {
			t.Errorf("%s reports: the real agent sets %v, the simulated one %v", state, fields, got)
		}
	}
	for _, r := range append(slices.Clone(real), sim...) {
		if !messageShape.MatchString(r.Message) {
			t.Errorf("report message %q (%s) is not of a shape the agent writes", r.Message, r.State)
		}
	}
	// The node-level fields too.
	for _, node := range []string{"real", "simulated"} {
		st := rec.last(node)
		if st.AgentVersion != "v-test" || st.HeartbeatTime == nil || st.CredentialsKey == "" || len(st.Roots) != 1 || st.Roots[0].Path != root || st.Demands != nil {
			t.Errorf("%s node's status: %+v", node, st)
		}
	}
	// Each keeps a Lease of the same shape: named after the node, labelled, of the configured
	// duration, renewed.
	for _, node := range []string{"real", "simulated"} {
		lease := &coordinationv1.Lease{}
		err := testutil.Until(ctx, time.Minute, func() error {
			return api.Client.Get(ctx, types.NamespacedName{Namespace: cfg.OperatorNamespace, Name: node}, lease)
		})
		if err != nil || lease.Labels[prewarmv1alpha1.AgentLeaseLabel] != "true" || lease.Spec.RenewTime == nil ||
			lease.Spec.LeaseDurationSeconds == nil || *lease.Spec.LeaseDurationSeconds != int32(cfg.Agent.LeaseDuration.Seconds()) {
			t.Errorf("%s node's agent Lease: %+v (%v)", node, lease, err)
		}
	}
	r, s := real[len(real)-1], sim[len(sim)-1]
	if r.Files != s.Files || r.BytesTotal != s.BytesTotal || r.BytesDone != s.BytesDone || r.Reason != s.Reason || r.Message != s.Message {
		t.Errorf("Ready reports differ: real %+v, simulated %+v", r, s)
	}
}

// messageShape matches every message the agent's reports of a download give.
var messageShape = regexp.MustCompile(`^(waiting to start|listing fsx://\S+|(Listing|Downloading|Verifying|Publishing): [0-9.]+ [kMGT]?i?B of [0-9.]+ [kMGT]?i?B|\d+ files, [0-9.]+ [kMGT]?i?B, verified)$`)

func trimQueued(states []string) []string {
	return slices.DeleteFunc(slices.Clone(states), func(s string) bool { return s == "Pending/Queued" })
}

func transitions(reports []prewarmv1alpha1.CacheStatus) []string {
	var out []string
	for _, r := range reports {
		s := string(r.State) + "/" + r.Reason
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

// fieldsByState lists, for each state, the JSON fields any of its reports set.
func fieldsByState(reports []prewarmv1alpha1.CacheStatus) map[string][]string {
	out := map[string][]string{}
	for _, r := range reports {
		b, _ := json.Marshal(r)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		// What a copy takes on disk is measured from the real agent's files, at its own pace (the
		// simulated agents have no disk, and set it once a copy is whole): not a field of a state.
		delete(m, "diskBytes")
		for k := range m {
			if !slices.Contains(out[string(r.State)], k) {
				out[string(r.State)] = append(out[string(r.State)], k)
			}
		}
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out
}

// recorder keeps every status written to the two NodeCaches, from a watch.
type recorder struct {
	mu      sync.Mutex
	written map[string][]prewarmv1alpha1.NodeCacheStatus
}

func (r *recorder) watch(ctx context.Context, t *testing.T, api *testutil.APIServer) {
	wc, err := client.NewWithWatch(api.Config, client.Options{Scheme: testutil.Scheme()})
	if err != nil {
		t.Error(err)
		return
	}
	w, err := wc.Watch(ctx, &prewarmv1alpha1.NodeCacheList{})
	if err != nil {
		t.Error(err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if nc, ok := ev.Object.(*prewarmv1alpha1.NodeCache); ok {
			r.mu.Lock()
			r.written[nc.Name] = append(r.written[nc.Name], nc.Status)
			r.mu.Unlock()
		}
	}
}

func (r *recorder) reports(node string) []prewarmv1alpha1.CacheStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []prewarmv1alpha1.CacheStatus
	for _, st := range r.written[node] {
		for _, c := range st.Caches {
			if c.UID == uid {
				out = append(out, c)
			}
		}
	}
	return out
}

func (r *recorder) last(node string) prewarmv1alpha1.NodeCacheStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.written[node]
	return w[len(w)-1]
}

func (r *recorder) bothReady() error {
	for _, node := range []string{"real", "simulated"} {
		reports := r.reports(node)
		if len(reports) == 0 || reports[len(reports)-1].State != inferencev1.CacheReady {
			return &notReady{node, append(transitions(reports), lastMessage(reports))}
		}
	}
	return nil
}

type notReady struct {
	node   string
	states []string
}

func (e *notReady) Error() string { return e.node + " not Ready yet: " + strings.Join(e.states, ", ") }

func lastMessage(reports []prewarmv1alpha1.CacheStatus) string {
	if len(reports) == 0 {
		return "nothing written"
	}
	return reports[len(reports)-1].Message
}
