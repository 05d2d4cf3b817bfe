package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progress serves next with a bound on each wait for the client: a read
// of the request body that gets no byte for bodyTimeout, or a write or
// flush to the client that cannot complete within writeTimeout, fails,
// and the server then drops the connection. Silent gaps between writes
// (an upstream thinking) do not count, nor does a connection the handler
// hijacked (a WebSocket).
func progress(next http.Handler, bodyTimeout, writeTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body != nil && r.Body != http.NoBody {
			// From the headers on, so that the server's discarding of a
			// body the handler left unread is bounded too.
			_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
			conn, _ := r.Context().Value(connKey{}).(*limitedConn)
			if conn != nil {
				conn.bodyGot.Store(0)
				conn.bodyFrom.Store(time.Now().UnixNano())
				defer func() {
					conn.gap.Store(0) // the server's discarding of the rest is not extended
					conn.bodyFrom.Store(0)
				}()
			}
			r2 := *r
			r2.Body = &progressBody{ReadCloser: r.Body, rc: rc, conn: conn, timeout: bodyTimeout}
			r = &r2
		}
		pw := &progressWriter{ResponseWriter: w, rc: rc, timeout: writeTimeout}
		next.ServeHTTP(pw, r)
		pw.extend() // for the server's last flush, after the handler
	})
}

// progressBody is a request body whose every read must get a byte within
// timeout. Once the body is read to its end the connection has no read
// deadline, so that the server's watch for the client going away does not
// fail during a long answer.
//
// A read of a chunked body waits for a chunk, or for as much of it as it
// asks, before it returns: meanwhile, each read of the connection that
// gets bytes moves the deadline timeout ahead (limitedConn.gap), so that
// a body whose bytes keep coming is not cut.
type progressBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	conn    *limitedConn // nil when the server's connection is not one
	timeout time.Duration
}

// Read implements io.Reader. Past the deadline it fails with an error
// that names the wait, not the connection's addresses: the handler may
// pass it on to the client.
func (b *progressBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	if b.conn != nil {
		b.conn.gap.Store(int64(b.timeout))
	}
	n, err := b.ReadCloser.Read(p)
	if b.conn != nil {
		b.conn.gap.Store(0) // only within a read of the body
		b.conn.bodyGot.Add(int64(n))
	}
	switch {
	case err == io.EOF:
		_ = b.rc.SetReadDeadline(time.Time{})
		if b.conn != nil {
			b.conn.bodyFrom.Store(0)
		}
	case errors.Is(err, errSlowBody):
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("nothing came for %v", b.timeout)
	}
	return n, err
}

// progressWriter is a ResponseWriter whose every write and flush must
// complete within timeout. It leaves a hijacked connection alone.
type progressWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	timeout  time.Duration
	hijacked bool
}

