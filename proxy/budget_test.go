package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
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

// budgetRig is a rig whose server counts the requests the proxy has
// finished serving.
type budgetRig struct {
	*rig
	served atomic.Int64
}

// newBudgetRig starts the fake upstream and a proxy over HTTP whose Config
// edit adjusts.
func newBudgetRig(t *testing.T, edit func(*Config)) *budgetRig {
	t.Helper()
	br := &budgetRig{rig: &rig{}}
	r := br.rig
	r.upstream = httptest.NewServer(fakeupstream.New(fakeupstream.Options{
		Script: fakeupstream.Script{ToolCalls: 2},
		Fault: func(req fakeupstream.Request) fakeupstream.Fault {
			if f := r.fault.Load(); f != nil {
				return (*f)(req)
			}
			return fakeupstream.Fault{}
		},
	}))
	t.Cleanup(r.upstream.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	up, err := NewHTTPUpstream(r.upstream.URL+"/v1", nil)
	require.NoError(t, err)
	cfg := Config{Store: st, Upstream: up}
	edit(&cfg)
	r.proxy, err = New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.proxy.Close() })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer br.served.Add(1)
		r.proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/v1/responses"
	return br
}

// holdUpstream makes the upstream's first call from now on wait until the
// returned release is called (by the test's end at the latest); reached
// is closed when that call arrives.
func (r *rig) holdUpstream(t *testing.T) (reached <-chan struct{}, release func()) {
	arrived, gate := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
		if calls.Add(1) == 1 {
			close(arrived)
			<-gate
		}
		return fakeupstream.Fault{}
	})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the upstream closes: it waits for its calls
	return arrived, release
}

// noFault answers every call normally.
func noFault(fakeupstream.Request) fakeupstream.Fault { return fakeupstream.Fault{} }

// budgetFree tells whether nothing holds any of p's budget.
func budgetFree(p *Proxy) bool {
	p.budget.mu.Lock()
	defer p.budget.mu.Unlock()
	return p.budget.cur == 0
}

// bigTurn is a turn of a user message of n bytes.
func bigTurn(n int) map[string]any {
	return map[string]any{"model": "gpt-test", "input": []any{
		map[string]any{"role": "user", "content": strings.Repeat("x", n)}}}
}

// postBytes sends body as a client would: its answer's status, headers
// and body. It may run outside the test's goroutine.
func postBytes(ctx context.Context, url, session string, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// While a turn holds most of a small budget, a second one, over HTTP or
// in the WebSocket mode, waits, then is refused with 503 and server_busy;
// once the first ends, the next turn is served.
func TestBudgetRefusesATurnWhileFull(t *testing.T) {
	turn := bigTurn(700 << 10)
	body, err := json.Marshal(turn)
	require.NoError(t, err)
	n := int64(len(body))
	for _, tc := range []struct {
		second transport
		size   int64 // room for the first turn and for the second alone, not for both
	}{
		{overHTTP, 3 * n},      // a turn weighs about 2n
		{overWebSocket, 5 * n}, // a message, about 4n
	} {
		t.Run(string(tc.second), func(t *testing.T) {
			r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = tc.size })
			reached, release := r.holdUpstream(t)
			first := make(chan int, 1)
			go func() {
				status, _, _, _ := postBytes(context.Background(), r.url, "s1", body)
				first <- status
			}()
			<-reached
			var c *socketClient
			if tc.second == overHTTP {
				status, header, b, err := postBytes(t.Context(), r.url, "s2", body)
				require.NoError(t, err)
				assert.Equal(t, http.StatusServiceUnavailable, status, "%s", b)
				assert.Equal(t, "1", header.Get("Retry-After"))
				e := gjson.GetBytes(b, "error")
				assert.Equal(t, "server_error", e.Get("type").String())
				assert.Equal(t, "server_busy", e.Get("code").String())
				assert.Equal(t, gjson.Null, e.Get("param").Type)
				assert.NotEmpty(t, e.Get("message").String())
			} else {
				c = dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "s2")
				ev := c.turn(turn).err
				assert.Equal(t, int64(http.StatusServiceUnavailable), ev.Get("status").Int(), ev.Raw)
				assert.Equal(t, "server_error", ev.Get("error.type").String())
				assert.Equal(t, "server_busy", ev.Get("error.code").String())
			}
			assert.Equal(t, int64(1), r.proxy.Stats().RefusedBusy)
			release()
			assert.Equal(t, http.StatusOK, <-first)
			a := post(t, r.url, http.Header{"X-Session-Id": {"s3"}}, turn)
			assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
			if c != nil {
				assert.Equal(t, "completed", c.turn(turn).response.Get("status").String(), "the connection goes on")
			}
		})
	}
}

