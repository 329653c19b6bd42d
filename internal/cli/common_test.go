package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// TestKlogLinesAreJSON: what client-go logs through klog (structured, printf-style, verbose,
// errors) comes out of the daemons' logger as one JSON object a line, with its message and its
// keys, and klog's verbose lines follow the daemon's verbosity.
func TestKlogLinesAreJSON(t *testing.T) {
	var out bytes.Buffer
	routeKlog(newLogger(&out, 2), 2)
	t.Cleanup(func() {
		klog.ClearLogger()
		routeKlog(newLogger(&bytes.Buffer{}, 0), 0)
		klog.ClearLogger()
	})

	klog.InfoS("successfully acquired lease", "lease", "hyperpod-inference-system/prewarm-controller")
	klog.Infof("Waited for %s due to client-side throttling", "1.2s")
	klog.V(2).InfoS("a verbose line", "n", 2)
	klog.V(3).InfoS("a line past the verbosity")
	klog.ErrorS(errors.New("connection refused"), "failed to watch", "resource", "pods")
	klog.Flush()

	type line struct {
		Level, Msg, Lease, Resource, Err string
		N                                int
	}
	var got []line
	for _, s := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("not a JSON line: %q (%v); all of it:\n%s", s, err, out.String())
		}
		got = append(got, l)
	}
	want := []line{
		{Level: "INFO", Msg: "successfully acquired lease", Lease: "hyperpod-inference-system/prewarm-controller"},
		{Level: "INFO", Msg: "Waited for 1.2s due to client-side throttling"},
		{Level: "DEBUG+2", Msg: "a verbose line", N: 2},
		{Level: "ERROR", Msg: "failed to watch", Resource: "pods", Err: "connection refused"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Durations in flag help read as the docs write them: no trailing zero minutes or seconds.
func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2 * time.Second: "2s", 5 * time.Minute: "5m", 90 * time.Second: "1m30s", 24 * time.Hour: "24h",
		90 * time.Minute: "1h30m", time.Hour + time.Second: "1h0m1s", 1500 * time.Millisecond: "1.5s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
}