// extend gives the next write to the client timeout from now.
func (w *progressWriter) extend() {
	if !w.hijacked {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

// Write implements http.ResponseWriter.
func (w *progressWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher, which streams Server-Sent Events.
func (w *progressWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Hijack implements http.Hijacker, for the WebSocket mode; the server
// clears the connection's deadlines as it hands it over.
func (w *progressWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := w.rc.Hijack()
	w.hijacked = err == nil
	return conn, rw, err
}

// Unwrap returns the server's ResponseWriter, for
// http.NewResponseController.
func (w *progressWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// limitListener serves at most cap(sem) connections open at once; the
// others wait: the first accepted, unanswered, the rest in the accept
// queue. It is golang.org/x/net/netutil's LimitListener, but its
// connections are *net.TCPConn still: the server half-closes one
// (CloseWrite) so that the client reads a refusal, such as the 413 of a
// body over -max-body, before the connection closes. A connection
// accepted while every slot is taken asks full, when set, to make room,
// and again every fullRetry while it waits.
type limitListener struct {
	*net.TCPListener
	sem       chan struct{}
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	full      func()
	mu        sync.Mutex
	conns     map[*limitedConn]struct{} // those open
}

// fullRetry is how often a connection waiting for a slot asks again to
// make room: a connection busy when it first asked may sit idle now.
const fullRetry = time.Second

// fileReserve is the open files kept out of the client connections'
// share of the process's limit: Redis, the listeners, logs, peers.
const fileReserve = 64

// connsWithin returns the most client connections, at most want, that a
// process allowed nofile open files can hold when each may need an
// upstream connection too (nofile 0: unknown, want).
func connsWithin(want int, nofile uint64) int {
	if nofile == 0 {
		return want
	}
	room := int(max(nofile, 2*fileReserve+2)-fileReserve) / 2
	return min(want, room)
}

// closeIdleConns closes srv's keep-alive connections that sit idle
// between requests, and those that have sent no whole request for 5
// seconds (a client that sends its headers a byte now and then): the
// client opens a new one for its next request.
func closeIdleConns(srv *http.Server) {
	srv.SetKeepAlivesEnabled(false) // which closes the idle connections
	srv.SetKeepAlivesEnabled(true)
}

// newLimitListener limits ln to n connections open at once.
func newLimitListener(ln *net.TCPListener, n int) *limitListener {
	return &limitListener{TCPListener: ln, sem: make(chan struct{}, n), done: make(chan struct{}), conns: map[*limitedConn]struct{}{}}
}

// Accept waits for a connection, then for a free slot for it.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	select {
	case l.sem <- struct{}{}:
	default:
		if err := l.wait(c); err != nil {
			return nil, err
		}
	}
	lc := &limitedConn{TCPConn: c, accepted: time.Now()}
	lc.release = func() {
		l.mu.Lock()
		delete(l.conns, lc)
		l.mu.Unlock()
		<-l.sem
	}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// track is the server's ConnState: it keeps each connection's state.
func (l *limitListener) track(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*limitedConn); ok {
		lc.state.Store(int32(st))
	}
}

// newIdleAfter is how long a connection that has sent no complete request
// yet must wait before the server takes it for idle (net/http closes such
// connections with the idle ones after 5 seconds).
const newIdleAfter = 5 * time.Second

// hasIdle reports whether a connection is idle as closeIdleConns takes
// it: between requests, or open newIdleAfter without a request.
func (l *limitListener) hasIdle() bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		switch http.ConnState(c.state.Load()) {
		case http.StateIdle:
			return true
		case http.StateNew:
			if now.Sub(c.accepted) >= newIdleAfter {
				return true
			}
		}
	}
	return false
}

// A request body arrives slowly when it has been arriving for slowAfter
// or more at less than slowRate bytes a second on average.
const (
	slowAfter = 2 * time.Second
	slowRate  = 64 << 10
)

// errSlowBody fails the reads of a body stopped by stopSlowestBody.
var errSlowBody = fmt.Errorf("the body came too slowly while the gateway needed its connection: %w", os.ErrDeadlineExceeded)

// stopSlowestBody stops the request body that arrives the slowest, of
// those that arrive slowly: its reads fail (errSlowBody), its request is
// answered as a body that could not be read, and its connection closes.
// It reports whether there was one.
func (l *limitListener) stopSlowestBody() bool {
	now := time.Now()
	var slowest *limitedConn
	var rate float64
	l.mu.Lock()
	for c := range l.conns {
		from := c.bodyFrom.Load()
		if from == 0 || c.stopped.Load() {
			continue
		}
		d := now.Sub(time.Unix(0, from))
		if r := float64(c.bodyGot.Load()) / d.Seconds(); d >= slowAfter && r < slowRate && (slowest == nil || r < rate) {
			slowest, rate = c, r
		}
	}
	l.mu.Unlock()
	if slowest == nil {
		return false
	}
	slowest.stopped.Store(true)
	_ = slowest.TCPConn.SetReadDeadline(now) // a read waiting returns
	return true
}

// wait waits for a slot for c, asking full to make room meanwhile.
func (l *limitListener) wait(c *net.TCPConn) error {
	var retry <-chan time.Time
	if l.full != nil {
		l.full()
		t := time.NewTicker(fullRetry)
		defer t.Stop()
		retry = t.C
	}
	for {
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-retry:
			l.full()
		case <-l.done:
			_ = c.Close()
			return net.ErrClosed
		}
	}
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.TCPListener.Close()
}

// limitedConn is a connection of a limitListener; closing it frees its
// slot.
type limitedConn struct {
	*net.TCPConn
	releaseOnce sync.Once
	release     func()
	accepted    time.Time
	state       atomic.Int32 // its http.ConnState (limitListener.track)
	// bodyFrom, while a request body arrives (progressBody), is when it
	// began (UnixNano), and bodyGot what has come of it; bodyFrom is 0
	// otherwise. stopped tells that stopSlowestBody stopped it.
	bodyFrom, bodyGot atomic.Int64
	stopped           atomic.Bool
	// gap, while a request body is read (progressBody), is how far each
	// read that gets bytes moves the read deadline ahead, in nanoseconds;
	// 0 otherwise.
	gap atomic.Int64
}

// Read implements net.Conn.
func (c *limitedConn) Read(p []byte) (int, error) {
	if c.stopped.Load() {
		return 0, errSlowBody
	}
	n, err := c.TCPConn.Read(p)
	if c.stopped.Load() {
		return 0, errSlowBody
	}
	if g := c.gap.Load(); g > 0 && n > 0 {
		_ = c.TCPConn.SetReadDeadline(time.Now().Add(time.Duration(g)))
	}
	return n, err
}

// connKey is the context key of a request's limitedConn (connContext).
type connKey struct{}

// connContext is the server's ConnContext: a request's context holds its
// connection, when it is a limitedConn.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// Close closes the connection and frees its slot, once.
func (c *limitedConn) Close() error {
	err := c.TCPConn.Close()
	c.releaseOnce.Do(c.release)
	return err
}
