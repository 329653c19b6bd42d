package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The server is healthy only once every file matches the listing; a short or altered file keeps
// it unhealthy, saying which.
func TestHealthyOnlyOnTheWholeModel(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"config.json": `{"a":1}`, "weights/model.safetensors": strings.Repeat("w", 1<<16)}
	var listing []File
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(content))
		listing = append(listing, File{Path: p, Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])})
	}
	get := func(s *server, path string) (int, string) {
		rec := httptest.NewRecorder()
		s.routes().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}

	s := newServer(dir)
	s.expect = listing
	if code, _ := get(s, "/health"); code != http.StatusServiceUnavailable {
		t.Errorf("before verifying: /health %d; want 503", code)
	}
	s.verify()
	if code, body := get(s, "/health"); code != http.StatusOK || !strings.Contains(body, "2 files") {
		t.Errorf("whole model: /health %d %q; want 200, 2 files", code, body)
	}
	if code, body := get(s, "/invocations"); code != http.StatusOK || !strings.Contains(body, `"files":2`) {
		t.Errorf("/invocations %d %q", code, body)
	}

	if err := os.WriteFile(filepath.Join(dir, "weights", "model.safetensors"), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = newServer(dir)
	s.expect = listing
	s.verify()
	if code, body := get(s, "/health"); code != http.StatusInternalServerError || !strings.Contains(body, "weights/model.safetensors: 5 bytes") {
		t.Errorf("short file: /health %d %q; want 500 naming it", code, body)
	}
	listing[0].SHA256 = strings.Repeat("0", 64)
	if err := os.WriteFile(filepath.Join(dir, "weights", "model.safetensors"), []byte(files["weights/model.safetensors"]), 0o644); err != nil {
		t.Fatal(err)
	}
	s = newServer(dir)
	s.expect = listing
	s.verify()
	if code, body := get(s, "/health"); code != http.StatusInternalServerError || !strings.Contains(body, "sha256") {
		t.Errorf("altered digest: /health %d %q; want 500 naming the digest", code, body)
	}
}

// /metrics reports the load vLLM reports, as POST /load sets it; a bad value is refused and
// changes nothing.
func TestLoadIsReportedAsVLLMReportsIt(t *testing.T) {
	s := newServer(t.TempDir())
	do := func(method, path string) (int, string) {
		rec := httptest.NewRecorder()
		s.routes().ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := do(http.MethodGet, "/metrics"); code != http.StatusOK || !strings.Contains(body, "vllm:num_requests_waiting 0\n") {
		t.Fatalf("/metrics %d %q; want the waiting gauge at 0", code, body)
	}
	if code, _ := do(http.MethodPost, "/load?waiting=15&running=2"); code != http.StatusNoContent {
		t.Fatalf("POST /load: %d; want 204", code)
	}
	if code, _ := do(http.MethodPost, "/load?waiting=-1"); code != http.StatusBadRequest {
		t.Errorf("POST /load?waiting=-1: %d; want 400", code)
	}
	if code, _ := do(http.MethodPost, "/load"); code != http.StatusBadRequest {
		t.Errorf("POST /load without values: %d; want 400", code)
	}
	if code, _ := do(http.MethodGet, "/load?waiting=3"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /load: %d; want 405", code)
	}
	_, body := do(http.MethodGet, "/metrics")
	for _, want := range []string{"vllm:num_requests_waiting 15\n", "vllm:num_requests_running 2\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}