// A body whose declared length alone weighs more than the whole budget is
// refused before any of it is sent.
func TestBudgetRefusesAnOversizedBodyUnread(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 1 << 20 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(r.url, "/v1/responses"), "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"X-Session-Id: s1\r\nContent-Length: %d\r\n\r\n", 1<<20)
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "answered with the body unsent")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", b)
	assert.Equal(t, "request_too_large", gjson.GetBytes(b, "error.code").String())
	assert.Zero(t, r.proxy.Stats().RefusedBusy)
	assert.True(t, budgetFree(r.proxy))
}

// A body holds what has arrived of it, not what it claims: clients that
// claim large bodies and send a little of each, whose claims together
// weigh the whole budget, hold little of it, and a turn meanwhile is
// served, and the memory taken at once for them is bounded (the others
// grow as they arrive). Nor does a body that has not arrived hold its items: one with
// many commas in a string holds its bytes only, though its commas alone,
// counted as items, would weigh more than the budget.
func TestABodyHoldsWhatArrivedNotWhatItClaims(t *testing.T) {
	const claimed = 1 << 20
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight, c.MaxBodyBytes = 2*weight(claimed, 1), claimed })
	host := strings.TrimPrefix(strings.TrimSuffix(r.url, "/v1/responses"), "http://")
	starts := []string{`{"model":`, `{"model":`, `{"model":"m","input":"` + strings.Repeat(",", 60<<10)}
	for _, start := range starts {
		conn, err := net.Dial("tcp", host)
		require.NoError(t, err)
		defer conn.Close()
		_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
			"X-Session-Id: s1\r\nContent-Length: %d\r\n\r\n%s", claimed, start)
		require.NoError(t, err)
	}
	// Each slow body holds its first item and its first read step.
	most := int64(len(starts)) * (itemBytes + weight(readStep, 0))
	require.Eventually(t, func() bool {
		r.proxy.budget.mu.Lock()
		defer r.proxy.budget.mu.Unlock()
		return r.proxy.budget.cur == most
	}, 10*time.Second, 5*time.Millisecond, "both slow bodies are being read, holding %d bytes", most)
	r.proxy.budget.mu.Lock()
	taken := r.proxy.budget.claimed
	r.proxy.budget.mu.Unlock()
	assert.Less(t, taken, int64(len(starts))*claimed, "not every body still arriving is allocated at once")
	a := post(t, r.url, http.Header{"X-Session-Id": {"s2"}}, bigTurn(10<<10))
	assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Zero(t, r.proxy.Stats().RefusedBusy)
}

// A body that has been arriving for a while gives way to a request that
// finds no room: a client that sent much of a large body and then stopped
// keeps the room from nobody. It is answered as a turn without room is.
func TestASlowBodyGivesWayToARequestThatFindsNoRoom(t *testing.T) {
	const sent, claimed = 300 << 10, 330 << 10
	start := `{"model":"m","input":"` + strings.Repeat("x", sent)
	stepped := int64(0) // the steps that read it (stepReader)
	for stepped < int64(len(start)) {
		stepped += min(max(readStep, stepped), claimed-stepped)
	}
	held := itemBytes + weight(stepped, 0)
	// Room for the claim, and for too little beside what the slow body holds.
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = held + 32<<10 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(r.url, "/v1/responses"), "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"X-Session-Id: s1\r\nContent-Length: %d\r\n\r\n%s", claimed, start)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r.proxy.budget.mu.Lock()
		defer r.proxy.budget.mu.Unlock()
		return r.proxy.budget.cur == held
	}, 10*time.Second, 5*time.Millisecond, "the slow body holds what arrived")
	time.Sleep(preemptAfter) // it has been arriving that long

	a := post(t, r.url, http.Header{"X-Session-Id": {"s2"}}, bigTurn(20<<10))
	assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Equal(t, "server_busy", gjson.GetBytes(b, "error.code").String())
	require.Eventually(t, func() bool { return budgetFree(r.proxy) }, 10*time.Second, 5*time.Millisecond)
}

