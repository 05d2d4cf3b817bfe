package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/store"
)

// refusedKey prefixes the keys whose handshake the rig's upstream
// refuses with 401.
const refusedKey = "Bearer sk-refused"

// poolCount is the number of credentials whose sockets u keeps.
func (u *wsUpstream) poolCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.pools)
}

// wsRig is a proxy over the WebSocket upstream in front of the fake
// upstream, which refuses the keys starting with refusedKey.
type wsRig struct {
	up  *wsUpstream
	url string // the proxy's /v1/responses
	// client sends the turns on a new connection each, so that idle
	// connections to the proxy do not count as what the proxy keeps.
	client *http.Client
}

func newWSRig(t *testing.T, opts WebSocketOptions) *wsRig {
	t.Helper()
	fake := fakeupstream.New(fakeupstream.Options{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("Authorization"), refusedKey) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
			return
		}
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(upstream.Close)
	up, url := proxyOverSockets(t, upstream, opts)
	return &wsRig{up: up, url: url, client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
}

// proxyOverSockets returns a proxy, replica r1 on the in-process store,
// over upstream in WebSocket mode with opts: its upstream and its
// /v1/responses.
func proxyOverSockets(t *testing.T, upstream *httptest.Server, opts WebSocketOptions) (*wsUpstream, string) {
	t.Helper()
	opts.Replica = "r1"
	up, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(upstream.URL, "http")+"/v1", opts)
	require.NoError(t, err)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	p, err := New(Config{Store: st, Upstream: up})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return up.(*wsUpstream), srv.URL + "/v1/responses"
}

