package redistest

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/contstore/contstore/internal/lua"
)

// ReplyLoss makes connections lose the reply of chosen commands after the
// server ran them, as a network that drops a reply does: the client sees
// the connection end and, when its options allow retries, sends the
// command again on another connection. Install Dial as the client's
// Dialer.
type ReplyLoss struct {
	mu    sync.Mutex
	match func(cmd []byte) bool
	then  func()
	left  int

	lost atomic.Int64
}

// Lose arms l: the next n commands for which match reports true lose their
// reply. then, when not nil, runs after each loss, before the client sees
// it: the moment another client's command would slip in.
func (l *ReplyLoss) Lose(n int, match func(cmd []byte) bool, then func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.match, l.then, l.left = match, then, n
}

// Calling returns a matcher for the calls of s: by FCALL, which names its
// function, or by EVALSHA, which names its SHA1.
func Calling(s *lua.Script) func(cmd []byte) bool {
	return func(cmd []byte) bool {
		return bytes.Contains(cmd, []byte(s.Function())) || bytes.Contains(cmd, []byte(s.Hash()))
	}
}

// Lost returns how many replies were lost so far.
func (l *ReplyLoss) Lost() int64 { return l.lost.Load() }

// take reports whether the command written as cmd loses its reply.
func (l *ReplyLoss) take(cmd []byte) (bool, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left == 0 || l.match == nil || !l.match(cmd) {
		return false, nil
	}
	l.left--
	return true, l.then
}

// Dial dials like a client's default dialer, returning a connection that
// loses the replies l selects.
func (l *ReplyLoss) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, loss: l}, nil
}

type lossyConn struct {
	net.Conn
	loss *ReplyLoss
	drop bool
	then func()
}

func (c *lossyConn) Write(b []byte) (int, error) {
	if ok, then := c.loss.take(b); ok {
		c.drop, c.then = true, then
	}
	return c.Conn.Write(b)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	if !c.drop {
		return c.Conn.Read(b)
	}
	// The reply's first bytes arriving prove the server ran the command.
	c.drop = false
	_, err := c.Conn.Read(b)
	_ = c.Conn.Close()
	c.loss.lost.Add(1)
	if c.then != nil {
		c.then()
	}
	if err == nil {
		err = io.EOF
	}
	return 0, err
}
