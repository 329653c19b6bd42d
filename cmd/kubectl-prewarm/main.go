// Command kubectl-prewarm is prewarm's command line, also usable as a kubectl plugin.
package main

import (
	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/cli/kubectl"
)

func main() { cli.Main(kubectl.NewRootCommand()) }
