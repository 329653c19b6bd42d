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
	cmd  func(endpoint, dest string) *exec.Cmd
	// syncAfter: the tool does not sync its files itself; the harness runs sync -f inside the
	// timed region.
	syncAfter bool
}

type sample struct {
	seconds float64
	rssMiB  float64
}

func main() {
	var (
		workDir     = flag.String("dir", "/var/tmp/prewarm-bench", "work folder (model data and downloads; needs about 3x the model size free)")
		shards      = flag.Int("shards", 3, "number of weight shards")
		shardMiB    = flag.Int("shard-mib", 1024, "size of each shard, MiB")
		reps        = flag.Int("reps", 3, "runs per tool and profile")
		out         = flag.String("out", "docs/benchmarks.md", "report to write (empty: print only)")
		connMBps    = flag.Float64("shaped-conn-mbps", 10, "shaped profile: bandwidth cap per connection, MB/s")
		latency     = flag.Duration("shaped-latency", 20*time.Millisecond, "shaped profile: first-byte latency")
		concurrency = flag.Int("concurrency", 0, "prewarm --concurrency (0: its default)")
		partSize    = flag.String("part-size", "", "prewarm --part-size (empty: its default)")
		only        = flag.String("tools", "", "comma-separated tools to run (default all)")
		profiles    = flag.String("profiles", "raw,shaped", "profiles to run")
	)
	flag.Parse()
	if err := run(*workDir, *shards, *shardMiB, *reps, *out, *connMBps, *latency, *concurrency, *partSize, *only, *profiles); err != nil {
		fmt.Fprintln(os.Stderr, "s3bench:", err)
		os.Exit(1)
	}
}

func run(workDir string, shards, shardMiB, reps int, outPath string, connMBps float64, latency time.Duration,
	concurrency int, partSize, only, profileList string) error {
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
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}
	tools, err := buildTools(workDir)
	if err != nil {
		return err
	}
	srv, err := s3fixture.Start(filepath.Join(workDir, "s3"))
	if err != nil {
		return err
	}
	defer srv.Stop()
	total, err := ensureModel(ctx, srv, shards, int64(shardMiB)<<20)
	if err != nil {
		return err
	}
	fmt.Printf("model: %d shards of %d MiB + small files = %.2f GB\n", shards, shardMiB, float64(total)/1e9)

	env := append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3fixture.SecretKey,
		"AWS_REGION="+s3fixture.Region, "AWS_CA_BUNDLE=", "AWS_PAGER=")
	rcloneRemote := func(endpoint string) string {
		return fmt.Sprintf(":s3,provider=Other,access_key_id=%s,secret_access_key=%s,endpoint='%s',force_path_style=true,region=%s:%s/%s",
			s3fixture.AccessKey, s3fixture.SecretKey, endpoint, s3fixture.Region, bucket, prefix)
	}
	prewarmArgs := []string{"--progress", "none"}
	if concurrency > 0 {
		prewarmArgs = append(prewarmArgs, "--concurrency", fmt.Sprint(concurrency))
	}
	if partSize != "" {
		prewarmArgs = append(prewarmArgs, "--part-size", partSize)
	}
	all := []tool{
		{name: "prewarm", cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(tools["kubectl-prewarm"], append([]string{"pull", "s3://" + bucket + "/" + prefix, dest, "--endpoint", ep}, prewarmArgs...)...)
		}},
		{name: "rclone (defaults)", syncAfter: true, cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(rclone, "copy", rcloneRemote(ep), dest)
		}},
		{name: "rclone (tuned)", syncAfter: true, cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(rclone, "copy", rcloneRemote(ep), dest, "--transfers", "8", "--checkers", "16",
				"--multi-thread-streams", "32", "--multi-thread-cutoff", "64Mi", "--multi-thread-chunk-size", "16Mi")
		}},
		{name: "transfermanager (defaults)", cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(tools["tmget"], "-endpoint", ep, "-bucket", bucket, "-prefix", prefix, "-dest", dest)
		}},
		{name: "transfermanager (128)", cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(tools["tmget"], "-endpoint", ep, "-bucket", bucket, "-prefix", prefix, "-dest", dest, "-concurrency", "128")
		}},
		{name: "aws cli", syncAfter: true, cmd: func(ep, dest string) *exec.Cmd {
			return exec.Command(aws, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", ep, "s3://"+bucket+"/"+prefix, dest)
		}},
	}
	var selected []tool
	for _, t := range all {
		if only == "" || strings.Contains(","+only+",", ","+t.name+",") || strings.Contains(only, strings.Fields(t.name)[0]) {
			selected = append(selected, t)
		}
	}

	ceilings := map[string]float64{}
	diskGBps, err := diskCeiling(filepath.Join(workDir, "disk-probe"), total)
	if err != nil {
		return err
	}
	ceilings["disk write (sequential, fsync)"] = diskGBps
	fmt.Printf("disk write ceiling: %.2f GB/s\n", diskGBps)

	results := map[string]map[string][]sample{}
	var profileNames []string
	for _, profile := range strings.Split(profileList, ",") {
		endpoint := srv.Endpoint
		var proxy *shaper.Proxy
		switch profile {
		case "raw":
		case "shaped":
			proxy, err = shaper.Start(srv.Endpoint, shaper.Options{BytesPerSecond: int64(connMBps * 1e6), FirstByteLatency: latency})
			if err != nil {
				return err
			}
			endpoint = proxy.URL
		default:
			return fmt.Errorf("unknown profile %q", profile)
		}
		profileNames = append(profileNames, profile)
		if err := coldWritesWarmServer(filepath.Join(workDir, "s3", bucket)); err != nil {
			return err
		}
		ceil, err := serverCeiling(ctx, srv, endpoint, total)
		if err != nil {
			return err
		}
		ceilings["S3 server, "+profile+" (64 ranged GETs in flight, to /dev/null)"] = ceil
		fmt.Printf("[%s] server ceiling: %.2f GB/s\n", profile, ceil)
		results[profile] = map[string][]sample{}
		for rep := 0; rep < reps; rep++ {
			order := rotate(selected, rep)
			for _, t := range order {
				s, err := runOnce(t, endpoint, filepath.Join(workDir, "dest"), filepath.Join(workDir, "s3", bucket), env, total)
				if err != nil {
					return fmt.Errorf("[%s] %s: %w", profile, t.name, err)
				}
				results[profile][t.name] = append(results[profile][t.name], s)
				fmt.Printf("[%s] rep %d %-18s %6.2fs  %6.2f GB/s  peak RSS %6.0f MiB\n", profile, rep+1, t.name, s.seconds, float64(total)/1e9/s.seconds, s.rssMiB)
			}
		}
		if proxy != nil {
			proxy.Close()
		}
	}
	report := render(selected, profileNames, results, ceilings, total, shards, shardMiB, reps, connMBps, latency, strings.Join(os.Args[1:], " "))
	fmt.Println()
	fmt.Println(report)
	if outPath != "" {
		return os.WriteFile(outPath, []byte(report+keptSections(outPath)), 0o644)
	}
	return nil
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

