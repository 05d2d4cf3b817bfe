package proxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/contstore/contstore/internal/route"
	"github.com/contstore/contstore/store"
)

// Defaults of WebSocketOptions.
const (
	defaultSockets        = 16
	defaultSocketLifetime = 55 * time.Minute
	defaultDialTimeout    = 10 * time.Second
	defaultIdleTimeout    = 5 * time.Minute
	defaultCredentials    = 1024
	defaultMaxSockets     = 4096
)

// WebSocketOptions configure NewWebSocketUpstream.
type WebSocketOptions struct {
	// Replica is the replica id of the proxy's store
	// (store.Options.Replica): a continuation is taken on this replica's
	// sockets only when its origin names this replica. Required.
	Replica string
	// Sockets bounds the sockets kept per credential. Default 16.
	Sockets int
	// Lifetime is how long a socket is used before it is replaced; the
	// upstream closes its sockets after 60 minutes. Default 55 minutes.
	Lifetime time.Duration
	// DialTimeout bounds opening a socket. Default 10s.
	DialTimeout time.Duration
	// Header, when it has a credential (an Authorization, api-key or
	// other credential header), is sent on every socket's handshake and
	// the clients' credentials are not used. Otherwise the client's
	// credential, OpenAI-Organization, OpenAI-Project and OpenAI-Beta
	// headers are, with the other headers named like a credential and the
	// client's query, and sockets are kept per credential.
	Header http.Header
	// Client makes the handshakes and carries the requests other than
	// turns (passthrough.go). When nil, a client of the upstream's own
	// whose transport keeps idle connections as NewHTTPUpstream's does.
	Client *http.Client
	// IdleTimeout closes a socket that has carried no turn for that long
	// (with a close frame, status 1000); a credential whose last socket
	// closes is forgotten, so that the sockets, goroutines and memory of
	// credentials that went quiet are given back. A conversation whose
	// socket closed sends its next turn with the full context (store
	// false). Default 5 minutes.
	IdleTimeout time.Duration
	// MaxCredentials bounds the credentials whose sockets are kept. A new
	// credential past it takes the place of the one least recently used
	// among those with no turn in flight, whose sockets close as idle ones
	// do. When every credential kept has a turn in flight, the new
	// credential's turn waits for one of those turns to finish, as a turn
	// waits for a socket while its credential has Sockets in use, for as
	// long as the turn may take (Config.UpstreamTimeout), and then fails
	// as an upstream that did not answer in time (504). A credential whose
	// handshake fails (such as a key the upstream refuses with 401) is not
	// kept. Default 1024.
	MaxCredentials int
	// MaxSockets bounds the sockets open at once, of every credential:
	// each takes a file descriptor, as a client connection does. A turn
	// that needs a new socket past it closes the socket idle the longest,
	// of any credential, or waits, as for a socket of its own credential.
	// contproxy sets it to its -max-conns. Default 4096.
	MaxSockets int
}

// handshakeHeaders are the client headers a socket's handshake carries,
// and that tell its credential apart.
var handshakeHeaders = append(slices.Clone(accountHeaders), "OpenAI-Beta")

// wsUpstream is the Responses API's WebSocket mode: a pool of sockets per
// replica, each carrying one response at a time. With store false the
// upstream keeps only each socket's latest response, so a continuation is
// taken only on the socket that produced it, while that socket still holds
// it; a response stored upstream (store true) continues on any socket.
type wsUpstream struct {
	url  string
	opts WebSocketOptions
	now  func() time.Time

	mu      sync.Mutex
	pools   map[[32]byte]*wsPool
	slots   int // the sockets of every pool, open or being opened
	nextID  uint64
	closed  bool
	changed chan struct{} // closed and replaced whenever a socket is released
}

// wsPool holds the sockets of one credential. It is kept while it has a
// socket, open or being opened, and no more.
type wsPool struct {
	key     [32]byte
	hs      handshake
	sockets []*wsSocket
	// used is when a turn last took or released one of its sockets.
	used time.Time
}

