package proxy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/storehooks"
	"github.com/contstore/contstore/store"
)

// testSecret is the replicas' shared forwarding secret.
var testSecret = []byte(strings.Repeat("s", 32))

// replicaSet is several proxies sharing one store and one directory over
// the WebSocket upstream, and a round-robin balancer in front of them.
type replicaSet struct {
	proxies []*Proxy
	servers []*httptest.Server
	dir     *directory.Directory
	url     string // the balancer's /v1/responses
}

func newReplicaSet(t testing.TB, n int) *replicaSet {
	t.Helper()
	return newReplicaSetWith(t, n, fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}}, 0)
}

// newReplicaSetWith is newReplicaSet in front of a fake upstream with opts,
// forwarding with timeout (0: the default).
func newReplicaSetWith(t testing.TB, n int, opts fakeupstream.Options, timeout time.Duration) *replicaSet {
	t.Helper()
	up := httptest.NewServer(fakeupstream.New(opts))
	t.Cleanup(up.Close)
	base, err := store.NewMemory(store.Options{Replica: "r0"})
	require.NoError(t, err)
	dir, err := directory.NewMemory(directory.Options{CacheTTL: time.Nanosecond})
	require.NoError(t, err)
	rs := &replicaSet{dir: dir}
	for i := range n {
		st := storehooks.WithReplica(base, "r"+string(rune('1'+i)))
		ws, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1",
			WebSocketOptions{Replica: st.Options().Replica, Sockets: 2})
		require.NoError(t, err)
		p, err := New(Config{Store: st, Upstream: ws, Forwarding: &Forwarding{Directory: dir, Secret: testSecret, Timeout: timeout}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		require.NoError(t, dir.Announce(context.Background(), st.Options().Replica, strings.TrimPrefix(srv.URL, "http://")))
		rs.proxies, rs.servers = append(rs.proxies, p), append(rs.servers, srv)
	}
	next := 0
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := rs.proxies[next%n]
		next++
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(lb.Close)
	rs.url = lb.URL + "/v1/responses"
	return rs
}

// total sums the replicas' stats.
func (rs *replicaSet) total() Stats {
	var s Stats
	for _, p := range rs.proxies {
		st := p.Stats()
		s.Turns += st.Turns
		s.Continued += st.Continued
		s.Forwarded += st.Forwarded
		s.ForwardFailures += st.ForwardFailures
		s.ForwardedIn += st.ForwardedIn
		s.FullContextRetries += st.FullContextRetries
	}
	return s
}

func TestRoundRobinTurnsAreForwardedToTheirSocket(t *testing.T) {
	rs := newReplicaSet(t, 3)
	for _, stream := range []bool{true, false} {
		c := newConversation(t, rs.url, "s-"+map[bool]string{true: "stream", false: "json"}[stream], stream, false)
		c.say("hello")
		c.say("again")
	}
	// A client's query goes with the forward, as its socket's handshake
	// carried it.
	q := newConversation(t, rs.url+"?api-version=1", "s-query", true, false)
	q.say("hello")
	q.say("again")
	s := rs.total()
	assert.Equal(t, s.Turns-3, s.Continued, "every later turn continues, wherever it lands")
	assert.Positive(t, s.Forwarded)
	assert.Equal(t, s.Forwarded, s.ForwardedIn-s.ForwardFailures)
	assert.Zero(t, s.ForwardFailures)
	assert.Zero(t, s.FullContextRetries)
}

func TestAnswersNameTheReplicaHoldingTheSocket(t *testing.T) {
	rs := newReplicaSet(t, 2)
	body := `{"model":"m","store":false,"input":"hi"}`
	req, _ := http.NewRequest(http.MethodPost, rs.servers[1].URL+"/v1/responses", strings.NewReader(body))
	req.Header.Set("X-Session-Id", "s1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "r2", resp.Header.Get("Contproxy-Replica"))

	// The next turn lands on r1, which forwards it to r2: its answer still
	// names r2, by name.
	c := newConversation(t, rs.servers[1].URL+"/v1/responses", "s2", true, false)
	c.say("hello")
	next := map[string]any{"input": append(c.history, map[string]any{"role": "user", "content": "again"})}
	for k, v := range c.params {
		next[k] = v
	}
	b, err := json.Marshal(next)
	require.NoError(t, err)
	req, _ = http.NewRequest(http.MethodPost, rs.servers[0].URL+"/v1/responses", bytes.NewReader(b))
	req.Header.Set("X-Session-Id", "s2")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, int64(1), rs.proxies[0].Stats().Forwarded)
	assert.Equal(t, []string{"r2"}, resp.Header.Values("Contproxy-Replica"))
	assert.Empty(t, resp.Header.Values(originHeader))
}

func TestForgedForwardsAreRefused(t *testing.T) {
	rs := newReplicaSet(t, 1)
	f := rs.proxies[0].cfg.Forwarding
	body := []byte(`{"model":"m","store":false,"input":"hi"}`)
	for name, value := range map[string]string{
		"no signature":  "t=1, by=1, socket=1, prev=resp_1",
		"wrong secret":  (&Forwarding{Secret: []byte(strings.Repeat("x", 32))}).header(time.Now(), soon(), 1, "resp_1", body),
		"stale":         f.header(time.Now().Add(-time.Hour), soon(), 1, "resp_1", body),
		"other body":    f.header(time.Now(), soon(), 1, "resp_1", []byte(`{}`)),
		"garbage":       "hello",
		"extra members": f.header(time.Now(), soon(), 1, "resp_1", body) + ", x=1",
		"no deadline":   "t=1, socket=1, prev=resp_1, sig=00",
	} {
		// The body and the go, at once, as a forger would send them, or
		// a client's turn with the header added (its last byte taken for
		// the go).
		for _, sent := range []string{string(body) + "g", string(body)} {
			req, _ := http.NewRequest(http.MethodPost, rs.servers[0].URL+"/v1/responses", strings.NewReader(sent))
			req.Header.Set(forwardHeader, value)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", name, sent)
		}
	}
	assert.Zero(t, rs.proxies[0].Stats().ForwardedIn, "nothing ran")
}

func TestAGoneOriginCostsOnlyItsContinuations(t *testing.T) {
	rs := newReplicaSet(t, 2)
	c := newConversation(t, rs.url, "s1", true, false)
	c.say("hello")
	// r2's server dies while its announcement lives on; r1 withdraws. The
	// balancer still reaches both proxies' handlers.
	rs.servers[1].CloseClientConnections()
	rs.servers[1].Close()
	require.NoError(t, rs.dir.Withdraw(context.Background(), "r1"))
	before := rs.total()
	c.say("again") // every answer is the upstream's: say checks the status
	after := rs.total()
	assert.Positive(t, after.ForwardFailures, "turns for r2's sockets are served here")
	assert.Less(t, after.Continued-before.Continued, after.Turns-before.Turns, "and send their full context")
	assert.Zero(t, after.FullContextRetries)
}

func TestForwardingConfigIsChecked(t *testing.T) {
	st, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	dir, err := directory.NewMemory(directory.Options{})
	require.NoError(t, err)
	for name, f := range map[string]*Forwarding{
		"no directory": {Secret: testSecret},
		"short secret": {Directory: dir, Secret: []byte("short")},
		"negative":     {Directory: dir, Secret: testSecret, Timeout: -1},
	} {
		_, err := New(Config{Store: st, Upstream: up, Forwarding: f})
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
}

func TestForwardSignatureIsThePublishedOne(t *testing.T) {
	// PROTOCOL.md 6.7, computed here from the text, not from sign.
	body := []byte(`{"model":"m","input":[]}`)
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, testSecret)
	m.Write([]byte("contproxy-forward-v3\n1800000000\n1800000002000\n7\nresp_abc\n" + hex.EncodeToString(sum[:])))
	want := "t=1800000000, by=1800000002000, socket=7, prev=resp_abc, sig=" + hex.EncodeToString(m.Sum(nil))
	f := &Forwarding{Secret: testSecret, MaxSkew: 30 * time.Second}
	assert.Equal(t, want, f.header(time.Unix(1_800_000_000, 0), time.Unix(1_800_000_002, 0), 7, "resp_abc", body))
	fw, err := f.verify(time.Unix(1_800_000_029, 0), want, body)
	require.NoError(t, err)
	assert.Equal(t, forward{socket: 7, prev: "resp_abc", by: time.Unix(1_800_000_002, 0)}, fw)
	_, err = f.verify(time.Unix(1_800_000_031, 0), want, body)
	assert.ErrorContains(t, err, "stale")
}

func TestAnUnreachableDirectoryServesTurnsHere(t *testing.T) {
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}}))
	t.Cleanup(up.Close)
	base, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	dir, err := directory.NewRedis(redistest.Failing(t), "ns", directory.Options{OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	var proxies []*Proxy
	for _, id := range []string{"r1", "r2"} {
		ws, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1", WebSocketOptions{Replica: id})
		require.NoError(t, err)
		p, err := New(Config{Store: storehooks.WithReplica(base, id), Upstream: ws, Forwarding: &Forwarding{Directory: dir, Secret: testSecret}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		proxies = append(proxies, p)
	}
	next := 0
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxies[next%2].ServeHTTP(w, r)
		next++
	}))
	t.Cleanup(lb.Close)
	c := newConversation(t, lb.URL+"/v1/responses", "s1", true, false)
	c.say("hello") // every answer is the upstream's: say checks the status
	for _, p := range proxies {
		assert.Zero(t, p.Stats().Forwarded)
		assert.Zero(t, p.Stats().Continued, "each turn lands on the replica without the socket")
	}
}