// ensureModel uploads the generated model unless the bucket already holds it.
func ensureModel(ctx context.Context, srv *s3fixture.Server, shards int, shardSize int64) (int64, error) {
	small := map[string]int64{"config.json": 700, "generation_config.json": 200, "tokenizer.json": 9 << 20, "tokenizer_config.json": 50 << 10}
	want := map[string]int64{}
	for k, v := range small {
		want[k] = v
	}
	for i := 1; i <= shards; i++ {
		want[fmt.Sprintf("model-%05d-of-%05d.safetensors", i, shards)] = shardSize
	}
	var total int64
	for _, n := range want {
		total += n
	}
	have := map[string]int64{}
	_ = srv.CreateBucket(ctx, bucket)
	p := s3.NewListObjectsV2Paginator(srv.Client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return 0, err
		}
		for _, o := range page.Contents {
			have[strings.TrimPrefix(aws.ToString(o.Key), prefix+"/")] = aws.ToInt64(o.Size)
		}
	}
	seed := uint64(1)
	for name, size := range want {
		seed++
		if have[name] == size {
			continue
		}
		fmt.Printf("uploading %s (%d MiB)\n", name, size>>20)
		if err := srv.Put(ctx, bucket, prefix+"/"+name, io.LimitReader(gen.Reader(seed), size), size); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// runOnce downloads into an empty dest, syncs when the tool does not, and checks the sizes.
func runOnce(t tool, endpoint, dest, serverData string, env []string, total int64) (sample, error) {
	if err := os.RemoveAll(dest); err != nil {
		return sample{}, err
	}
	if err := os.RemoveAll(filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".prewarm-partial")); err != nil {
		return sample{}, err
	}
	if err := coldWritesWarmServer(serverData); err != nil {
		return sample{}, err
	}
	cmd := t.cmd(endpoint, dest)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return sample{}, fmt.Errorf("%w: %s", err, stderr.String())
	}
	if t.syncAfter {
		if err := exec.Command("sync", "-f", dest).Run(); err != nil {
			return sample{}, err
		}
	}
	elapsed := time.Since(start).Seconds()
	rss := float64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024
	got, err := treeSize(dest)
	if err != nil {
		return sample{}, err
	}
	if got != total {
		return sample{}, fmt.Errorf("downloaded %d bytes, want %d", got, total)
	}
	return sample{seconds: elapsed, rssMiB: rss}, nil
}