// Only bodies that have been arriving for preemptAfter and now arrive
// slowly give way: not a young one, not one waiting for room, and not an
// upload that moves. The rule is read at chosen instants, so the test does
// not depend on the machine keeping a pace.
func TestOnlyASlowArrivalGivesWay(t *testing.T) {
	at := func(age, quiet time.Duration) (*arrival, time.Time) {
		a := newArrival(func() {})
		now := time.Now()
		a.since = now.Add(-age)
		a.last.Store(now.Add(-quiet).UnixNano())
		return a, now
	}
	a, now := at(preemptAfter/2, 2*preemptAfter)
	assert.False(t, a.slow(now), "younger than preemptAfter, though silent")
	a, now = at(2*preemptAfter, 2*preemptAfter)
	assert.True(t, a.slow(now), "no byte for preemptAfter")
	a.waiting.Store(true)
	assert.False(t, a.slow(now), "silent while it waits for room")

	a, now = at(2*preemptAfter, 0)
	assert.False(t, a.slow(now), "no whole window counted yet")
	a.from.Store(now.Add(-preemptAfter).UnixNano())
	a.got(16 * slowRate) // over a window a little longer than preemptAfter
	require.Positive(t, a.rate.Load())
	assert.False(t, a.slow(time.Now()), "an upload at %d bytes/s", a.rate.Load())
	a.from.Store(time.Now().Add(-preemptAfter).UnixNano())
	a.got(slowRate / 2)
	assert.True(t, a.slow(time.Now()), "an upload at %d bytes/s", a.rate.Load())
}

// A body whose strings hold many commas (CSV, code) is weighed by the
// commas outside its strings once those inside would not fit: it is
// served, where counting every comma as an item would refuse it.
func TestCommasInsideStringsAreNoItems(t *testing.T) {
	for _, tc := range []struct {
		json   string
		commas int64
	}{
		{`{"a":"x,\",y","b":[1,2]}`, 2},
		{`{"a":"\\","b":",",c:"\\\",",d:1}`, 3},
		{`[",,,"`, 0},
		{`"unterminated,\"`, 0},
		{`1,2,3`, 2},
	} {
		assert.Equal(t, tc.commas, commasOutsideStrings([]byte(tc.json)), tc.json)
	}

	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 16 << 20 })
	csv := strings.Repeat("a,b,c,d\n", 128<<10) // 1 MiB, 384 K commas: 30 MB as items
	for _, stream := range []bool{false, true} {
		a := post(t, r.url, http.Header{"X-Session-Id": {"s"}}, map[string]any{"model": "gpt-test", "stream": stream,
			"input": []any{map[string]any{"role": "user", "content": csv}}})
		assert.Equal(t, http.StatusOK, a.status, "%.300s", a.body)
	}
	c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "ws")
	ev := c.turn(map[string]any{"model": "gpt-test", "input": []any{map[string]any{"role": "user", "content": csv}}})
	assert.False(t, ev.err.Exists(), ev.err.Raw)
}

// A body of unknown length that fits the budget is served, however far
// ahead its read steps would have gone.
func TestABodyOfUnknownLengthThatFitsIsServed(t *testing.T) {
	turn := bigTurn(17 << 20)
	body, err := json.Marshal(turn)
	require.NoError(t, err)
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 64 << 20 })
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, r.url, io.MultiReader(bytes.NewReader(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	require.Equal(t, int64(0), req.ContentLength, "sent chunked")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%.300s", b)
}

// A client that sends messages on its WebSocket and does not read the
// answers keeps what they hold no longer than MessageTimeout: an answer it
// does not take closes its connection.
func TestAWebSocketClientThatDoesNotReadGivesItsHoldBack(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MessageTimeout = 300 * time.Millisecond })
	c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "s1")
	instructions := strings.Repeat("x", 4<<20) // each answer's events carry them
	msg, err := json.Marshal(map[string]any{"type": "response.create", "model": "m", "instructions": instructions, "input": "hi"})
	require.NoError(t, err)
	require.NoError(t, c.ws.Write(t.Context(), websocket.MessageText, msg))
	for range 5 {
		// The connection may be closed before the client has sent them all.
		if c.ws.Write(t.Context(), websocket.MessageText, msg) != nil {
			break
		}
	}
	// The answers fill what the connection buffers, and their writes stall:
	// each 64 KiB of them must go within MessageTimeout, not the whole
	// answer within as many as it has.
	require.Eventually(t, func() bool { return budgetFree(r.proxy) }, 15*time.Second, 10*time.Millisecond,
		"the messages' hold is given back")
}