// turn sends one turn with key as its credential and returns the status
// and body.
func (r *wsRig) turn(t *testing.T, key string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(`{"model":"m","store":false,"input":"hi"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", key)
	req.Header.Set("X-Session-Id", "s-"+key)
	resp, err := r.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// openFDs is the number of the process's open file descriptors, -1 where
// /proc does not tell.
func openFDs() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}

// baseline is the goroutines and file descriptors of the process.
type baseline struct{ goroutines, fds int }

func takeBaseline() baseline { return baseline{runtime.NumGoroutine(), openFDs()} }

// settled polls, for up to 8 seconds, until r keeps no credential and the
// process is back within a few goroutines and file descriptors of b.
func (r *wsRig) settled(t *testing.T, b baseline) {
	t.Helper()
	const slack = 8
	back := func() bool {
		return r.up.poolCount() == 0 && runtime.NumGoroutine() <= b.goroutines+slack &&
			(b.fds < 0 || openFDs() <= b.fds+slack)
	}
	start := time.Now()
	t.Logf("before settling: %d credentials kept, %+d goroutines, %+d file descriptors",
		r.up.poolCount(), runtime.NumGoroutine()-b.goroutines, openFDs()-b.fds)
	for !back() && time.Since(start) < 8*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("after %v: %d credentials kept, %+d goroutines, %+d file descriptors", time.Since(start).Round(time.Millisecond),
		r.up.poolCount(), runtime.NumGoroutine()-b.goroutines, openFDs()-b.fds)
	assert.Zero(t, r.up.poolCount(), "credentials kept")
	assert.LessOrEqual(t, runtime.NumGoroutine(), b.goroutines+slack, "goroutines (baseline %d)", b.goroutines)
	if b.fds >= 0 {
		assert.LessOrEqual(t, openFDs(), b.fds+slack, "file descriptors (baseline %d)", b.fds)
	}
}

// 200 credentials each run a turn, then go quiet: their sockets close
// after IdleTimeout, and their pools, goroutines and descriptors go.
func TestIdleUpstreamSocketsClose(t *testing.T) {
	const credentials = 200
	r := newWSRig(t, WebSocketOptions{IdleTimeout: 200 * time.Millisecond})
	base := takeBaseline()
	concurrently(credentials, 8, func(i int) {
		status, b := r.turn(t, fmt.Sprint("Bearer sk-", i))
		assert.Equal(t, http.StatusOK, status, "%s", b)
	})
	r.settled(t, base)
}

// An upstream that drops its sockets without a close frame (restarted,
// or a balancer in front of it) gives their descriptors back at once, not
// after IdleTimeout: a socket's reader closes the connection it can no
// longer read.
func TestADroppedUpstreamSocketIsClosed(t *testing.T) {
	if openFDs() < 0 {
		t.Skip("no /proc/self/fd to count descriptors")
	}
	upstream := httptest.NewUnstartedServer(fakeupstream.New(fakeupstream.Options{}))
	accepted := &acceptedConns{Listener: upstream.Listener}
	upstream.Listener = accepted
	upstream.Start()
	t.Cleanup(upstream.Close)
	up, url := proxyOverSockets(t, upstream, WebSocketOptions{IdleTimeout: time.Minute})
	r := &wsRig{up: up, url: url, client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	base := takeBaseline()
	const credentials = 20
	concurrently(credentials, 4, func(i int) {
		status, b := r.turn(t, fmt.Sprint("Bearer sk-", i))
		assert.Equal(t, http.StatusOK, status, "%s", b)
	})
	require.GreaterOrEqual(t, openFDs(), base.fds+2*credentials, "each socket's two ends")
	accepted.closeAll()
	require.Eventually(t, func() bool { return openFDs() <= base.fds+8 }, 5*time.Second, 20*time.Millisecond,
		"descriptors: %d, %d before the sockets opened", openFDs(), base.fds)
}

// acceptedConns is a listener that can close every connection it
// accepted.
type acceptedConns struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *acceptedConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *acceptedConns) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}

// A credential the upstream refuses leaves nothing behind, and the client
// gets the upstream's own answer to the handshake: 401 invalid_api_key.
func TestRefusedCredentialsLeaveNoPool(t *testing.T) {
	r := newWSRig(t, WebSocketOptions{})
	base := takeBaseline()
	for i := range 50 {
		status, b := r.turn(t, fmt.Sprint(refusedKey, "-", i))
		require.Equal(t, http.StatusUnauthorized, status, "%s", b)
		require.Equal(t, "invalid_api_key", gjson.GetBytes(b, "error.code").String(), "the upstream's answer: %s", b)
		require.Zero(t, r.up.poolCount(), "credentials kept after %d refusals", i+1)
	}
	r.settled(t, base)
}

// With room for 4 credentials, 10 used one after another each get their
// turn, and at most 4 are kept.
func TestCredentialsAreCapped(t *testing.T) {
	r := newWSRig(t, WebSocketOptions{MaxCredentials: 4})
	for round := range 2 {
		for i := range 10 {
			status, b := r.turn(t, fmt.Sprint("Bearer sk-", i))
			require.Equal(t, http.StatusOK, status, "round %d, credential %d: %s", round, i, b)
			require.LessOrEqual(t, r.up.poolCount(), 4, "round %d, credential %d", round, i)
		}
	}
}

// When every credential kept has a turn in flight, a new credential waits
// for one to finish: its turn fails when its context ends first, and goes
// on when one finishes.
func TestANewCredentialWaitsWhileEveryCredentialIsBusy(t *testing.T) {
	r := newWSRig(t, WebSocketOptions{MaxCredentials: 1})
	tg := func(key string) *target { return &target{header: http.Header{"Authorization": {key}}} }
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	a, err := r.up.acquire(ctx, tg("Bearer sk-a"))
	require.NoError(t, err)
	short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = r.up.acquire(short, tg("Bearer sk-b"))
	stop()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "room for another upstream credential")

	got := make(chan error, 1)
	go func() {
		b, err := r.up.acquire(ctx, tg("Bearer sk-b"))
		if err == nil {
			b.release()
		}
		got <- err
	}()
	a.release()
	require.NoError(t, <-got)
	assert.Equal(t, 1, r.up.poolCount())
}

// The sockets open at once, of every credential, stay within MaxSockets:
// a credential past it takes the room of another's idle socket, and waits
// while every other socket is busy.
func TestSocketsOfEveryCredentialAreCapped(t *testing.T) {
	r := newWSRig(t, WebSocketOptions{MaxSockets: 3})
	open := func() int {
		r.up.mu.Lock()
		defer r.up.mu.Unlock()
		n := 0
		for _, p := range r.up.pools {
			for _, s := range p.sockets {
				if s.ws != nil {
					n++
				}
			}
		}
		return n
	}
	for i := range 10 {
		status, b := r.turn(t, fmt.Sprint("Bearer sk-", i))
		require.Equal(t, http.StatusOK, status, "credential %d: %s", i, b)
		require.LessOrEqual(t, open(), 3, "credential %d", i)
	}

	tg := func(key string) *target { return &target{header: http.Header{"Authorization": {key}}} }
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var held []conn
	for i := range 3 {
		c, err := r.up.acquire(ctx, tg(fmt.Sprint("Bearer sk-busy-", i)))
		require.NoError(t, err)
		held = append(held, c)
	}
	short, stop := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := r.up.acquire(short, tg("Bearer sk-late"))
	stop()
	require.ErrorIs(t, err, context.DeadlineExceeded, "every socket is busy")
	held[0].release()
	c, err := r.up.acquire(ctx, tg("Bearer sk-late"))
	require.NoError(t, err)
	c.release()
	for _, c := range held[1:] {
		c.release()
	}
	assert.LessOrEqual(t, open(), 3)
}

func TestWebSocketOptionsAreChecked(t *testing.T) {
	for _, o := range []WebSocketOptions{{Replica: "r", IdleTimeout: -1}, {Replica: "r", MaxCredentials: -1}, {Replica: "r", MaxSockets: -1}} {
		_, err := NewWebSocketUpstream("ws://x/v1", o)
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", o)
	}
	up, err := NewWebSocketUpstream("ws://x/v1", WebSocketOptions{Replica: "r"})
	require.NoError(t, err)
	opts := up.(*wsUpstream).opts
	assert.Equal(t, 5*time.Minute, opts.IdleTimeout)
	assert.Equal(t, 1024, opts.MaxCredentials)
}

// A socket's handshake carries the client's credential, Authorization or
// api-key, the other headers named like a credential (a cookie, an
// authenticating proxy's user) and its query, as an HTTP turn does, and
// sockets are kept per credential; a credential the operator configures,
// either header, replaces the clients'.
func TestSocketsAreKeptPerCredential(t *testing.T) {
	up, err := NewWebSocketUpstream("ws://x/v1?api-version=1", WebSocketOptions{Replica: "r"})
	require.NoError(t, err)
	ws := up.(*wsUpstream)
	handshake := func(h http.Header, query string) (http.Header, [32]byte) {
		hs, k := ws.credential(h, query)
		return hs.header, k
	}
	h1, k1 := handshake(http.Header{"Api-Key": {"sk-1"}}, "")
	h2, k2 := handshake(http.Header{"Api-Key": {"sk-2"}}, "")
	hb, kb := handshake(http.Header{"Authorization": {"Bearer sk-1"}}, "")
	assert.Equal(t, "sk-1", h1.Get("Api-Key"), "the handshake carries the api-key")
	assert.Equal(t, "sk-2", h2.Get("Api-Key"))
	assert.Equal(t, "Bearer sk-1", hb.Get("Authorization"))
	assert.NotEqual(t, k1, k2, "two api-keys, two pools")
	assert.NotEqual(t, k1, kb)
	hx, kx := handshake(http.Header{"X-Api-Key": {"sk-1"}}, "")
	assert.Equal(t, "sk-1", hx.Get("X-Api-Key"))
	assert.NotEqual(t, k1, kx)
	he, _ := handshake(http.Header{"Api-Key": {"sk-1"}, "Authorization": {""}, "X-Forwarded-User": {""}}, "")
	assert.Equal(t, http.Header{"Api-Key": {"sk-1"}}, he, "no header that holds nothing")
	hm, km := handshake(http.Header{"Api-Key": {"sk-1", "sk-2"}}, "")
	assert.Equal(t, []string{"sk-1", "sk-2"}, hm.Values("Api-Key"), "every value")
	assert.NotEqual(t, k1, km)
	keys := map[[32]byte]bool{k1: true}
	for _, h := range []http.Header{
		{"Api-Key": {"sk-1"}, "Cookie": {"session=a; AWSALB=x"}},
		{"Api-Key": {"sk-1"}, "Cookie": {"session=b"}},
		{"Api-Key": {"sk-1"}, "X-Forwarded-User": {"bob"}},
	} {
		got, k := handshake(h, "")
		for name := range h {
			assert.NotEmpty(t, got.Get(name), "the handshake carries %s", name)
		}
		assert.False(t, keys[k], "%v: a pool of its own", h)
		keys[k] = true
	}
	hc, _ := handshake(http.Header{"Cookie": {"session=a; AWSALB=x"}}, "")
	assert.Equal(t, "session=a", hc.Get("Cookie"), "not the load balancer's cookies")
	hs, kq := ws.credential(http.Header{"Api-Key": {"sk-1"}}, "key=q")
	assert.Equal(t, "ws://x/v1/responses?api-version=1&key=q", hs.url, "the client's query beside the upstream's")
	assert.False(t, keys[kq], "a query of its own, a pool of its own")

	for _, configured := range []http.Header{{"Api-Key": {"sk-op"}}, {"Authorization": {"Bearer sk-op"}}, {"X-Api-Key": {"sk-op"}}} {
		up, err := NewWebSocketUpstream("ws://x/v1", WebSocketOptions{Replica: "r", Header: configured})
		require.NoError(t, err)
		ws := up.(*wsUpstream)
		hs, k := ws.credential(http.Header{"Api-Key": {"sk-1"}, "Authorization": {"Bearer sk-1"}, "Cookie": {"s=1"}}, "key=q")
		assert.Equal(t, configured, hs.header, "the operator's credential, not the client's")
		_, k2 := ws.credential(http.Header{"Api-Key": {"sk-2"}}, "")
		assert.Equal(t, k, k2, "one pool")
		assert.Equal(t, configured, ws.passthroughTarget().credential)
	}
}

// What an upstream socket sends after a response's end, or that
// response's events again, is not the next turn's: the next turn's events
// begin with its own response.created, or its refusal. Here each request
// first gets what came after the last response (a rate_limits.updated,
// and that response again), as an upstream that sent them late would
// have them arrive; the continuation is then refused, and the full
// context sent again is answered.
func TestEventsLeftOverOnASocketAreNotTheNextTurns(t *testing.T) {
	var refusals, answers atomic.Int64
	response := func(id, status string) string {
		return `{"id":"` + id + `","object":"response","status":"` + status + `","output":[` +
			`{"type":"message","id":"msg_` + id + `","role":"assistant","status":"completed","content":[{"type":"output_text","text":"` + id + `"}]}]}`
	}
	var last sync.Map // each socket's last response
	upstream := scriptedSockets(t, func(socket, n int, msg []byte, send func(string)) {
		if v, ok := last.Load(socket); ok {
			id := v.(string)
			send(`{"type":"rate_limits.updated","rate_limits":[]}`)
			send(`{"type":"response.created","response":` + response(id, "in_progress") + `}`)
			send(`{"type":"response.completed","response":` + response(id, "completed") + `}`)
		}
		if gjson.GetBytes(msg, "previous_response_id").String() != "" {
			refusals.Add(1)
			send(`{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"previous_response_not_found",` +
				`"message":"Previous response not found.","param":"previous_response_id"}}`)
			return
		}
		answers.Add(1)
		id := fmt.Sprintf("resp_%d_%d", socket, n)
		last.Store(socket, id)
		send(`{"type":"response.created","response":` + response(id, "in_progress") + `}`)
		send(`{"type":"response.completed","response":` + response(id, "completed") + `}`)
	})
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overWebSocket, st, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	h := http.Header{"X-Session-Id": {"s1"}}
	first := post(t, srv.URL+"/v1/responses", h, map[string]any{"model": "m", "input": "hi", "store": false})
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	second := post(t, srv.URL+"/v1/responses", h, map[string]any{"model": "m", "store": false,
		"input": first.next([]any{map[string]any{"role": "user", "content": "hi"}}, "again")})
	require.Equal(t, http.StatusOK, second.status, "%s", second.body)
	assert.Equal(t, int64(1), refusals.Load(), "the continuation was sent, and refused")
	assert.Equal(t, int64(2), answers.Load(), "then sent again whole")
	assert.NotEqual(t, string(first.response["id"]), string(second.response["id"]), "the second turn got an answer of its own")
}

// An error event an upstream socket sends late, after a response ended,
// is taken for the next request's answer (nothing tells them apart), but
// the socket then carries no other request: the request's own answer,
// which the upstream sends after it, reaches no other turn. Each turn
// after that one gets its own answer.
func TestALateErrorOnASocketReachesNoOtherTurn(t *testing.T) {
	upstream := scriptedSockets(t, func(socket, n int, msg []byte, send func(string)) {
		if n > 1 { // the last response's late error
			send(`{"type":"error","error":{"type":"server_error","code":"server_error","message":"Late."}}`)
		}
		said := gjson.GetBytes(msg, "input.0.content").String() // the string input, as the message it stands for
		id := fmt.Sprintf("resp_%d_%d", socket, n)
		resp := `{"id":"` + id + `","object":"response","status":"%s","output":[{"type":"message","id":"msg_` + id +
			`","role":"assistant","status":"completed","content":[{"type":"output_text","text":` + strconv.Quote(said) + `}]}]}`
		send(`{"type":"response.created","response":` + fmt.Sprintf(resp, "in_progress") + `}`)
		send(`{"type":"response.completed","response":` + fmt.Sprintf(resp, "completed") + `}`)
	})
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	answers := map[string]int{}
	for i := range 6 {
		said := fmt.Sprint("conversation ", i)
		a := post(t, url, http.Header{"X-Session-Id": {said}}, map[string]any{"model": "m", "input": said, "store": false})
		if a.status != http.StatusOK {
			answers["error"]++
			continue
		}
		require.Len(t, a.output, 1, "%s", a.body)
		got := gjson.GetBytes(a.output[0], "content.0.text").String()
		require.Equal(t, said, got, "turn %d got another's answer", i)
		answers["own"]++
	}
	t.Logf("answers: %v", answers)
	assert.LessOrEqual(t, answers["error"], 3, "a late error reaches one turn in two at most")
}

// scriptedSockets is an upstream in WebSocket mode that answers the n-th
// message (from 1) of its socket-th connection (from 1) with what answer
// sends, called on the connection's goroutine.
func scriptedSockets(t *testing.T, answer func(socket, n int, msg []byte, send func(string))) *httptest.Server {
	var sockets atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		socket := int(sockets.Add(1))
		send := func(s string) {
			// In frames, so that a large message is not copied whole.
			w, err := ws.Writer(ctx, websocket.MessageText)
			if err != nil {
				return
			}
			for ; len(s) > 32<<10; s = s[32<<10:] {
				if _, err := io.WriteString(w, s[:32<<10]); err != nil {
					return
				}
			}
			_, _ = io.WriteString(w, s)
			_ = w.Close()
		}
		for n := 1; ; n++ {
			_, msg, err := ws.Read(ctx)
			if err != nil {
				return
			}
			answer(socket, n, msg, send)
		}
	}))
	t.Cleanup(upstream.Close)
	return upstream
}

