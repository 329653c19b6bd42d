package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prewarm/prewarm/internal/testutil/realnode"
	"github.com/prewarm/prewarm/internal/testutil/realseed"
)

// Node kinds.
const (
	// KindReal runs real kubelets (containerd, runc) where the machine allows: real pods.
	KindReal = "real"
	// KindKwok runs simulated nodes: no containers, so many nodes fit.
	KindKwok = "kwok"
	// KindAuto is real where the machine allows, kwok elsewhere.
	KindAuto = "auto"
)

// ResolveKind says which kind of node Up runs for the asked kind, and why.
func ResolveKind(kind string) (string, string, error) {
	why := realnode.Unsupported()
	switch kind {
	case KindReal:
		if why != "" {
			return "", "", fmt.Errorf("--nodes-kind=real: %s", why)
		}
		return KindReal, "real kubelet nodes (containerd, runc, bridge CNI): pods really run", nil
	case KindKwok:
		return KindKwok, "kwok nodes, as asked: simulated, no containers run", nil
	case KindAuto, "":
		if why != "" {
			return KindKwok, "kwok nodes (simulated, no containers run): this machine cannot run real ones: " + why, nil
		}
		return KindReal, "real kubelet nodes (containerd, runc, bridge CNI): pods really run", nil
	}
	return "", "", fmt.Errorf("--nodes-kind %q: want real, kwok or auto", kind)
}

// realSteps are the sandbox's steps on real nodes: prewarm installed with its chart from its own
// images, the seed applied, and real pods timed.
func (s *sandbox) realSteps() []step {
	return []step{
		{"start three real nodes, S3 and a Hugging Face Hub stand-in; build and push the images; helm install prewarm", s.startReal},
		{"apply the seed's two manifests unchanged", func(ctx context.Context) error { return s.real.ApplySeed(ctx) }},
		{"wait until both are ready", s.waitReady},
		{"time real pods: image cached against not, weights warm against cold", s.measureReal},
	}
}

func (s *sandbox) startReal(ctx context.Context) error {
	env, err := realseed.Start(ctx, realseed.Options{Dir: filepath.Join(s.o.Dir, "run"), ModelSize: s.o.ModelSize,
		Logf: func(format string, args ...any) { s.say("  "+format, args...) }})
	if err != nil {
		return err
	}
	s.real = env
	kc, err := os.ReadFile(env.C.Kubeconfig)
	if err != nil {
		return err
	}
	return os.WriteFile(s.kubeconfig(), kc, 0o600)
}

func (s *sandbox) measureReal(ctx context.Context) error {
	rep := &realseed.Report{}
	if err := s.real.MeasureImage(ctx, rep); err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: "default", Name: "example-model"}
	if err := s.real.MeasureWeights(ctx, key, rep); err != nil {
		return err
	}
	// Cold pods started together share the one download their node's agent makes for them.
	if _, err := s.real.MeasureSharedFill(ctx, key, 3, rep); err != nil {
		return err
	}
	s.say("\n  Real pods, created → condition (model %s; image %s):\n", rep.Model, rep.Image)
	var b strings.Builder
	rep.Table(&b)
	s.say("%s", strings.TrimRight(b.String(), "\n"))
	return s.printTables()
}

// explore is how to reach the cluster from a shell: real nodes live in the sandbox's network
// namespace.
func (s *sandbox) explore() string {
	if s.o.Kind != KindReal {
		return fmt.Sprintf("Explore it:\n  export KUBECONFIG=%s\n  kubectl get modeldatacacheconfig\n  kubectl get inferenceimagecache -n %s\n  kubectl-prewarm status\n  kubectl-prewarm explain node %s",
			s.kubeconfig(), opNS, coldNode)
	}
	enter := fmt.Sprintf("nsenter --net=/proc/%d/ns/net", os.Getpid())
	return fmt.Sprintf("The cluster lives in the sandbox's network namespace; run kubectl through it:\n  export KUBECONFIG=%s\n  %s kubectl get nodes -o wide\n  %s kubectl get modeldatacacheconfig\n  %s kubectl get pods -A\n  %s kubectl-prewarm status\n  %s kubectl-prewarm explain node %s",
		s.kubeconfig(), enter, enter, enter, enter, enter, realseed.Cold)
}