// wsSocket is one upstream socket, or a slot for one.
type wsSocket struct {
	id     uint64 // unique per process; a new socket gets a new id
	busy   bool
	ws     *websocket.Conn
	frames *frameQueue // filled by the socket's reader
	born   time.Time
	// latest is the upstream's latest response on this socket, "" when
	// it holds none or it is unknown; begun, the last response whose
	// events began on it (wsConn.send), held or not. Only the turn that
	// holds the socket uses begun.
	latest, begun string
	// released is when the socket last finished a turn.
	released time.Time
	// idle closes the socket once it has been idle for IdleTimeout; nil
	// while the socket is busy.
	idle *time.Timer
}

// NewWebSocketUpstream returns the Responses WebSocket mode at baseURL
// (such as "wss://api.openai.com/v1"; sockets open its path +
// "/responses", with its query). Each turn is sent as a response.create
// event on a socket of the pool, and its events go back to the client as
// Server-Sent Events, or as the final response object when the client
// asked for JSON. Request headers other than the credentials are not sent:
// a socket is shared by many clients' turns.
func NewWebSocketUpstream(baseURL string, opts WebSocketOptions) (Upstream, error) {
	u, err := responsesURL(baseURL, "ws", "wss")
	if err != nil {
		return nil, err
	}
	switch {
	case opts.Replica == "":
		return nil, fmt.Errorf("%w: WebSocketOptions.Replica is empty", ErrInvalidConfig)
	case opts.Sockets < 0 || opts.Lifetime < 0 || opts.DialTimeout < 0 || opts.IdleTimeout < 0 || opts.MaxCredentials < 0 ||
		opts.MaxSockets < 0:
		return nil, fmt.Errorf("%w: negative WebSocketOptions (Sockets %d, Lifetime %v, DialTimeout %v, IdleTimeout %v, MaxCredentials %d, MaxSockets %d)",
			ErrInvalidConfig, opts.Sockets, opts.Lifetime, opts.DialTimeout, opts.IdleTimeout, opts.MaxCredentials, opts.MaxSockets)
	}
	opts.Sockets = cmp.Or(opts.Sockets, defaultSockets)
	opts.MaxCredentials = cmp.Or(opts.MaxCredentials, defaultCredentials)
	opts.MaxSockets = cmp.Or(opts.MaxSockets, defaultMaxSockets)
	opts.Lifetime = cmp.Or(opts.Lifetime, defaultSocketLifetime)
	opts.DialTimeout = cmp.Or(opts.DialTimeout, defaultDialTimeout)
	opts.IdleTimeout = cmp.Or(opts.IdleTimeout, defaultIdleTimeout)
	if opts.Client == nil {
		opts.Client = newClient(newTransport())
	}
	return &wsUpstream{url: u, opts: opts, now: time.Now, pools: map[[32]byte]*wsPool{},
		changed: make(chan struct{})}, nil
}

