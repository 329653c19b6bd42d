// Package cli holds the commands of kubectl-prewarm, thin over prewarm's libraries.
package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// NewRootCommand returns the kubectl-prewarm command tree.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "kubectl-prewarm",
		Short:         "See and drive prewarm's node-local caches of model weights and inference images",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newPullCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of kubectl-prewarm",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), Version())
			return err
		},
	}
}

// Version is the module version this binary was built from, or "devel".
func Version() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "devel"
}
