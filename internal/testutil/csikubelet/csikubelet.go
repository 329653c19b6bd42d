// Package csikubelet drives a CSI node plugin's socket as the kubelet does for a CSI ephemeral
// volume: NodePublishVolume with the pod's info (podInfoOnMount), called again while the plugin
// says to wait, and NodeUnpublishVolume. kwok's kubelet calls no CSI driver; the kwok tests and
// the kwok sandbox play that part against the real agent binary and its real socket.
package csikubelet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// Kubelet is one node's kubelet, as far as prewarm's volumes go.
type Kubelet struct {
	// Dir is the kubelet's root directory.
	Dir  string
	conn *grpc.ClientConn
	node csipb.NodeClient
}

// Socket is where the node plugin serves under a kubelet directory.
func Socket(kubeletDir string) string {
	return filepath.Join(kubeletDir, "plugins", prewarmv1alpha1.CSIDriverName, "csi.sock")
}

// AgentArgs are the agent flags that serve its node plugin under kubeletDir, waiting at most
// wait in one call.
func AgentArgs(kubeletDir string, wait time.Duration) []string {
	return []string{"--kubelet-dir=" + kubeletDir, "--csi-endpoint=" + Socket(kubeletDir), "--mount-wait=" + wait.String()}
}

// New connects to the node plugin under kubeletDir.
func New(kubeletDir string) (*Kubelet, error) {
	conn, err := grpc.NewClient("unix://"+Socket(kubeletDir), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &Kubelet{Dir: kubeletDir, conn: conn, node: csipb.NewNodeClient(conn)}, nil
}

// Close closes the connection.
func (k *Kubelet) Close() error { return k.conn.Close() }

// Target is where the kubelet asks for pod p's volume of this name.
func (k *Kubelet) Target(p *corev1.Pod, volume string) string {
	return filepath.Join(k.Dir, "pods", string(p.UID), "volumes", "kubernetes.io~csi", volume, "mount")
}

// Publish asks once for pod p's prewarm volume, at most two minutes (the kubelet's limit). It
// returns the volume's target.
func (k *Kubelet) Publish(ctx context.Context, p *corev1.Pod) (string, error) {
	var vol *corev1.Volume
	for i, v := range p.Spec.Volumes {
		if v.CSI != nil && v.CSI.Driver == prewarmv1alpha1.CSIDriverName {
			vol = &p.Spec.Volumes[i]
		}
	}
	if vol == nil {
		return "", errors.New("the pod has no prewarm volume")
	}
	target := k.Target(p, vol.Name)
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return "", err
	}
	// The pod's own attributes, then what the kubelet sets over them.
	vc := map[string]string{}
	for key, v := range vol.CSI.VolumeAttributes {
		vc[key] = v
	}
	for key, v := range map[string]string{
		"csi.storage.k8s.io/pod.namespace": p.Namespace, "csi.storage.k8s.io/pod.name": p.Name,
		"csi.storage.k8s.io/pod.uid": string(p.UID), "csi.storage.k8s.io/ephemeral": "true",
		"csi.storage.k8s.io/serviceAccount.name": "default",
	} {
		vc[key] = v
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err := k.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: "csi-" + string(p.UID), TargetPath: target, Readonly: true, VolumeContext: vc,
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}},
	})
	return target, err
}

// Mount publishes pod p's volume, calling again while the plugin says to wait (Unavailable,
// NotFound), as the kubelet does, until within. It returns the target and the answers.
func (k *Kubelet) Mount(ctx context.Context, p *corev1.Pod, within time.Duration) (string, []codes.Code, error) {
	var answers []codes.Code
	deadline := time.Now().Add(within)
	for {
		target, err := k.Publish(ctx, p)
		answers = append(answers, status.Code(err))
		if c := status.Code(err); (c != codes.Unavailable && c != codes.NotFound) || !time.Now().Before(deadline) {
			return target, answers, err
		}
		select {
		case <-ctx.Done():
			return target, answers, ctx.Err()
		case <-time.After(500 * time.Millisecond): // the kubelet's first retry delay
		}
	}
}

// Unmount asks for pod p's volume to be unpublished.
func (k *Kubelet) Unmount(ctx context.Context, p *corev1.Pod, target string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := k.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-" + string(p.UID), TargetPath: target})
	return err
}
