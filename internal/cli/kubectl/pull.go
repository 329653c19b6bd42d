package kubectl

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

type pullOptions struct {
	endpoint    string
	region      string
	pathStyle   bool
	concurrency int
	partSize    string
	revision    string
	tokenFile   string
	limitRate   string
	progress    string
	directIO    bool
}

func newPullCommand() *cobra.Command {
	o := &pullOptions{}
	cmd := &cobra.Command{
		Use:   "pull SOURCE DEST",
		Short: "Download a model into a directory: fast, verified, resumable",
		Long: `Download a model into DEST, verify every file, and make it appear there at once.

SOURCE is one of
  s3://bucket/prefix          every object under the prefix (standard AWS credentials)
  hf://org/name[@revision]    a Hugging Face repository (a branch or tag is pinned to its commit)
  /path or file:///path       a local or mounted directory (e.g. FSx for Lustre)

DEST ends up holding the source's files at their relative paths, plus prewarm's own
.prewarm-manifest.json. A pull that is interrupted resumes where it stopped when run again;
a pull of what DEST already holds returns at once.`,
		Example: `  kubectl-prewarm pull s3://example-bucket/models/example-model /opt/dlami/nvme/example-model
  kubectl-prewarm pull hf://meta-llama/Llama-3.1-8B-Instruct ./llama --token-file ~/.hf-token
  kubectl-prewarm pull s3://models/llama ./llama --endpoint http://127.0.0.1:7070 --path-style`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0], args[1]) },
	}
	f := cmd.Flags()
	f.StringVar(&o.endpoint, "endpoint", "", "S3 endpoint (an S3-compatible store) or Hugging Face endpoint (a mirror; default $HF_ENDPOINT, else the Hub)")
	f.StringVar(&o.region, "region", "", "S3 region (default: from the AWS environment)")
	f.BoolVar(&o.pathStyle, "path-style", false, "address S3 buckets in the path (default when --endpoint is set)")
	f.IntVar(&o.concurrency, "concurrency", engine.DefaultConcurrency, "ranged reads in flight at once")
	f.StringVar(&o.partSize, "part-size", "16MiB", "size of each ranged read")
	f.StringVar(&o.revision, "revision", "", "Hugging Face branch, tag or commit (default main)")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding a Hugging Face token (default: $HF_TOKEN)")
	f.StringVar(&o.limitRate, "limit-rate", "", "cap the download rate, in bytes per second (e.g. 500MB)")
	f.BoolVar(&o.directIO, "direct-io", true, "write files verified as they stream in with O_DIRECT, past the page cache (the page cache where the filesystem refuses it)")
	f.StringVar(&o.progress, "progress", "auto", "progress display: auto (a bar on a terminal, lines otherwise), bar, lines or none")
	return cmd
}

func (o *pullOptions) run(cmd *cobra.Command, src, dest string) error {
	partSize, err := cli.ParseBytes(o.partSize)
	if err != nil {
		return fmt.Errorf("--part-size: %w", err)
	}
	var limit int64
	if o.limitRate != "" {
		if limit, err = cli.ParseBytes(o.limitRate); err != nil {
			return fmt.Errorf("--limit-rate: %w", err)
		}
	}
	if o.concurrency < 1 {
		return fmt.Errorf("--concurrency must be at least 1")
	}
	token := os.Getenv("HF_TOKEN")
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	pathStyle := sources.DefaultPathStyle(o.endpoint)
	if cmd.Flags().Changed("path-style") {
		pathStyle = o.pathStyle
	}
	ctx := cmd.Context()
	spec, err := sources.Parse(src)
	if err != nil {
		return err
	}
	endpoint := o.endpoint
	if endpoint == "" && spec.Kind == sources.HuggingFace {
		endpoint = os.Getenv("HF_ENDPOINT") // as the Hub's own tools read it
	}
	spec.Region = o.region
	if o.revision != "" {
		spec.Revision = o.revision
	}
	s, err := sources.Open(ctx, spec, sources.Options{
		Endpoint: endpoint, PathStyle: pathStyle, Token: token, Connections: o.concurrency,
	})
	if err != nil {
		return err
	}
	display, err := newProgressDisplay(o.progress, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	e := engine.New(
		engine.WithConcurrency(o.concurrency),
		engine.WithPartSize(partSize),
		engine.WithRateLimit(limit),
		engine.WithDirectIO(o.directIO),
		engine.WithProgress(display.update, display.interval),
	)
	res, err := e.Fetch(ctx, engine.Request{Source: s, Dest: dest})
	display.finish()
	if err != nil {
		return fmt.Errorf("pull %s: %w", s, err)
	}
	out := cmd.OutOrStdout()
	if res.UpToDate {
		_, err = fmt.Fprintf(out, "%s is up to date (%d files, %s)\n", dest, res.Files, engine.HumanBytes(res.Bytes))
		return err
	}
	rate := float64(res.Fetched) / max(res.Duration.Seconds(), 1e-9)
	_, err = fmt.Fprintf(out, "pulled %s into %s: %d files, %s verified; %s fetched in %s (%s/s)%s\n",
		s, dest, res.Files, engine.HumanBytes(res.Bytes), engine.HumanBytes(res.Fetched),
		res.Duration.Round(10*time.Millisecond), engine.HumanBytes(int64(rate)), revisionNote(res.Revision))
	return err
}

func revisionNote(rev string) string {
	if rev == "" {
		return ""
	}
	return "; revision " + rev
}

// progressDisplay draws a bar on a terminal, or prints a line every few seconds elsewhere.
type progressDisplay struct {
	w        io.Writer
	bar      bool
	none     bool
	interval time.Duration
	drawn    bool
	last     engine.Progress
}

func newProgressDisplay(mode string, w io.Writer) (*progressDisplay, error) {
	d := &progressDisplay{w: w}
	isTTY := false
	if f, ok := w.(*os.File); ok {
		isTTY = term.IsTerminal(int(f.Fd()))
	}
	switch mode {
	case "auto":
		d.bar = isTTY
	case "bar":
		d.bar = true
	case "lines":
	case "none":
		d.none = true
	default:
		return nil, fmt.Errorf("--progress %q: want auto, bar, lines or none", mode)
	}
	d.interval = 5 * time.Second
	if d.bar {
		d.interval = 200 * time.Millisecond
	}
	return d, nil
}

func (d *progressDisplay) update(p engine.Progress) {
	d.last = p
	if d.none || p.Phase == engine.PhaseDone || p.Phase == engine.PhaseListing {
		return
	}
	pct := 0.0
	if p.BytesTotal > 0 {
		pct = 100 * float64(p.BytesDone) / float64(p.BytesTotal)
	}
	eta := "--"
	if p.BytesPerSecond > 0 {
		eta = (time.Duration(float64(p.BytesTotal-p.BytesDone)/p.BytesPerSecond) * time.Second).Round(time.Second).String()
	}
	status := fmt.Sprintf("%5.1f%% %s / %s  %s/s  ETA %s  files %d/%d",
		pct, engine.HumanBytes(p.BytesDone), engine.HumanBytes(p.BytesTotal),
		engine.HumanBytes(int64(p.BytesPerSecond)), eta, p.FilesDone, p.FilesTotal)
	if !d.bar {
		fmt.Fprintf(d.w, "%s: %s\n", strings.ToLower(string(p.Phase)), status)
		return
	}
	const width = 30
	filled := int(pct / 100 * width)
	fmt.Fprintf(d.w, "\r[%s%s] %s\033[K", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), status)
	d.drawn = true
}

func (d *progressDisplay) finish() {
	if d.drawn {
		fmt.Fprintln(d.w)
	}
}
