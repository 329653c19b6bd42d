package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The image cache pod's two steps, with the real binary: the init container installs the
// sleeper into a volume; the target image's container runs it until the kubelet stops it.
func TestInstallThenSleepUntilTerminated(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "sleeper")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	installed := filepath.Join(dir, "volume", "sleeper")
	if err := os.Mkdir(filepath.Dir(installed), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "--install", installed).CombinedOutput(); err != nil {
		t.Fatalf("--install: %v\n%s", err, out)
	}
	info, err := os.Stat(installed)
	if err != nil || info.Mode()&0o111 == 0 {
		t.Fatalf("installed sleeper: %v, mode %v", err, info.Mode())
	}

	cmd := exec.Command(installed)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("the sleeper exited on its own: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the sleeper ignored SIGTERM")
	}
	if out, err := exec.Command(installed, "extra", "args").CombinedOutput(); err == nil {
		t.Errorf("unexpected arguments accepted: %s", out)
	}
}