// soon is an acceptance deadline a forward meets.
func soon() time.Time { return time.Now().Add(2 * time.Second) }

// executions counts the calls the upstream answered (ran), from its own
// log: a refused continuation is not one.
type executions struct {
	mu    sync.Mutex
	lines int
}

func (e *executions) Write(b []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines += bytes.Count(b, []byte("\n"))
	return len(b), nil
}

func (e *executions) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lines
}

// A forwarded turn whose origin is slow to produce its first event (longer
// than the forwarding timeout) runs once, on the origin, which accepted
// it before going upstream: the replica the client reached waits and
// relays, and never runs the turn itself as well.
func TestASlowOriginRunsAForwardedTurnOnce(t *testing.T) {
	var ran executions
	rs := newReplicaSetWith(t, 2, fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 1},
		EventDelay: 150 * time.Millisecond, Recorder: fakeupstream.NewRecorder(&ran)}, 100*time.Millisecond)
	c := newConversation(t, rs.url, "s-slow", true, false)
	c.say("hello")
	s := rs.total()
	assert.Equal(t, int(s.Turns), ran.count(), "one upstream execution per client turn")
	if s.ForwardFailures > 0 {
		// A machine too busy for the origin to accept within its margin
		// (half the 100 ms left): the origin ran nothing, and the turn
		// went here, once.
		t.Logf("the origin did not accept in time: %+v", s)
		return
	}
	assert.Equal(t, s.Turns-1, s.Continued, "the later turn continues on the origin")
	assert.Positive(t, s.Forwarded)
}

