package main

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/pkg/engine"
)

const (
	beginMarker = "<!-- bench-fanout:begin (make bench-fanout writes this section) -->"
	endMarker   = "<!-- bench-fanout:end -->"
)

type report struct {
	o       options
	results []result
}

// quantile is the q-quantile of sorted d (nearest rank).
func quantile(d []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func (res result) sharing() string {
	if res.peers {
		return "on"
	}
	return "off"
}

func (res result) class() string {
	if res.witness {
		return "CRC only, witness"
	}
	if res.noDigest {
		return "CRC only"
	}
	return "MD5 ETag"
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func (r report) markdown() string {
	o := r.o
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Fan-out: N nodes warming one model together\n\n", beginMarker)
	var tuned string
	if o.streams > 0 {
		tuned += fmt.Sprintf(" --streams %d", o.streams)
	}
	if o.maxPeers > 0 {
		tuned += fmt.Sprintf(" --max-peers %d", o.maxPeers)
	}
	fmt.Fprintf(&b, "`make bench-fanout` (`go run ./test/bench/fanout --nodes %s --model %s --files %d --node-rate %d --origin-rate %d --slow-rate %d --part-size %s --concurrency %d%s --stagger %s`), %s, on this machine (%d CPUs, %s).\n\n",
		testutil.JoinInts(o.nodes), o.model, o.files, o.nodeRate, o.originRate, o.slowRate, o.partSize, o.concurrency, tuned, o.stagger,
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOARCH)
	fmt.Fprintf(&b, "A model of %s in %d files. Each node is a network namespace with its own agent process and disk folder, on a veth link shaped with `tbf` to %s/s in each direction; "+
		"the origin (versitygw) is behind a proxy capped at %s/s for all nodes together. The controller groups the nodes (one group up to 16). "+
		"Time to Ready is from the cache's creation to the node's NodeCache status saying Ready (polled every 100 ms; the agents write state changes every 250 ms). "+
		"\"Origin sent\" is every byte the origin's proxy sent, listings included. "+
		"Nodes take from each other only parts a digest vouches for (`peers.trust: SourceDigests`, docs/security.md): "+
		"\"MD5 ETag\" is the model uploaded in one part per file (its ETag is the MD5 of its bytes); \"CRC only\" the same model uploaded in 8 MiB parts (no digest of the source's own), "+
		"\"CRC only, witness\" with the controller's witness, which the nodes read such files through and which records each part's SHA-256 (its reads are the origin's, counted in \"origin sent\").\n\n",
		engine.HumanBytes(o.modelBytes), o.files, engine.HumanBytes(o.nodeRate), engine.HumanBytes(o.originRate))
	b.WriteString("Each link's rate is in the \"links\" column; the origin's cap is the same multiple of it in every run. " +
		"T(N)/T(1) compares runs at the same link rate. \"Machine CPU\" is the whole machine's busy share over the run, and of it the kernel's softirq (the network stack).\n\n")
	b.WriteString("| nodes | links | source | sharing | T(N) | T(N)/T(1) | per node p50 | per node p95 | origin sent / model | status originBytes / model | status peerBytes / model | machine CPU (softirq) |\n")
	b.WriteString("|---:|---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	t1 := map[int64]time.Duration{}
	for _, res := range r.results {
		if res.nodes == 1 && res.peers && !res.noDigest {
			t1[res.rate] = res.times[len(res.times)-1]
		}
	}
	for _, res := range r.results {
		if res.paused != "" || res.slow != "" || res.joined != nil {
			continue
		}
		t := res.times[len(res.times)-1]
		ratio := "–"
		if one := t1[res.rate]; one > 0 {
			ratio = fmt.Sprintf("%.2f", t.Seconds()/one.Seconds())
		}
		m := float64(o.modelBytes)
		fmt.Fprintf(&b, "| %d | %s/s | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.0f %% (%.0f %%) |\n", res.nodes, engine.HumanBytes(res.rate), res.class(), res.sharing(), secs(t), ratio,
			secs(quantile(res.times, 0.5)), secs(quantile(res.times, 0.95)), float64(res.originSent)/m,
			float64(res.status.OriginBytes)/m, float64(res.status.PeerBytes)/m, 100*res.machine.busy, 100*res.machine.softirq)
	}
	r.partWaits(&b)
	r.stalled(&b)
	r.staggered(&b, t1)
	r.classes(&b)
	r.goals(&b, t1)
	for _, res := range r.results {
		if res.nodes < 2 || !res.peers || res.noDigest || res.paused != "" || res.slow != "" || res.joined != nil {
			continue
		}
		if res.nodes != slices.Max(o.nodes) {
			continue
		}
		t := res.times[len(res.times)-1]
		fmt.Fprintf(&b, "\nWhere each node's time goes: %d nodes sharing, links at %s/s, T(N) %s. "+
			"Agent CPU is the agent process's CPU time over the run (of T(N)). The links' use is the bytes through the node's veth in each direction over T(N) at the link's rate. "+
			"Waited on peers is the time the download workers spent waiting for a peer to hold and start sending a part (`prewarm_engine_peer_wait_seconds_total`, summed over workers), also per part taken from peers. "+
			"Claimed is the parts the node read from the source although another member owned them (`prewarm_peer_claims_total`: stalled, idle, or behind at the tail); 429s are the requests its server refused as busy.\n\n",
			res.nodes, engine.HumanBytes(res.rate), secs(t))
		b.WriteString("| node | Ready | agent CPU | downlink use | uplink use | from peers / model | waited on peers | per part from peers | claimed | 429s |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, u := range res.uses {
			perPart := "–"
			if parts := u.peerBytes / float64(o.partBytes); parts > 0 {
				perPart = fmt.Sprintf("%.0f ms", 1000*u.peerWait/parts)
			}
			fmt.Fprintf(&b, "| %s | %s | %.1f s (%.0f %%) | %.0f %% | %.0f %% | %.2f | %.1f s | %s | %.0f | %.0f |\n", u.name, secs(u.ready), u.cpu, 100*u.cpu/t.Seconds(),
				100*u.rxUse, 100*u.txUse, u.peerBytes/float64(o.modelBytes), u.peerWait, perPart, u.claims, u.busy)
		}
	}
	b.WriteString("\nWhat limits T(N), and what was tried: [Fan-out: what limits T(N)](#fan-out-what-limits-tn), below.\n")
	fmt.Fprintf(&b, "\n%s\n", endMarker)
	return b.String()
}

// partWaits writes every run's part waits: how long the parts waited for their first byte, and
// the longest any went without a byte, from the agents' histograms.
func (r report) partWaits(b *strings.Builder) {
	b.WriteString("\nPart waits, every node's parts together, from the agents' histograms (so to a bucket's bound: ≤ 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120 s). " +
		"The wait is from a worker asking for a part (of a peer, or of the source) to its first byte (`prewarm_engine_part_wait_seconds`); " +
		"without progress is a part's longest time with no byte arriving, from being asked for to its last byte (`prewarm_engine_part_stall_seconds`; goal: none over 5 s). " +
		"A part no worker has asked for yet, its owner still reading it, counts in neither; in the stalled owner's run, the stopped node's own parts (which stood still with it) count in neither.\n\n")
	b.WriteString("| run | nodes | links | source | parts | wait p50 | wait p99 | wait max | without progress p99 | without progress max | none over 5 s |\n")
	b.WriteString("|:---|---:|---:|:---|---:|---:|---:|---:|---:|---:|:---|\n")
	for _, res := range r.results {
		if !res.peers {
			continue
		}
		kind := "all together"
		switch {
		case res.paused != "":
			kind = "stalled owner"
		case res.slow != "":
			kind = "slow owner"
		case res.joined != nil:
			kind = "staggered"
		}
		over := "–"
		if n := res.stall.total(); n > 0 {
			k := slices.Index(res.stall.bounds, 5)
			over = met(k >= 0 && res.stall.counts[k] == n)
		}
		fmt.Fprintf(b, "| %s | %d | %s/s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", kind, res.nodes, engine.HumanBytes(res.rate), res.class(), res.wait.total(),
			res.wait.quantile(0.5), res.wait.quantile(0.99), res.wait.quantile(1), res.stall.quantile(0.99), res.stall.quantile(1), over)
	}
}

// stalled writes the stalled-owner run's paragraph: the other nodes' time against the same run
// without a stop, and the origin's bytes, each against its goal.
func (r report) stalled(b *strings.Builder) {
	for _, res := range r.results {
		if res.paused == "" && res.slow == "" {
			continue
		}
		var plain time.Duration
		for _, o := range r.results {
			if o.paused == "" && o.slow == "" && o.joined == nil && o.peers && !o.noDigest && o.nodes == res.nodes && o.rate == res.rate {
				plain = o.times[len(o.times)-1]
			}
		}
		ratio := res.othersReady.Seconds() / plain.Seconds()
		origin := float64(res.originSent) / float64(r.o.modelBytes)
		if res.slow != "" {
			fmt.Fprintf(b, "\nA slow owner: %d nodes sharing, links at %s/s but %s's at a %dth of that. "+
				"The other %d nodes were Ready at %s, %.2f× the same run with every link alike (%s); the slow node at %s; the origin sent %.2f× the model (goal ≤ 1.1×: %s).\n",
				res.nodes, engine.HumanBytes(res.rate), res.slow, r.o.slowOwner, res.nodes-1, secs(res.othersReady), ratio, secs(plain),
				secs(res.times[len(res.times)-1]), origin, met(origin <= 1.1))
			continue
		}
		fmt.Fprintf(b, "\nA stalled owner: %d nodes sharing, links at %s/s, with %s's agent stopped (SIGSTOP: it neither reads, serves nor answers, its connections left open) for %s from %s after the cache's creation. "+
			"The other %d nodes were Ready at %s, %.2f× the same run without a stop (%s; goal ≤ 1.3×: %s); the stopped node at %s; the origin sent %.2f× the model (goal ≤ 1.1×: %s).\n",
			res.nodes, engine.HumanBytes(res.rate), res.paused, r.o.pause, r.o.pauseAt, res.nodes-1, secs(res.othersReady), ratio, secs(plain), met(ratio <= 1.3),
			secs(res.times[len(res.times)-1]), origin, met(origin <= 1.1))
	}
}

// staggered writes the staggered run's paragraph: each node's time from being made a target to
// Ready against one node alone, and the origin's bytes against its goal.
func (r report) staggered(b *strings.Builder, t1 map[int64]time.Duration) {
	for _, res := range r.results {
		if res.joined == nil {
			continue
		}
		var took []time.Duration
		for _, u := range res.uses {
			took = append(took, u.ready-res.joined[u.name])
		}
		slices.Sort(took)
		last := slices.Max(slices.Collect(maps.Values(res.joined)))
		origin := float64(res.originSent) / float64(r.o.modelBytes)
		alone := "–"
		if one := t1[res.rate]; one > 0 {
			alone = fmt.Sprintf("%s; the slowest %.2f× that", secs(one), took[len(took)-1].Seconds()/one.Seconds())
		}
		fmt.Fprintf(b, "\nStaggered starts: %d nodes sharing, links at %s/s, node k made a target k × %s after the cache's creation (its instance-type label set then; the last at %s), a scale-out one node at a time. "+
			"From being made a target to Ready the nodes took %s at the median and %s at most (one node alone: %s); the last was Ready at %s; the origin sent %.2f× the model (goal ≤ 1.1×: %s).\n",
			res.nodes, engine.HumanBytes(res.rate), r.o.stagger, secs(last), secs(quantile(took, 0.5)), secs(took[len(took)-1]), alone,
			secs(res.times[len(res.times)-1]), origin, met(origin <= 1.1))
	}
}

// classes writes, for the model uploaded in parts, its time and the origin's bytes against the
// same run of the model with digests, and the origin's goal.
func (r report) classes(b *strings.Builder) {
	for _, res := range r.results {
		if !res.peers || !res.noDigest || res.nodes < 2 {
			continue
		}
		same := "–"
		for _, o := range r.results {
			if o.peers && !o.noDigest && o.paused == "" && o.slow == "" && o.joined == nil && o.nodes == res.nodes && o.rate == res.rate {
				same = secs(o.times[len(o.times)-1])
			}
		}
		origin := float64(res.originSent) / float64(r.o.modelBytes)
		fmt.Fprintf(b, "\nSource classes: %d nodes sharing, links at %s/s, the model uploaded in parts (%s): the last node was Ready at %s (the model with MD5 ETags: %s); the origin sent %.2f× the model (goal ≤ 1.1×: %s).\n",
			res.nodes, engine.HumanBytes(res.rate), res.class(), secs(res.times[len(res.times)-1]), same, origin, met(origin <= 1.1))
	}
}

// goals writes the closing line: each of the fan-out's goals this run measured, met or not.
func (r report) goals(b *strings.Builder, t1 map[int64]time.Duration) {
	largest := slices.Max(r.o.nodes)
	if largest < 2 {
		return
	}
	var lines []string
	for _, res := range r.results {
		plain := res.paused == "" && res.slow == "" && res.joined == nil
		if !plain || !res.peers || res.nodes != largest {
			continue
		}
		t := res.times[len(res.times)-1]
		if one := t1[res.rate]; one > 0 && !res.noDigest {
			ratio := t.Seconds() / one.Seconds()
			lines = append(lines, fmt.Sprintf("T(%d)/T(1) ≤ 1.2 at %s/s: %.2f, %s", largest, engine.HumanBytes(res.rate), ratio, met(ratio <= 1.2)))
		}
		origin := float64(res.originSent) / float64(r.o.modelBytes)
		lines = append(lines, fmt.Sprintf("origin ≤ 1.1× the model, %s, %d nodes at %s/s: %.2f×, %s", res.class(), largest, engine.HumanBytes(res.rate), origin, met(origin <= 1.1)))
	}
	if len(lines) == 0 {
		return
	}
	stalled := ""
	if slices.ContainsFunc(r.results, func(res result) bool { return res.paused != "" }) {
		stalled = " The stalled owner's goal is in its paragraph above."
	}
	b.WriteString("\nGoals, in this run: " + strings.Join(lines, "; ") +
		"; files of an FSx or directory source: not run (no trusted reader reads file systems, so every node reads them whole, as with sharing off)." + stalled + "\n")
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// write replaces the report's section of the file at path (or appends it).
func (r report) write(path string) error {
	return testutil.WriteSection(path, beginMarker, endMarker, r.markdown())
}
