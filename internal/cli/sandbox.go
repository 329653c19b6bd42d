package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/sandbox"
	"github.com/prewarm/prewarm/internal/scheme"
)

func defaultSandboxDir() string { return filepath.Join(os.TempDir(), "prewarm-sandbox") }

func newSandboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run the whole of prewarm on this machine: control plane, simulated GPU nodes, S3, agents",
	}
	var (
		o         sandbox.Options
		modelSize string
	)
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the sandbox, apply the seed manifests, and measure warm and cold pods",
		Long: `Start a local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
built by hack/testbin.sh) with kwok nodes — three ml.g5.24xlarge and one ml.g5.xlarge, each with a
folder standing in for its NVMe — a local S3 server holding a generated model, a Hugging Face
Hub stand-in for the JumpStart model, prewarm's controller and one agent per node. Apply the two
seed manifests unchanged, show per-node progress until both are ready, then scale the endpoint
to 5 replicas after a node without the cache joins, run each pod's init container step against
its node's disk and print how long each pod waited for its weights and what it read from S3.

Run it from a clone of prewarm after make build. It stays up for kubectl until Ctrl-C or
"sandbox down"; with --exit it stops after the measurement. Logs: <dir>/logs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			size, err := ParseBytes(modelSize)
			if err != nil {
				return err
			}
			o.ModelSize, o.Out, o.Status = size, cmd.OutOrStdout(), sandboxStatus
			if o.BinDir == "" {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				o.BinDir = filepath.Dir(self)
			}
			return sandbox.Up(cmd.Context(), o)
		},
	}
	up.Flags().StringVar(&o.Dir, "dir", defaultSandboxDir(), "folder for everything the sandbox makes (removed when it stops)")
	up.Flags().StringVar(&o.BinDir, "bin-dir", "", "folder with the controller and agent binaries (default: this binary's folder)")
	up.Flags().StringVar(&modelSize, "model-size", "2GiB", "size of the generated model")
	up.Flags().IntVar(&o.Nodes, "nodes", 4, "simulated nodes at the start: all ml.g5.24xlarge but one ml.g5.xlarge (2-5)")
	up.Flags().BoolVar(&o.Exit, "exit", false, "stop after the measurement (for CI and scripts)")
	up.Flags().DurationVar(&o.Interval, "interval", 2*time.Second, "time between two progress displays")

	var dir string
	down := &cobra.Command{
		Use:   "down",
		Short: "Stop the sandbox and remove every file it made",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return sandbox.Down(dir, cmd.OutOrStdout()) },
	}
	down.Flags().StringVar(&dir, "dir", defaultSandboxDir(), "the sandbox's folder")
	cmd.AddCommand(up, down)
	return cmd
}

// sandboxStatus renders `kubectl-prewarm status -A` and says whether every parent is complete.
func sandboxStatus(ctx context.Context, kubeconfig string) (string, bool, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", false, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return "", false, err
	}
	rep, err := buildStatus(ctx, c, "", "")
	if err != nil {
		return "", false, err
	}
	var buf bytes.Buffer
	if err := renderStatus(&buf, rep, true); err != nil {
		return "", false, err
	}
	ready := len(rep.Parents) > 0
	for _, p := range rep.Parents {
		ready = ready && p.State == string(inferencev1.DeploymentComplete)
	}
	return buf.String(), ready, nil
}
