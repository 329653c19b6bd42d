package controller

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every series the Grafana dashboard queries is one prewarm exports, and every prewarm metric
// is on the dashboard.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	name := regexp.MustCompile(`Name:\s+"(prewarm_[a-z_]+)"`)
	for _, dir := range []string{".", "../agent", "../../pkg/engine", "../../pkg/engine/peer"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range name.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = true
			}
		}
	}
	if len(defined) < 10 {
		t.Fatalf("found only %d metric definitions: %v", len(defined), defined)
	}
	used := map[string]bool{}
	series := regexp.MustCompile(`prewarm_[a-z_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, s := range series.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s, "_bucket"), "_count"), "_sum")
				if !defined[base] {
					t.Errorf("panel %q queries %s, which prewarm does not export", p.Title, s)
				}
				used[base] = true
			}
		}
	}
	for m := range defined {
		if !used[m] {
			t.Errorf("metric %s is not on the dashboard", m)
		}
	}
}
