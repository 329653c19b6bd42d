// Package kubectl holds the commands of kubectl-prewarm (also a kubectl plugin): status, explain
// node, pull and version.
package kubectl

import (
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/prewarm/prewarm/internal/cli"
)

// NewRootCommand returns the kubectl-prewarm command tree.
func NewRootCommand() *cobra.Command {
	return newRoot(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, time.Now)
}

// newRoot builds the command tree on these streams and this clock.
func newRoot(streams genericiooptions.IOStreams, now func() time.Time) *cobra.Command {
	root := &cobra.Command{
		Use:           "kubectl-prewarm",
		Short:         "See and drive prewarm's node-local caches of model weights and inference images",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var cpuProfile string
	root.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile to this file (for performance work)")
	_ = root.PersistentFlags().MarkHidden("cpuprofile")
	var profFile *os.File
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if cpuProfile == "" {
			return nil
		}
		var err error
		if profFile, err = os.Create(cpuProfile); err != nil {
			return err
		}
		return pprof.StartCPUProfile(profFile)
	}
	root.PersistentPostRunE = func(*cobra.Command, []string) error {
		if profFile == nil {
			return nil
		}
		pprof.StopCPUProfile()
		return profFile.Close()
	}
	flags := genericclioptions.NewConfigFlags(true)
	flags.AddFlags(root.PersistentFlags())
	root.AddCommand(newVersionCommand(), newPullCommand(),
		newStatusCommand(flags, streams, now), newExplainCommand(flags, streams, now))
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of kubectl-prewarm",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), cli.Version())
			return err
		},
	}
}
