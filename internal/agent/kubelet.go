package agent

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/prewarm/prewarm/internal/config"
)

// A cache root on a disk the kubelet or the container runtime also uses (the instance-store
// array that EKS's nodeadm, Karpenter and Bottlerocket bind /var/lib/kubelet and
// /var/lib/containerd onto, GKE's local SSD ephemeral storage, or the node's root filesystem
// where allowed), and the kubelet's filesystem that the scratch copies go on, are filled at most
// to the kubelet's lowest threshold on that disk less a margin: below where it evicts pods
// (evictionHard nodefs.available, imagefs.available) and where it removes images
// (imageGCHighThresholdPercent). Both are measured as the kubelet measures them: the disk's
// capacity less what is available to write.

// kubeletLimits are the kubelet's thresholds on the disks it uses, and where each was read.
type kubeletLimits struct {
	nodefs, imagefs config.Threshold
	imageGCHigh     int32
	margin          int32
	// from says where each of nodefs, imagefs and imageGCHigh was read (agent.kubelet, a file,
	// or the kubelet's default).
	from [3]string
}

const fromDefault = "the kubelet's default"

// loadKubeletLimits takes each threshold from the configuration, else from the kubelet's
// configuration file (k.ConfigFile, else the first of config.KubeletConfigFiles that exists),
// read where the agent sees the node's files (local), else the kubelet's default. A signal the
// file's evictionHard leaves out takes the kubelet's default too: the margin errs on the side
// of the pods. It also returns what kept it from reading a file (nil: read, or none exists).
func loadKubeletLimits(k config.Kubelet, local func(string) string) (kubeletLimits, error) {
	defaults := config.KubeletDefaultEvictionHard()
	l := kubeletLimits{margin: k.Margin(), imageGCHigh: config.KubeletDefaultImageGCHighThresholdPercent, from: [3]string{fromDefault, fromDefault, fromDefault}}
	l.nodefs, _ = config.ParseThreshold(defaults[config.SignalNodefsAvailable])
	l.imagefs, _ = config.ParseThreshold(defaults[config.SignalImagefsAvailable])
	file, kc, err := readKubeletConfig(k.ConfigFile, local)
	if kc != nil {
		for i, s := range []string{config.SignalNodefsAvailable, config.SignalImagefsAvailable} {
			v, ok := kc.EvictionHard[s]
			if !ok {
				continue
			}
			t, perr := config.ParseThreshold(v)
			if perr != nil {
				err = errors.Join(err, fmt.Errorf("%s: evictionHard %s: %w", file, s, perr))
				continue
			}
			*l.signal(i), l.from[i] = t, file
		}
		if kc.ImageGCHighThresholdPercent != nil {
			l.imageGCHigh, l.from[2] = *kc.ImageGCHighThresholdPercent, file
		}
	}
	for i, s := range []string{config.SignalNodefsAvailable, config.SignalImagefsAvailable} {
		if v, ok := k.EvictionHard[s]; ok {
			t, _ := config.ParseThreshold(v) // validated with the configuration
			*l.signal(i), l.from[i] = t, "agent.kubelet"
		}
	}
	if k.ImageGCHighThresholdPercent > 0 {
		l.imageGCHigh, l.from[2] = k.ImageGCHighThresholdPercent, "agent.kubelet"
	}
	return l, err
}

func (l *kubeletLimits) signal(i int) *config.Threshold {
	if i == 0 {
		return &l.nodefs
	}
	return &l.imagefs
}

// kubeletFile is what the agent reads of the kubelet's configuration file
// (KubeletConfiguration, kubelet.config.k8s.io/v1beta1, in YAML or JSON).
type kubeletFile struct {
	EvictionHard                map[string]string `json:"evictionHard,omitempty"`
	ImageGCHighThresholdPercent *int32            `json:"imageGCHighThresholdPercent,omitempty"`
}

// readKubeletConfig reads the kubelet's configuration file and its drop-ins (<file>.d/*.conf, in
// name order, each overriding what it sets), and returns the file's node path. None found: nil.
func readKubeletConfig(file string, local func(string) string) (string, *kubeletFile, error) {
	files := config.KubeletConfigFiles
	if file != "" {
		files = []string{file}
	}
	for _, f := range files {
		b, err := os.ReadFile(local(f))
		if errors.Is(err, iofs.ErrNotExist) && file == "" {
			continue
		}
		if err != nil {
			return f, nil, fmt.Errorf("reading the kubelet's configuration: %w", err)
		}
		kc := &kubeletFile{}
		if err := yaml.Unmarshal(b, kc); err != nil {
			return f, nil, fmt.Errorf("reading the kubelet's configuration %s: %w", f, err)
		}
		dropIns, _ := filepath.Glob(filepath.Join(local(f+".d"), "*.conf"))
		slices.Sort(dropIns)
		for _, d := range dropIns {
			b, err := os.ReadFile(d)
			if err != nil {
				return f, kc, fmt.Errorf("reading the kubelet's configuration drop-in: %w", err)
			}
			over := &kubeletFile{}
			if err := yaml.Unmarshal(b, over); err != nil {
				return f, kc, fmt.Errorf("reading the kubelet's configuration drop-in %s: %w", filepath.Base(d), err)
			}
			if over.EvictionHard != nil && kc.EvictionHard == nil {
				kc.EvictionHard = map[string]string{}
			}
			maps.Copy(kc.EvictionHard, over.EvictionHard)
			if over.ImageGCHighThresholdPercent != nil {
				kc.ImageGCHighThresholdPercent = over.ImageGCHighThresholdPercent
			}
		}
		if len(dropIns) > 0 {
			f += " (and " + f + ".d)"
		}
		return f, kc, nil
	}
	return "", nil, nil
}

// high is the most of a disk of capacity bytes, in percent, that the kubelet lets be used
// before it evicts pods or removes images, less the margin (at least 1).
func (l kubeletLimits) high(capacity int64) int32 {
	h := float64(l.imageGCHigh)
	if capacity > 0 {
		for _, t := range []config.Threshold{l.nodefs, l.imagefs} {
			h = min(h, 100-float64(t.Free(capacity))*100/float64(capacity))
		}
	}
	return max(1, int32(math.Floor(h))-l.margin)
}

// String says, for people, the thresholds and where they were read.
func (l kubeletLimits) String() string {
	threshold := func(t config.Threshold) string {
		if t.Bytes > 0 {
			return resource.NewQuantity(t.Bytes, resource.BinarySI).String()
		}
		return fmt.Sprintf("%g%%", t.Percent)
	}
	figures := []string{
		fmt.Sprintf("%s<%s (%s)", config.SignalNodefsAvailable, threshold(l.nodefs), l.from[0]),
		fmt.Sprintf("%s<%s (%s)", config.SignalImagefsAvailable, threshold(l.imagefs), l.from[1]),
		fmt.Sprintf("imageGCHighThresholdPercent %d (%s)", l.imageGCHigh, l.from[2]),
	}
	return fmt.Sprintf("the kubelet evicts pods at %s and removes images from %s; prewarm stays %d points below",
		strings.Join(figures[:2], " or "), figures[2], l.margin)
}