// A response the upstream keeps for its socket alone (store false) is
// continued by no other client that names it: a turn carrying its own
// previous_response_id goes on no socket holding that response (here the
// only one, opened again), and gets the upstream's not-found, as it would
// on a connection of its own.
func TestAClientsOwnPreviousResponseGoesOnNoSocketHoldingIt(t *testing.T) {
	upstream := httptest.NewServer(fakeupstream.New(fakeupstream.Options{}))
	t.Cleanup(upstream.Close)
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	h := http.Header{"Authorization": {"Bearer k"}, "X-Session-Id": {"a"}}
	a := post(t, url, h, map[string]any{"model": "m", "store": false, "input": []any{map[string]any{"role": "user", "content": "mine"}}})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	id := gjson.GetBytes(a.body, "id").String()
	for _, stores := range []any{false, true, nil} {
		body := map[string]any{"model": "m", "previous_response_id": id, "input": []any{map[string]any{"role": "user", "content": "theirs?"}}}
		if stores != nil {
			body["store"] = stores
		}
		b := post(t, url, http.Header{"Authorization": {"Bearer k"}, "X-Session-Id": {"b"}}, body)
		assert.Equal(t, http.StatusBadRequest, b.status, "store %v: %s", stores, b.body)
		assert.Equal(t, notFoundCode, gjson.GetBytes(b.body, "error.code").String(), "store %v", stores)
	}
}