// credential returns the handshake of a socket for a turn of a client with
// headers h and URL query query, and the key of its pool: the client's
// credential, account and OpenAI-Beta headers, the other headers named
// like a credential (credentialParts: what scopes its owners) and its
// query, as an HTTP turn carries them; or, when the operator configures a
// credential (WebSocketOptions.Header), that credential, for every turn.
func (u *wsUpstream) credential(h http.Header, query string) (handshake, [32]byte) {
	if carriesCredential(u.opts.Header) {
		return handshake{url: u.url, header: u.opts.Header}, [32]byte{}
	}
	out := u.opts.Header.Clone()
	if out == nil {
		out = http.Header{}
	}
	given := func(vs []string) bool { return slices.ContainsFunc(vs, func(v string) bool { return v != "" }) }
	for _, k := range handshakeHeaders {
		if vs := h.Values(k); given(vs) {
			out[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
		}
	}
	for _, p := range credentialParts(h) { // the credential headers among them, above
		if k := http.CanonicalHeaderKey(p.name); out[k] == nil && given(p.values) {
			out[k] = slices.Clone(p.values)
		}
	}
	hs := handshake{url: withQuery(u.url, query), header: out}
	return hs, hs.digest()
}

// handshake is what a socket's handshake carries: its URL and headers.
type handshake struct {
	url    string
	header http.Header
}

// digest tells handshakes apart, in this process only.
func (hs handshake) digest() [32]byte {
	d := sha256.New()
	fmt.Fprintf(d, "%q\n", hs.url)
	for _, k := range slices.Sorted(maps.Keys(hs.header)) {
		fmt.Fprintf(d, "%q %q\n", k, hs.header[k])
	}
	var sum [32]byte
	d.Sum(sum[:0])
	return sum
}

func (u *wsUpstream) acquire(ctx context.Context, tg *target) (conn, error) {
	hs, key := u.credential(tg.header, tg.query)
	for {
		u.mu.Lock()
		pool, s, err := u.take(key, hs, tg)
		changed := u.changed
		u.mu.Unlock()
		switch {
		case err != nil:
			return nil, err
		case s != nil:
			c := &wsConn{up: u, pool: pool, s: s, tg: tg}
			if err := c.ready(ctx); err != nil {
				c.release()
				return nil, err
			}
			return c, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if pool == nil {
				return nil, fmt.Errorf("waiting for room for another upstream credential (%d kept, each with a turn in flight): %w",
					u.opts.MaxCredentials, ctx.Err())
			}
			return nil, fmt.Errorf("waiting for an upstream socket (%d in use): %w", u.opts.Sockets, ctx.Err())
		}
	}
}

// take returns the socket a turn takes, marked busy, and its pool; a nil
// socket to wait for a change, with a nil pool when the credential waits
// for room among MaxCredentials. u.mu is held.
func (u *wsUpstream) take(key [32]byte, hs handshake, tg *target) (*wsPool, *wsSocket, error) {
	if u.closed {
		return nil, nil, errClosed
	}
	pool := u.pools[key]
	if pool == nil {
		if tg.forwarded {
			return nil, nil, errMovedOn // its socket went with its pool
		}
		if pool = u.newPool(key, hs); pool == nil {
			return nil, nil, nil
		}
	}
	s, gone := u.pick(pool, tg)
	if gone {
		return nil, nil, errMovedOn
	}
	if s != nil {
		s.busy, pool.used = true, u.now()
		s.stopIdle()
	}
	return pool, s, nil
}

// newPool adds the pool of a new credential and returns it. At
// MaxCredentials it first evicts the pool least recently used among those
// with no busy socket, and returns nil when every pool has one. u.mu is
// held.
func (u *wsUpstream) newPool(key [32]byte, hs handshake) *wsPool {
	if len(u.pools) >= u.opts.MaxCredentials {
		var lru *wsPool
		for _, p := range u.pools {
			if !p.busy() && (lru == nil || p.used.Before(lru.used)) {
				lru = p
			}
		}
		if lru == nil {
			return nil
		}
		for _, s := range lru.sockets {
			s.shut("credential evicted")
		}
		u.slots -= len(lru.sockets)
		delete(u.pools, lru.key)
	}
	pool := &wsPool{key: key, hs: hs, used: u.now()}
	u.pools[key] = pool
	return pool
}

// busy tells whether a turn holds one of the pool's sockets.
func (p *wsPool) busy() bool {
	for _, s := range p.sockets {
		if s.busy {
			return true
		}
	}
	return false
}

// remove takes a socket that is closed and idle out of its pool, and the
// pool out of u when it has no socket left. u.mu is held.
func (u *wsUpstream) remove(pool *wsPool, s *wsSocket) {
	n := len(pool.sockets)
	pool.sockets = slices.DeleteFunc(pool.sockets, func(o *wsSocket) bool { return o == s })
	u.slots -= n - len(pool.sockets)
	if len(pool.sockets) == 0 && u.pools[pool.key] == pool {
		delete(u.pools, pool.key)
	}
}

// idleFrom starts the idle timeout of a socket just released. u.mu is
// held.
func (u *wsUpstream) idleFrom(pool *wsPool, s *wsSocket) {
	var t *time.Timer
	t = time.AfterFunc(u.opts.IdleTimeout, func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if s.idle != t {
			return // taken, or closed, since
		}
		s.shut("idle")
		u.remove(pool, s)
	})
	s.idle = t
}

