package realnode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/testutil"
)

// deploymentNode is the node the parent's Deployment pod runs on.
func (e *env) deploymentNode(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	var pods corev1.PodList
	if err := e.C.Client.List(ctx, &pods, client.InNamespace("default")); err != nil {
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

// imageGC prunes every unused image on the nodes: the image the image cache holds stays on the
// node whose only user of it is the image cache, and goes from the node that merely pulled it.
func (e *env) imageGC(t *testing.T, ctx context.Context) {
	ref := "docker.io/" + serverImage
	// The node that runs no pod of the endpoint: only the image cache's container uses the image.
	witness := warm1
	if e.deploymentNode(t, ctx, "example-model") == warm1 {
		witness = warm2
	}
	if has, err := e.C.Node(cold).HasImage(ctx, ref); err != nil || !has {
		t.Fatalf("%s not on %s after its pod ran (err %v)", ref, cold, err)
	}
	// The kubelet removes a deleted pod's exited containers a little later; until then they
	// still use the image.
	err := testutil.Until(ctx, 3*time.Minute, func() error {
		for _, n := range []string{witness, cold} {
			if _, err := e.C.Node(n).PruneImages(ctx); err != nil {
				return err
			}
		}
		if has, err := e.C.Node(cold).HasImage(ctx, ref); err != nil || has {
			return errors.Join(err, fmt.Errorf("%s still on %s, where no pod uses it any more", ref, cold))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if has, err := e.C.Node(witness).HasImage(ctx, ref); err != nil || !has {
		t.Errorf("%s pruned from %s, where the image cache holds it (err %v)", ref, witness, err)
	}
	t.Logf("after pruning every unused image: %s kept on %s (image cache), gone from %s", ref, witness, cold)
}