// A client's WebSocket message holds its bytes as they arrive, as a body
// does, and one that stalls closes its connection after MessageTimeout,
// giving back what it held; meanwhile turns are served.
func TestAWebSocketMessageHoldsWhatArrivedAndMayNotStall(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MessageTimeout = 500 * time.Millisecond })
	c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "s1")
	w, err := c.ws.Writer(t.Context(), websocket.MessageText)
	require.NoError(t, err)
	_, err = io.WriteString(w, `{"type":"response.create","model":"m","input":"`+strings.Repeat("x", 200<<10))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r.proxy.budget.mu.Lock()
		defer r.proxy.budget.mu.Unlock()
		return r.proxy.budget.cur >= weight(200<<10, 0)
	}, 10*time.Second, 5*time.Millisecond, "the message's bytes are held as they arrive")
	a := post(t, r.url, http.Header{"X-Session-Id": {"s2"}}, bigTurn(10<<10))
	assert.Equal(t, http.StatusOK, a.status, "%s", a.body)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, _, err = c.ws.Read(ctx)
	require.Error(t, err, "the connection is closed")
	require.NoError(t, ctx.Err(), "closed within 10 s of the stall")
	require.Eventually(t, func() bool { return budgetFree(r.proxy) }, 10*time.Second, 5*time.Millisecond)
}

// A message fed in small frames moves no faster for their number: less
// than 64 KiB within MessageTimeout closes its connection, however many
// frames brought it (here 8 KiB every 100 ms, 40 KiB a timeout).
func TestAWebSocketMessageFedInSmallFramesMayNotStall(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MessageTimeout = 500 * time.Millisecond })
	c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "s1")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	w, err := c.ws.Writer(ctx, websocket.MessageText)
	require.NoError(t, err)
	_, err = io.WriteString(w, `{"type":"response.create","model":"m","input":"`)
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() {
		_, _, err := c.ws.Read(ctx)
		closed <- err
	}()
	start := time.Now()
	for {
		select {
		case err := <-closed:
			require.NoError(t, ctx.Err(), "closed before the test's own limit: %v", err)
			assert.Less(t, time.Since(start), 5*time.Second, "closed once the message stalled")
			return
		case <-time.After(100 * time.Millisecond):
		}
		_, _ = io.WriteString(w, strings.Repeat("x", 8<<10)) // a frame, every 100 ms
	}
}

// Every way a request can end gives back what it held of the budget.
func TestBudgetIsReleasedOnEveryPath(t *testing.T) {
	for _, tc := range slices.Concat(failedTurns(), failedBodies()) {
		t.Run(tc.name, func(t *testing.T) {
			r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight, c.MaxBodyBytes = 8<<20, 1<<20 })
			tc.run(t, r)
			require.Eventually(t, func() bool { return r.served.Load() == 1 }, 10*time.Second, time.Millisecond,
				"the proxy ends the request")
			assert.True(t, budgetFree(r.proxy), "the budget is held after the request ended")
			a := post(t, r.url, http.Header{"X-Session-Id": {"s"}}, bigTurn(100<<10))
			assert.Equal(t, http.StatusOK, a.status, "%s", a.body)
		})
	}
}

// releaseCase is one way a request, or a WebSocket connection, ends
// badly.
type releaseCase struct {
	name string
	run  func(t *testing.T, r *budgetRig)
}

// failedTurns are turns read in full that fail.
func failedTurns() []releaseCase {
	turn := bigTurn(100 << 10)
	valid, _ := json.Marshal(turn)
	failWith := func(f fakeupstream.Fault) func(*testing.T, *budgetRig, map[string]any) answer {
		return func(t *testing.T, r *budgetRig, body map[string]any) answer {
			r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return f })
			defer r.setFault(noFault)
			return post(t, r.url, http.Header{"X-Session-Id": {"s"}}, body)
		}
	}
	streamed := bigTurn(100 << 10)
	streamed["stream"] = true
	return []releaseCase{
		{"invalid JSON", func(t *testing.T, r *budgetRig) {
			status, _, _, err := postBytes(t.Context(), r.url, "s", valid[:len(valid)-1])
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadRequest, status)
		}},
		{"a body the fingerprint refuses, sent upstream as received", func(t *testing.T, r *budgetRig) {
			refused := bytes.Replace(valid, []byte(`"model":`), []byte(`"model":"m","model":`), 1)
			status, _, _, err := postBytes(t.Context(), r.url, "s", refused)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, status, "the upstream's answer")
		}},
		{"a body the fingerprint refuses, its stream dropped upstream", func(t *testing.T, r *budgetRig) {
			r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
				return fakeupstream.Fault{Kind: fakeupstream.FaultDrop, Events: 2}
			})
			defer r.setFault(noFault)
			body, _ := json.Marshal(streamed)
			refused := bytes.Replace(body, []byte(`"model":`), []byte(`"model":"m","model":`), 1)
			_, _, _, err := postBytes(t.Context(), r.url, "s", refused)
			assert.Error(t, err, "the stream broke off")
		}},
		{"upstream error", func(t *testing.T, r *budgetRig) {
			a := failWith(fakeupstream.Fault{Kind: fakeupstream.FaultStatus, Status: http.StatusInternalServerError})(t, r, turn)
			assert.Equal(t, http.StatusInternalServerError, a.status)
		}},
		{"stream dropped upstream", func(t *testing.T, r *budgetRig) {
			assert.Len(t, failWith(fakeupstream.Fault{Kind: fakeupstream.FaultDrop, Events: 2})(t, r, streamed).events, 2)
		}},
		{"client gone during the turn", func(t *testing.T, r *budgetRig) {
			reached, release := r.holdUpstream(t)
			defer r.setFault(noFault)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _, _, _ = postBytes(ctx, r.url, "s", valid)
			}()
			<-reached
			cancel()
			<-done
			release()
		}},
	}
}

