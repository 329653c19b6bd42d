package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
)

// cpuProfile is one profiled prewarm pull: its time, its CPU, and where that CPU went.
type cpuProfile struct {
	layout         layout
	seconds        float64
	user, system   float64
	top            string             // go tool pprof -top, trimmed
	groups         map[string]float64 // share of the samples under each group of functions
	samplesSeconds float64
	server         float64            // the S3 server's CPU-seconds during the pull
	machine        map[string]float64 // the machine's time during the pull, by /proc/stat column, in CPU-seconds
}

// machineColumns are /proc/stat's cpu columns, in order.
var machineColumns = []string{"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}

// machineTicks reads the machine-wide cpu line of /proc/stat, in CPU-seconds.
func machineTicks() (map[string]float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	out := map[string]float64{}
	for i, name := range machineColumns {
		if i+1 >= len(f) {
			break
		}
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			return nil, err
		}
		out[name] = v / 100 // USER_HZ
	}
	return out, nil
}

// profileGroups are the kinds of work a pull's CPU goes to, each matched (cumulatively) by
// function name in the profile.
var profileGroups = []struct {
	name string
	re   *regexp.Regexp
}{
	{"writes (pwrite64)", regexp.MustCompile(`^(internal/poll\.\(\*FD\)\.Pwrite|os\.\(\*File\)\.WriteAt)$`)},
	{"socket reads", regexp.MustCompile(`^internal/poll\.\(\*FD\)\.Read$`)},
	{"CRC-64/NVME", regexp.MustCompile(`^github\.com/minio/crc64nvme\.`)},
	{"CRC-32C", regexp.MustCompile(`^hash/crc32\.`)},
	{"the AWS SDK's request pipeline", regexp.MustCompile(`^github\.com/aws/aws-sdk-go-v2/service/s3\.\(\*Client\)\.GetObject$`)},
	{"memory copies", regexp.MustCompile(`^runtime\.memmove$`)},
	{"garbage collection", regexp.MustCompile(`^runtime\.gcBgMarkWorker$`)},
	{"scheduler", regexp.MustCompile(`^runtime\.(schedule|findRunnable|mcall)$`)},
}

// profilePull runs one prewarm pull of l with --cpuprofile and summarises the profile.
func profilePull(prewarm string, srv *s3fixture.Server, l layout, c config, env []string) (cpuProfile, error) {
	p := cpuProfile{layout: l}
	prof := filepath.Join(c.workDir, "pull-"+l.name+".pprof")
	profiled := tool{name: "prewarm (profiled)", cmd: func(ep, prefix, dest string) *exec.Cmd {
		return pullCommand(prewarm, c, ep, prefix, dest, "--cpuprofile", prof)
	}}
	before, err := machineTicks()
	if err != nil {
		return p, err
	}
	s, err := runOnce(profiled, srv, srv.Endpoint, l, filepath.Join(c.workDir, "dest"), filepath.Join(c.workDir, "s3", bucket, l.prefix), env)
	if err != nil {
		return p, err
	}
	after, err := machineTicks()
	if err != nil {
		return p, err
	}
	p.seconds, p.user, p.system, p.server = s.seconds, s.user, s.system, s.server
	p.machine = map[string]float64{}
	for k, v := range after {
		p.machine[k] = v - before[k]
	}
	top, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=14", prewarm, prof).Output()
	if err != nil {
		return p, fmt.Errorf("go tool pprof: %w", err)
	}
	p.top = trimTop(string(top))
	cum, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=100000", prewarm, prof).Output()
	if err != nil {
		return p, fmt.Errorf("go tool pprof: %w", err)
	}
	p.groups, p.samplesSeconds = groupShares(string(cum))
	return p, nil
}

// trimTop keeps pprof's header line on the total and its table.
func trimTop(out string) string {
	var keep []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, "File:") || strings.HasPrefix(line, "Build ID:") || strings.HasPrefix(line, "Type:") ||
			strings.HasPrefix(line, "Time:") || strings.HasPrefix(line, "Showing top") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

