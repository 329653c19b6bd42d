package hf_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
	"github.com/prewarm/prewarm/pkg/engine/source/hf"
)

func files() map[string][]byte {
	return map[string][]byte{
		"config.json":                      []byte(`{"model_type":"llama"}`),
		"generation_config.json":           []byte(`{"do_sample":true}`),
		"model-00001-of-00002.safetensors": gen.Bytes(1, 3<<20+5),
		"model-00002-of-00002.safetensors": gen.Bytes(2, 2<<20),
		"original/params.json":             []byte(`{"dim":4096}`),
		"tokenizer.json":                   gen.Bytes(3, 40000),
	}
}

func fetch(t *testing.T, opts hf.Options) (string, engine.Result, error) {
	t.Helper()
	src, err := hf.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "m")
	res, err := engine.New(engine.WithConcurrency(4), engine.WithPartSize(1<<20), engine.WithRetry(3, time.Millisecond, time.Millisecond)).
		Fetch(context.Background(), engine.Request{Source: src, Dest: dest})
	return dest, res, err
}

func TestFetchResolvesBranchToCommitAndVerifies(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	want := files()
	commit := hub.AddCommit("meta-llama/Llama-3.1-8B-Instruct", "main", want)

	dest, res, err := fetch(t, hf.Options{RepoID: "meta-llama/Llama-3.1-8B-Instruct", Endpoint: hub.URL})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != commit {
		t.Errorf("revision = %q, want the commit main points at, %q", res.Revision, commit)
	}
	for p, data := range want {
		got, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: differs or missing (%v)", p, err)
		}
	}
	m, err := engine.ReadManifest(dest)
	if err != nil {
		t.Fatal(err)
	}
	var lfs, git int
	for _, f := range m.Files {
		if f.Checksums.SHA256 != "" {
			lfs++
		}
		if f.Checksums.GitBlobSHA1 != "" {
			git++
		}
	}
	if lfs != 2 || git != 4 {
		t.Errorf("manifest: %d files with sha256, %d with git ids; want 2 and 4 (every file checkable)", lfs, git)
	}
}

// A later push to main does not change what an earlier pinned commit fetches.
func TestPinnedCommitIsHonoured(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	v1 := files()
	first := hub.AddCommit("org/model", "main", v1)
	hub.AddCommit("org/model", "main", map[string][]byte{"config.json": []byte(`{"v":2}`)})

	dest, res, err := fetch(t, hf.Options{RepoID: "org/model", Revision: first, Endpoint: hub.URL})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != first || res.Files != len(v1) {
		t.Errorf("fetched %d files at %s; want %d at %s", res.Files, res.Revision, len(v1), first)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "config.json")); !bytes.Equal(b, v1["config.json"]) {
		t.Error("config.json is not the pinned commit's")
	}
}