// A forward whose acceptance reaches the forwarding replica late, on a
// slow network, runs nowhere but there: the origin accepted in time, but
// the go never came, so it ran nothing.
func TestALateAcceptanceRunsAForwardedTurnOnce(t *testing.T) {
	var ran executions
	const timeout = 300 * time.Millisecond
	rs := newReplicaSetWith(t, 2, fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 1},
		Recorder: fakeupstream.NewRecorder(&ran)}, timeout)
	for i, p := range rs.proxies {
		// The replicas reach each other through a link whose answers take
		// twice the timeout: the requests arrive at once.
		addr := slowAnswers(t, strings.TrimPrefix(rs.servers[i].URL, "http://"), 2*timeout)
		require.NoError(t, rs.dir.Announce(t.Context(), p.replica, addr))
	}
	c := newConversation(t, rs.url, "s-late", true, false)
	c.say("hello")
	s := rs.total()
	assert.Equal(t, int(s.Turns), ran.count(), "one upstream execution per client turn")
	assert.Positive(t, s.ForwardFailures, "the forwards were accepted too late")
	assert.Zero(t, s.Forwarded)
	assert.Zero(t, s.ForwardedIn, "no origin ran a turn")
}

// A forward the origin refuses is answered at once (it does not wait for
// the go that will not come), and one it refuses or accepts too late
// leaves nothing running behind it on the replica that sent it.
func TestForwardsNotCarriedLeaveNothingBehind(t *testing.T) {
	rs := newReplicaSet(t, 1) // the origin, r1, whose socket 7 holds nothing
	origin := strings.TrimPrefix(rs.servers[0].URL, "http://")
	forwarding := func(timeout time.Duration) *Forwarding {
		dir, err := directory.NewMemory(directory.Options{})
		require.NoError(t, err)
		f := &Forwarding{Directory: dir, Secret: testSecret, Timeout: timeout}
		require.NoError(t, f.check())
		t.Cleanup(f.Client.CloseIdleConnections)
		return f
	}
	// A wait for acceptance long enough that only a refusal that waits
	// for the go could outlast it; a short one that answers outlast.
	patient, hasty := forwarding(10*time.Second), forwarding(100*time.Millisecond)
	slow := slowAnswers(t, origin, 300*time.Millisecond)
	send := func(f *Forwarding, addr string) error {
		c := &forwardConn{f: f, addr: addr, origin: store.Socket{Replica: "r1", ID: 7}, prev: "resp_1",
			tg: &target{header: http.Header{}}}
		_, err := c.send(t.Context(), []byte(`{"model":"m","store":false,"input":"hi"}`), true)
		require.Error(t, err)
		require.NotErrorIs(t, err, errForwardLost, "nothing ran there")
		return err
	}
	before := runtime.NumGoroutine()
	for range 10 {
		require.Contains(t, send(patient, origin).Error(), "409", "refused, and told so at once")
		assert.Contains(t, send(hasty, slow).Error(), "no acceptance", "accepted too late")
	}
	patient.Client.CloseIdleConnections()
	hasty.Client.CloseIdleConnections()
	assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+4 }, 5*time.Second, 10*time.Millisecond,
		"goroutines: %d before", before)
}

