// Command s3bench is make bench: it downloads a generated model from a local S3 server
// (versitygw) with prewarm's engine and with the tools a platform engineer would otherwise
// script (rclone at its defaults and tuned, the AWS CLI, aws-sdk-go-v2's transfermanager),
// alternating tools run by run, each run ending with the files synced to disk. It does this on
// raw loopback and through a shaping proxy (a bandwidth cap per connection and a first-byte
// latency, as S3 has), measures the server's and the disk's ceilings in the same session, and
// writes the medians, ratios and peak RSS to docs/benchmarks.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
	s3src "github.com/prewarm/prewarm/pkg/engine/source/s3"
)

const (
	bucket = "bench"
	prefix = "models/bench-model"
)

type tool struct {
	name string
	cmd  func(endpoint, prefix, dest string) *exec.Cmd
	// syncAfter: the tool does not sync its files itself; the harness runs sync -f inside the
	// timed region.
	syncAfter bool
}

type sample struct {
	seconds float64
	rssMiB  float64
	user    float64 // user and system seconds of the tool's process
	system  float64
	server  float64 // user + system seconds of the S3 server during the run
}

func (s sample) cpu() float64 { return s.user + s.system }

// layout is one model the tools download.
type layout struct {
	name, prefix, desc string
	files              map[string]int64
}

// layouts are the two shapes of model make bench measures: a few large shards (as most
// checkpoints are published), and many mid-size files with awkward names (spaces, non-ASCII, an
// empty file), where per-file costs and the number of transfers in flight count.
func layouts(shards, shardMiB, files, fileMiB int) []layout {
	large := layout{name: "large", prefix: "models/bench-model", files: map[string]int64{
		"config.json": 700, "generation_config.json": 200, "tokenizer.json": 9 << 20, "tokenizer_config.json": 50 << 10,
	}}
	for i := 1; i <= shards; i++ {
		large.files[fmt.Sprintf("model-%05d-of-%05d.safetensors", i, shards)] = int64(shardMiB) << 20
	}
	large.desc = fmt.Sprintf("%d shards of %d MiB plus four small files", shards, shardMiB)
	many := layout{name: "many", prefix: "models/bench-many", files: map[string]int64{
		"config.json": 1200, "tokenizer.json": 7 << 20, "README (model card).md": 5 << 10, "empty.txt": 0,
	}}
	for i := 1; i <= files; i++ {
		many.files[fmt.Sprintf("layers/layer %02d – gewichte.safetensors", i)] = int64(fileMiB) << 20
	}
	many.desc = fmt.Sprintf("%d files of %d MiB under names with spaces and non-ASCII, plus an empty file and three small ones", files, fileMiB)
	return []layout{large, many}
}

func (l layout) total() int64 {
	var n int64
	for _, v := range l.files {
		n += v
	}
	return n
}

// config is make bench's flags.
type config struct {
	workDir          string
	shards, shardMiB int
	files, fileMiB   int
	reps             int
	out              string
	connMBps         float64
	latency          time.Duration
	concurrency      int
	partSize         string
	only             string
	profiles         string
	layouts          string
	shapedLayouts    string
	profileCPU       bool
	baseline         string
}

