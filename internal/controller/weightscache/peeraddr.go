package weightscache

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// agentPods select the agents' pods in the operator namespace.
var agentPods = client.MatchingLabels{"app.kubernetes.io/name": "prewarm", "app.kubernetes.io/component": "agent"}

// podIPs remembers which nodes' agent pods hold which IPs, as listed (the one check of a peer
// address that costs an API call): a match is kept until the node reports another address, a
// miss for podIPRecheck (the pod's IP may not have been written when it was listed). refused
// is the address last refused per node, so that each refusal is logged once.
type podIPs struct {
	mu      sync.Mutex
	seen    map[string]podIPVerdict // by node
	refused map[string]string
}

type podIPVerdict struct {
	ip    netip.Addr
	match bool
	at    time.Time
}

// podIPRecheck is how long a listed agent pod that lacks a reported IP is believed: the kubelet
// writes a pod's IPs shortly after its containers see them, so an agent may report its address
// first. While any target's address stands refused, its cache is looked at again this often.
const podIPRecheck = 5 * time.Second

// peerPhase fills the decision's peerAddrs, unless peers are off, and has the cache looked at again
// soon while an address is refused (a pod IP or node address not yet written where it is
// checked).
func (r *Reconciler) peerPhase(ctx context.Context, s *state) error {
	if r.Config.Peers.Disabled {
		return nil
	}
	p := &s.decision
	addrs, refused, err := r.peerAddrsOf(ctx, p.targets, s.fleet)
	if err != nil {
		return err
	}
	p.peerAddrs = addrs
	if refused && (p.requeue == 0 || p.requeue > podIPRecheck) {
		p.requeue = podIPRecheck
	}
	return nil
}

// peerAddrsOf returns the peer address of each target whose agent reports one that other agents
// may be sent: exactly an IP and port, the IP the node's own (one of its addresses, inside its
// pod CIDRs, or its agent pod's IP). Other agents send their bearer token there, so an address
// an agent makes up (another host, a path) never reaches them; its node is no one's peer.
// refused says whether any reported address was refused.
func (r *Reconciler) peerAddrsOf(ctx context.Context, targets []*corev1.Node, f *fleet) (out map[string]string, refused bool, err error) {
	out = make(map[string]string, len(targets))
	for _, n := range targets {
		nc := f.nodeCache(n.Name)
		if nc == nil || nc.Status.PeerAddress == "" {
			continue
		}
		problem, perr := r.peerAddressProblem(ctx, n, nc.Status.PeerAddress)
		switch {
		case perr != nil:
			return nil, false, perr
		case problem != "":
			refused = true
			r.logRefusal(ctx, n.Name, nc.Status.PeerAddress, problem)
		default:
			out[n.Name] = nc.Status.PeerAddress
		}
	}
	return out, refused, nil
}

func (r *Reconciler) logRefusal(ctx context.Context, node, addr, problem string) {
	r.podIPs.mu.Lock()
	defer r.podIPs.mu.Unlock()
	if r.podIPs.refused[node] == addr {
		return
	}
	if r.podIPs.refused == nil {
		r.podIPs.refused = map[string]string{}
	}
	r.podIPs.refused[node] = addr
	ctrl.LoggerFrom(ctx).Info("refusing a node's peer address: it is no one's peer", "node", node, "peerAddress", addr, "why", problem)
}

// peerAddressProblem says why addr, which node n's agent reports, must not be given to other
// agents ("" when it may).
func (r *Reconciler) peerAddressProblem(ctx context.Context, n *corev1.Node, addr string) (string, error) {
	ip, problem := parsePeerAddress(addr)
	if problem != "" {
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
	match, err := r.agentPodHas(ctx, n.Name, ip)
	if err != nil || match {
		return "", err
	}
	return fmt.Sprintf("%s is none of the node's addresses, in none of its pod CIDRs, and not its agent pod's IP", ip), nil
}

// agentPodHas reports whether node's agent pod has ip.
func (r *Reconciler) agentPodHas(ctx context.Context, node string, ip netip.Addr) (bool, error) {
	if r.APIReader == nil {
		return false, nil
	}
	now := r.Now()
	r.podIPs.mu.Lock()
	v, ok := r.podIPs.seen[node]
	r.podIPs.mu.Unlock()
	if ok && v.ip == ip && (v.match || now.Sub(v.at) < podIPRecheck) {
		return v.match, nil
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.InNamespace(r.Config.OperatorNamespace), agentPods,
		client.MatchingFields{"spec.nodeName": node}); err != nil {
		return false, fmt.Errorf("listing the agent pods of node %s, to check its peer address: %w", node, err)
	}
	match := false
	for _, pod := range pods.Items {
		for _, pip := range pod.Status.PodIPs {
			match = match || pod.Spec.NodeName == node && sameIP(pip.IP, ip)
		}
	}
	r.podIPs.mu.Lock()
	if r.podIPs.seen == nil {
		r.podIPs.seen = map[string]podIPVerdict{}
	}
	r.podIPs.seen[node] = podIPVerdict{ip: ip, match: match, at: now}
	r.podIPs.mu.Unlock()
	return match, nil
}

// parsePeerAddress accepts exactly an IP and a port ("10.0.0.7:9444", "[fd00::7]:9444").
func parsePeerAddress(addr string) (netip.Addr, string) {
	ap, err := netip.ParseAddrPort(addr)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Sprintf("%q is not an IP and port: %v", addr, err)
	case ap.String() != addr || ap.Port() == 0 || ap.Addr().Zone() != "":
		return netip.Addr{}, fmt.Sprintf("%q: want an IP and a port such as 10.0.0.7:9444", addr)
	case ap.Addr().IsUnspecified() || ap.Addr().IsMulticast() || ap.Addr().IsLinkLocalUnicast():
		return netip.Addr{}, fmt.Sprintf("%q: not an address a node's agent serves on", addr)
	}
	return ap.Addr(), ""
}

func sameIP(s string, ip netip.Addr) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Unmap() == ip.Unmap()
}