// A flat error event on a socket (the type of the event, "error", beside
// its code and message) answers a client that asked for JSON with the
// API's error: its code and message, and the error type the API gives
// one without, not the event's.
func TestAFlatErrorEventIsAnAPIError(t *testing.T) {
	upstream := scriptedSockets(t, func(_, _ int, _ []byte, send func(string)) {
		send(`{"type":"error","code":"server_error","message":"Boom.","param":null,"sequence_number":0}`)
	})
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	a := post(t, url, nil, map[string]any{"model": "m", "input": "hi", "store": false})
	require.Equal(t, http.StatusInternalServerError, a.status, "%s", a.body)
	e := gjson.GetBytes(a.body, "error")
	assert.Equal(t, "server_error", e.Get("type").String(), "%s", a.body)
	assert.Equal(t, "server_error", e.Get("code").String())
	assert.Equal(t, "Boom.", e.Get("message").String())
}

// A socket's error event carrying a status is answered as the HTTP API
// answers that error, with the headers the event carries (as Codex reads
// them): Retry-After, the rate limits, the request id.
func TestASocketsErrorEventKeepsItsHeaders(t *testing.T) {
	upstream := scriptedSockets(t, func(_, _ int, _ []byte, send func(string)) {
		send(`{"type":"error","status":429,"error":{"type":"requests","code":"rate_limit_exceeded","message":"Slow down."},` +
			`"headers":{"retry-after":"7","x-ratelimit-reset-requests":"7s","x-request-id":"req_ws429","content-type":"text/plain",` +
			`"bad name":"x","x-split":"a\r\nx-injected: 1","x-many":["1","2"],"x-number":3}}`)
	})
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	for _, stream := range []bool{false, true} {
		resp, err := http.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"model":"m","input":"hi","store":false,"stream":%v}`, stream)))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
		assert.Equal(t, "rate_limit_exceeded", gjson.GetBytes(body, "error.code").String(), "%s", body)
		assert.Equal(t, "7", resp.Header.Get("Retry-After"), "stream %v", stream)
		assert.Equal(t, "7s", resp.Header.Get("X-Ratelimit-Reset-Requests"))
		assert.Equal(t, "req_ws429", resp.Header.Get("X-Request-Id"))
		assert.Equal(t, []string{"1", "2"}, resp.Header.Values("X-Many"))
		assert.Equal(t, "3", resp.Header.Get("X-Number"))
		assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"), "the answer's own content type")
		assert.Empty(t, resp.Header.Get("X-Split"), "a value that would split the header is not sent")
		assert.Empty(t, resp.Header.Get("X-Injected"))
	}
}

// A socket message that is not an event (a completion cut before its
// type, garbled) breaks the turn off at once: the client's stream is cut,
// not left waiting for an end that will not come, and the socket, whose
// state is unknown, is not used again.
func TestASocketMessageThatIsNotAnEventBreaksTheTurnOff(t *testing.T) {
	for name, bad := range map[string]string{
		"cut before its type": `{"response":{"id":"%s","object":"response","status":"completed","output":[]`,
		"a type not a string": `{"type":5,"response":{"id":"%s","object":"response","status":"completed","output":[]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			var sockets atomic.Int64
			upstream := scriptedSockets(t, func(socket, n int, _ []byte, send func(string)) {
				sockets.Store(int64(socket))
				id := fmt.Sprintf("resp_%d_%d", socket, n)
				send(`{"type":"response.created","response":{"id":"` + id + `","object":"response","status":"in_progress","output":[]}}`)
				if socket == 1 && n == 1 {
					send(fmt.Sprintf(bad, id))
					return
				}
				send(`{"type":"response.completed","response":{"id":"` + id + `","object":"response","status":"completed","output":[]}}`)
			})
			_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","input":"hi","store":false,"stream":true}`))
			require.NoError(t, err)
			req.Header.Set("X-Session-Id", "s1")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.Error(t, err, "the stream is cut")
			require.NoError(t, ctx.Err(), "at once, not when the client gives up")

			a := post(t, url, http.Header{"X-Session-Id": {"s1"}}, map[string]any{"model": "m", "store": false,
				"input": []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "user", "content": "next"}}})
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			assert.Equal(t, int64(2), sockets.Load(), "the next turn went on a new socket")
		})
	}
}