// slowAnswers relays TCP connections to addr, delaying what addr sends
// back by delay, and returns its own address.
func slowAnswers(t *testing.T, addr string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() {
				_, _ = io.Copy(out, in)
				_ = out.Close()
			}()
			go func() {
				defer in.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := in.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A continuation the upstream refuses on the origin's socket reaches the
// client as the same turn sent again with the full context, from the
// replica the client reached: 200, and the upstream ran it once.
func TestARefusedForwardedContinuationIsSentAgainHere(t *testing.T) {
	var ran executions
	rs := newReplicaSetWith(t, 2, fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 1},
		KeepsNoResponses: true, Recorder: fakeupstream.NewRecorder(&ran)}, 0)
	c := newConversation(t, rs.url, "s-refused", true, false)
	c.say("hello") // say requires 200 for every turn
	s := rs.total()
	assert.Equal(t, int(s.Turns), ran.count(), "one upstream execution per client turn")
	assert.Positive(t, s.FullContextRetries, "the origin's upstream refused the continuation")
	assert.Zero(t, s.Continued)
}

// An upstream stream that breaks off reaches the client as a cut stream,
// as it would without the proxy, never as a stream that ended.
func TestACutStreamReachesTheClientCut(t *testing.T) {
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 1},
		Fault: func(fakeupstream.Request) fakeupstream.Fault {
			return fakeupstream.Fault{Kind: fakeupstream.FaultDrop, Events: 2}
		}}))
	t.Cleanup(up.Close)
	body := `{"model":"gpt-test","stream":true,"store":false,"input":"hi"}`
	read := func(url string) error {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("X-Session-Id", "s-cut")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return err
	}
	require.Error(t, read(up.URL+"/v1/responses"), "the upstream itself cuts the stream")
	st, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	for name, url := range map[string]string{"http": up.URL + "/v1", "websocket": "ws" + strings.TrimPrefix(up.URL, "http") + "/v1"} {
		t.Run(name, func(t *testing.T) {
			var u Upstream
			if name == "http" {
				u, err = NewHTTPUpstream(url, nil)
			} else {
				u, err = NewWebSocketUpstream(url, WebSocketOptions{Replica: "r1"})
			}
			require.NoError(t, err)
			p, err := New(Config{Store: st, Upstream: u})
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			srv := httptest.NewServer(p)
			t.Cleanup(srv.Close)
			err = read(srv.URL + "/v1/responses")
			require.Error(t, err, "the client must not take a cut stream for a finished one")
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		})
	}
}