// stopIdle stops the socket's idle timeout. u.mu is held.
func (s *wsSocket) stopIdle() {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
}

// shut closes an idle socket with a close frame, in the background.
// u.mu is held.
func (s *wsSocket) shut(reason string) {
	s.stopIdle()
	if ws := s.detach(); ws != nil {
		go func() { _ = ws.Close(websocket.StatusNormalClosure, reason) }()
	}
}

// detach takes the connection out of the slot, which opens a new one when
// next used, and returns it, nil when the slot held none. Its frames are
// drained until its reader sees the close and stops. u.mu is held.
func (s *wsSocket) detach() *websocket.Conn {
	ws, frames := s.ws, s.frames
	s.ws, s.latest, s.frames = nil, "", nil
	if ws != nil {
		go func() {
			for f := range frames.c {
				frames.took(f)
			}
		}()
	}
	return ws
}

// pick returns the socket a turn takes, or nil to wait for one; u.mu is
// held. A turn whose continuation lives on a socket of this pool that
// still holds it waits for that socket; a forwarded turn takes only that
// socket, and gets gone when it holds the response no more. Any other
// turn takes an idle socket holding no response, else a new one while the
// pool has room and MaxSockets does (or, the pool having no idle socket,
// another credential's idle socket gives way), else the idle socket whose
// response has waited longest.
func (u *wsUpstream) pick(pool *wsPool, tg *target) (s *wsSocket, gone bool) {
	if route.Decide(tg.offer(u.opts.Replica, false, true)) == route.Local { // continues on a socket of this pool, if one holds it
		for _, s := range pool.sockets {
			if s.id == tg.want.ID && s.holds(tg.prev, u.now(), u.opts.Lifetime) {
				if s.busy {
					return nil, false
				}
				return s, false
			}
		}
	}
	if tg.forwarded {
		return nil, true
	}
	// A turn that names its own previous response goes on no socket
	// holding it: the upstream would continue there a response it keeps
	// for that socket alone (store false), which another client's
	// connection made. When only such a socket is free it is opened
	// again: that response's own next turn then sends its full context.
	var idle, holding *wsSocket
	for _, s := range pool.sockets {
		switch {
		case s.busy:
		case tg.own != "" && s.latest == tg.own:
			holding = s
		case s.latest == "":
			return s, false
		case idle == nil || s.released.Before(idle.released):
			idle = s
		}
	}
	if len(pool.sockets) < u.opts.Sockets && (u.slots < u.opts.MaxSockets || idle == nil && u.evictIdle(pool)) {
		s := &wsSocket{}
		pool.sockets = append(pool.sockets, s)
		u.slots++
		return s, false
	}
	if idle == nil && holding != nil {
		holding.shut("its response was named on another turn")
		return holding, false // opened again, as a new socket
	}
	return idle, false // the one whose response has waited longest, or none
}

// evictIdle makes room within MaxSockets for a new socket of pool, which
// has none idle: it closes the socket of another credential idle the
// longest; false when every socket of the others is busy. u.mu is held.
func (u *wsUpstream) evictIdle(pool *wsPool) bool {
	var lru *wsSocket
	var from *wsPool
	for _, p := range u.pools {
		for _, s := range p.sockets {
			if p != pool && !s.busy && (lru == nil || s.released.Before(lru.released)) {
				lru, from = s, p
			}
		}
	}
	if lru == nil {
		return false
	}
	lru.shut("room for another credential")
	u.remove(from, lru)
	return true
}

