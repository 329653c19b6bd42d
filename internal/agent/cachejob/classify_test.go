package cachejob

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/testutil/hubfixture"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source/hf"
)

// A source with more files than a listing may hold fails for good: the node reports the
// terminal InvalidSource with the bound and what to do, and waits the longest retry interval
// instead of listing it again at once.
func TestTooManyFilesIsATerminalInvalidSource(t *testing.T) {
	hub := hubfixture.Start()
	defer hub.Close()
	files := map[string][]byte{}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		files[name+".json"] = []byte(`{}`)
	}
	hub.AddCommit("org/many-files", "main", files)
	src, err := hf.New(hf.Options{RepoID: "org/many-files", Endpoint: hub.URL, MaxFiles: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, fetchErr := engine.New().Fetch(ctx, engine.Request{Source: src, Dest: filepath.Join(t.TempDir(), "m")})
	if fetchErr == nil {
		t.Fatal("a repository of 5 files fetched under a bound of 4")
	}

	j := &Job{env: &Env{MaxRetryInterval: 5 * time.Minute}}
	reason, msg, wait := j.classify(fetchErr)
	if reason != prewarmv1alpha1.ReasonInvalidSource || !prewarmv1alpha1.Terminal(reason) {
		t.Errorf("reason %q for %v; want the terminal %s", reason, fetchErr, prewarmv1alpha1.ReasonInvalidSource)
	}
	if !strings.Contains(msg, "more than 4 files") || !strings.Contains(msg, "hf://org/many-files") {
		t.Errorf("message %q; want the source and the bound named", msg)
	}
	if wait != 5*time.Minute {
		t.Errorf("wait %v; want the longest retry interval, 5m0s", wait)
	}
}
