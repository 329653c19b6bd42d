package agentcmd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

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

// The agent's settings come from the operator configuration, which holds their defaults; a flag
// given overrides its value for this agent, and a flag not given changes nothing.
func TestAgentSettingsComeFromTheConfiguration(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(conf, []byte("agent: {retryInterval: 3s, maxParallel: 3, reserve: 0, mountWait: 45s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	af := &agentFlags{}
	cmd := newAgentCommand(af)
	if err := cmd.ParseFlags([]string{"--config=" + conf, "--status-interval=1s", "--max-parallel=5"}); err != nil {
		t.Fatal(err)
	}
	if err := af.load(cmd); err != nil {
		t.Fatal(err)
	}
	o := af.opts
	o.Defaults()
	for name, got := range map[string][2]any{
		"status interval (flag)":       {o.StatusInterval, time.Second},
		"max parallel (flag)":          {o.MaxParallel, 5},
		"retry interval (file)":        {o.RetryInterval, 3 * time.Second},
		"mount wait (file)":            {o.MountWait, 45 * time.Second},
		"reserve (file, 0 kept)":       {o.Reserve, int64(0)},
		"recheck interval (default)":   {o.RecheckInterval, 5 * time.Minute},
		"verify interval (default)":    {o.VerifyInterval, 24 * time.Hour},
		"progress interval (default)":  {o.ProgressInterval, 10 * time.Second},
		"verify rate (default, 200Mi)": {o.VerifyRate, int64(200 << 20)},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %v, want %v", name, got[0], got[1])
		}
	}
}