// holds tells whether the socket is open, within its lifetime and holds
// response id.
func (s *wsSocket) holds(id string, now time.Time, lifetime time.Duration) bool {
	return s.ws != nil && s.latest == id && id != "" && now.Sub(s.born) < lifetime
}

// close closes every socket, at once, each with a close frame, and
// returns once they are closed or closeGrace has passed.
// An idle socket's frames are drained (detach) so that its reader ends.
func (u *wsUpstream) close() error {
	u.mu.Lock()
	u.closed = true
	u.opts.Client.CloseIdleConnections()
	var open []*websocket.Conn
	for _, pool := range u.pools {
		for _, s := range pool.sockets {
			s.stopIdle()
			ws := s.ws
			if s.busy {
				s.ws = nil // its turn reads what came until the socket closes
			} else {
				ws = s.detach()
			}
			if ws != nil {
				open = append(open, ws)
			}
		}
	}
	u.mu.Unlock()
	var wg sync.WaitGroup
	for _, ws := range open {
		wg.Go(func() { _ = ws.Close(websocket.StatusNormalClosure, "proxy shutting down") })
	}
	closed := make(chan struct{})
	go func() {
		wg.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeGrace):
	}
	return nil
}

// closeGrace is how long closing the transport waits for the upstream to
// answer its sockets' close frames. A socket's close waits up to 5 s for
// its answer, and as long to send its frame: those the upstream leaves
// unanswered finish closing in the background.
const closeGrace = time.Second

// wsConn is a socket held by one turn.
type wsConn struct {
	up   *wsUpstream
	pool *wsPool
	s    *wsSocket
	tg   *target
	// clean tells whether the last response on the socket was read to its
	// end, so that the socket can carry the next one.
	clean bool
	// errored tells that the last request's answer was an error event:
	// the socket carries no other request, since what it sends next (that
	// request's answer after all, if the error was a late one of an earlier
	// response) could not be told apart from the next request's.
	errored bool
}

// ready makes sure the held socket is open, within its lifetime, and has
// nothing left over from before (such as the upstream's lifetime error on
// an idle socket).
func (c *wsConn) ready(ctx context.Context) error {
	s := c.s
	c.up.mu.Lock()
	defer c.up.mu.Unlock()
	if s.ws != nil && c.up.now().Sub(s.born) >= c.up.opts.Lifetime {
		c.drop()
	}
drain:
	for s.ws != nil {
		select {
		case f, ok := <-s.frames.c:
			s.frames.took(f)
			if !ok || f.start && eventType(f.data) == "error" {
				c.drop() // the upstream closed it, or said why it will
			}
		default:
			break drain
		}
	}
	if s.ws != nil {
		c.clean = true
		return nil
	}
	// Dial without the lock: other turns go on meanwhile.
	c.up.mu.Unlock()
	ws, err := c.dial(ctx)
	c.up.mu.Lock()
	switch {
	case err != nil:
		return err
	case c.up.closed:
		_ = ws.CloseNow() // opened while the upstream closed: nothing closes it later
		return errClosed
	}
	c.up.nextID++
	s.id, s.ws, s.born, s.latest, s.frames = c.up.nextID, ws, c.up.now(), "", newFrameQueue()
	go read(ws, s.frames)
	c.clean = true
	return nil
}

// dial opens a socket.
func (c *wsConn) dial(ctx context.Context) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.up.opts.DialTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, c.pool.hs.url, &websocket.DialOptions{
		HTTPHeader: c.pool.hs.header, HTTPClient: c.up.opts.Client,
	})
	if err != nil && resp != nil && resp.StatusCode >= 400 {
		// The upstream answered the handshake, with an HTTP error such as
		// 401 for a key it does not know: the client gets that answer.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
		return nil, &upstreamRefusal{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
	}
	if err != nil {
		return nil, fmt.Errorf("opening an upstream socket: %w", withoutQuery(err))
	}
	ws.SetReadLimit(maxUpstreamBody)
	return ws, nil
}

