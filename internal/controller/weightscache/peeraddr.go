package weightscache

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// AgentPodLabels select the agents' pods in the operator namespace.
var AgentPodLabels = client.MatchingLabels{"app.kubernetes.io/name": "prewarm", "app.kubernetes.io/component": "agent"}

// peerAddresses is what the controller has decided of the peer addresses agents report: an
// address is handed to other agents only if it is an IP and port where the node itself can be
// (one of the Node's addresses, inside its pod CIDRs, or the IP of its agent pod). Other agents
// send their bearer token to it, so an address an agent makes up (another host, a path) must
// never reach them. Verdicts are kept per node until its address changes; a refusal is checked
// again after refusalTTL (the agent's pod may have been seen before its IP was).
type peerAddresses struct {
	mu      sync.Mutex
	checked map[string]addrVerdict // by node
}

type addrVerdict struct {
	addr    string
	problem string // "": usable
	at      time.Time
}

const refusalTTL = time.Minute

// usablePeers returns byNode with the NodeCaches whose peer address is not usable replaced by
// copies that report none, so that they are no one's peer; each refusal is logged once.
func (r *Reconciler) usablePeers(ctx context.Context, targets []*corev1.Node, byNode map[string]*prewarmv1alpha1.NodeCache) (map[string]*prewarmv1alpha1.NodeCache, error) {
	out, copied := byNode, false
	for _, n := range targets {
		nc := byNode[n.Name]
		if nc == nil || nc.Status.PeerAddress == "" {
			continue
		}
		problem, err := r.peerAddressProblem(ctx, n, nc.Status.PeerAddress)
		if err != nil {
			return nil, err
		}
		if problem == "" {
			continue
		}
		if !copied {
			out, copied = maps.Clone(byNode), true
		}
		c := *nc // shallow: only the address differs, and nothing writes either
		c.Status.PeerAddress = ""
		out[n.Name] = &c
	}
	return out, nil
}

// peerAddressProblem says why addr, which node n's agent reports, must not be given to other
// agents ("" when it may).
func (r *Reconciler) peerAddressProblem(ctx context.Context, n *corev1.Node, addr string) (string, error) {
	r.peerAddrs.mu.Lock()
	v, ok := r.peerAddrs.checked[n.Name]
	r.peerAddrs.mu.Unlock()
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	if ok && v.addr == addr && (v.problem == "" || now.Sub(v.at) < refusalTTL) {
		return v.problem, nil
	}
	problem, err := r.checkPeerAddress(ctx, n, addr)
	if err != nil {
		return "", err
	}
	r.peerAddrs.mu.Lock()
	if r.peerAddrs.checked == nil {
		r.peerAddrs.checked = map[string]addrVerdict{}
	}
	r.peerAddrs.checked[n.Name] = addrVerdict{addr: addr, problem: problem, at: now}
	r.peerAddrs.mu.Unlock()
	if problem != "" && (!ok || v.addr != addr) {
		ctrl.LoggerFrom(ctx).Info("refusing a node's peer address: it is no one's peer", "node", n.Name, "peerAddress", addr, "why", problem)
	}
	return problem, nil
}

func (r *Reconciler) checkPeerAddress(ctx context.Context, n *corev1.Node, addr string) (string, error) {
	ip, problem := parsePeerAddress(addr)
	if problem != "" || !r.Config.CheckPeerIPs {
		return problem, nil
	}
	for _, a := range n.Status.Addresses {
		if (a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP) && sameIP(a.Address, ip) {
			return "", nil
		}
	}
	for _, cidr := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
		if p, err := netip.ParsePrefix(cidr); err == nil && p.Contains(ip) {
			return "", nil
		}
	}
	if r.APIReader != nil {
		pods := &corev1.PodList{}
		if err := r.APIReader.List(ctx, pods, client.InNamespace(r.Config.OperatorNamespace), AgentPodLabels,
			client.MatchingFields{"spec.nodeName": n.Name}); err != nil {
			return "", fmt.Errorf("listing the agent pods of node %s, to check its peer address: %w", n.Name, err)
		}
		for _, pod := range pods.Items {
			if pod.Spec.NodeName != n.Name {
				continue
			}
			for _, pip := range pod.Status.PodIPs {
				if sameIP(pip.IP, ip) {
					return "", nil
				}
			}
		}
	}
	return fmt.Sprintf("%s is none of the node's addresses, in none of its pod CIDRs, and not its agent pod's IP", ip), nil
}

// parsePeerAddress accepts exactly an IP and a port ("10.0.0.7:9444", "[fd00::7]:9444").
func parsePeerAddress(addr string) (netip.Addr, string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.Addr{}, fmt.Sprintf("%q is not an IP and port: %v", addr, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, fmt.Sprintf("%q: the host must be an IP address", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		return netip.Addr{}, fmt.Sprintf("%q: the port must be a number from 1 to 65535", addr)
	}
	if ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() {
		return netip.Addr{}, fmt.Sprintf("%q: not an address a node's agent serves on", addr)
	}
	if net.JoinHostPort(ip.String(), port) != addr {
		return netip.Addr{}, fmt.Sprintf("%q: write it as %s", addr, net.JoinHostPort(ip.String(), port))
	}
	return ip, ""
}

func sameIP(s string, ip netip.Addr) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Unmap() == ip.Unmap()
}