// failedBodies are bodies and WebSocket messages that fail before their
// turn is parsed, or as they are read.
func failedBodies() []releaseCase {
	turn := bigTurn(100 << 10)
	commas := map[string]any{"model": "gpt-test", "input": json.RawMessage("[" + strings.Repeat("0,", 200<<10) + "0]")} // 200 K items at most
	return []releaseCase{
		{"client gone during the body", func(t *testing.T, r *budgetRig) {
			sendPartial(t, r.url, 500<<10, bytes.Repeat([]byte("x"), 100<<10))
		}},
		{"body over MaxBodyBytes, length unknown", func(t *testing.T, r *budgetRig) {
			status := postChunked(t, r.url, bytes.Repeat([]byte("x"), 2<<20))
			assert.Contains(t, []int{0, http.StatusRequestEntityTooLarge}, status)
		}},
		{"items over the budget", func(t *testing.T, r *budgetRig) {
			assert.Equal(t, http.StatusRequestEntityTooLarge, post(t, r.url, http.Header{"X-Session-Id": {"s"}}, commas).status)
		}},
		{"socket closed with messages read ahead", func(t *testing.T, r *budgetRig) {
			reached, release := r.holdUpstream(t)
			defer r.setFault(noFault)
			c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "ws1")
			c.create(turn)
			<-reached
			c.create(turn)
			c.create(turn)
			_ = c.ws.CloseNow()
			release()
		}},
		{"socket message over the budget", func(t *testing.T, r *budgetRig) {
			c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "ws2")
			ev := c.turn(commas).err
			assert.Equal(t, int64(http.StatusRequestEntityTooLarge), ev.Get("status").Int(), ev.Raw)
			_ = c.ws.CloseNow()
		}},
	}
}

// sendPartial sends a request declaring n bytes of body, sends part of
// them and hangs up.
func sendPartial(t *testing.T, url string, n int, part []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/v1/responses"), "http://"))
	require.NoError(t, err)
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
		"X-Session-Id: s\r\nContent-Length: %d\r\n\r\n", n)
	require.NoError(t, err)
	_, err = conn.Write(part)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}

// postChunked sends body without its length: the answer's status, 0 when
// the proxy hung up before the client got one.
func postChunked(t *testing.T, url string, body []byte) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, io.MultiReader(bytes.NewReader(body)))
	require.NoError(t, err)
	req.Header.Set("X-Session-Id", "s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func TestNewRejectsANegativeBudget(t *testing.T) {
	st, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	_, err = New(Config{Store: st, Upstream: up, MaxBytesInFlight: -1})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	p, err := New(Config{Store: st, Upstream: up})
	require.NoError(t, err)
	assert.Equal(t, int64(defaultMaxBytesInFlight), p.budget.size, "the default")
}

// A request that fits the room gets in at once, even while a bigger one
// waits for room: waiting in order would hold small turns behind a big
// body for up to budgetWait, and refuse some with room to spare.
func TestASmallRequestPassesABigOneWaiting(t *testing.T) {
	b := newBudget(100)
	held := &hold{b: b}
	require.NoError(t, held.grow(context.Background(), 80))
	big := make(chan error, 1)
	go func() { big <- (&hold{b: b}).grow(context.Background(), 50) }() // waits: 20 free
	time.Sleep(100 * time.Millisecond)                                  // the big one waits by now
	small := &hold{b: b}
	require.NoError(t, small.grow(context.Background(), 10), "10 fits the 20 free")
	small.release()
	held.release()
	require.NoError(t, <-big, "the big one gets in once the room is there")
}