var (
	totalRE = regexp.MustCompile(`Total samples = ([0-9.]+)(ms|s)`)
	cumRE   = regexp.MustCompile(`^\s*\S+\s+\S+%\s+\S+%\s+([0-9.]+)(ms|s)\s+(\S+)%\s+(.+)$`)
)

// groupShares reads pprof -top -cum output and returns each group's share of the samples (the
// largest cumulative share of a function it matches) and the samples' total in seconds.
func groupShares(out string) (map[string]float64, float64) {
	shares := map[string]float64{}
	var total float64
	if m := totalRE.FindStringSubmatch(out); m != nil {
		total, _ = strconv.ParseFloat(m[1], 64)
		if m[2] == "ms" {
			total /= 1000
		}
	}
	for _, line := range strings.Split(out, "\n") {
		m := cumRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pct, _ := strconv.ParseFloat(m[3], 64)
		fn := strings.TrimSpace(m[4])
		for _, g := range profileGroups {
			if g.re.MatchString(fn) && pct > shares[g.name] {
				shares[g.name] = pct
			}
		}
	}
	return shares, total
}

func render(tools []tool, sections []section, ceilings map[string]float64, profiles []cpuProfile, c config, args string) string {
	var b strings.Builder
	cmdline := strings.TrimSpace("go run ./test/bench/s3bench " + args)
	fmt.Fprintf(&b, "# Benchmarks\n\nProduced by `make bench` (`%s`) on %s. Where the time goes, and what the goals are: [performance.md](performance.md). The real-node section is `make bench-nodes`'; the scale section is `make bench-scale`', explained in [scale.md](scale.md); the fan-out section is `make bench-fanout`'s.\n\n", cmdline, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Machine: %s.\n\n", strings.Join(machineFacts(), "; "))
	b.WriteString("Models, served by versitygw (posix backend) on loopback, uploaded with the AWS SDK's defaults (so each object carries a full-object CRC64NVME):\n\n")
	seen := map[string]bool{}
	for _, s := range sections {
		if !seen[s.layout.name] {
			seen[s.layout.name] = true
			fmt.Fprintf(&b, "- **%s**: %s, %.2f GB in all.\n", s.layout.name, s.layout.desc, float64(s.layout.total())/1e9)
		}
	}
	fmt.Fprintf(&b, "\nEach run starts from an empty destination and a dropped page cache, with the server's objects then read into memory (a remote S3 serves from its own fleet, "+
		"so the local disk should only write), and ends with every file synced to disk "+
		"(tools that do not sync their files get `sync -f` inside the timed region). Tools alternate run by run; %d runs each; medians shown. "+
		"CPU is the tool's own user + system seconds (median); the kernel's writeback of the page cache is not in it.\n\n", c.reps)
	fmt.Fprintf(&b, "Profiles: **raw** is plain loopback; **shaped** goes through a proxy (in the benchmark process) that caps each response at %.0f MB/s and delays its first byte by %s, "+
		"as one S3 connection behaves. The cap is scaled to this machine: filling its loopback path (the server ceiling below) takes about as many connections "+
		"as filling a large GPU node takes on AWS (a 400 Gb/s NIC over roughly 5 Gb/s per S3 connection: about 80), which is what separates a downloader that keeps "+
		"many ranged reads in flight from one that keeps a few.\n\n", c.connMBps, c.latency)
	b.WriteString("## Ceilings, measured in the same session\n\n| what | GB/s |\n|---|---|\n")
	for _, s := range sections {
		fmt.Fprintf(&b, "| S3 server, %s, %s layout (64 ranged GETs of 16 MiB in flight, to /dev/null) | %.2f |\n", s.profile, s.layout.name, s.ceiling)
	}
	var keys []string
	for k := range ceilings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	disk := 0.0
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %.2f |\n", k, ceilings[k])
		disk = max(disk, ceilings[k])
	}
	for _, s := range sections {
		renderSection(&b, tools, s, disk)
	}
	for _, p := range profiles {
		renderProfile(&b, p)
	}
	return b.String()
}

