// Package ports finds TCP ports free now for a process to bind later. Its ports are drawn below
// Linux's ephemeral range (32768 and up), which the kernel hands out to every outgoing
// connection and every bind to port 0: a port freed there can be taken by another test's
// connection before the process binds it.
package ports

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
)

// Listen listens on a free port of host ("" for every address) below the ephemeral range.
func Listen(host string) (net.Listener, error) {
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(20000+rand.IntN(12000))))
		if err == nil {
			return l, nil
		}
	}
	return nil, errors.New("no free port found below the ephemeral range")
}

// Free is a port of host free now, below the ephemeral range.
func Free(host string) (int, error) {
	l, err := Listen(host)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
