package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The engine benchmark rewrites its report but keeps the sections the other benchmarks write.
func TestKeptSections(t *testing.T) {
	p := filepath.Join(t.TempDir(), "benchmarks.md")
	in := "intro\n<!-- realnode:begin (x) -->\nA\n<!-- realnode:end -->\nmid <!-- a comment -->\n<!-- bench-scale:begin (y) -->\nB\n<!-- bench-scale:end -->\ntail\n"
	if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "\n<!-- realnode:begin (x) -->\nA\n<!-- realnode:end -->\n\n<!-- bench-scale:begin (y) -->\nB\n<!-- bench-scale:end -->\n"
	if got := keptSections(p); got != want {
		t.Errorf("kept %q, want %q", got, want)
	}
}
