// Command kubectl-prewarm is prewarm's command line, also usable as a kubectl plugin.
package main

import "github.com/prewarm/prewarm/internal/cli"

func main() { cli.Main(cli.NewRootCommand()) }
