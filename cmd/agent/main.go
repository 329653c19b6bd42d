// Command agent is prewarm's node agent, and (as "agent prepare") the init container of
// inference pods.
package main

import (
	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/cli/agentcmd"
)

func main() { cli.Main(agentcmd.NewAgentCommand()) }
