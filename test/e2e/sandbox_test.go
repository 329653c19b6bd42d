package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/testutil"
)

// The README's run command, as CI runs it: sandbox up --exit, then the table it prints.
func TestSandboxUpExit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "sandbox")
	cmd := exec.CommandContext(ctx, sandboxPath, "up", "--nodes-kind=kwok", "--exit", "--model-size=32MiB", "--dir="+dir, "--bin-dir="+filepath.Dir(agentPath))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sandbox up --exit: %v\n%s%s", err, out, logTails(dir))
	}
	text := string(out)
	size := regexp.MustCompile(`all asked at once, model ([0-9.]+ [kMG]B):`).FindStringSubmatch(text)
	if size == nil {
		t.Fatalf("no table header with the model's size:\n%s", text)
	}
	row := regexp.MustCompile(`(?m)^\s+(example-model-\S+)\s+(\S+)\s+(warm|cold)\s+([0-9.]+) s$`)
	rows := row.FindAllStringSubmatch(text, -1)
	if len(rows) != 5 {
		t.Fatalf("%d pod rows, want 5:\n%s", len(rows), text)
	}
	warm, cold := 0, 0
	for _, r := range rows {
		node, kind := r[2], r[3]
		switch kind {
		case "warm":
			warm++
			if node == "g5-cold" {
				t.Errorf("pod %s on g5-cold counted warm: the node joined without the cache", r[1])
			}
		case "cold":
			cold++
			if node != "g5-cold" {
				t.Errorf("pod %s on %s counted cold, want cold pods on g5-cold only", r[1], node)
			}
		}
	}
	if warm != 3 || cold != 2 {
		t.Errorf("%d warm and %d cold pods, want 3 and 2", warm, cold)
	}
	// The two cold pods share the one download their node's agent makes, from the warm nodes.
	if want := "The 2 cold pods on g5-cold share one download: "; !strings.Contains(text, want) {
		t.Errorf("output lacks %q", want)
	}
	// The three nodes warming the seed's cache together read it from S3 about once.
	shared := regexp.MustCompile(`The 3 nodes warmed example-model-cache together: S3 sent [0-9.]+ [kMG]?B \(([0-9.]+)× the model`).FindStringSubmatch(text)
	if shared == nil {
		t.Errorf("output does not say what S3 sent the three warming nodes:\n%s", text)
	} else if r, err := strconv.ParseFloat(shared[1], 64); err != nil || r > 1.5 {
		t.Errorf("S3 sent %s× the model to three nodes warming together; want about 1×", shared[1])
	}
	for _, want := range []string{
		"$ kubectl get modeldatacacheconfig",
		"$ kubectl get inferenceimagecache -n hyperpod-inference-system",
		"example-model-cache", "example-jumpstart-model-cache", "iic-vllm-openai-ml-g5-24xlarge-",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	var headers []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "NAME" {
			headers = append(headers, strings.Join(f, " "))
		}
	}
	if len(headers) != 2 || headers[0] != "NAME STATE TARGET READY AGE" || headers[1] != "NAME PHASE CACHED TARGET AGE" {
		t.Errorf("kubectl get headers %q, want the seed's columns", headers)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the sandbox left %s behind (%v)", dir, err)
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}

// sandbox up stays up until sandbox down, which stops it and removes its files.
func TestSandboxDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "sandbox")
	up := exec.CommandContext(ctx, sandboxPath, "up", "--nodes-kind=kwok", "--model-size=8MiB", "--dir="+dir, "--bin-dir="+filepath.Dir(agentPath))
	var mu sync.Mutex
	var out bytes.Buffer
	up.Stdout = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	up.Stderr = up.Stdout
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- up.Wait() }()
	deadline := time.After(6 * time.Minute)
	for {
		mu.Lock()
		ready := strings.Contains(out.String(), "The sandbox is up.")
		mu.Unlock()
		if ready {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("sandbox up ended early: %v\n%s%s", err, out.String(), logTails(dir))
		case <-deadline:
			t.Fatalf("sandbox up never came up:\n%s", out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "kubeconfig")); err != nil {
		t.Errorf("no kubeconfig for kubectl: %v", err)
	}
	downOut, err := exec.CommandContext(ctx, sandboxPath, "down", "--dir="+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("sandbox down: %v\n%s", err, downOut)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sandbox up exited with %v after down:\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("sandbox up still runs after sandbox down")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after sandbox down (%v)", dir, err)
	}
	if out, err := exec.CommandContext(ctx, sandboxPath, "down", "--dir="+dir).CombinedOutput(); err != nil || !strings.Contains(string(out), "no sandbox") {
		t.Errorf("a second down: %v %s", err, out)
	}
}

// logTails is the end of the controller's and the agents' logs a failed sandbox keeps in
// dir/logs, for a failure's report.
func logTails(dir string) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, p := range logs {
		if name := filepath.Base(p); strings.HasPrefix(name, "controller") || strings.HasPrefix(name, "agent-") {
			fmt.Fprintf(&b, "\n--- the end of %s:\n%s\n", name, testutil.FileTail(p, 6000))
		}
	}
	return b.String()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
