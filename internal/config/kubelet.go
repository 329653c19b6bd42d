package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Kubelet says where the nodes' kubelets evict pods and remove images. Caches kept on a disk the
// kubelet or the container runtime also uses (the instance-store array that EKS's nodeadm,
// Karpenter and Bottlerocket bind /var/lib/kubelet and /var/lib/containerd onto; GKE's local SSD
// ephemeral storage), and the copies kept on the kubelet's filesystem for the pods of a node
// with no local disk, fill it at most to MarginPercent points below the lowest of those
// thresholds. A threshold not set here is read from the kubelet's configuration file on the
// node; one the file does not set either is the kubelet's default.
type Kubelet struct {
	// ConfigFile is the kubelet's configuration file on the nodes, and its drop-in directory
	// <file>.d (*.conf, in name order) is read too (empty: the first that exists of
	// KubeletConfigFiles). The agent reads it where it sees the node's files: the chart mounts
	// the file's directory, read-only, when this is set.
	ConfigFile string `json:"configFile,omitempty"`
	// EvictionHard are the kubelet's hard eviction thresholds on the disks' free space, as in
	// its configuration: nodefs.available and imagefs.available, each a percent of the disk
	// ("10%") or a quantity ("20Gi").
	EvictionHard map[string]string `json:"evictionHard,omitempty"`
	// ImageGCHighThresholdPercent is the disk usage, in percent, from which the kubelet removes
	// images (its default 85; 100 turns image garbage collection off).
	ImageGCHighThresholdPercent int32 `json:"imageGCHighThresholdPercent,omitempty"`
	// MarginPercent is how many points of the disk below the kubelet's lowest threshold caches
	// and copies stop ([DefaultKubeletMarginPercent]).
	MarginPercent *int32 `json:"marginPercent,omitempty"`
}

// The kubelet's eviction signals on disk space that prewarm keeps clear of.
const (
	SignalNodefsAvailable  = "nodefs.available"
	SignalImagefsAvailable = "imagefs.available"
)

// KubeletDefaultEvictionHard are the kubelet's defaults of the signals prewarm keeps clear of.
func KubeletDefaultEvictionHard() map[string]string {
	return map[string]string{SignalNodefsAvailable: "10%", SignalImagefsAvailable: "15%"}
}

// KubeletDefaultImageGCHighThresholdPercent is the kubelet's default imageGCHighThresholdPercent.
const KubeletDefaultImageGCHighThresholdPercent = 85

// KubeletConfigFiles are where the kubelet's configuration file is on the platforms prewarm
// knows, in the order the agent looks for them: EKS AL2023 (nodeadm), Bottlerocket, EKS AL2,
// GKE, kubeadm.
var KubeletConfigFiles = []string{
	"/etc/kubernetes/kubelet/config.json",
	"/etc/kubernetes/kubelet/config",
	"/etc/kubernetes/kubelet/kubelet-config.json",
	"/home/kubernetes/kubelet-config.yaml",
	"/var/lib/kubelet/config.yaml",
}

// Margin is MarginPercent, or its default.
func (k Kubelet) Margin() int32 {
	if k.MarginPercent == nil {
		return DefaultKubeletMarginPercent
	}
	return *k.MarginPercent
}

// Threshold is one eviction threshold on a disk's free space: a percent of the disk, or bytes.
type Threshold struct {
	Percent float64
	Bytes   int64
}

// ParseThreshold reads an eviction threshold's value as the kubelet writes it: "10%" or "20Gi".
func ParseThreshold(s string) (Threshold, error) {
	if p, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return Threshold{}, fmt.Errorf("%q: want a percent from 0%% to 100%%", s)
		}
		return Threshold{Percent: f}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() < 0 {
		return Threshold{}, fmt.Errorf("%q: want a percent (10%%) or a quantity (20Gi)", s)
	}
	return Threshold{Bytes: q.Value()}, nil
}

// Free is the free space the threshold asks of a disk of capacity bytes.
func (t Threshold) Free(capacity int64) int64 {
	if t.Bytes > 0 {
		return t.Bytes
	}
	return int64(t.Percent * float64(capacity) / 100)
}

func (k Kubelet) validate(at *field.Path) field.ErrorList {
	var errs field.ErrorList
	if k.ConfigFile != "" {
		if err := nodePath(k.ConfigFile); err != nil {
			errs = append(errs, field.Invalid(at.Child("configFile"), k.ConfigFile, err.Error()))
		}
	}
	signals := []string{SignalNodefsAvailable, SignalImagefsAvailable}
	for _, s := range slices.Sorted(maps.Keys(k.EvictionHard)) {
		if !slices.Contains(signals, s) {
			errs = append(errs, field.NotSupported(at.Child("evictionHard").Key(s), s, signals))
			continue
		}
		if _, err := ParseThreshold(k.EvictionHard[s]); err != nil {
			errs = append(errs, field.Invalid(at.Child("evictionHard").Key(s), k.EvictionHard[s], err.Error()))
		}
	}
	if k.ImageGCHighThresholdPercent < 0 || k.ImageGCHighThresholdPercent > 100 {
		errs = append(errs, field.Invalid(at.Child("imageGCHighThresholdPercent"), k.ImageGCHighThresholdPercent, "want a percent of the disk, 1 to 100 (0: not set)"))
	}
	if m := k.Margin(); m < 0 || m > 50 {
		errs = append(errs, field.Invalid(at.Child("marginPercent"), m, "want 0 to 50 points of the disk"))
	}
	return errs
}