// maxRefusalBody is the most of a refused handshake's answer kept (the
// WebSocket library keeps its first 1,024 bytes).
const maxRefusalBody = 1024

// upstreamRefusal is the upstream's HTTP answer to a socket's handshake
// that it refused.
type upstreamRefusal struct {
	status      int
	contentType string
	body        []byte
}

func (e *upstreamRefusal) Error() string {
	return fmt.Sprintf("the upstream refused the socket: %d %.200s", e.status, e.body)
}

// write answers the client as the upstream answered the handshake: its
// status and its error body, when the body is a Responses error.
func (e *upstreamRefusal) write(w http.ResponseWriter) {
	if strings.HasPrefix(e.contentType, "application/json") && gjson.GetBytes(e.body, "error.message").Exists() {
		w.Header().Set("Content-Type", e.contentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(e.body)))
		w.WriteHeader(e.status)
		_, _ = w.Write(e.body)
		return
	}
	writeError(w, e.status, "upstream_error", "", "", "The upstream refused the request.")
}

// A socket's reader reads its messages in pieces of messagePiece bytes
// at most, up to socketFrames pieces ahead of the turn that takes them,
// while they come to readAhead bytes at most: a few smooth the relay, and
// an upstream that sends more than the turn takes (to a client that reads
// slowly), or sends while no turn holds the socket, waits, holding no more
// memory than these and one piece.
const (
	socketFrames = 4
	readAhead    = 1 << 20
	messagePiece = 64 << 10
)

// piece is a part of a socket's message: start tells that it is the
// message's first, end that it is its last.
type piece struct {
	data       []byte
	start, end bool
}

// frameQueue is a socket's messages read ahead, in pieces.
type frameQueue struct {
	c      chan piece // closed when the reader stops
	queued atomic.Int64
	taken  chan struct{} // a piece left c: the reader may read on
}

func newFrameQueue() *frameQueue {
	return &frameQueue{c: make(chan piece, socketFrames), taken: make(chan struct{}, 1)}
}

// took notes that p left the queue.
func (q *frameQueue) took(p piece) {
	q.queued.Add(-int64(len(p.data)))
	select {
	case q.taken <- struct{}{}:
	default:
	}
}

// read moves a socket's messages to q, in pieces, until the socket fails,
// reading the next only once the pieces in q come to readAhead bytes at
// most. A socket it can no longer read is closed, so that its descriptor
// goes at once, without waiting for the turn that finds it dead or for
// the idle timeout.
func read(ws *websocket.Conn, q *frameQueue) {
	defer close(q.c)
	defer func() { _ = ws.CloseNow() }()
	buf := make([]byte, messagePiece)
	for {
		_, r, err := ws.Reader(context.Background())
		if err != nil {
			return
		}
		for start, end := true, false; !end; start = false {
			for q.queued.Load() > readAhead {
				<-q.taken
			}
			n, err := io.ReadFull(r, buf)
			switch {
			case err == io.EOF || err == io.ErrUnexpectedEOF:
				end = true
			case err != nil:
				return
			}
			q.queued.Add(int64(n))
			q.c <- piece{data: bytes.Clone(buf[:n]), start: start, end: end}
		}
	}
}

// socketMessages reads a turn's messages from the pieces of its socket's
// queue.
type socketMessages struct {
	frames *frameQueue
	ctx    context.Context // the turn's time upstream
	eventHold
}

// piece returns the next piece.
func (m *socketMessages) piece() (piece, error) {
	select {
	case p, ok := <-m.frames.c:
		m.frames.took(p)
		if !ok {
			return piece{}, fmt.Errorf("the upstream socket closed mid-response: %w", io.ErrUnexpectedEOF)
		}
		return p, nil
	case <-m.ctx.Done():
		return piece{}, fmt.Errorf("waiting for the upstream socket: %w", m.ctx.Err())
	}
}