func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.Mode().IsRegular() && !strings.HasPrefix(info.Name(), ".prewarm") {
			n += info.Size()
		}
		return nil
	})
	return n, err
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

// diskCeiling writes size bytes with 1 MiB writes across 4 files in parallel, then fsyncs.
func diskCeiling(dir string, size int64) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	buf := gen.Bytes(5, 1<<20)
	dropCaches()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for w := int64(0); w < size/4; w += int64(len(buf)) {
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
	return float64(size) / 1e9 / time.Since(start).Seconds(), nil
}

// serverCeiling reads every shard with 64 ranged GETs of 16 MiB in flight, into io.Discard.
func serverCeiling(ctx context.Context, srv *s3fixture.Server, endpoint string, total int64) (float64, error) {
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
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix + "/")})
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
	return float64(total) / 1e9 / time.Since(start).Seconds(), firstErr
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

func render(tools []tool, profiles []string, results map[string]map[string][]sample, ceilings map[string]float64,
	total int64, shards, shardMiB, reps int, connMBps float64, latency time.Duration, args string) string {
	var b strings.Builder
	cmdline := strings.TrimSpace("go run ./test/bench/s3bench " + args)
	fmt.Fprintf(&b, "# Benchmarks\n\nProduced by `make bench` (`%s`) on %s. Where the time goes, and what the goals are: [performance.md](performance.md). The real-node section is `make bench-nodes`'; the scale section is `make bench-scale`', explained in [scale.md](scale.md).\n\n", cmdline, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Machine: %s.\n\n", strings.Join(machineFacts(), "; "))
	fmt.Fprintf(&b, "Model: %d shards of %d MiB plus four small files, %.2f GB in all, served by versitygw (posix backend) on loopback. "+
		"Each run starts from an empty destination and a dropped page cache, with the server's objects then read into memory (a remote S3 serves from its own fleet, "+
		"so the local disk should only write), and ends with every file synced to disk "+
		"(tools that do not sync their files get `sync -f` inside the timed region). Tools alternate run by run; %d runs each; medians shown.\n\n",
		shards, shardMiB, float64(total)/1e9, reps)
	fmt.Fprintf(&b, "Profiles: **raw** is plain loopback; **shaped** goes through a proxy (in the benchmark process) that caps each response at %.0f MB/s and delays its first byte by %s, "+
		"as one S3 connection behaves. The cap is scaled to this machine: filling its loopback path (the server ceiling below) takes about as many connections "+
		"as filling a large GPU node takes on AWS (a 400 Gb/s NIC over roughly 5 Gb/s per S3 connection: about 80), which is what separates a downloader that keeps "+
		"many ranged reads in flight from one that keeps a few.\n\n", connMBps, latency)
	b.WriteString("## Ceilings, measured in the same session\n\n| what | GB/s |\n|---|---|\n")
	var keys []string
	for k := range ceilings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %.2f |\n", k, ceilings[k])
	}
	for _, p := range profiles {
		fmt.Fprintf(&b, "\n## %s\n\n| tool | median s | GB/s | prewarm is × faster | peak RSS MiB |\n|---|---|---|---|---|\n", p)
		base := median(secs(results[p]["prewarm"]))
		for _, t := range tools {
			ss := results[p][t.name]
			if len(ss) == 0 {
				continue
			}
			m := median(secs(ss))
			ratio := "—"
			if t.name != "prewarm" && base > 0 {
				ratio = fmt.Sprintf("%.2f×", m/base)
			}
			var rss []float64
			for _, s := range ss {
				rss = append(rss, s.rssMiB)
			}
			sort.Float64s(rss)
			fmt.Fprintf(&b, "| %s | %.2f | %.2f | %s | %.0f |\n", t.name, m, float64(total)/1e9/m, ratio, rss[len(rss)-1])
		}
	}
	return b.String()
}

func secs(ss []sample) []float64 {
	var out []float64
	for _, s := range ss {
		out = append(out, s.seconds)
	}
	return out
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