// bigAnswer is the length of bigAnswerProxy's answers' text.
const bigAnswer = 16 << 20

// bigAnswerProxy returns a proxy whose HTTP upstream answers every turn
// with a completed response of bigAnswer bytes of text, as JSON, or as
// an event stream (its item, then its response) when the turn asks for
// one, with a budget of twice that, its
// server, and the steps of its turns.
func bigAnswerProxy(t *testing.T) (*Proxy, *httptest.Server, *stepLog) {
	return gatedBigAnswerProxy(t, nil)
}

// gatedBigAnswerProxy is bigAnswerProxy whose upstream calls gate, when
// not nil, with each request's body before it answers.
func gatedBigAnswerProxy(t *testing.T, gate func(body []byte)) (*Proxy, *httptest.Server, *stepLog) {
	text := strings.Repeat("x", bigAnswer)
	item := `{"type":"message","id":"msg_big","role":"assistant","status":"completed","content":[{"type":"output_text","text":"` + text + `","annotations":[]}]}`
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if gate != nil {
			gate(body)
		}
		if !gjson.GetBytes(body, "stream").Bool() {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"id":"resp_big","object":"response","status":"completed","output":[%s]}`, item)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_big\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n")
		_, _ = fmt.Fprintf(w, "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":%s}\n\n", item)
		_, _ = fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_big\",\"object\":\"response\",\"status\":\"completed\",\"output\":[%s]}}\n\n", item)
	}))
	t.Cleanup(upstream.Close)
	up, err := NewHTTPUpstream(upstream.URL+"/v1", nil)
	require.NoError(t, err)
	return bigAnswerProxyOver(t, up)
}

// bigAnswerProxyOver returns the proxy of bigAnswerProxy over up.
func bigAnswerProxyOver(t *testing.T, up Upstream) (*Proxy, *httptest.Server, *stepLog) {
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	steps := &stepLog{}
	p, err := New(Config{Store: st, Upstream: up, MaxBytesInFlight: 2 * bigAnswer, MaxBodyBytes: 1 << 20, Observer: steps})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv, steps
}

// budgetHeld returns what p's budget holds, and its size.
func budgetHeld(p *Proxy) (cur, size int64) {
	p.budget.mu.Lock()
	defer p.budget.mu.Unlock()
	return p.budget.cur, p.budget.size
}

// An upstream's answer is held in the budget as it is read, three times
// its bytes (the answer, its output items, the copy the client is shown),
// until its client has it; one that the budget cannot hold is read no
// further than the budget allows, and relayed as it comes, unkept, as a
// reverse proxy relays it: the budget is never exceeded, and the client
// gets the whole answer all the same.
func TestAnAnswerAClientDoesNotReadHoldsTheBudget(t *testing.T) {
	p, srv, steps := bigAnswerProxy(t)

	// A client that sends a turn and reads nothing of its answer.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"model":"m","input":"hi"}`
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cur, size := budgetHeld(p)
		require.LessOrEqual(t, cur, size, "the budget is never exceeded")
		return cur > size/2
	}, 10*time.Second, 10*time.Millisecond, "the answer held in the budget")

	// Another turn, whose answer finds the budget short: the whole answer
	// all the same, relayed as it comes.
	a := post(t, srv.URL+"/v1/responses", nil, map[string]any{"model": "m", "input": "other"})
	require.Equal(t, http.StatusOK, a.status, "%.200s", a.body)
	assert.Len(t, a.output, 1, "the whole answer, relayed unkept")
	assert.Equal(t, bigAnswer, len(gjson.GetBytes(a.body, "output.0.content.0.text").Str))
	cur, size := budgetHeld(p)
	assert.LessOrEqual(t, cur, size, "the budget is never exceeded")
	var seen []string
	assert.Eventually(t, func() bool {
		seen = append(seen, steps.take()...)
		return slices.Contains(seen, "end:relayed_unkept")
	}, 10*time.Second, time.Millisecond, "the turn ends relayed_unkept: %q", seen)

	_ = conn.Close() // the client goes: its answer is let go
	require.Eventually(t, func() bool { return budgetFree(p) }, 10*time.Second, 10*time.Millisecond)
}