// next returns the next message as an event, and its head, its first
// passedHead bytes at most, which tell what it is. A message of one piece
// comes whole. A longer one is held in the reply's hold as it grows
// (eventHold); once the response has begun and when the room does not
// have it, it goes on through the reply's pass as it arrives, unread, as
// a Server-Sent Event (an event passed). Before the response has begun,
// a longer one whose head tells a type that cannot begin it (opening) is
// read and dropped: its event has that type and no data.
func (m *socketMessages) next(begun bool) (ev event, head []byte, err error) {
	m.release()
	p, err := m.piece()
	for err == nil && !p.start {
		p, err = m.piece() // the rest of a message the last turn left
	}
	if err != nil || p.end {
		return newEvent("", p.data), p.data, err
	}
	head = bytes.Clone(p.data[:min(len(p.data), passedHead)])
	if typ := eventType(head); typ != "" && !begun && !opening(typ) {
		for err == nil && !p.end {
			p, err = m.piece()
		}
		return event{typ: typ}, head, err
	}
	data := p.data
	for !p.end {
		if p, err = m.piece(); err != nil {
			return event{}, head, err
		}
		grown, ok := m.grow(data, p.data, begun)
		if !ok {
			return m.passOn(head, data, p)
		}
		data = grown
	}
	return newEvent("", data), head, nil
}

// opening tells whether an event of type typ may begin a response's
// events: its response.created, or an error refusing the request.
func opening(typ string) bool { return typ == "response.created" || typ == "error" }

// passOn sends a message that goes on unread through the reply's pass: its
// data read, then p and the rest of the message as they arrive, each line
// of it on a data line of its own (writeEvent).
func (m *socketMessages) passOn(head, data []byte, p piece) (event, []byte, error) {
	pass := writeFunc(m.rep.pass)
	ev := newEvent("", head)
	ev.passed, ev.data = true, nil
	if ev.typ != "" {
		_, _ = io.WriteString(pass, "event: "+ev.typ+"\n")
	}
	_, _ = io.WriteString(pass, "data: ")
	writeLines(pass, data)
	var last tail
	last.keep(data)
	m.release()
	for {
		writeLines(pass, p.data)
		last.keep(p.data)
		if p.end {
			_, _ = io.WriteString(pass, "\n\n")
			return ev.endingWith(head, last), head, nil
		}
		var err error
		if p, err = m.piece(); err != nil {
			return event{}, head, err
		}
	}
}

// drop closes the held socket, the slot opening a new one when next used;
// u.mu is held.
func (c *wsConn) drop() {
	if ws := c.s.detach(); ws != nil {
		_ = ws.CloseNow()
	}
}

func (c *wsConn) continues(res *store.Reservation) bool {
	if c.tg.forwarded {
		return true // the origin checked the socket when it took it
	}
	o := route.Offer{Continues: res.Continues(), Origin: res.Origin, Stores: c.tg.stores, Self: c.up.opts.Replica,
		Holds: res.Origin.ID == c.s.id && c.s.holds(res.PreviousResponseID, c.up.now(), c.up.opts.Lifetime)}
	return route.Decide(o).Here() // Local: this connection is the origin socket, and holds the response
}

func (c *wsConn) socket() store.Socket {
	if c.tg.stores {
		return store.Socket{Any: true}
	}
	return store.Socket{Replica: c.up.opts.Replica, ID: c.s.id}
}

func (c *wsConn) release() {
	c.up.mu.Lock()
	defer c.up.mu.Unlock()
	if !c.clean || c.errored {
		c.drop() // a response may still be arriving on it
	}
	c.s.busy, c.s.released = false, c.up.now()
	c.pool.used = c.s.released
	if c.s.ws == nil {
		c.up.remove(c.pool, c.s) // closed, or never opened: a refused handshake leaves nothing
	} else {
		c.up.idleFrom(c.pool, c.s)
	}
	close(c.up.changed)
	c.up.changed = make(chan struct{})
}