func main() {
	var c config
	flag.StringVar(&c.workDir, "dir", "/var/tmp/prewarm-bench", "work folder (model data and downloads; needs about 3x the model sizes free)")
	flag.IntVar(&c.shards, "shards", 3, "large layout: number of weight shards")
	flag.IntVar(&c.shardMiB, "shard-mib", 1024, "large layout: size of each shard, MiB")
	flag.IntVar(&c.files, "files", 40, "many layout: number of mid-size files")
	flag.IntVar(&c.fileMiB, "file-mib", 64, "many layout: size of each, MiB")
	flag.IntVar(&c.reps, "reps", 3, "runs per tool, profile and layout")
	flag.StringVar(&c.out, "out", "docs/benchmarks.md", "report to write (empty: print only)")
	flag.Float64Var(&c.connMBps, "shaped-conn-mbps", 10, "shaped profile: bandwidth cap per connection, MB/s")
	flag.DurationVar(&c.latency, "shaped-latency", 20*time.Millisecond, "shaped profile: first-byte latency")
	flag.IntVar(&c.concurrency, "concurrency", 0, "prewarm --concurrency (0: its default)")
	flag.StringVar(&c.partSize, "part-size", "", "prewarm --part-size (empty: its default)")
	flag.StringVar(&c.only, "tools", "", "comma-separated tools to run (default all)")
	flag.StringVar(&c.profiles, "profiles", "raw,shaped", "profiles to run")
	flag.StringVar(&c.layouts, "layouts", "large,many", "model layouts to run on raw loopback")
	flag.StringVar(&c.shapedLayouts, "shaped-layouts", "large", "model layouts to run through the shaping proxy")
	flag.StringVar(&c.baseline, "baseline-prewarm", "", "another kubectl-prewarm binary (say, built from an earlier commit) to run side by side as \"prewarm (baseline)\"")
	flag.BoolVar(&c.profileCPU, "cpuprofile", true, "after the timed runs, profile one prewarm pull per layout (raw) and report where its CPU goes")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "s3bench:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	ctx := context.Background()
	bin, err := s3fixture.BinDir()
	if err != nil {
		return err
	}
	rclone := filepath.Join(bin, "rclone-v1.76.0")
	aws, err := exec.LookPath("aws")
	if err != nil {
		return fmt.Errorf("the AWS CLI is needed: apt-get install awscli (%w)", err)
	}
	if err := os.MkdirAll(c.workDir, 0o755); err != nil {
		return err
	}
	tools, err := buildTools(c.workDir)
	if err != nil {
		return err
	}
	srv, err := s3fixture.Start(filepath.Join(c.workDir, "s3"))
	if err != nil {
		return err
	}
	defer srv.Stop()
	all := layouts(c.shards, c.shardMiB, c.files, c.fileMiB)
	var biggest int64
	for _, l := range all {
		if err := ensureModel(ctx, srv, l); err != nil {
			return err
		}
		biggest = max(biggest, l.total())
		fmt.Printf("layout %s: %s = %.2f GB\n", l.name, l.desc, float64(l.total())/1e9)
	}

	env := append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3fixture.SecretKey,
		"AWS_REGION="+s3fixture.Region, "AWS_CA_BUNDLE=", "AWS_PAGER=")
	selected := selectTools(allTools(tools, rclone, aws, c), c.only)

	ceilings := map[string]float64{}
	disk, err := diskCeilings(filepath.Join(c.workDir, "disk-probe"), biggest)
	if err != nil {
		return err
	}
	for k, v := range disk {
		ceilings[k] = v
		fmt.Printf("%s: %.2f GB/s\n", k, v)
	}

	var sections []section
	for _, profile := range strings.Split(c.profiles, ",") {
		endpoint := srv.Endpoint
		var proxy *shaper.Proxy
		which := c.layouts
		switch profile {
		case "raw":
		case "shaped":
			proxy, err = shaper.Start(srv.Endpoint, shaper.Options{BytesPerSecond: int64(c.connMBps * 1e6), FirstByteLatency: c.latency})
			if err != nil {
				return err
			}
			endpoint, which = proxy.URL, c.shapedLayouts
		default:
			return fmt.Errorf("unknown profile %q", profile)
		}
		for _, l := range all {
			if !strings.Contains(","+which+",", ","+l.name+",") {
				continue
			}
			sec, err := runSection(ctx, srv, endpoint, profile, l, selected, env, c)
			if err != nil {
				return err
			}
			sections = append(sections, sec)
		}
		if proxy != nil {
			proxy.Close()
		}
	}
	var profiles []cpuProfile
	if c.profileCPU {
		for _, l := range all {
			if !strings.Contains(","+c.layouts+",", ","+l.name+",") {
				continue
			}
			p, err := profilePull(tools["kubectl-prewarm"], srv, l, c, env)
			if err != nil {
				return err
			}
			profiles = append(profiles, p)
		}
	}
	report := render(selected, sections, ceilings, profiles, c, strings.Join(os.Args[1:], " "))
	fmt.Println()
	fmt.Println(report)
	if c.out != "" {
		return os.WriteFile(c.out, []byte(report+keptSections(c.out)), 0o644)
	}
	return nil
}

// section is one profile on one layout: the server's ceiling there and every tool's runs.
type section struct {
	profile string
	layout  layout
	ceiling float64
	// ceilingCPU is the CPU-seconds per GB the server and the reading client spent at the
	// ceiling.
	ceilingServerCPU, ceilingClientCPU float64
	results                            map[string][]sample
}

