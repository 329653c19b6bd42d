// Command agent is prewarm's node agent, and (as "agent prepare") the init container of
// inference pods.
package main

import (
	// Root certificates for images without a system store (the images are built FROM scratch);
	// the system's are used where there are some.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/cli/agentcmd"
)

func main() { cli.Main(agentcmd.NewAgentCommand()) }