// A streamed answer's events are held as they are read, and its output as
// the relay keeps it, while the room has them; an event the room does not
// have goes on to the client as it arrives, unread, and the turn is
// relayed unkept: the budget is never exceeded, whatever the clients
// read, and each gets its whole stream. (A WebSocket client gets each
// event whole, in a message: its answer is held, past the budget if it
// must, as the next test shows.)
func TestAStreamedAnswerStaysWithinTheBudget(t *testing.T) {
	release := make(chan struct{})
	p, srv, steps := gatedBigAnswerProxy(t, holdOther(release))
	most := watchBudget(p)
	types := readBesideNonReaders(t, p, srv.URL+"/v1/responses", release)
	assertRelayedUnkept(t, types, steps, most)
}

// So does an upstream socket's: a message the budget has no room for
// goes on to the client as it arrives, unread.
func TestAnUpstreamSocketsAnswerStaysWithinTheBudget(t *testing.T) {
	release := make(chan struct{})
	hold := holdOther(release)
	item := `{"type":"message","id":"msg_big","role":"assistant","status":"completed","content":[{"type":"output_text","text":"` +
		strings.Repeat("x", bigAnswer) + `","annotations":[]}]}`
	upstream := scriptedSockets(t, func(socket, n int, msg []byte, send func(string)) {
		hold(msg)
		resp := fmt.Sprintf(`{"id":"resp_%d_%d","object":"response","status":"%%s","output":[%%s]}`, socket, n)
		send(`{"type":"response.created","response":` + fmt.Sprintf(resp, "in_progress", "") + `}`)
		send(`{"type":"response.output_item.done","output_index":0,"item":` + item + `}`)
		send(`{"type":"response.completed","response":` + fmt.Sprintf(resp, "completed", item) + `}`)
	})
	up, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(upstream.URL, "http")+"/v1", WebSocketOptions{Replica: "r1", Sockets: 4})
	require.NoError(t, err)
	p, srv, steps := bigAnswerProxyOver(t, up)
	most := watchBudget(p)
	types := readBesideNonReaders(t, p, srv.URL+"/v1/responses", release)
	assertRelayedUnkept(t, types, steps, most)
}

// holdOther returns an upstream's gate (gatedBigAnswerProxy) that holds the
// answer to a request saying "other" until release is closed.
func holdOther(release chan struct{}) func(body []byte) {
	return func(body []byte) {
		if bytes.Contains(body, []byte("other")) {
			<-release
		}
	}
}

// readBesideNonReaders sends a streamed turn to the proxy p at url, whose
// upstream holds its answer until release is closed (holdOther); then two
// turns whose clients read nothing of their answers; once their answers
// hold half of p's budget it closes release, and returns the event types
// of the first turn's answer, which it reads, checking that every event
// came whole.
func readBesideNonReaders(t *testing.T, p *Proxy, url string, release chan struct{}) []string {
	t.Helper()
	answer := make(chan []byte, 1)
	go func() {
		defer close(answer)
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","input":"other","stream":true}`))
		if !assert.NoError(t, err) {
			return
		}
		defer resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		events, err := io.ReadAll(resp.Body)
		assert.NoError(t, err)
		answer <- events
	}()
	// Released however the test ends: the upstream's handler waits for
	// it, and its server's Close for the handler.
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let)
	postUnread(t, strings.TrimSuffix(url, "/v1/responses"), 2)
	// 16 MiB each under -race on a loaded machine: a minute at most.
	require.Eventually(t, func() bool {
		cur, size := budgetHeld(p)
		return cur >= size/2
	}, time.Minute, time.Millisecond, "the answers not read hold the budget")
	let()
	var types []string
	for ev := range strings.SplitSeq(strings.TrimSuffix(string(<-answer), "\n\n"), "\n\n") {
		name, data, ok := strings.Cut(ev, "\ndata: ")
		require.True(t, ok, "%.200q", ev)
		require.True(t, gjson.Valid(data), "%.200q", ev)
		typ := gjson.Get(data, "type").String()
		assert.Equal(t, "event: "+typ, name)
		types = append(types, typ)
		text := gjson.Get(data, "item.content.0.text").Str + gjson.Get(data, "response.output.0.content.0.text").Str
		if typ != "response.created" {
			assert.Len(t, text, bigAnswer, typ)
		}
	}
	return types
}