func runSection(ctx context.Context, srv *s3fixture.Server, endpoint, profile string, l layout, tools []tool, env []string, c config) (section, error) {
	sec := section{profile: profile, layout: l, results: map[string][]sample{}}
	if err := coldWritesWarmServer(filepath.Join(c.workDir, "s3", bucket, l.prefix)); err != nil {
		return sec, err
	}
	selfBefore := selfCPU()
	srvCPU, err := serverCPUDuring(srv, func() (err error) {
		sec.ceiling, err = serverCeiling(ctx, srv, endpoint, l)
		return err
	})
	if err != nil {
		return sec, err
	}
	gb := float64(l.total()) / 1e9
	sec.ceilingServerCPU, sec.ceilingClientCPU = srvCPU/gb, (selfCPU()-selfBefore)/gb
	fmt.Printf("[%s %s] server ceiling: %.2f GB/s (server %.2f, client %.2f CPU-s/GB)\n", profile, l.name, sec.ceiling, sec.ceilingServerCPU, sec.ceilingClientCPU)
	total := l.total()
	for rep := 0; rep < c.reps; rep++ {
		for _, t := range rotate(tools, rep) {
			s, err := runOnce(t, srv, endpoint, l, filepath.Join(c.workDir, "dest"), filepath.Join(c.workDir, "s3", bucket, l.prefix), env)
			if err != nil {
				return sec, fmt.Errorf("[%s %s] %s: %w", profile, l.name, t.name, err)
			}
			sec.results[t.name] = append(sec.results[t.name], s)
			fmt.Printf("[%s %s] rep %d %-28s %6.2fs  %6.2f GB/s  CPU %5.1fs  server CPU %5.1fs  peak RSS %6.0f MiB\n",
				profile, l.name, rep+1, t.name, s.seconds, float64(total)/1e9/s.seconds, s.cpu(), s.server, s.rssMiB)
		}
	}
	return sec, nil
}

// pullCommand is bin (kubectl-prewarm, or another build of it) pulling prefix from ep into
// dest with the benchmark's engine settings, then extra.
func pullCommand(bin string, c config, ep, prefix, dest string, extra ...string) *exec.Cmd {
	args := []string{"pull", "s3://" + bucket + "/" + prefix, dest, "--endpoint", ep, "--progress", "none"}
	if c.concurrency > 0 {
		args = append(args, "--concurrency", fmt.Sprint(c.concurrency))
	}
	if c.partSize != "" {
		args = append(args, "--part-size", c.partSize)
	}
	return exec.Command(bin, append(args, extra...)...)
}