// stepLog records the steps an Observer sees.
type stepLog struct {
	mu    sync.Mutex
	steps []string
}

func (l *stepLog) Observe(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	what := ev.Result
	if ev.Step == StepFallback {
		what = ev.Cause
	}
	l.steps = append(l.steps, string(ev.Step)+":"+what)
}

func (l *stepLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.steps
	l.steps = nil
	return s
}

// The Observer sees each turn's route, attempts, fallbacks and end: a
// forwarded turn the origin's upstream refused goes forward, is refused,
// falls back and is answered here.
func TestTheObserverSeesEachStep(t *testing.T) {
	rs := newReplicaSetWith(t, 2, fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 1}, KeepsNoResponses: true}, 0)
	var steps stepLog
	for _, p := range rs.proxies {
		p.cfg.Observer = &steps
	}
	c := newConversation(t, rs.url, "s-steps", true, false)
	c.say("hello")
	assert.Equal(t, []string{
		"route:full", "attempt:answered", "end:recorded",
		"route:forward", "attempt:refused", "fallback:refused", "attempt:answered", "end:recorded",
	}, steps.take())
}

// recordsSeen is a store Observer that signals each record's return.
type recordsSeen chan struct{}

func (c recordsSeen) Observe(ev store.Event) {
	if ev.Op == store.OpRecord {
		c <- struct{}{}
	}
}

func (recordsSeen) BreakerChanged(store.BreakerStatus) {}