// assertRelayedUnkept asserts that a client of bigAnswerProxy got the
// event types of its answer, types, that a turn ended relayed unkept, and
// that the budget, watched (watchBudget), never held more than its size.
func assertRelayedUnkept(t *testing.T, types []string, steps *stepLog, most func() int64) {
	t.Helper()
	assert.Equal(t, []string{"response.created", "response.output_item.done", "response.completed"}, types)
	var seen []string
	assert.Eventually(t, func() bool {
		seen = append(seen, steps.take()...)
		return slices.Contains(seen, "end:relayed_unkept")
	}, 10*time.Second, time.Millisecond, "the turn ends relayed_unkept: %q", seen)
	assert.LessOrEqual(t, most(), 2*int64(bigAnswer), "the budget is never exceeded")
}

// postUnread sends n streamed turns to the server at base whose clients
// read nothing of their answers.
func postUnread(t *testing.T, base string, n int) {
	body := `{"model":"m","input":"hi","stream":true}`
	for range n {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
	}
}

// watchBudget watches what p's budget holds all along, until the
// function it returns is called: that returns the most it held.
func watchBudget(p *Proxy) func() int64 {
	stop := make(chan struct{})
	watched := make(chan int64)
	go func() {
		most := int64(0)
		for {
			cur, _ := budgetHeld(p)
			most = max(most, cur)
			select {
			case <-stop:
				watched <- most
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	return func() int64 {
		close(stop)
		return <-watched
	}
}

// A small WebSocket message needs little room: the first step it is read
// by is small, as a small body's is its length.
func TestASmallSocketMessageNeedsLittleRoom(t *testing.T) {
	r := newBudgetRig(t, func(c *Config) { c.MaxBytesInFlight = 16 << 20 })
	_, size := budgetHeld(r.proxy)
	taken := size - weight(readStep, 0)/2
	require.NoError(t, r.proxy.budget.acquire(t.Context(), taken))
	t.Cleanup(func() { r.proxy.budget.release(taken) })
	c := dialSocket(t, "ws"+strings.TrimPrefix(r.url, "http"), "s1")
	a := c.turn(map[string]any{"model": "m", "input": "hi"})
	assert.False(t, a.err.Exists(), a.err.Raw)
	assert.Zero(t, r.proxy.Stats().RefusedBusy)
}

// So does a socket client's: an event the budget has no room for goes on
// to it as it arrives, in the frames of its message, unread.
func TestASocketClientsAnswerStaysWithinTheBudget(t *testing.T) {
	answer := make(chan struct{})
	p, srv, steps := gatedBigAnswerProxy(t, func(body []byte) {
		if gjson.GetBytes(body, "input.0.content").String() == "other" {
			<-answer // once the others hold the budget
		}
	})
	// Let go however the test ends: the upstream's server's Close waits
	// for its handler.
	let := sync.OnceFunc(func() { close(answer) })
	t.Cleanup(let)
	most := watchBudget(p)
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/responses"
	c := dialSocket(t, url, "reader") // which reads every event, whole
	c.ws.SetReadLimit(2 * bigAnswer)
	c.create(map[string]any{"model": "m", "input": "other"})

	// Two clients that send a turn and read nothing of its answer, one
	// holding an event it is not taken.
	for i := range 2 {
		dialSocket(t, url, fmt.Sprint("idle", i)).create(map[string]any{"model": "m", "input": "hi"})
	}
	require.Eventually(t, func() bool {
		cur, _ := budgetHeld(p)
		return cur >= bigAnswer
	}, time.Minute, time.Millisecond, "an answer not taken holds the budget")
	let()

	var types []string
	for len(types) < 3 {
		msg, err := c.next()
		require.NoError(t, err)
		typ := msg.Get("type").String()
		require.NotEqual(t, "error", typ, msg.Raw)
		types = append(types, typ)
		if typ != "response.created" {
			assert.Len(t, msg.Get("item.content.0.text").Str+msg.Get("response.output.0.content.0.text").Str, bigAnswer, typ)
		}
	}
	assertRelayedUnkept(t, types, steps, most)
}

// So does a WebSocket turn's answer, in its message's hold.
func TestAnAnswerASocketClientDoesNotReadHoldsTheBudget(t *testing.T) {
	p, srv, _ := bigAnswerProxy(t)
	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s1")
	c.create(map[string]any{"model": "m", "store": true, "input": "hi"}) // and reads nothing
	require.Eventually(t, func() bool {
		cur, size := budgetHeld(p)
		require.LessOrEqual(t, cur, size, "the budget is never exceeded")
		return cur > size/2
	}, 10*time.Second, 10*time.Millisecond, "the answer held in the budget")
	_ = c.ws.CloseNow()
	require.Eventually(t, func() bool { return budgetFree(p) }, 10*time.Second, 10*time.Millisecond)
}
