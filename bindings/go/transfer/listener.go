// listener.go - a cap on the connections a receiver holds open (kvxd's
// --max-conns).
//
// gRPC accepts every connection that reaches its listener, and each one
// holds a file descriptor, a goroutine and its buffers until
// HandshakeTimeout or ConnIdle closes it: a client opening thousands of
// connections ran the process out of descriptors and memory. LimitListener
// makes Accept wait while n accepted connections are open, as
// golang.org/x/net/netutil.LimitListener does (not vendored here): the
// connections past the cap wait in the kernel's accept queue, holding
// nothing of the process, and are taken in turn as open ones close.

package transfer

import (
	"net"
	"sync"
)

// DefaultMaxConns is kvxd's --max-conns.
const DefaultMaxConns = 256

// LimitListener returns a listener whose Accept waits while n of the
// connections it returned are open (n <= 0 is taken as 1). A connection
// frees its place on its first Close; a second Close frees nothing more.
// Closing the listener ends an Accept waiting for a place (with the
// error of the listener's own Accept), so grpc.Server's Stop and
// GracefulStop are not held up by a full cap. m (nil: none) counts the
// open connections (kvx_transfer_connections_open).
func LimitListener(l net.Listener, n int, m *Metrics) net.Listener {
	if n <= 0 {
		n = 1
	}
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}), m: m}
}

type limitListener struct {
	net.Listener
	sem       chan struct{} // one token per open connection
	done      chan struct{} // closed with the listener
	closeOnce sync.Once
	m         *Metrics
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		// closed while waiting: the listener's own error (net.ErrClosed),
		// which gRPC takes for the end of serving
		c, err := l.Listener.Accept()
		if err == nil { // not expected of a closed listener
			c.Close()
			err = net.ErrClosed
		}
		return nil, err
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.m.conns(1)
	return &limitConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn is an accepted connection; its first Close frees its place.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		<-c.l.sem
		c.l.m.conns(-1)
	})
	return err
}