// send sends body as a response.create event and returns its events. The
// socket is read to the response's end, so that it can carry the next
// turn; but a client that goes away before the end has the socket closed:
// the response ends upstream, where nobody would read it, and its slot is
// free at once. (The socket would hold nothing to continue: the response
// left unread would be its latest.)
func (c *wsConn) send(ctx context.Context, body []byte, _ bool) (*reply, error) {
	if c.errored { // a new socket for the request sent again
		c.up.mu.Lock()
		c.drop()
		c.up.mu.Unlock()
		c.errored = false
		if err := c.ready(ctx); err != nil {
			return nil, err
		}
	}
	if !c.clean {
		return nil, errors.New("upstream socket still busy with the previous response")
	}
	msg, err := createEvent(body)
	if err != nil {
		return nil, err
	}
	frames := c.s.frames
	// The socket outlives the client's request; the turn's timeout bounds it.
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = c.up.now().Add(defaultUpstreamTimeout)
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	c.clean = false
	if err := c.s.ws.Write(rctx, websocket.MessageText, msg); err != nil {
		cancel()
		return nil, fmt.Errorf("sending to the upstream socket: %w", err)
	}
	abandon := context.AfterFunc(ctx, func() {
		if clientLeft(ctx) {
			c.up.mu.Lock()
			if !c.clean && c.s.frames == frames {
				c.drop()
			}
			c.up.mu.Unlock()
		}
	})
	// A response's events begin with its response.created; what comes
	// before, but an error (this request's refusal), was left over from
	// an earlier response on the socket, such as an event the upstream
	// sent after that one's end, or that response's events again: none of
	// it is this turn's.
	s := c.s
	rep := &reply{status: http.StatusOK, header: http.Header{}, socket: true}
	msgs := &socketMessages{frames: frames, ctx: rctx, eventHold: eventHold{rep: rep}}
	finished, started := false, false
	rep.next = func() (event, error) {
		if finished {
			msgs.release()
			return event{}, io.EOF
		}
		for {
			ev, head, err := msgs.next(started)
			if err != nil {
				return event{}, err
			}
			if ev.typ == "" {
				// Every message of the WebSocket mode is an event, typed: this
				// one was cut or garbled, and what the socket holds is unknown.
				return event{}, fmt.Errorf("the upstream socket sent a message that is not an event: %.64q", head)
			}
			if !started {
				switch {
				case ev.typ == "response.created":
					if id := gjson.GetBytes(ev.data, "response.id").String(); id == "" || id != s.begun {
						s.begun, started = id, true
					} else {
						continue
					}
				case ev.typ != "error":
					continue
				}
			}
			switch {
			case continues(ev.typ):
				seen := ev.data
				if ev.passed {
					seen = head
				}
				c.finish(gjson.GetBytes(seen, "response.id").String())
				finished = true
			case ev.typ == "response.failed":
				c.finish("") // a failed turn evicts what the socket held
				finished = true
			case ev.typ == "error":
				c.finish("")
				c.errored, finished = true, true
			}
			return ev, nil
		}
	}
	rep.done = func() { abandon(); cancel() }
	return rep, nil
}

// finish notes the end of the socket's response: latest is what the
// socket now holds.
func (c *wsConn) finish(latest string) {
	c.up.mu.Lock()
	c.s.latest, c.clean = latest, true
	c.up.mu.Unlock()
}

// createEvent turns a create-response body into a response.create event:
// stream and stream_options go, as every response streams on a socket.
func createEvent(body []byte) ([]byte, error) {
	msg, err := sjson.SetBytes(body, "type", "response.create")
	for _, k := range []string{"stream", "stream_options"} {
		if err == nil && gjson.GetBytes(msg, k).Exists() {
			msg, err = sjson.DeleteBytes(msg, k)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("building response.create: %w", err)
	}
	return msg, nil
}