// A client that goes away mid-response has its upstream socket closed: the
// response ends upstream, where nobody would read it, and the
// credential's socket is free for its next turn at once.
func TestAClientThatGoesAwayMidResponseClosesItsSocket(t *testing.T) {
	closed := make(chan struct{})
	var sockets atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx, socket := t.Context(), sockets.Add(1) // ends with the test, which leaves nothing waiting
		for n := 1; ; n++ {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
			id := fmt.Sprintf("resp_%d_%d", socket, n)
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.created","response":{"id":"`+id+`","object":"response","status":"in_progress","output":[]}}`))
			if socket == 1 { // a long response, the client leaving
				if _, _, err := ws.Read(ctx); err != nil && ctx.Err() == nil {
					close(closed)
				}
				return
			}
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.completed","response":{"id":"`+id+`","object":"response","status":"completed","output":[]}}`))
		}
	}))
	t.Cleanup(upstream.Close)
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","input":"hi","store":false,"stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "response.created")
	cancel() // the client goes
	_ = resp.Body.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream socket stayed open with nobody to read its response")
	}
	start := time.Now()
	a := post(t, url, nil, map[string]any{"model": "m", "store": false, "input": "next"})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Less(t, time.Since(start), 5*time.Second, "the credential's only socket was free")
	assert.Equal(t, int64(2), sockets.Load())
}