func renderSection(b *strings.Builder, tools []tool, s section, disk float64) {
	total := s.layout.total()
	gb := float64(total) / 1e9
	fmt.Fprintf(b, "\n## %s, %s layout\n\n| tool | median s | GB/s | prewarm is × faster | CPU s | server CPU s | peak RSS MiB |\n|---|---|---|---|---|---|---|\n", s.profile, s.layout.name)
	base := median(secs(s.results["prewarm"]))
	for _, t := range tools {
		ss := s.results[t.name]
		if len(ss) == 0 {
			continue
		}
		m := median(secs(ss))
		ratio := "—"
		if t.name != "prewarm" && base > 0 {
			ratio = fmt.Sprintf("%.2f×", m/base)
		}
		var rss, cpu, srv []float64
		for _, x := range ss {
			rss = append(rss, x.rssMiB)
			cpu = append(cpu, x.cpu())
			srv = append(srv, x.server)
		}
		sort.Float64s(rss)
		fmt.Fprintf(b, "| %s | %.2f | %.2f | %s | %.1f | %.1f | %.0f |\n", t.name, m, gb/m, ratio, median(cpu), median(srv), rss[len(rss)-1])
	}
	if base <= 0 {
		return
	}
	ceil := min(s.ceiling, disk)
	fmt.Fprintf(b, "\nprewarm: %.2f GB/s = %.0f %% of min(server ceiling %.2f, disk ceiling %.2f GB/s).", gb/base, 100*gb/base/ceil, s.ceiling, disk)
	var cpu, srv []float64
	for _, x := range s.results["prewarm"] {
		cpu = append(cpu, x.cpu())
		srv = append(srv, x.server)
	}
	perGB := (median(cpu) + median(srv)) / gb
	cpus := float64(runtime.NumCPU())
	fmt.Fprintf(b, " The server and prewarm share this machine's %.0f CPUs: prewarm spent %.2f and the server %.2f CPU-seconds per GB, "+
		"so with nothing else running the two could not go past %.2f GB/s (prewarm reached %.0f %% of that). "+
		"At the server ceiling the server spent %.2f and the reading client %.2f CPU-seconds per GB.\n",
		cpus, median(cpu)/gb, median(srv)/gb, cpus/perGB, 100*gb/base/(cpus/perGB), s.ceilingServerCPU, s.ceilingClientCPU)
}

func renderProfile(b *strings.Builder, p cpuProfile) {
	fmt.Fprintf(b, "\n## Where prewarm's CPU goes: raw, %s layout\n\n", p.layout.name)
	fmt.Fprintf(b, "One more pull after the timed runs, with `--cpuprofile`: %.2f s, %.1f CPU-seconds user and %.1f system (of %d available: %.0f %% of the machine); %.1f s of samples.\n\n",
		p.seconds, p.user, p.system, runtime.NumCPU(), 100*(p.user+p.system)/(float64(runtime.NumCPU())*p.seconds), p.samplesSeconds)
	var all float64
	for _, v := range p.machine {
		all += v
	}
	if all > 0 {
		b.WriteString("The whole machine meanwhile (`/proc/stat`), against what the two processes account for:\n\n| where | CPU-seconds | share |\n|---|---|---|\n")
		for _, k := range machineColumns {
			fmt.Fprintf(b, "| %s | %.2f | %.0f %% |\n", k, p.machine[k], 100*p.machine[k]/all)
		}
		fmt.Fprintf(b, "| of which prewarm (user + system) | %.2f | %.0f %% |\n", p.user+p.system, 100*(p.user+p.system)/all)
		fmt.Fprintf(b, "| of which the S3 server | %.2f | %.0f %% |\n\n", p.server, 100*p.server/all)
	}
	b.WriteString("| work | share of the pull's samples (cumulative) |\n|---|---|\n")
	for _, g := range profileGroups {
		fmt.Fprintf(b, "| %s | %.1f %% |\n", g.name, p.groups[g.name])
	}
	fmt.Fprintf(b, "\nTop functions by their own time (`go tool pprof -top`):\n\n```\n%s\n```\n", p.top)
}

func secs(ss []sample) []float64 {
	var out []float64
	for _, s := range ss {
		out = append(out, s.seconds)
	}
	return out
}
