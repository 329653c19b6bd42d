package ports

import (
	"net"
	"strconv"
	"testing"
)

// A free port is below the ephemeral range, and a process can bind it.
func TestAFreePortIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	port, err := Free("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if port < 20000 || port >= 32768 {
		t.Errorf("port %d; want one in [20000, 32768)", port)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("binding the free port %d: %v", port, err)
	}
	l.Close()
}
