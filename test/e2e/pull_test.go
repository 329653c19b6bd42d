// Package e2e runs prewarm as a user meets it: real binaries, a real S3 server, real files.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/internal/testutil/shaper"
)

var (
	cliPath, agentPath, controllerPath, sandboxPath string
	s3srv                                           *s3fixture.Server
	model                                           = map[string][]byte{}
	total                                           int64
)

const bucket, prefix = "example-bucket", "models/example-model"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testutil.SkipPackageIfShort() {
		return 0
	}
	tmp, err := os.MkdirTemp("", "prewarm-e2e-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmp)
	cliPath = filepath.Join(tmp, "kubectl-prewarm")
	agentPath = filepath.Join(tmp, "agent")
	controllerPath = filepath.Join(tmp, "controller")
	sandboxPath = filepath.Join(tmp, "prewarm-sandbox")
	build := exec.Command("go", "build", "-o", tmp+"/", "github.com/prewarm/prewarm/cmd/...")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building prewarm's binaries:", err)
		return 1
	}
	if s3srv, err = s3fixture.Start(filepath.Join(tmp, "s3")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s3srv.Stop()
	ctx := context.Background()
	if err := s3srv.CreateBucket(ctx, bucket); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	model["config.json"] = []byte(`{"model_type":"llama"}`)
	model["tokenizer.json"] = gen.Bytes(1, 200_000)
	for i := 1; i <= 3; i++ {
		model[fmt.Sprintf("model-0000%d-of-00003.safetensors", i)] = gen.Bytes(uint64(10+i), 8<<20)
	}
	for p, data := range model {
		total += int64(len(data))
		if err := s3srv.PutBytes(ctx, bucket, prefix+"/"+p, data); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// pull runs the CLI with S3 credentials for the fixture in its environment.
func pull(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	// A hung pull fails its test after two minutes instead of stalling the whole suite.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliPath, append([]string{"pull"}, args...)...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3fixture.SecretKey, "AWS_REGION="+s3fixture.Region)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

func assertModel(t *testing.T, dest string) {
	t.Helper()
	assertTree(t, dest, model)
}

func TestPullFromS3(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "example-model")
	out, errOut, err := pull(t, "s3://"+bucket+"/"+prefix, dest, "--endpoint", s3srv.Endpoint, "--part-size", "2MiB")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, errOut)
	}
	assertModel(t, dest)
	if !strings.Contains(out, "pulled s3://"+bucket+"/"+prefix) || !strings.Contains(out, "5 files") {
		t.Errorf("summary = %q", out)
	}
	if strings.Contains(errOut, "\r") {
		t.Errorf("progress drew a bar on a non-terminal: %q", errOut)
	}

	out, _, err = pull(t, "s3://"+bucket+"/"+prefix, dest, "--endpoint", s3srv.Endpoint)
	if err != nil || !strings.Contains(out, "up to date") {
		t.Errorf("second pull: %v, %q; want up to date", err, out)
	}
}

// On a terminal (forced here with --progress bar) the progress redraws one line; it ends with a
// newline so the summary starts on its own line.
func TestPullDrawsAProgressBar(t *testing.T) {
	proxy, err := shaper.Start(s3srv.Endpoint, shaper.Options{BytesPerSecond: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	_, errOut, err := pull(t, "s3://"+bucket+"/"+prefix, filepath.Join(t.TempDir(), "m"), "--endpoint", proxy.URL, "--progress", "bar", "--concurrency", "4")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "\r[") || !strings.Contains(errOut, "files ") || !strings.HasSuffix(errOut, "\n") {
		t.Errorf("stderr %q: want a redrawn bar ending in a newline", errOut)
	}
}

func TestPullFailuresSayWhy(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"missing prefix", []string{"s3://" + bucket + "/models/nope", "DEST", "--endpoint", s3srv.Endpoint}, "no objects under s3://example-bucket/models/nope/"},
		{"missing bucket", []string{"s3://no-such-bucket/x", "DEST", "--endpoint", s3srv.Endpoint}, "no-such-bucket"},
		{"bad part size", []string{"s3://" + bucket + "/" + prefix, "DEST", "--part-size", "lots"}, `--part-size: "lots" is not a size`},
		{"unknown scheme", []string{"gs://bucket/x", "DEST"}, "unknown scheme"},
		{"one argument", []string{"s3://" + bucket + "/" + prefix}, "accepts 2 arg(s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "m")
			for i, a := range tc.args {
				if a == "DEST" {
					tc.args[i] = dest
				}
			}
			_, errOut, err := pull(t, tc.args...)
			if err == nil {
				t.Fatal("pull succeeded")
			}
			if !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("stderr %q does not say %q", errOut, tc.wantErr)
			}
			if _, err := os.Stat(dest); err == nil {
				t.Errorf("%s was created", dest)
			}
		})
	}
}

