package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/prewarm/prewarm/internal/config"
)

// The kubelet's thresholds come from the configuration first, then from the kubelet's file and
// its drop-ins, then from the kubelet's defaults; each says where it was read.
func TestLoadKubeletLimits(t *testing.T) {
	pct := func(p float64) config.Threshold { return config.Threshold{Percent: p} }
	for _, tc := range []struct {
		name    string
		files   map[string]string // node path: content
		cfg     config.Kubelet
		want    kubeletLimits
		wantErr string
	}{
		{
			name: "no file: the kubelet's defaults",
			want: kubeletLimits{nodefs: pct(10), imagefs: pct(15), imageGCHigh: 85, margin: 5, from: [3]string{fromDefault, fromDefault, fromDefault}},
		},
		{
			name: "EKS AL2023: nodeadm's file and its drop-in",
			files: map[string]string{
				"/etc/kubernetes/kubelet/config.json":                   `{"kind":"KubeletConfiguration","evictionHard":{"memory.available":"100Mi","nodefs.available":"10%","nodefs.inodesFree":"5%"}}`,
				"/etc/kubernetes/kubelet/config.json.d/00-nodeadm.conf": `{"evictionHard":{"nodefs.available":"20Gi"},"imageGCHighThresholdPercent":70}`,
			},
			want: kubeletLimits{nodefs: config.Threshold{Bytes: 20 << 30}, imagefs: pct(15), imageGCHigh: 70, margin: 5, from: [3]string{
				"/etc/kubernetes/kubelet/config.json (and /etc/kubernetes/kubelet/config.json.d)", fromDefault,
				"/etc/kubernetes/kubelet/config.json (and /etc/kubernetes/kubelet/config.json.d)"}},
		},
		{
			name:  "GKE's YAML file",
			files: map[string]string{"/home/kubernetes/kubelet-config.yaml": "kind: KubeletConfiguration\nevictionHard:\n  nodefs.available: 10%\n  imagefs.available: 15%\nimageGCHighThresholdPercent: 85\n"},
			want: kubeletLimits{nodefs: pct(10), imagefs: pct(15), imageGCHigh: 85, margin: 5, from: [3]string{
				"/home/kubernetes/kubelet-config.yaml", "/home/kubernetes/kubelet-config.yaml", "/home/kubernetes/kubelet-config.yaml"}},
		},
		{
			name:  "the configuration wins over the file",
			files: map[string]string{"/var/lib/kubelet/config.yaml": "evictionHard: {nodefs.available: 5%, imagefs.available: 5%}\n"},
			cfg:   config.Kubelet{EvictionHard: map[string]string{"nodefs.available": "25%"}, ImageGCHighThresholdPercent: 60, MarginPercent: ptr(int32(2))},
			want: kubeletLimits{nodefs: pct(25), imagefs: pct(5), imageGCHigh: 60, margin: 2, from: [3]string{
				"agent.kubelet", "/var/lib/kubelet/config.yaml", "agent.kubelet"}},
		},
		{
			name:  "a configured file only",
			files: map[string]string{"/var/lib/kubelet/config.yaml": "evictionHard: {nodefs.available: 5%}\n", "/srv/kubelet.yaml": "imageGCHighThresholdPercent: 75\n"},
			cfg:   config.Kubelet{ConfigFile: "/srv/kubelet.yaml"},
			want:  kubeletLimits{nodefs: pct(10), imagefs: pct(15), imageGCHigh: 75, margin: 5, from: [3]string{fromDefault, fromDefault, "/srv/kubelet.yaml"}},
		},
		{
			name:    "a configured file missing: the defaults, and why",
			cfg:     config.Kubelet{ConfigFile: "/srv/kubelet.yaml"},
			want:    kubeletLimits{nodefs: pct(10), imagefs: pct(15), imageGCHigh: 85, margin: 5, from: [3]string{fromDefault, fromDefault, fromDefault}},
			wantErr: "no such file",
		},
		{
			name:    "a threshold the file spells wrong: the default for it, and why",
			files:   map[string]string{"/var/lib/kubelet/config.yaml": "evictionHard: {nodefs.available: ten, imagefs.available: 20%}\n"},
			want:    kubeletLimits{nodefs: pct(10), imagefs: pct(20), imageGCHigh: 85, margin: 5, from: [3]string{fromDefault, "/var/lib/kubelet/config.yaml", fromDefault}},
			wantErr: "evictionHard nodefs.available",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := t.TempDir()
			for p, body := range tc.files {
				f := filepath.Join(host, p)
				if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			o := Options{HostPrefix: host, Config: config.OperatorConfiguration{Agent: config.Agent{Kubelet: tc.cfg}}}
			o.Config.SetDefaults()
			got, err := loadKubeletLimits(o.Config.Agent.Kubelet, o.local)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(kubeletLimits{})); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v; want %q", err, tc.wantErr)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// The high watermark of a shared disk is the kubelet's lowest threshold less the margin, a
// quantity taken against the disk's capacity; the configuration's own watermark stays when it
// is lower, and the gap to the low one is kept.
func TestSharedWatermarks(t *testing.T) {
	pct := func(p float64) config.Threshold { return config.Threshold{Percent: p} }
	defaults := kubeletLimits{nodefs: pct(10), imagefs: pct(15), imageGCHigh: 85, margin: 5}
	const gi = int64(1) << 30
	for _, tc := range []struct {
		name            string
		l               kubeletLimits
		capacity, avail int64
		high, low       int32 // configured
		wantHigh        int32
		wantLow         int32
	}{
		{"the kubelet's defaults: image GC at 85 %, less 5", defaults, 100 * gi, 60 * gi, 90, 80, 80, 70},
		{"a lower watermark of the configuration stays", defaults, 100 * gi, 60 * gi, 70, 60, 70, 60},
		{"nodefs.available as a quantity, on a small disk", kubeletLimits{nodefs: config.Threshold{Bytes: 40 * gi}, imagefs: pct(1), imageGCHigh: 100, margin: 5}, 100 * gi, 90 * gi, 90, 80, 55, 45},
		{"image GC off, eviction at 1 %", kubeletLimits{nodefs: pct(1), imagefs: pct(1), imageGCHigh: 100, margin: 5}, 100 * gi, 90 * gi, 90, 80, 90, 80},
		{"thresholds above the margin: at least 1 %", kubeletLimits{nodefs: pct(97), imagefs: pct(1), imageGCHigh: 100, margin: 5}, 100 * gi, 90 * gi, 90, 80, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := diskFigures{capacity: tc.capacity, used: tc.capacity - tc.avail - gi, avail: tc.avail, high: tc.high, low: tc.low}
			f.keepClearOf(tc.l)
			if f.high != tc.wantHigh || f.low != tc.wantLow {
				t.Errorf("watermarks %d/%d; want %d/%d", f.high, f.low, tc.wantHigh, tc.wantLow)
			}
			// Used as the kubelet counts it: all but what is available (the filesystem's own
			// reserved blocks included).
			if f.used != tc.capacity-tc.avail {
				t.Errorf("used %d; want %d (capacity less available)", f.used, tc.capacity-tc.avail)
			}
		})
	}
	// Filling to the high watermark leaves more free than the kubelet's thresholds ask.
	f := diskFigures{capacity: 100 * gi, used: 10 * gi, avail: 90 * gi, high: 90, low: 80}
	f.keepClearOf(defaults)
	if after := f.avail - f.room(); after*100/f.capacity < 15 || 100-after*100/f.capacity >= 85 {
		t.Errorf("filled to the watermark, %d of %d bytes are left free: past the kubelet's thresholds", after, f.capacity)
	}
}

// Whether a root may hold caches, and whether it shares its disk: a data disk the kubelet uses
// is taken, shared; the node's root filesystem is refused unless allowed, and then shared; a
// disk of its own is taken as it is.
func TestCheckDiskJudgement(t *testing.T) {
	dir := t.TempDir()
	nodeRoot := "/mnt/k8s-disks/0"
	kubelet := filepath.Join(dir, "var", "lib", "kubelet")
	local := filepath.Join(dir, nodeRoot)
	for _, d := range []string{local, filepath.Join(kubelet, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		mounts   string
		kubelet  bool
		allow    bool
		want     string // what it shares
		noDisk   string // a word of the NoLocalDisk refusal
		wantFigs bool
	}{
		{"nodeadm's RAID0: the array, the kubelet's directory on it", line(local, "/", "xfs", "/dev/md0"), true, false, "the kubelet's directory " + kubelet, "", true},
		{"a dedicated disk", line(local, "/", "ext4", "/dev/nvme1n1"), false, false, "", "", true},
		{"the node's root filesystem", line(local, nodeRoot, "ext4", "/dev/nvme0n1p1"), true, false, "", "root filesystem", false},
		{"the node's root filesystem, allowed", line(local, nodeRoot, "ext4", "/dev/nvme0n1p1"), true, true, "the node's root filesystem", "", true},
		{"memory, allowed: taken as it is", line(local, "/", "tmpfs", "tmpfs"), false, true, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.OperatorConfiguration{CacheRoots: []config.CacheRoot{{Path: nodeRoot, AllowRootFilesystem: tc.allow}}}
			cfg.SetDefaults()
			a := &Agent{life: context.Background(), opts: Options{Config: cfg, HostPrefix: dir, Now: time.Now}, kubelet: kubeletLimits{nodefs: config.Threshold{Percent: 10}, imagefs: config.Threshold{Percent: 15}, imageGCHigh: 85, margin: 5}}
			a.disks = &diskCheck{mounts: mountTableFrom(strings.NewReader(tc.mounts)), verdicts: map[string]verdict{}}
			if tc.kubelet {
				a.disks.refs = newDiskCheck(kubelet).refs
			}
			shares, err := a.checkDisk(nodeRoot)
			switch {
			case tc.noDisk == "" && (err != nil || shares != tc.want):
				t.Errorf("checkDisk = %q, %v; want it taken, shared with %q", shares, err, tc.want)
			case tc.noDisk != "" && (!errors.As(err, new(errNoDisk)) || !strings.Contains(err.Error(), tc.noDisk)):
				t.Errorf("checkDisk = %v; want NoLocalDisk saying %q", err, tc.noDisk)
			}
			rs := a.rootStatus(nodeRoot)
			if got := rs.Reason == ""; got != tc.wantFigs {
				t.Errorf("root status %+v; want it taken: %v", rs, tc.wantFigs)
			}
			if tc.noDisk != "" && !strings.Contains(rs.Message, "/mnt/k8s-disks/0 on EKS") {
				t.Errorf("NoLocalDisk message %q names no layout to map the root to", rs.Message)
			}
			if rs.SharedWith != tc.want || (tc.want != "") != strings.Contains(rs.KubeletThresholds, "imageGCHighThresholdPercent 85") {
				t.Errorf("root status shared with %q (%q); want %q, and the thresholds when shared", rs.SharedWith, rs.KubeletThresholds, tc.want)
			}
			if tc.want != "" && (rs.HighWatermarkPercent != 80 || rs.LowWatermarkPercent != 70) {
				t.Errorf("shared root's watermarks %d/%d; want 80/70 (the kubelet's image GC at 85 %%, less 5)", rs.HighWatermarkPercent, rs.LowWatermarkPercent)
			}
			if tc.wantFigs && tc.want == "" && rs.HighWatermarkPercent != config.DefaultHighWatermarkPercent {
				t.Errorf("a disk of its own has high watermark %d; want the configuration's %d", rs.HighWatermarkPercent, config.DefaultHighWatermarkPercent)
			}
		})
	}
}
