package agentcmd

import (
	"testing"

	"github.com/prewarm/prewarm/pkg/engine/sources"
)

// The init container's typed source flags give the engine the address byte for byte.
func TestPrepareSourceFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want sources.Spec
		bad  bool
	}{
		{args: []string{"--s3-bucket=models", "--s3-prefix=team/a#b?c=%41 é", "--region=eu-west-1"},
			want: sources.Spec{Kind: sources.S3, Bucket: "models", Prefix: "team/a#b?c=%41 é", Region: "eu-west-1"}},
		{args: []string{"--hf-repo=org/name", "--hf-revision=0123abcd"}, want: sources.Spec{Kind: sources.HuggingFace, Repo: "org/name", Revision: "0123abcd"}},
		{args: []string{"--source-dir=/fsx/b/a%20b"}, want: sources.Spec{Kind: sources.Dir, Path: "/fsx/b/a%20b"}},
		{args: []string{"--s3-bucket=models", "--s3-prefix=m", "--content-revision=sha256:ab"}, want: sources.Spec{Kind: sources.S3, Bucket: "models", Prefix: "m", Revision: "sha256:ab"}},
		{args: nil, want: sources.Spec{}},
		{args: []string{"--s3-prefix=x"}, bad: true},
		{args: []string{"--hf-repo=no-org"}, bad: true},
		{args: []string{"--s3-bucket=a", "--hf-repo=org/name"}, bad: true},
	} {
		cmd := newPrepareCommand()
		var got sources.Spec
		cmd.RunE = nil
		err := cmd.ParseFlags(append([]string{"--dest=/d"}, tc.args...))
		if err == nil {
			err = cmd.ValidateFlagGroups()
		}
		if err == nil {
			got, err = prepareSource(cmd)
		}
		if tc.bad {
			if err == nil {
				t.Errorf("%v: %+v; want an error", tc.args, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
}
