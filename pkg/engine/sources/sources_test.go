package sources_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/s3fixture"
	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// Characters that mean something in a URI (%xx, ?, #, spaces, non-ASCII) are bytes of a key
// prefix or a path: Parse takes them literally, and String writes back what Parse read.
func TestParseIsLiteral(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want sources.Spec
	}{
		{"s3://bucket/models/a#b?c=d%41 e/é", sources.Spec{Kind: sources.S3, Bucket: "bucket", Prefix: "models/a#b?c=d%41 e/é"}},
		{"s3://bucket", sources.Spec{Kind: sources.S3, Bucket: "bucket"}},
		{"hf://org/name@0123abc", sources.Spec{Kind: sources.HuggingFace, Repo: "org/name", Revision: "0123abc"}},
		{"hf://org/name", sources.Spec{Kind: sources.HuggingFace, Repo: "org/name"}},
		{"file:///fsx/a%20b#c", sources.Spec{Kind: sources.Dir, Path: "/fsx/a%20b#c"}},
		{"./model?x", sources.Spec{Kind: sources.Dir, Path: "./model?x"}},
	} {
		got, err := sources.Parse(tc.uri)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.uri, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tc.uri, got, tc.want)
		}
		if tc.want.Kind != sources.Dir || tc.uri[0] != 'f' {
			if back, err := sources.Parse(got.String()); err != nil || back != got {
				t.Errorf("Parse(%q.String()) = %+v, %v; want %+v", tc.uri, back, err, got)
			}
		}
	}
	for _, bad := range []string{"s3:///prefix", "hf://name-only", "hf://org/name/extra", "gs://bucket/x"} {
		if s, err := sources.Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %+v; want an error", bad, s)
		}
	}
}

// A prefix holding URI syntax lists exactly the objects under it, against a real S3 server;
// an address parsed as a URL would list models/a instead.
func TestOpenS3PrefixIsBytes(t *testing.T) {
	dir := t.TempDir()
	testutil.NeedsTestBin(t)
	srv, err := s3fixture.Start(filepath.Join(dir, "s3"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	t.Setenv("AWS_ACCESS_KEY_ID", s3fixture.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3fixture.SecretKey)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "none"))
	ctx := context.Background()
	if err := srv.CreateBucket(ctx, "models"); err != nil {
		t.Fatal(err)
	}
	for key, body := range map[string]string{
		"team/a#b?c%41/wanted.bin": "the model asked for",
		"team/a/other.bin":         "what a URL parser would cache",
		"team/a#b?cA/decoded.bin":  "what %-decoding would cache",
	} {
		if err := srv.PutBytes(ctx, "models", key, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	specs := []sources.Spec{{Kind: sources.S3, Bucket: "models", Prefix: "team/a#b?c%41", Region: s3fixture.Region}}
	parsed, err := sources.Parse("s3://models/team/a#b?c%41")
	if err != nil {
		t.Fatal(err)
	}
	parsed.Region = s3fixture.Region
	specs = append(specs, parsed)
	for _, spec := range specs {
		src, err := sources.Open(ctx, spec, sources.Options{Endpoint: srv.Endpoint, PathStyle: true})
		if err != nil {
			t.Fatal(err)
		}
		l, err := src.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range l.Files {
			names = append(names, f.Path)
		}
		if !slices.Equal(names, []string{"wanted.bin"}) {
			t.Errorf("%+v lists %v, want [wanted.bin]", spec, names)
		}
	}
}
