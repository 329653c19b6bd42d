// Package stall is a TCP server for tests that accepts connections and never answers: an
// endpoint whose every read stalls. No Kubernetes imports.
package stall

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
)

// Server accepts connections on loopback, reads nothing from them and writes nothing to them
// until it is closed.
type Server struct {
	// URL is the server's address as an http:// endpoint.
	URL string
	// Accepted counts the connections accepted.
	Accepted atomic.Int64

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

// Start listens on a free loopback port.
func Start() (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), ln: ln, done: make(chan struct{})}
	go s.accept()
	return s, nil
}

func (s *Server) accept() {
	defer close(s.done)
	for {
		c, err := s.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		s.Accepted.Add(1)
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
	}
}

// Close stops listening and closes every connection accepted.
func (s *Server) Close() {
	s.ln.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}
