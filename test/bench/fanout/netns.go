package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
)

// network is a bridge in this namespace and one network namespace per node, each on a veth
// pair whose two ends are shaped with tbf to the node's bandwidth: what the node receives (the
// bridge end) and what it sends (the node's end). The bridge's address is this namespace's:
// servers listening there (the origin's proxy, the API server's forwarder) are reached from
// every node through its shaped link.
type network struct {
	id      string
	subnet  string // 10.X.0
	bridge  string
	nodes   []string // namespace names
	rate    string   // tc rate, e.g. 100mbit
	cleanup []func()
}

func (n *network) hostIP() string         { return n.subnet + ".1" }
func (n *network) nodeIP(i int) string    { return fmt.Sprintf("%s.%d", n.subnet, 10+i) }
func (n *network) namespace(i int) string { return n.nodes[i] }

// hostLink is the bridge's end of node i's veth.
func (n *network) hostLink(i int) string { return fmt.Sprintf("pwh%s%d", n.id, i) }

// setRate reshapes every link, both ends, to rate (a tc rate: 20mbit).
func (n *network) setRate(rate string) error {
	for i, ns := range n.nodes {
		change := []string{"tc", "qdisc", "change", "dev", "", "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"}
		host, node := slices.Clone(change), slices.Clone(change)
		host[4], node[4] = n.hostLink(i), fmt.Sprintf("pwn%s%d", n.id, i)
		if err := sh(host, append([]string{"ip", "netns", "exec", ns}, node...)); err != nil {
			return err
		}
	}
	n.rate = rate
	return nil
}

// setLinkRate sets node i's link alone to rate (a tc rate), both ends.
func (n *network) setLinkRate(i int, rate string) error {
	change := []string{"tc", "qdisc", "change", "dev", "", "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"}
	host, node := slices.Clone(change), slices.Clone(change)
	host[4], node[4] = n.hostLink(i), fmt.Sprintf("pwn%s%d", n.id, i)
	return sh(host, append([]string{"ip", "netns", "exec", n.nodes[i]}, node...))
}

// newNetwork makes count namespaces shaped to rate (a tc rate: 100mbit).
func newNetwork(count int, rate string) (*network, error) {
	n := &network{id: fmt.Sprintf("%04x", rand.IntN(1<<16)), rate: rate}
	used, _ := exec.Command("ip", "-o", "addr").Output()
	for tries := 0; ; tries++ {
		n.subnet = fmt.Sprintf("10.%d.%d", 100+rand.IntN(150), rand.IntN(250))
		if !strings.Contains(string(used), " "+n.subnet+".") || tries > 50 {
			break
		}
	}
	n.bridge = "pwbr" + n.id
	steps := [][]string{
		{"ip", "link", "add", n.bridge, "type", "bridge"},
		{"ip", "addr", "add", n.hostIP() + "/24", "dev", n.bridge},
		{"ip", "link", "set", n.bridge, "up"},
	}
	if err := sh(steps...); err != nil {
		return nil, err
	}
	n.cleanup = append(n.cleanup, func() { _ = sh([]string{"ip", "link", "del", n.bridge}) })
	for i := range count {
		ns := fmt.Sprintf("pw%s-%d", n.id, i)
		host, peer := n.hostLink(i), fmt.Sprintf("pwn%s%d", n.id, i)
		in := func(args ...string) []string { return append([]string{"ip", "netns", "exec", ns}, args...) }
		if err := sh([]string{"ip", "netns", "add", ns}); err != nil {
			n.close()
			return nil, err
		}
		n.nodes = append(n.nodes, ns)
		n.cleanup = append(n.cleanup, func() { _ = sh([]string{"ip", "netns", "del", ns}) })
		tbf := func(dev string) []string {
			// A burst of 64 KiB and 50 ms of queue: the link's rate within a few per cent over
			// a second, as a provisioned cloud link.
			return []string{"tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"}
		}
		err := sh(
			[]string{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
			[]string{"ip", "link", "set", peer, "netns", ns},
			[]string{"ip", "link", "set", host, "master", n.bridge},
			[]string{"ip", "link", "set", host, "up"},
			in("ip", "link", "set", "lo", "up"),
			in("ip", "addr", "add", n.nodeIP(i)+"/24", "dev", peer),
			in("ip", "link", "set", peer, "up"),
			in("ip", "route", "add", "default", "via", n.hostIP()),
			tbf(host),
			in(tbf(peer)...),
		)
		if err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

func (n *network) close() {
	for i := len(n.cleanup) - 1; i >= 0; i-- {
		n.cleanup[i]()
	}
	n.cleanup = nil
}

func sh(steps ...[]string) error {
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// forward listens on addr and copies every connection to and from target: the nodes reach the
// API server, which listens on loopback, through the bridge.
func forward(ctx context.Context, addr, target string) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String(), func() { ln.Close() }, nil
}

var errNotRoot = errors.New("make bench-fanout makes network namespaces: run it as root")