// With Affinity, a turn forwarded to the replica holding its socket is
// recorded before its client gets the end: header affinity sends the next
// turn to that replica, which would not wait for this one's record.
func TestWithAffinityAForwardedTurnIsRecordedBeforeItsEnd(t *testing.T) {
	const hold = 30 * time.Millisecond
	held := &heldCalls{script: lua.Record, release: make(chan struct{})}
	_, rc := redistest.Miniredis(t)
	rc.AddHook(held)
	recorded := make(recordsSeen, 4)
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{}))
	t.Cleanup(up.Close)
	dir, err := directory.NewMemory(directory.Options{CacheTTL: time.Nanosecond})
	require.NoError(t, err)
	var proxies []*Proxy
	var urls []string
	for _, name := range []string{"r1", "r2"} {
		st, err := store.NewRedis(rc, store.Options{Namespace: "fwd", Replica: name, OpTimeout: 10 * time.Second, Observer: recorded})
		require.NoError(t, err)
		ws, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1", WebSocketOptions{Replica: name, Sockets: 2})
		require.NoError(t, err)
		p, err := New(Config{Store: st, Upstream: ws, Affinity: true, Forwarding: &Forwarding{Directory: dir, Secret: testSecret}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		require.NoError(t, dir.Announce(context.Background(), name, strings.TrimPrefix(srv.URL, "http://")))
		proxies, urls = append(proxies, p), append(urls, srv.URL+"/v1/responses")
	}
	input := []any{map[string]any{"role": "user", "content": "hi"}}
	turn := func(url string) {
		a := post(t, url, http.Header{"X-Session-Id": {"s-forwarded"}}, map[string]any{"model": "gpt-test", "store": false, "input": input})
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
		require.Equal(t, `"completed"`, string(a.response["status"]))
		input = a.next(input, "more")
	}
	seen := func() {
		select {
		case <-recorded:
		case <-time.After(5 * time.Second):
			t.Fatal("no record returned")
		}
	}

	turn(urls[0]) // on r1's own socket: recorded while its end goes out
	held.let(t, 0)
	seen()
	sent := time.Now()
	held.let(t, hold)
	turn(urls[1]) // on r2, forwarded to r1, which holds the socket
	assert.GreaterOrEqual(t, time.Since(sent), hold, "the client got the forwarded turn's end before its record")
	seen()
	st := proxies[1].Stats()
	assert.Equal(t, int64(1), st.Forwarded, "the second turn went to r1's socket")
	assert.Equal(t, int64(1), st.Continued)
}

// A turn carrying a forward's header to a replica that takes none is
// refused as such (403), before its body is read as a forward's.
func TestAForwardToAReplicaWithoutForwardingIsRefused(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	a := post(t, r.url, http.Header{"Contproxy-Forward": {"t=1, sig=x"}}, map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusForbidden, a.status, "%s", a.body)
	assert.Contains(t, string(a.body), `"code":"forward_refused"`)
}

// A forwarded turn's answer is held in the origin's budget, beside its
// body, as a turn's is.
func TestAForwardedTurnsAnswerIsHeldInTheOriginsBudget(t *testing.T) {
	rs := newReplicaSet(t, 2)
	instructions := strings.Repeat("i", 300<<10) // in the answer's response objects too
	h := http.Header{"X-Session-Id": {"s-big"}}
	first := []any{map[string]any{"role": "user", "content": "hello"}}
	a := post(t, rs.url, h, map[string]any{"model": "m", "store": false, "instructions": instructions, "input": first})
	require.Equal(t, http.StatusOK, a.status, "%.300s", a.body)
	input := append(first, map[string]any{"role": "user", "content": "again"})
	for _, it := range a.output {
		input = slices.Insert(input, len(input)-1, any(it))
	}
	most := watchBudget(rs.proxies[0]) // the origin: the first turn's replica
	body := map[string]any{"model": "m", "store": false, "instructions": instructions, "input": input}
	b := post(t, rs.url, h, body)
	require.Equal(t, http.StatusOK, b.status, "%.300s", b.body)
	require.Equal(t, int64(1), rs.total().ForwardedIn, "the turn was forwarded")
	sent, err := json.Marshal(body)
	require.NoError(t, err)
	assert.Greater(t, most(), 2*int64(len(sent))+int64(len(instructions)), "the body's weight, and the answer")
}

// A forward told to go whose answer breaks off before the origin said
// the turn began may have run there: its client is told
// upstream_disconnected, not upstream_unreachable, which says a retry is
// free (docs/operating.md).
func TestALostForwardIsNotToldUnreachable(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		_, _ = io.ReadAll(r.Body) // the go: the turn runs here...
		if conn, _, err := rc.Hijack(); err == nil {
			_ = conn.Close() // ...and the origin dies before its first event
		}
	}))
	t.Cleanup(origin.Close)
	dir, err := directory.NewMemory(directory.Options{})
	require.NoError(t, err)
	f := &Forwarding{Directory: dir, Secret: testSecret}
	require.NoError(t, f.check())
	c := &forwardConn{f: f, addr: origin.Listener.Addr().String(), origin: store.Socket{Replica: "r1", ID: 7}, prev: "resp_1",
		tg: &target{header: http.Header{}}}
	_, err = c.send(t.Context(), []byte(`{"model":"m","store":false,"input":"hi"}`), true)
	require.ErrorIs(t, err, errForwardLost, "told to go, then lost: it may have run")

	// What run answers (upstreamError -> writeUnreachable).
	w := httptest.NewRecorder()
	writeUnreachable(w, err)
	assert.Equal(t, http.StatusBadGateway, w.Code)
	assert.Equal(t, "upstream_disconnected", gjson.GetBytes(w.Body.Bytes(), "error.code").String(), "%s", w.Body.Bytes())
}
