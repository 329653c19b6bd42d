package kubectl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/scheme"
	"github.com/prewarm/prewarm/pkg/engine"
)

// statusOptions are the flags of `status` and `explain`.
type statusOptions struct {
	flags         *genericclioptions.ConfigFlags
	streams       genericiooptions.IOStreams
	output        string
	allNamespaces bool
	watch         bool
	interval      time.Duration
	nodes         nodeView
	now           func() time.Time
	// operatorNamespace is where explain reads the operator configuration.
	operatorNamespace string
}

func (o *statusOptions) addOutput(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json or yaml (default: text for people)")
}

func (o *statusOptions) print(v any, text func(io.Writer) error) error {
	switch o.output {
	case "":
		return text(o.streams.Out)
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(o.streams.Out, string(b))
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = o.streams.Out.Write(b)
		return err
	}
	return fmt.Errorf("--output %q: want json or yaml", o.output)
}

func newStatusCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, now func() time.Time) *cobra.Command {
	o := &statusOptions{flags: flags, streams: streams, now: now}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show every model with its weights and image caches, node by node",
		Long: `Show each InferenceEndpointConfig and JumpStartModel (or the one named) with its state, its
weights cache (how many nodes are ready, downloading, waiting, failed; per node: state, bytes,
rate, time left, error) and its image cache (per node: phase, pull error).

On a large fleet each cache lists the nodes that need attention first — failed, then the
slowest downloads, then those waiting — up to --max-nodes; --all-nodes lists every node, read
from the nodes' own NodeCache objects.`,
		Example: `  kubectl prewarm status
  kubectl prewarm status example-model -n default --watch
  kubectl prewarm status example-model --all-nodes -o json
  kubectl prewarm status -A -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return o.runStatus(cmd.Context(), name)
		},
	}
	o.addOutput(cmd)
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "every namespace")
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "redraw every --interval with progress bars, until interrupted")
	cmd.Flags().DurationVar(&o.interval, "interval", 2*time.Second, "time between redraws with --watch")
	cmd.Flags().IntVar(&o.nodes.limit, "max-nodes", defaultNodeLimit, "most nodes listed per cache, those that need attention first (0: no limit)")
	cmd.Flags().BoolVar(&o.nodes.all, "all-nodes", false, "list every node of each cache, from the nodes' own NodeCache objects")
	return cmd
}

func (o *statusOptions) runStatus(ctx context.Context, name string) error {
	c, ns, err := clientFor(o.flags)
	if err != nil {
		return err
	}
	if o.allNamespaces {
		ns = ""
	}
	tty := false
	if f, ok := o.streams.Out.(interface{ Fd() uintptr }); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	for {
		rep, err := buildStatus(ctx, c, ns, name, o.nodes)
		if err != nil {
			return err
		}
		if o.watch && tty && o.output == "" {
			fmt.Fprint(o.streams.Out, "\033[H\033[2J")
		}
		if err := o.print(rep, func(w io.Writer) error { return renderStatus(w, rep, o.watch) }); err != nil {
			return err
		}
		if !o.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.interval):
		}
		if !tty {
			fmt.Fprintln(o.streams.Out, "---")
		}
	}
}

// renderStatus writes the report for people; bars draws progress bars.
func renderStatus(w io.Writer, rep *StatusReport, bars bool) error {
	if len(rep.Parents) == 0 {
		_, err := fmt.Fprintln(w, "No InferenceEndpointConfig, JumpStartModel, ModelWeightsCacheConfig or ModelImageCache found.")
		return err
	}
	for i, p := range rep.Parents {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s %s/%s: %s\n", p.Kind, p.Namespace, p.Name, orDash(p.State))
		if p.Ready != nil {
			fmt.Fprintf(w, "  ready: %s %s: %s\n", p.Ready.Status, p.Ready.Reason, p.Ready.Message)
		}
		if p.Gated != nil && p.Gated.Status == "True" {
			fmt.Fprintf(w, "  gated: %s: %s\n", p.Gated.Reason, p.Gated.Message)
		}
		if p.Deployment != "" {
			fmt.Fprintf(w, "  deployment: %s, %d of %d pods ready\n", p.Deployment, p.ReadyReplicas, p.Replicas)
		}
		if x := p.Weights; x != nil {
			fmt.Fprintf(w, "  weights cache %s: %s, %d/%d nodes ready, %s", x.Name, orDash(x.State), x.Ready, x.Target, engine.HumanBytes(x.TotalBytes))
			if x.Revision != "" {
				fmt.Fprintf(w, ", revision %s", x.Revision)
			}
			fmt.Fprintln(w)
			if x.Ready < x.Target {
				fmt.Fprintf(w, "    %d downloading, %d waiting, %d failed\n", x.Downloading, x.Waiting, x.Failed)
			}
			if len(x.Nodes) > 0 {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "    NODE\tSTATE\tPROGRESS\tDISK\tRATE\tETA\tMESSAGE")
				for _, n := range x.Nodes {
					prog := fmt.Sprintf("%s / %s", engine.HumanBytes(n.BytesDone), engine.HumanBytes(n.BytesTotal))
					if bars {
						prog = bar(n.BytesDone, n.BytesTotal, 20) + " " + prog
					}
					rate, eta, disk := "-", "-", "-"
					if n.DiskBytes > 0 {
						disk = engine.HumanBytes(n.DiskBytes)
					}
					if n.BytesPerSecond > 0 {
						rate = engine.HumanBytes(n.BytesPerSecond) + "/s"
					}
					if n.ETASeconds != nil {
						eta = (time.Duration(*n.ETASeconds) * time.Second).String()
					}
					msg := n.Message
					if n.Reason != "" && n.State != "Ready" && n.State != "Downloading" {
						msg = n.Reason + ": " + msg
					}
					fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.State, prog, disk, rate, eta, msg)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if x.NodesOmitted > 0 {
				fmt.Fprintf(w, "    … and %d more nodes (those listed need attention first); --all-nodes lists every node\n", x.NodesOmitted)
			}
		}
		if x := p.Image; x != nil {
			if err := renderImage(w, x); err != nil {
				return err
			}
		}
	}
	return nil
}

// renderImage writes an image cache and the nodes whose pull needs attention.
func renderImage(w io.Writer, x *ImageReport) error {
	fmt.Fprintf(w, "  image cache %s/%s: %s, %d/%d nodes hold %s", x.Namespace, x.Name, orDash(x.Phase), x.Cached, x.Target, x.Image)
	if x.Digest != "" {
		fmt.Fprintf(w, " (%s)", x.Digest)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := false
	for _, n := range x.Nodes {
		if n.Phase == "Complete" {
			continue // only what needs attention
		}
		if !header {
			fmt.Fprintln(tw, "    NODE\tPHASE\tREASON\tMESSAGE")
			header = true
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\n", n.Node, n.Phase, orDash(n.Reason), n.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pending := int(x.Target-x.Cached) - attention(x.Nodes); x.NodesOmitted > 0 && pending > 0 {
		fmt.Fprintf(w, "    … and %d more nodes without the image yet\n", pending)
	}
	return nil
}

// attention counts the image nodes listed that do not hold the image.
func attention(nodes []ImageNode) int {
	n := 0
	for _, x := range nodes {
		if x.Phase != "Complete" {
			n++
		}
	}
	return n
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func bar(done, total int64, width int) string {
	if total <= 0 {
		return "[" + strings.Repeat(" ", width) + "]"
	}
	n := int(done * int64(width) / total)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func progressText(done, total, rate int64) string {
	s := fmt.Sprintf("%s of %s", engine.HumanBytes(done), engine.HumanBytes(total))
	if total > 0 {
		s += fmt.Sprintf(" (%d%%)", done*100/total)
	}
	if rate > 0 {
		s += fmt.Sprintf(", %s/s", engine.HumanBytes(rate))
		if total > done {
			s += ", " + (time.Duration((total-done)/rate) * time.Second).String() + " left"
		}
	}
	return s
}

// StatusAll renders `kubectl-prewarm status -A` for the cluster of a kubeconfig file, and says
// whether every parent is complete (the sandbox shows it as it waits).
func StatusAll(ctx context.Context, kubeconfig string) (string, bool, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", false, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return "", false, err
	}
	rep, err := buildStatus(ctx, c, "", "", nodeView{limit: defaultNodeLimit})
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