// A socket reads ahead of the turn that takes its messages no more than
// readAhead bytes and a message: an upstream that sends large events to a
// client that does not read them waits, and they do not pile up here.
func TestASocketReadsAheadABoundedAmount(t *testing.T) {
	const event = 2 << 20
	upstream := scriptedSockets(t, func(socket, n int, _ []byte, send func(string)) {
		id := fmt.Sprintf("resp_%d_%d", socket, n)
		send(`{"type":"response.created","response":{"id":"` + id + `","object":"response","status":"in_progress","output":[]}}`)
		delta := `{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"` + strings.Repeat("x", event) + `"}`
		for range 12 {
			send(delta)
		}
		send(`{"type":"response.completed","response":{"id":"` + id + `","object":"response","status":"completed","output":[]}}`)
	})
	up, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://")[:strings.Index(strings.TrimPrefix(url, "http://"), "/")])
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"model":"m","input":"hi","stream":true}`
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err) // and reads nothing
	queued := func() int64 {
		up.mu.Lock()
		defer up.mu.Unlock()
		n := int64(0)
		for _, p := range up.pools {
			for _, s := range p.sockets {
				if s.frames != nil {
					n += s.frames.queued.Load()
				}
			}
		}
		return n
	}
	most := int64(0)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		most = max(most, queued())
	}
	assert.Positive(t, most, "the socket read ahead")
	assert.LessOrEqual(t, most, int64(readAhead+messagePiece), "no more than readAhead and a piece")
}

// A socket's message is held in the budget as it is read, within it:
// beside the budget, the turns of clients that read nothing hold their
// sockets' read-ahead alone (TestASocketReadsAheadABoundedAmount),
// whatever the size of the messages.
func TestAnUpstreamSocketsMessagesAreHeldInTheBudget(t *testing.T) {
	message := `{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"` + strings.Repeat("x", bigAnswer) + `"}`
	upstream := scriptedSockets(t, func(socket, n int, _ []byte, send func(string)) {
		id := fmt.Sprintf("resp_%d_%d", socket, n)
		send(`{"type":"response.created","response":{"id":"` + id + `","object":"response","status":"in_progress","output":[]}}`)
		for range 3 {
			send(message)
		}
		send(`{"type":"response.completed","response":{"id":"` + id + `","object":"response","status":"completed","output":[]}}`)
	})
	up, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(upstream.URL, "http")+"/v1", WebSocketOptions{Replica: "r1", Sockets: 4})
	require.NoError(t, err)
	p, srv, _ := bigAnswerProxyOver(t, up)
	most := watchBudget(p)
	postUnread(t, srv.URL, 4)
	require.Eventually(t, func() bool {
		cur, size := budgetHeld(p)
		return cur >= size/2
	}, 10*time.Second, time.Millisecond, "the answers not read hold the budget")
	time.Sleep(500 * time.Millisecond)
	assert.LessOrEqual(t, most(), int64(2*bigAnswer), "the budget is never exceeded")
}

// A response.created too long for a piece, whose type comes last (an
// upstream that writes members in the order of their names), begins the
// turn.
func TestALongResponseCreatedWithItsTypeLastBeginsTheTurn(t *testing.T) {
	instructions := strings.Repeat("y", 100<<10)
	upstream := scriptedSockets(t, func(socket, n int, _ []byte, send func(string)) {
		resp := `{"id":"resp_` + fmt.Sprint(socket, "_", n) + `","instructions":"` + instructions + `","object":"response","output":[],"status":"%s"}`
		send(`{"response":` + fmt.Sprintf(resp, "in_progress") + `,"sequence_number":0,"type":"response.created"}`)
		send(`{"response":` + fmt.Sprintf(resp, "completed") + `,"sequence_number":1,"type":"response.completed"}`)
	})
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 1})
	a := post(t, url, http.Header{"X-Session-Id": {"s"}}, map[string]any{"model": "m", "input": "hi", "store": false})
	assert.Equal(t, http.StatusOK, a.status, "%.300s", a.body)
}

// A socket's message that the budget has no room for goes on as a
// Server-Sent Event as its pieces come, each line of it on a data line;
// one that fits comes whole; a piece left over from an earlier message
// is passed over.
func TestASocketsMessageGoesOnInPieces(t *testing.T) {
	big := "{\"type\":\"response.output_item.done\",\r\n\"item\":\"" + strings.Repeat("x", 3*messagePiece) + "\",\n\"n\":1}"
	small := `{"type":"response.output_text.delta","delta":"hi"}`
	q := newFrameQueue()
	q.c = make(chan piece, 16)
	q.c <- piece{data: []byte(`"rest of an earlier one"}`), end: true}
	for rest, start := big, true; rest != ""; start = false {
		n := min(len(rest), messagePiece)
		q.c <- piece{data: []byte(rest[:n]), start: start, end: n == len(rest)}
		rest = rest[n:]
	}
	q.c <- piece{data: []byte(small), start: true, end: true}
	last := `{"response":{"output":[{"type":"message","text":"` + strings.Repeat("x", 2*messagePiece) + `"}]},"type":"response.completed"}`
	q.c <- piece{data: []byte(last[:messagePiece]), start: true}
	q.c <- piece{data: []byte(last[messagePiece:]), end: true}
	rep := &reply{held: &hold{b: newBudget(messagePiece)}}
	var passed bytes.Buffer
	rep.pass = func(b []byte) { passed.Write(b) }
	m := &socketMessages{frames: q, ctx: t.Context(), eventHold: eventHold{rep: rep}}

	ev, head, err := m.next(true)
	require.NoError(t, err)
	assert.True(t, ev.passed)
	assert.Equal(t, "response.output_item.done", ev.typ)
	assert.Equal(t, big[:passedHead], string(head))
	sent, ok := parseEvent(bytes.TrimSuffix(passed.Bytes(), []byte("\n\n")))
	require.True(t, ok)
	assert.Equal(t, "response.output_item.done", sent.name)
	assert.Equal(t, strings.NewReplacer("\r\n", "\n").Replace(big), string(sent.data))

	ev, _, err = m.next(true)
	require.NoError(t, err)
	assert.False(t, ev.passed)
	assert.Equal(t, small, string(ev.data))

	ev, _, err = m.next(true)
	require.NoError(t, err)
	assert.True(t, ev.passed)
	assert.Equal(t, "response.completed", ev.typ, "the type its end tells")
}

// The WebSocket mode has no background responses: a background turn goes
// over HTTP, as sent, whatever the transport of the other turns.
func TestABackgroundTurnGoesOverHTTPOnTheWebSocketTransport(t *testing.T) {
	var over sync.Map // transport → calls
	fake := fakeupstream.New(fakeupstream.Options{Fault: func(req fakeupstream.Request) fakeupstream.Fault {
		n, _ := over.LoadOrStore(req.Transport, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return fakeupstream.Fault{}
	}})
	up := httptest.NewServer(fake)
	t.Cleanup(up.Close)
	p := newProxy(t, overWebSocket, nil, up.URL+"/v1")
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	calls := func(transport string) int32 {
		n, ok := over.Load(transport)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	a := post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s"}},
		map[string]any{"model": "m", "input": "hi", "background": true})
	assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Equal(t, int32(1), calls(fakeupstream.TransportHTTP))
	assert.Zero(t, calls(fakeupstream.TransportWebSocket))
	a = post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s"}}, map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Equal(t, int32(1), calls(fakeupstream.TransportWebSocket), "the other turns go on the sockets")
}

// Closing the proxy closes its upstream sockets at once, and does not
// wait past a second for an upstream that leaves their close frames
// unanswered (a socket's close alone waits up to five seconds).
func TestClosingTheWebSocketUpstreamWaitsOnNoSocketLong(t *testing.T) {
	stop := make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(stop) }) }
	t.Cleanup(let)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		if _, _, err := ws.Read(r.Context()); err != nil {
			return
		}
		id := fmt.Sprintf("resp_%d", time.Now().UnixNano())
		ctx := context.Background()
		_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.created","response":{"id":"`+id+`","object":"response","status":"in_progress","output":[]}}`))
		<-stop // the turns overlap: a socket each
		_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.completed","response":{"id":"`+id+`","object":"response","status":"completed","output":[]}}`))
		<-r.Context().Done() // and reads nothing more: the close frame goes unanswered
	}))
	t.Cleanup(upstream.Close)
	ws, url := proxyOverSockets(t, upstream, WebSocketOptions{Sockets: 4})

	const turns = 3
	var wg sync.WaitGroup
	for i := range turns {
		wg.Go(func() {
			_, _, _, _ = postBytes(t.Context(), url, "", fmt.Appendf(nil, `{"model":"m","stream":true,"input":"hi %d"}`, i))
		})
	}
	require.Eventually(t, func() bool {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		return ws.slots == turns
	}, time.Minute, 10*time.Millisecond, "a socket for each turn")
	let()
	wg.Wait()
	start := time.Now()
	require.NoError(t, ws.close())
	assert.Less(t, time.Since(start), 3*time.Second, "closing %d sockets", turns)
}

// A client that asked for JSON over the WebSocket transport, whose
// response's terminal event came garbled, gets 502 upstream_disconnected,
// not a 200 with nothing in it.
func TestAGarbledTerminalEventIsNotAnEmptyAnswer(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			if _, _, err := ws.Read(r.Context()); err != nil {
				return
			}
			ctx := r.Context()
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.created","response":{"id":"resp_g","object":"response","status":"in_progress","output":[]}}`))
			_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.completed","response":{"id":"resp_g","object":"response","status":"compl`))
		}
	}))
	t.Cleanup(upstream.Close)
	_, url := proxyOverSockets(t, upstream, WebSocketOptions{})
	a := post(t, url, nil, map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusBadGateway, a.status, "%s", a.body)
	assert.Equal(t, "upstream_disconnected", gjson.GetBytes(a.body, "error.code").String(), "%s", a.body)
}
