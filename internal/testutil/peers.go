package testutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Peer identity of the agents the tests start as processes: the chart's service account, and
// the audience of the default configuration.
const (
	PeerNamespace      = "hyperpod-inference-system"
	PeerServiceAccount = "prewarm-agent"
	PeerAudience       = "prewarm-peer"
)

// PeerUser is the user name of PeerServiceAccount's tokens.
const PeerUser = "system:serviceaccount:" + PeerNamespace + ":" + PeerServiceAccount

// PeerToken returns a token of PeerServiceAccount for audience, as the kubelet projects one
// into an agent's pod.
func PeerToken(ctx context.Context, c client.Client, audience string) (string, error) {
	return ServiceAccountToken(ctx, c, PeerNamespace, PeerServiceAccount, audience)
}

// ServiceAccountToken returns a token of service account namespace/name for audience, creating
// the namespace and the account when missing.
func ServiceAccountToken(ctx context.Context, c client.Client, namespace, name, audience string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	for _, obj := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, sa.DeepCopy()} {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](3600)}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token of %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// NodePeerToken returns a token of PeerServiceAccount for audience bound to a pod on node, as
// the kubelet projects one into the agent's pod of that node: the API server puts the node's
// name in it, which peers check. The pod (prewarm-agent-token-<node>, in PeerNamespace, with
// none of the agents' labels) stands in for the agent's pod; it is made once per node.
func NodePeerToken(ctx context.Context, c client.Client, node, audience string) (string, error) {
	if _, err := PeerToken(ctx, c, audience); err != nil { // the namespace and account
		return "", err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: PeerNamespace, Name: "prewarm-agent-token-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: PeerServiceAccount,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "agent", Image: "prewarm-agent-stand-in"}}},
	}
	if err := c.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		err = c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("creating the pod node %s's peer token is bound to: %w", node, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: PeerNamespace, Name: PeerServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting node %s's peer token: %w", node, err)
	}
	return tr.Status.Token, nil
}

// PeerArgs returns the flags that make an agent process serve its parts on a free loopback
// port, with a token of the agents' service account bound to node (NodePeerToken) in dir.
func PeerArgs(ctx context.Context, c client.Client, node, dir string) ([]string, error) {
	tok, err := NodePeerToken(ctx, c, node, PeerAudience)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "peer-token-"+node)
	if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
		return nil, err
	}
	// Port 0: the agent takes a free port as it listens and reports it (no port picked here
	// and released, which another process may take first).
	return []string{"--peer-bind-address=127.0.0.1:0", "--peer-token-file=" + file,
		"--peer-service-account=" + PeerUser}, nil
}
