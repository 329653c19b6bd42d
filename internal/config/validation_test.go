package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/config"
)

func TestSharingSettingsAreValidated(t *testing.T) {
	for _, tc := range []struct {
		conf, want string
	}{
		{"peers: {groupSize: 1}", "peers.groupSize: Invalid value: 1: want 2 to 32"},
		{"peers: {groupSize: 40}", "peers.groupSize: Invalid value: 40: want 2 to 32"},
		{"peers: {port: 70000}", "peers.port: Invalid value: 70000: want a TCP port"},
		{"peers: {wait: soon}", `peers.wait: Invalid value: "soon": want a duration`},
		{"peers: {maxPeers: -1}", "peers.maxPeers: Invalid value: -1: must not be negative"},
		{"peers: {witness: {port: -3}}", "peers.witness.port: Invalid value: -3: want a TCP port"},
		{"peers: {audience: shared, witness: {audience: shared}}", `peers.witness.audience: Invalid value: "shared": want another audience than peers.audience`},
		{"peers: {wait: -1s}", `peers.wait: Invalid value: "-1s": want a positive duration`},
		{"s3: {budget: {maxRate: fast}}", `s3.budget.maxRate: Invalid value: "fast": want a size`},
		{"huggingFace: {budget: {maxConcurrency: -2}}", "huggingFace.budget.maxConcurrency: Invalid value: -2: must not be negative"},
	} {
		_, err := config.Parse([]byte(tc.conf))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.conf, err, tc.want)
		}
	}
	o, err := config.Parse([]byte("peers: {groupSize: 8, uploadRate: 500Mi}\ns3: {budget: {maxConcurrency: 32, maxRate: 1Gi}}"))
	if err != nil {
		t.Fatal(err)
	}
	if o.Peers.GroupSize != 8 || o.Peers.UploadRateBytes() != 500<<20 || o.S3.Budget.MaxRateBytes() != 1<<30 || o.Peers.Port != 9444 || o.Peers.Wait.Duration != 30*time.Second {
		t.Errorf("parsed %+v %+v", o.Peers, o.S3.Budget)
	}
	if w := o.Peers.Witness; w.Port != 8444 || w.Audience != "prewarm-witness" || !o.Peers.Witnessed() {
		t.Errorf("the witness's defaults: %+v, witnessed %v", w, o.Peers.Witnessed())
	}
	for conf, want := range map[string]bool{
		"peers: {witness: {disabled: true}}": false,
		"peers: {trust: AllNodes}":           false, // nothing to check: every file is taken from peers
		"peers: {disabled: true}":            false,
	} {
		if o, err := config.Parse([]byte(conf)); err != nil || o.Peers.Witnessed() != want {
			t.Errorf("%s: witnessed %v (%v), want %v", conf, o.Peers.Witnessed(), err, want)
		}
	}
}