func allTools(built map[string]string, rclone, aws string, c config) []tool {
	rcloneRemote := func(endpoint, prefix string) string {
		return fmt.Sprintf(":s3,provider=Other,access_key_id=%s,secret_access_key=%s,endpoint='%s',force_path_style=true,region=%s:%s/%s",
			s3fixture.AccessKey, s3fixture.SecretKey, endpoint, s3fixture.Region, bucket, prefix)
	}
	pull := func(bin string, extra ...string) func(ep, prefix, dest string) *exec.Cmd {
		return func(ep, prefix, dest string) *exec.Cmd { return pullCommand(bin, c, ep, prefix, dest, extra...) }
	}
	tm := func(extra ...string) func(ep, prefix, dest string) *exec.Cmd {
		return func(ep, prefix, dest string) *exec.Cmd {
			return exec.Command(built["tmget"], append([]string{"-endpoint", ep, "-bucket", bucket, "-prefix", prefix, "-dest", dest}, extra...)...)
		}
	}
	tools := []tool{
		{name: "prewarm", cmd: pull(built["kubectl-prewarm"])},
		{name: "prewarm (page cache)", cmd: pull(built["kubectl-prewarm"], "--direct-io=false")},
		{name: "rclone (defaults)", syncAfter: true, cmd: func(ep, prefix, dest string) *exec.Cmd {
			return exec.Command(rclone, "copy", rcloneRemote(ep, prefix), dest)
		}},
		{name: "rclone (tuned)", syncAfter: true, cmd: func(ep, prefix, dest string) *exec.Cmd {
			return exec.Command(rclone, "copy", rcloneRemote(ep, prefix), dest, "--transfers", "8", "--checkers", "16",
				"--multi-thread-streams", "32", "--multi-thread-cutoff", "64Mi", "--multi-thread-chunk-size", "16Mi")
		}},
		{name: "transfermanager (defaults)", cmd: tm()},
		{name: "transfermanager (128)", cmd: tm("-concurrency", "128")},
		{name: "aws cli", syncAfter: true, cmd: func(ep, prefix, dest string) *exec.Cmd {
			return exec.Command(aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", ep, "s3://"+bucket+"/"+prefix, dest)
		}},
	}
	if c.baseline != "" {
		tools = append(tools, tool{name: "prewarm (baseline)", cmd: pull(c.baseline)})
	}
	return tools
}

func selectTools(all []tool, only string) []tool {
	var selected []tool
	for _, t := range all {
		if only == "" || strings.Contains(","+only+",", ","+t.name+",") || strings.Contains(only, strings.Fields(t.name)[0]) {
			selected = append(selected, t)
		}
	}
	return selected
}

func rotate(ts []tool, k int) []tool {
	out := append([]tool{}, ts[k%len(ts):]...)
	return append(out, ts[:k%len(ts)]...)
}

// buildTools builds kubectl-prewarm and the transfermanager harness into the work folder.
func buildTools(workDir string) (map[string]string, error) {
	out := map[string]string{}
	for name, pkg := range map[string]string{
		"kubectl-prewarm": "github.com/prewarm/prewarm/cmd/kubectl-prewarm",
		"tmget":           "github.com/prewarm/prewarm/test/bench/tmget",
	} {
		path := filepath.Join(workDir, "bin", name)
		cmd := exec.Command("go", "build", "-o", path, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("building %s: %w", name, err)
		}
		out[name] = path
	}
	return out, nil
}

// ensureModel uploads a layout's files unless the bucket already holds them.
func ensureModel(ctx context.Context, srv *s3fixture.Server, l layout) error {
	have := map[string]int64{}
	_ = srv.CreateBucket(ctx, bucket)
	p := s3.NewListObjectsV2Paginator(srv.Client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(l.prefix + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range page.Contents {
			have[strings.TrimPrefix(aws.ToString(o.Key), l.prefix+"/")] = aws.ToInt64(o.Size)
		}
	}
	names := make([]string, 0, len(l.files))
	for name := range l.files {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		size := l.files[name]
		if n, ok := have[name]; ok && n == size {
			continue
		}
		fmt.Printf("uploading %s/%s (%d MiB)\n", l.prefix, name, size>>20)
		if err := srv.Put(ctx, bucket, l.prefix+"/"+name, io.LimitReader(gen.Reader(uint64(i+2)), size), size); err != nil {
			return err
		}
	}
	return nil
}

// runOnce downloads into an empty dest, syncs when the tool does not, and checks the sizes.
func runOnce(t tool, srv *s3fixture.Server, endpoint string, l layout, dest, serverData string, env []string) (sample, error) {
	if err := os.RemoveAll(dest); err != nil {
		return sample{}, err
	}
	if err := os.RemoveAll(filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".prewarm-partial")); err != nil {
		return sample{}, err
	}
	if err := coldWritesWarmServer(serverData); err != nil {
		return sample{}, err
	}
	cmd := t.cmd(endpoint, l.prefix, dest)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	var elapsed float64
	srvCPU, err := serverCPUDuring(srv, func() error {
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, stderr.String())
		}
		if t.syncAfter {
			if err := exec.Command("sync", "-f", dest).Run(); err != nil {
				return err
			}
		}
		elapsed = time.Since(start).Seconds()
		return nil
	})
	if err != nil {
		return sample{}, err
	}
	rss := float64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024
	if err := checkTree(dest, l); err != nil {
		return sample{}, fmt.Errorf("%s: %w", t.name, err)
	}
	return sample{seconds: elapsed, rssMiB: rss, user: cmd.ProcessState.UserTime().Seconds(),
		system: cmd.ProcessState.SystemTime().Seconds(), server: srvCPU}, nil
}

// serverCPUDuring runs fn and returns the CPU-seconds the S3 server used meanwhile.
func serverCPUDuring(srv *s3fixture.Server, fn func() error) (float64, error) {
	before, err := srv.CPUSeconds()
	if err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	after, err := srv.CPUSeconds()
	return after - before, err
}

// checkTree checks that dest holds every file of the layout at its size.
func checkTree(dest string, l layout) error {
	for name, size := range l.files {
		info, err := os.Stat(filepath.Join(dest, filepath.FromSlash(name)))
		if err != nil {
			return err
		}
		if info.Size() != size {
			return fmt.Errorf("%s: %d bytes, want %d", name, info.Size(), size)
		}
	}
	return nil
}

// selfCPU is this process's user and system seconds so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// dropCaches empties the page cache (root only).
func dropCaches() {
	_ = exec.Command("sync").Run()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
}