func TestPullGatedHuggingFaceRepo(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	hub.AddCommit("meta-llama/Llama-3.1-8B-Instruct", "main", map[string][]byte{"config.json": []byte("{}"), "model.safetensors": gen.Bytes(5, 2<<20)})
	hub.SetGated("meta-llama/Llama-3.1-8B-Instruct", "hf_granted")
	dest := filepath.Join(t.TempDir(), "llama")

	_, errOut, err := pull(t, "hf://meta-llama/Llama-3.1-8B-Instruct", dest, "--endpoint", hub.URL)
	if err == nil || !strings.Contains(errOut, "gated") || !strings.Contains(errOut, "pass a token") {
		t.Fatalf("without a token: %v, %q; want a message about the gated repo and a token", err, errOut)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("hf_granted\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := pull(t, "hf://meta-llama/Llama-3.1-8B-Instruct", dest, "--endpoint", hub.URL, "--token-file", tokenFile)
	if err != nil {
		t.Fatalf("with a token: %v\n%s", err, errOut)
	}
	if !strings.Contains(out, "revision ") || strings.Contains(out+errOut, "hf_granted") {
		t.Errorf("output %q: want the pinned revision and never the token", out+errOut)
	}
}

// The destination's filesystem is too small: the pull fails before writing, saying by how much.
func TestPullIntoTooSmallFilesystem(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (%v)", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	_, errOut, err := pull(t, "s3://"+bucket+"/"+prefix, filepath.Join(dir, "m"), "--endpoint", s3srv.Endpoint)
	if err == nil {
		t.Fatal("pull succeeded into an 8 MiB filesystem")
	}
	if want := fmt.Sprintf("needs %.1f MB, 8.4 MB free under %s", float64(total)/1e6, dir); !strings.Contains(errOut, want) {
		t.Errorf("stderr %q does not say %q", errOut, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("%d entries written into the small filesystem", len(entries))
	}
}

// journaledBytes sums the ranges a partial download's journal records as written.
func journaledBytes(t *testing.T, journal string) int64 {
	t.Helper()
	f, err := os.Open(journal)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if (len(fields) == 4 || len(fields) == 5) && fields[0] == "W" {
			k, _ := strconv.ParseInt(fields[3], 10, 64)
			n += k
		}
	}
	return n
}

// kill -9 in the middle of a pull, then pull again: only what was not written is fetched.
func TestPullKilledThenResumed(t *testing.T) {
	proxy, err := shaper.Start(s3srv.Endpoint, shaper.Options{BytesPerSecond: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	parent := t.TempDir()
	dest := filepath.Join(parent, "example-model")
	journal := filepath.Join(parent, ".example-model.prewarm-partial", ".prewarm-journal")

	cmd := exec.Command(cliPath, "pull", "s3://"+bucket+"/"+prefix, dest, "--endpoint", proxy.URL, "--part-size", "1MiB", "--concurrency", "4")
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3fixture.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3fixture.SecretKey, "AWS_REGION="+s3fixture.Region)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill once a third of the model is journaled.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(journal); err == nil && journaledBytes(t, journal) > total/3 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the pull never got a third of the way")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	done := journaledBytes(t, journal)
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("dest exists after the kill")
	}

	proxy.SetOptions(shaper.Options{})
	before := proxy.Served.Load()
	out, errOut, err := pull(t, "s3://"+bucket+"/"+prefix, dest, "--endpoint", proxy.URL, "--part-size", "1MiB")
	if err != nil {
		t.Fatalf("resumed pull: %v\n%s", err, errOut)
	}
	assertModel(t, dest)
	fetched := proxy.Served.Load() - before
	// Listing and HEAD answers are a few kB; every journaled byte must be skipped.
	if limit := total - done + 64<<10; fetched > limit {
		t.Errorf("resumed pull fetched %d bytes; %d of %d were already written, so at most %d", fetched, done, total, limit)
	}
	if fetched < total-done {
		t.Errorf("resumed pull fetched %d bytes, less than the %d missing: the count is wrong", fetched, total-done)
	}
	t.Logf("killed with %d of %d bytes journaled; the rerun fetched %d (%s)", done, total, fetched, strings.TrimSpace(out))
}
