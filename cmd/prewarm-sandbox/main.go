// Command prewarm-sandbox runs the whole of prewarm on one machine, for trying it out and for
// the end-to-end tests: a local control plane, simulated GPU nodes, a local S3 server, the
// controller and one agent per node. It is built on the test harness (internal/testutil) and is
// not shipped in prewarm's images.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/cli/kubectl"
	"github.com/prewarm/prewarm/internal/sandbox"
	"github.com/prewarm/prewarm/internal/testutil/realnode"
)

func defaultSandboxDir() string { return filepath.Join(os.TempDir(), "prewarm-sandbox") }

func newSandboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "prewarm-sandbox",
		SilenceUsage:  true,
		SilenceErrors: true,
		Short:         "Run the whole of prewarm on this machine: control plane, simulated GPU nodes, S3, agents",
	}
	var (
		o         sandbox.Options
		modelSize string
		kindFlag  string
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
"prewarm-sandbox down"; with --exit it stops after the measurement. Logs: <dir>/logs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			size, err := cli.ParseBytes(modelSize)
			if err != nil {
				return err
			}
			o.ModelSize, o.Out, o.Status = size, cmd.OutOrStdout(), kubectl.StatusAll
			kind, why, err := sandbox.ResolveKind(kindFlag)
			if err != nil {
				return err
			}
			o.Kind = kind
			if kind == sandbox.KindReal && !realnode.InNetns() {
				// Real nodes live in a network namespace of their own: run again inside one.
				fmt.Fprintf(cmd.OutOrStdout(), "nodes: %s\n", why)
				os.Exit(realnode.Main(func() int { return 0 }))
			}
			if kind == sandbox.KindReal {
				var upErr error
				realnode.Main(func() int { upErr = sandbox.Up(cmd.Context(), o); return 0 })
				return upErr
			}
			fmt.Fprintf(cmd.OutOrStdout(), "nodes: %s\n", why)
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
	up.Flags().IntVar(&o.Nodes, "nodes", 4, "kwok nodes at the start: all ml.g5.24xlarge but one ml.g5.xlarge (2-5; real nodes are always three)")
	up.Flags().StringVar(&kindFlag, "nodes-kind", sandbox.KindAuto, "real (kubelets, containerd: pods run), kwok (simulated, for many nodes) or auto (real where the machine allows)")
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

func main() {
	// The status display's clients log nothing.
	ctrllog.SetLogger(logr.Discard())
	cli.Main(newSandboxCommand())
}