// coldWritesWarmServer starts every run alike: nothing dirty or cached from the last run, and
// the server's objects in memory, as a remote S3 serves them, so that the local disk does only
// what it does on a node (write the model) instead of also serving it.
func coldWritesWarmServer(serverData string) error {
	dropCaches()
	return filepath.Walk(serverData, func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(io.Discard, f)
		return err
	})
}

// diskCeilings measures the disk's write rate the ways a downloader can write: through the page
// cache, and with O_DIRECT at a shallow and a deep queue (the engine keeps up to its concurrency
// in flight).
func diskCeilings(dir string, size int64) (map[string]float64, error) {
	out := map[string]float64{}
	for _, w := range []struct {
		writers int
		direct  bool
	}{{4, false}, {4, true}, {16, true}} {
		how := "writes through the page cache"
		if w.direct {
			how = "O_DIRECT writes"
		}
		name := fmt.Sprintf("disk write (%d writers, 1 MiB %s, then fsync)", w.writers, how)
		gbps, err := diskCeiling(dir, size, w.writers, w.direct)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = gbps
	}
	return out, nil
}

// diskCeiling writes size bytes with 1 MiB writes across writers files in parallel, then
// fsyncs.
func diskCeiling(dir string, size int64, writers int, direct bool) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	const chunk = 1 << 20
	raw := gen.Bytes(5, chunk+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))%4096)) % 4096
	buf := raw[skip : skip+chunk]
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if direct {
		flags |= syscall.O_DIRECT
	}
	per := size / int64(writers) / chunk // writes per writer
	dropCaches()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(i)), flags, 0o644)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for range per {
				if _, err := f.Write(buf); err != nil {
					errs <- err
					return
				}
			}
			errs <- f.Sync()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(per*int64(writers)*chunk) / 1e9 / time.Since(start).Seconds(), nil
}

// serverCeiling reads every shard with 64 ranged GETs of 16 MiB in flight, into io.Discard.
func serverCeiling(ctx context.Context, srv *s3fixture.Server, endpoint string, l layout) (float64, error) {
	client := s3.NewFromConfig(aws.Config{Region: s3fixture.Region, Credentials: srv.Client.Options().Credentials,
		HTTPClient: s3src.NewTransport(64)}, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
	type rng struct {
		key    string
		off, n int64
	}
	var work []rng
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(l.prefix + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return 0, err
		}
		for _, o := range page.Contents {
			for off := int64(0); off < aws.ToInt64(o.Size); off += 16 << 20 {
				work = append(work, rng{aws.ToString(o.Key), off, min(16<<20, aws.ToInt64(o.Size)-off)})
			}
		}
	}
	ch := make(chan rng)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range ch {
				out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(r.key),
					Range: aws.String(fmt.Sprintf("bytes=%d-%d", r.off, r.off+r.n-1))})
				if err == nil {
					_, err = io.Copy(io.Discard, out.Body)
					out.Body.Close()
				}
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	for _, r := range work {
		ch <- r
	}
	close(ch)
	wg.Wait()
	return float64(l.total()) / 1e9 / time.Since(start).Seconds(), firstErr
}

func median(xs []float64) float64 {
	s := append([]float64{}, xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func machineFacts() []string {
	facts := []string{fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		facts = append(facts, strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1]+" kB memory")
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		facts = append(facts, "kernel "+strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("findmnt", "-no", "FSTYPE,SOURCE", "-T", "/var/tmp").Output(); err == nil {
		facts = append(facts, "work folder on "+strings.TrimSpace(string(out)))
	}
	return facts
}

// keptSections returns the sections other benchmarks write into the same report (between
// "<!-- NAME:begin" and "<!-- NAME:end -->" lines: make bench-nodes', make bench-scale's), to
// keep them.
func keptSections(path string) string {
	old, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var kept strings.Builder
	text := string(old)
	for {
		i := strings.Index(text, "<!-- ")
		if i < 0 {
			return kept.String()
		}
		name, _, ok := strings.Cut(text[i+len("<!-- "):], ":begin")
		if !ok || strings.ContainsAny(name, " \n") {
			text = text[i+len("<!-- "):]
			continue
		}
		endMarker := "<!-- " + name + ":end -->"
		j := strings.Index(text, endMarker)
		if j < i {
			return kept.String()
		}
		end := j + len(endMarker)
		kept.WriteString("\n" + text[i:end] + "\n")
		text = text[end:]
	}
}
