package kubectl

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/testutil/gen"
)

// Every field of a node's copy (inferencev1.CopyStatus), whether the cache's status lists the
// node or, with --all-nodes, its agent's NodeCache reports it, is in kubectl prewarm's report of
// the node under its own JSON name: a field added to CopyStatus fails here until NodeProgress
// carries it too.
func TestCopyStatusReachesKubectl(t *testing.T) {
	const uid = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	cs := gen.Every[inferencev1.CopyStatus]()
	m := &inferencev1.ModelDataCacheConfig{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: uid},
		Status: inferencev1.ModelDataCacheConfigStatus{TargetNodes: 2, Nodes: []inferencev1.NodeCacheStatus{{Name: "listed", CopyStatus: cs}}}}
	reporting := prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: "reporting"},
		Spec:   prewarmv1alpha1.NodeCacheSpec{Caches: []prewarmv1alpha1.CacheRequest{{UID: uid}}},
		Status: prewarmv1alpha1.NodeCacheStatus{Caches: []prewarmv1alpha1.CacheStatus{{UID: uid, CopyStatus: cs}}}}
	w := weightsReport(m, []prewarmv1alpha1.NodeCache{reporting}, nodeView{all: true})
	if len(w.Nodes) != 2 {
		t.Fatalf("report of nodes %+v; want the listed node and the reporting one", w.Nodes)
	}
	for _, n := range w.Nodes {
		// The node's JSON, as kubectl prewarm status -o json writes it, read back as a copy.
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		var got inferencev1.CopyStatus
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got != cs {
			t.Errorf("node %s in kubectl's report: %s\nread back as %+v, want %+v", n.Node, b, got, cs)
		}
	}
}