func TestGatedRepository(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	hub.AddCommit("meta-llama/Llama-3.1-8B-Instruct", "main", files())
	hub.SetGated("meta-llama/Llama-3.1-8B-Instruct", "granted-token")

	cases := []struct {
		name, token, wantHint string
	}{
		{"no token", "", "accept its terms on the Hub, then pass a token"},
		{"token not granted", "other-token", "has not been granted access"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := fetch(t, hf.Options{RepoID: "meta-llama/Llama-3.1-8B-Instruct", Endpoint: hub.URL, Token: tc.token})
			var aerr *source.AccessError
			if !errors.As(err, &aerr) || !aerr.Gated || !errors.Is(err, source.ErrAccessDenied) {
				t.Fatalf("err = %v; want a gated AccessError", err)
			}
			if !strings.Contains(err.Error(), tc.wantHint) {
				t.Errorf("message %q does not say %q", err, tc.wantHint)
			}
			if tc.token != "" && strings.Contains(err.Error(), tc.token) {
				t.Errorf("the token appears in the error: %q", err)
			}
		})
	}
	t.Run("granted token", func(t *testing.T) {
		// The fixture's content host refuses requests that carry the token: it must not leak there.
		if _, _, err := fetch(t, hf.Options{RepoID: "meta-llama/Llama-3.1-8B-Instruct", Endpoint: hub.URL, Token: "granted-token"}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNotFound(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	hub.AddCommit("org/model", "main", files())
	for name, opts := range map[string]hf.Options{
		"repository": {RepoID: "org/missing", Endpoint: hub.URL},
		"revision":   {RepoID: "org/model", Revision: "no-such-branch", Endpoint: hub.URL},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := fetch(t, opts)
			if !errors.Is(err, source.ErrNotFound) {
				t.Fatalf("err = %v; want not found", err)
			}
		})
	}
}

func TestCorruptLFSFileFailsVerification(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	f := files()
	hub.AddCommit("org/model", "main", f)
	hub.Corrupt(f["model-00002-of-00002.safetensors"], 1000)
	dest, _, err := fetch(t, hf.Options{RepoID: "org/model", Endpoint: hub.URL})
	var verr *engine.VerificationError
	if !errors.As(err, &verr) {
		t.Fatalf("err = %v; want a VerificationError", err)
	}
	if diff := cmp.Diff([]string{"model-00002-of-00002.safetensors", "sha256"}, []string{verr.Path, verr.Kind}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dest published: %v", err)
	}
}

func TestRepoIDValidated(t *testing.T) {
	for _, bad := range []string{"llama", "../etc/passwd", "org/../x", "/org/x", "org/x/y"} {
		if _, err := hf.New(hf.Options{RepoID: bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The token goes with every page of the file tree, so a page's Link to another origin is not
// followed (the token would reach it), and pages that lead back end the listing.
func TestTreePagesStayOnTheHub(t *testing.T) {
	var leaked atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Add(1)
		}
		_, _ = w.Write([]byte(`[]`))
	}))
	defer elsewhere.Close()
	const commit = "0123456789abcdef0123456789abcdef01234567"
	var next string
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "<"+next+">; rel=\"next\"")
		_, _ = w.Write([]byte(`[{"type":"file","path":"config.json","size":2,"oid":"` + commit + `"}]`))
	}))
	defer hub.Close()
	for _, tc := range []struct{ name, next, want string }{
		{"another origin", elsewhere.URL + "/page2", "not on the Hub"},
		{"the same page again", "?recursive=true&expand=false", "lead back"},
	} {
		next = tc.next
		src, err := hf.New(hf.Options{RepoID: "org/model", Revision: commit, Endpoint: hub.URL, Token: "hf_secret"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.List(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: List: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
	if n := leaked.Load(); n != 0 {
		t.Errorf("the token was sent to another origin %d times", n)
	}
}

// A repository with more files than MaxFiles fails the listing at the page that passes the
// bound, without reading the pages after it, and the engine writes nothing; one of exactly
// MaxFiles files is fetched.
func TestListStopsAtMaxFiles(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	many := map[string][]byte{}
	for i := range 10 {
		many[fmt.Sprintf("shard-%02d.json", i)] = []byte(fmt.Sprintf(`{"shard":%d}`, i))
	}
	hub.AddCommit("org/many", "main", many)

	dest, _, err := fetch(t, hf.Options{RepoID: "org/many", Endpoint: hub.URL, MaxFiles: 4})
	var tooMany *source.TooManyFilesError
	if !errors.As(err, &tooMany) || !errors.Is(err, source.ErrTooManyFiles) || source.Retryable(err) {
		t.Fatalf("err = %v; want a TooManyFilesError, not retryable", err)
	}
	if !strings.Contains(err.Error(), "hf://org/many@") || !strings.Contains(err.Error(), "more than 4 files") {
		t.Errorf("message %q does not name the repository and the bound", err)
	}
	// Pages of 3 entries: the 5th file is on the 2nd page.
	if n := hub.TreePages.Load(); n != 2 {
		t.Errorf("%d pages of the tree read; want 2 (the listing stops at the page that passes the bound)", n)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dest: %v; want nothing written", err)
	}
	assertNothingBeside(t, filepath.Dir(dest))

	if _, res, err := fetch(t, hf.Options{RepoID: "org/many", Endpoint: hub.URL, MaxFiles: 10}); err != nil || res.Files != 10 {
		t.Errorf("exactly MaxFiles files: %+v %v; want all 10 fetched", res, err)
	}
}

// assertNothingBeside fails if dir holds anything (a partial download, a journal).
func assertNothingBeside(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind: %s", e.Name())
	}
}

// An answer of the Hub's API larger than MaxAnswerBytes is not read past the bound.
func TestListRefusesAnOversizedAnswer(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A JSON list padded with whitespace past the bound, streamed.
		blank := bytes.Repeat([]byte(" "), 1<<20)
		_, _ = w.Write([]byte("["))
		for range hf.MaxAnswerBytes>>20 + 8 {
			if _, err := w.Write(blank); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte("]"))
	}))
	defer hub.Close()
	src, err := hf.New(hf.Options{RepoID: "org/model", Revision: commit, Endpoint: hub.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.List(context.Background())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("larger than %d MiB", hf.MaxAnswerBytes>>20)) {
		t.Errorf("List: %v; want an error naming the bound", err)
	}
}
