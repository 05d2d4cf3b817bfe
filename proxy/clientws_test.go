package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/store"
)

// socketRig is a proxy serving client sockets in front of the fake
// upstream, which logs the calls it answers.
type socketRig struct {
	proxy *Proxy
	url   string // ws://…/v1/responses
	http  string // http://…/v1/responses
	fake  *fakeupstream.Upstream
	fault atomic.Pointer[fakeupstream.Fault]

	mu    sync.Mutex
	calls []gjson.Result // the bodies the upstream answered
}

// newSocketRig starts the fake upstream (with opts) and a proxy over tr
// whose Config edit adjusts.
func newSocketRig(t *testing.T, tr transport, opts fakeupstream.Options, edit func(*Config)) *socketRig {
	t.Helper()
	r := &socketRig{}
	opts.Script = fakeupstream.Script{ToolCalls: 2}
	opts.Fault = func(req fakeupstream.Request) fakeupstream.Fault {
		r.mu.Lock()
		r.calls = append(r.calls, gjson.ParseBytes(req.Body))
		r.mu.Unlock()
		if f := r.fault.Load(); f != nil {
			return *f
		}
		return fakeupstream.Fault{}
	}
	r.fake = fakeupstream.New(opts)
	up := httptest.NewServer(r.fake)
	t.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	var u Upstream
	if tr == overHTTP {
		u, err = NewHTTPUpstream(up.URL+"/v1", nil)
	} else {
		u, err = NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1", WebSocketOptions{Replica: "r1", Sockets: 2})
	}
	require.NoError(t, err)
	cfg := Config{Store: st, Upstream: u}
	if edit != nil {
		edit(&cfg)
	}
	r.proxy, err = New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(r.proxy)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = r.proxy.Close() })
	r.http = srv.URL + "/v1/responses"
	r.url = "ws" + strings.TrimPrefix(r.http, "http")
	return r
}

// upstreamCalls returns the bodies the upstream answered so far.
func (r *socketRig) upstreamCalls() []gjson.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gjson.Result(nil), r.calls...)
}

// socketClient is a client connection in the WebSocket mode.
type socketClient struct {
	t  *testing.T
	ws *websocket.Conn
}

// dialSocket opens a connection as the Codex CLI does.
func dialSocket(t *testing.T, url, session string) *socketClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{
		"X-Session-Id": {session}, "OpenAI-Beta": {"responses_websockets=2026-02-06"},
		"Authorization": {"Bearer test-key"},
	}})
	require.NoError(t, err)
	ws.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return &socketClient{t: t, ws: ws}
}

// create sends a response.create with body's members.
func (c *socketClient) create(body map[string]any) {
	c.t.Helper()
	msg := map[string]any{"type": "response.create"}
	for k, v := range body {
		msg[k] = v
	}
	b, err := json.Marshal(msg)
	require.NoError(c.t, err)
	c.sendRaw(b)
}

func (c *socketClient) sendRaw(b []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(c.t, c.ws.Write(ctx, websocket.MessageText, b))
}

// next reads one message, within a minute: a 16 MiB one under -race on
// a loaded machine takes more than ten seconds.
func (c *socketClient) next() (gjson.Result, error) {
	ctx, cancel := context.WithTimeout(c.t.Context(), time.Minute)
	defer cancel()
	typ, data, err := c.ws.Read(ctx)
	if err != nil {
		return gjson.Result{}, err
	}
	if typ != websocket.MessageText {
		return gjson.Result{}, fmt.Errorf("a %v message", typ)
	}
	return gjson.ParseBytes(data), nil
}

// socketAnswer is what a client read of one response.
type socketAnswer struct {
	events   []string
	seqs     []int64
	response gjson.Result // the terminal event's response object
	output   []json.RawMessage
	err      gjson.Result // the error event, when it ended with one
}

// read reads the events of one response, up to its terminal event.
func (c *socketClient) read() socketAnswer {
	c.t.Helper()
	var a socketAnswer
	for {
		ev, err := c.next()
		require.NoError(c.t, err, "events so far: %v", a.events)
		typ := ev.Get("type").String()
		a.events = append(a.events, typ)
		if s := ev.Get("sequence_number"); s.Exists() {
			a.seqs = append(a.seqs, s.Int())
		}
		switch typ {
		case "response.output_item.done":
			a.output = append(a.output, json.RawMessage(ev.Get("item").Raw))
		case "response.completed", "response.failed", "response.incomplete":
			a.response = ev.Get("response")
			return a
		case "error":
			a.err = ev
			return a
		}
	}
}

// turn sends one response.create and reads its answer.
func (c *socketClient) turn(body map[string]any) socketAnswer {
	c.t.Helper()
	c.create(body)
	return c.read()
}

// socketConversation plays the Codex CLI's tool loop on one connection:
// the first request with the full context, each later one with the
// previous response's id and the new items only, or, when full, the whole
// history again.
type socketConversation struct {
	c       *socketClient
	params  map[string]any
	full    bool
	history []any
	sent    int    // the history items the last request held
	prev    string // the last response's id
	answers []socketAnswer
}

func newSocketConversation(c *socketClient, stores, full bool) *socketConversation {
	return &socketConversation{c: c, full: full, params: map[string]any{
		"model": "gpt-test", "store": stores,
		"tools": []any{map[string]any{"type": "function", "name": "run_command", "parameters": map[string]any{
			"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}},
			"required": []any{"command"}}}},
	}}
}

// body returns the next request.
func (s *socketConversation) body() map[string]any {
	body := map[string]any{"input": s.history}
	if s.prev != "" && !s.full {
		body["input"], body["previous_response_id"] = s.history[s.sent:], s.prev
	}
	for k, v := range s.params {
		body[k] = v
	}
	return body
}

// say sends a user message and runs the tool loop until the model answers.
func (s *socketConversation) say(text string) {
	t := s.c.t
	t.Helper()
	s.history = append(s.history, map[string]any{"role": "user", "content": text})
	for step := 0; ; step++ {
		require.Less(t, step, 10, "the tool loop did not end")
		body := s.body()
		a := s.c.turn(body)
		require.False(t, a.err.Exists(), "error event: %s", a.err.Raw)
		require.Equal(t, "response.completed", a.events[len(a.events)-1])
		s.answers = append(s.answers, a)
		wantPrev := "null"
		if p, ok := body["previous_response_id"].(string); ok {
			wantPrev = `"` + p + `"`
		}
		assert.Equal(t, wantPrev, a.response.Get("previous_response_id").Raw, "the response shows the client's own previous_response_id")
		s.sent, s.prev = len(s.history), a.response.Get("id").String()
		call := false
		for _, raw := range a.output {
			var it map[string]any
			require.NoError(t, json.Unmarshal(raw, &it))
			s.history = append(s.history, it)
			s.sent++
			if it["type"] == "function_call" {
				call = true
				s.history = append(s.history, map[string]any{"type": "function_call_output",
					"call_id": it["call_id"], "output": "ok"})
			}
		}
		if !call {
			return
		}
	}
}

func TestSocketTurnsContinue(t *testing.T) {
	for _, tc := range []struct {
		tr     transport
		stores bool
		full   bool // the client resends its full history
	}{
		{overWebSocket, false, false},
		{overWebSocket, false, true},
		{overWebSocket, true, false},
		{overHTTP, true, false},
		{overHTTP, true, true},
	} {
		t.Run(fmt.Sprintf("%s/store=%v/full=%v", tc.tr, tc.stores, tc.full), func(t *testing.T) {
			r := newSocketRig(t, tc.tr, fakeupstream.Options{}, nil)
			conv := newSocketConversation(dialSocket(t, r.url, "s1"), tc.stores, tc.full)
			conv.say("hello")
			conv.say("again")
			require.Len(t, conv.answers, 6, "2 user turns of 2 tool calls and a reply")
			calls := r.upstreamCalls()
			require.Len(t, calls, 6)
			assert.False(t, calls[0].Get("previous_response_id").Exists(), "the first turn goes with the full context")
			for i, call := range calls[1:] {
				assert.Equal(t, conv.answers[i].response.Get("id").String(), call.Get("previous_response_id").String(),
					"turn %d continues the one before", i+2)
				assert.Less(t, len(call.Get("input").Array()), 4, "turn %d sends the new items only", i+2)
			}
			// A turn is counted once it is over, which may be after the
			// client has its last event.
			assert.Eventually(t, func() bool { return r.proxy.Stats().Continued == 5 }, 5*time.Second, time.Millisecond,
				"continued: %+v", r.proxy.Stats())
			st := r.proxy.Stats()
			assert.Equal(t, int64(6), st.Turns)
			assert.Zero(t, st.FullContextRetries)
			for _, a := range conv.answers {
				assert.Equal(t, "response.created", a.events[0])
				for i := 1; i < len(a.seqs); i++ {
					assert.Equal(t, a.seqs[i-1]+1, a.seqs[i], "events in order")
				}
			}
		})
	}
}

func TestSocketAnswersAnUnknownPreviousResponseAsTheUpstream(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	c := dialSocket(t, r.url, "s1")
	conv := newSocketConversation(c, false, false)
	conv.say("hello")
	calls := r.fake.Calls()
	known := conv.prev

	body := conv.body()
	body["previous_response_id"] = "resp_unknown"
	a := c.turn(body)
	require.True(t, a.err.Exists(), "events: %v", a.events)
	assert.Equal(t, []string{"error"}, a.events)
	assert.Equal(t, int64(400), a.err.Get("status").Int())
	assert.Equal(t, notFoundCode, a.err.Get("error.code").String())
	assert.Equal(t, "previous_response_id", a.err.Get("error.param").String())
	assert.Equal(t, "invalid_request_error", a.err.Get("error.type").String())
	assert.Equal(t, "Previous response with id 'resp_unknown' not found.", a.err.Get("error.message").String())

	// The failed request dropped the latest response, as upstream.
	body["previous_response_id"] = known
	a = c.turn(body)
	assert.Equal(t, notFoundCode, a.err.Get("error.code").String())
	assert.Equal(t, calls, r.fake.Calls(), "nothing went upstream")

	// The client sends its full history again, on the same connection.
	conv.full = true
	conv.say("again")
	assert.Equal(t, calls+3, r.fake.Calls())

	// Another connection holds none of this one's responses.
	other := dialSocket(t, r.url, "s1")
	body = conv.body()
	body["input"], body["previous_response_id"] = []any{}, conv.prev
	a = other.turn(body)
	assert.Equal(t, notFoundCode, a.err.Get("error.code").String())
}

// What the connections keep of their latest responses is bounded
// together (MaxKeptBytes): the responses kept the longest ago go first,
// their clients sending their full context again, and a connection that
// ends gives back what it kept.
func TestSocketsKeepAtMostMaxKeptBytes(t *testing.T) {
	const conns, kept = 6, 3
	// keptAfter waits until the connection of conv keeps its latest
	// response, which it does once the turn is over, maybe after the
	// client has its end, and returns its weight and what all keep.
	keptAfter := func(r *socketRig, conv *socketConversation) (size, all int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			r.proxy.kept.mu.Lock()
			defer r.proxy.kept.mu.Unlock()
			for e := r.proxy.kept.order.Front(); e != nil; e = e.Next() {
				if k := e.Value.(*keptResponse); k.id == conv.prev {
					size, all = k.bytes, r.proxy.kept.bytes
					return true
				}
			}
			return false
		}, 5*time.Second, time.Millisecond, "response %s kept", conv.prev)
		return size, all
	}
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	one := newSocketConversation(dialSocket(t, r.url, "s0"), false, false)
	one.say("hello")
	size, _ := keptAfter(r, one) // one connection's latest response

	r = newSocketRig(t, overWebSocket, fakeupstream.Options{}, func(c *Config) { c.MaxKeptBytes = kept*size + size/2 })
	convs := make([]*socketConversation, conns)
	for i := range convs {
		convs[i] = newSocketConversation(dialSocket(t, r.url, fmt.Sprintf("s%d", i)), false, false)
		convs[i].say("hello")
		_, all := keptAfter(r, convs[i])
		assert.Equal(t, int64(min(i+1, kept))*size, all, "after conversation %d", i)
	}
	for i, conv := range convs[:conns-kept] {
		a := conv.c.turn(conv.body())
		assert.Equal(t, notFoundCode, a.err.Get("error.code").String(), "conversation %d: its response was dropped", i)
	}
	last := convs[conns-1]
	last.say("again")
	assert.Equal(t, last.answers[2].response.Get("id").String(), r.upstreamCalls()[len(r.upstreamCalls())-3].Get("previous_response_id").String(),
		"the connection kept last continues")
	for _, conv := range convs {
		_ = conv.c.ws.Close(websocket.StatusNormalClosure, "")
	}
	assert.Eventually(t, func() bool {
		r.proxy.kept.mu.Lock()
		defer r.proxy.kept.mu.Unlock()
		return r.proxy.kept.bytes == 0 && r.proxy.kept.order.Len() == 0
	}, 5*time.Second, time.Millisecond, "the connections that ended keep nothing")
}

func TestSocketSendsAStoredPreviousResponseUpstream(t *testing.T) {
	r := newSocketRig(t, overHTTP, fakeupstream.Options{}, nil)
	first := post(t, r.http, http.Header{"X-Session-Id": {"s1"}}, map[string]any{
		"model": "gpt-test", "input": "hello",
	})
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	var id string
	require.NoError(t, json.Unmarshal(first.response["id"], &id))

	c := dialSocket(t, r.url, "s1")
	a := c.turn(map[string]any{"model": "gpt-test", "previous_response_id": id,
		"input": []any{map[string]any{"role": "user", "content": "more"}}})
	require.False(t, a.err.Exists(), "%s", a.err.Raw)
	calls := r.upstreamCalls()
	require.Len(t, calls, 2)
	assert.Equal(t, id, calls[1].Get("previous_response_id").String(), "the upstream keeps it: sent as is")
	assert.Equal(t, int64(1), r.proxy.Stats().Passthrough)
}

func TestSocketAnswersAWarmUpItself(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	c := dialSocket(t, r.url, "s1")
	conv := newSocketConversation(c, false, false)
	conv.history = []any{map[string]any{"role": "developer", "content": "be brief"},
		map[string]any{"role": "user", "content": "hello"}}
	body := conv.body()
	body["generate"] = false
	a := c.turn(body)
	assert.Equal(t, []string{"response.created", "response.completed"}, a.events)
	assert.Equal(t, "[]", a.response.Get("output").Raw)
	assert.Equal(t, "completed", a.response.Get("status").String())
	assert.Zero(t, r.fake.Calls(), "nothing went upstream")

	// The first request continues the warm-up with no new item: the full
	// context goes upstream.
	conv.sent, conv.prev = len(conv.history), a.response.Get("id").String()
	conv.history = conv.history[:len(conv.history)-1]
	conv.say("hello")
	calls := r.upstreamCalls()
	require.Len(t, calls, 3)
	assert.False(t, calls[0].Get("previous_response_id").Exists())
	assert.Len(t, calls[0].Get("input").Array(), 2)
	assert.False(t, calls[0].Get("generate").Exists())
	assert.Eventually(t, func() bool { return r.proxy.Stats().Continued == 2 }, 5*time.Second, time.Millisecond,
		"continued: %+v", r.proxy.Stats())
}

func TestSocketRunsResponsesOneAtATime(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{EventDelay: 2 * time.Millisecond}, nil)
	c := dialSocket(t, r.url, "s1")
	for _, text := range []string{"first", "second"} {
		c.create(map[string]any{"model": "gpt-test", "store": false, "input": text})
	}
	first, second := c.read(), c.read()
	for _, a := range []socketAnswer{first, second} {
		assert.Equal(t, "response.created", a.events[0])
		assert.Equal(t, "response.completed", a.events[len(a.events)-1])
	}
	assert.NotEqual(t, first.response.Get("id").String(), second.response.Get("id").String())
	calls := r.upstreamCalls()
	require.Len(t, calls, 2)
	assert.Equal(t, "first", calls[0].Get("input.0.content").String())
	assert.Equal(t, "second", calls[1].Get("input.0.content").String())
}

func TestSocketLifetime(t *testing.T) {
	const lifetime = 300 * time.Millisecond
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{EventDelay: 80 * time.Millisecond},
		func(c *Config) { c.ClientSocketLifetime = lifetime })

	t.Run("a turn in flight ends first", func(t *testing.T) {
		c := dialSocket(t, r.url, "s1")
		start := time.Now()
		a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hello"})
		require.Equal(t, "response.completed", a.events[len(a.events)-1])
		require.Greater(t, time.Since(start), lifetime, "the turn outlasts the connection's lifetime")
		ev, err := c.next()
		require.NoError(t, err)
		assert.Equal(t, "error", ev.Get("type").String())
		assert.Equal(t, int64(400), ev.Get("status").Int())
		assert.Equal(t, connectionLimitCode, ev.Get("error.code").String())
		assert.Equal(t, "Responses websocket connection limit reached (300ms). Create a new websocket connection to continue.",
			ev.Get("error.message").String())
		_, err = c.next()
		assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "%v", err)
	})
	t.Run("idle", func(t *testing.T) {
		start := time.Now() // before the upgrade, where the timer starts
		c := dialSocket(t, r.url, "s1")
		ev, err := c.next()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(start), lifetime, "not before its lifetime")
		assert.Equal(t, connectionLimitCode, ev.Get("error.code").String())
	})
}

func TestSocketErrorsLeaveTheConnectionUsable(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	c := dialSocket(t, r.url, "s1")
	for _, tc := range []struct {
		msg         string
		param, code string
	}{
		{`{"type":"response.create",`, "", ""},
		{`[1]`, "", ""},
		{`{"type":"session.update"}`, "type", "invalid_value"},
		{`{"type":"response.create","model":"gpt-test","input":"hi","background":true}`, "background", "unsupported_parameter"},
		{`{"type":"response.create","model":"gpt-test","input":{"role":"user","content":"hi"}}`, "input", "invalid_type"},
		{`{"type":"response.create","model":"gpt-test","input":3}`, "input", "invalid_type"},
	} {
		c.sendRaw([]byte(tc.msg))
		ev, err := c.next()
		require.NoError(t, err)
		assert.Equal(t, "error", ev.Get("type").String(), tc.msg)
		assert.Equal(t, int64(400), ev.Get("status").Int(), tc.msg)
		assert.Equal(t, tc.param, ev.Get("error.param").String(), tc.msg)
		assert.Equal(t, tc.code, ev.Get("error.code").String(), tc.msg)
	}
	c.sendRaw([]byte(`{"type":"response.processed","response_id":"resp_x"}`)) // answered with nothing
	r.fault.Store(&fakeupstream.Fault{Kind: fakeupstream.FaultError})
	a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	assert.Equal(t, []string{"response.created", "response.in_progress", "error"}, a.events)
	assert.Equal(t, "server_error", a.err.Get("error.code").String(), "the upstream's error event, as it sent it: %s", a.err.Raw)
	r.fault.Store(&fakeupstream.Fault{Kind: fakeupstream.FaultStatus, Status: http.StatusTooManyRequests})
	a = c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	assert.Equal(t, int64(429), a.err.Get("status").Int(), "the upstream's error, as it sent it: %s", a.err.Raw)
	assert.Equal(t, "rate_limit_exceeded", a.err.Get("error.code").String())
	r.fault.Store(&fakeupstream.Fault{})
	a = c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	assert.Equal(t, "response.completed", a.events[len(a.events)-1])
	assert.Zero(t, r.proxy.Stats().Passthrough)
}

// A text message that is not UTF-8 fails the connection, with 1007 (RFC
// 6455 8.1); the same bytes in a binary message are answered.
func TestATextMessageThatIsNotUTF8FailsTheConnection(t *testing.T) {
	r := newSocketRig(t, overHTTP, fakeupstream.Options{}, nil)
	bad := []byte(`{"type":"response.create","model":"gpt-test","input":"` + "\xff" + `"}`)
	c := dialSocket(t, r.url, "s1")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.ws.Write(ctx, websocket.MessageBinary, bad))
	ev, err := c.next()
	require.NoError(t, err)
	assert.Equal(t, "error", ev.Get("type").String(), "a binary message is answered")
	require.NoError(t, c.ws.Write(ctx, websocket.MessageText, bad))
	_, err = c.next()
	assert.Equal(t, websocket.StatusInvalidFramePayloadData, websocket.CloseStatus(err), "%v", err)
}

// A message that is not a response.create (of a type the connection does
// not serve, such as a later version's, or not a JSON object) is refused
// and leaves the connection's latest response to continue.
func TestAMessageThatIsNotACreateKeepsTheLatestResponse(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			r := newSocketRig(t, tr, fakeupstream.Options{}, nil)
			c := dialSocket(t, r.url, "s1")
			a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
			require.Equal(t, "completed", a.response.Get("status").String(), "%v", a.events)
			for _, msg := range []string{`{"type":"response.cancel"}`, `{"type":"session.update"}`, `{}`, `[1]`} {
				c.sendRaw([]byte(msg))
				ev, err := c.next()
				require.NoError(t, err)
				assert.Equal(t, "error", ev.Get("type").String(), msg)
			}
			b := c.turn(map[string]any{"model": "gpt-test", "store": false, "previous_response_id": a.response.Get("id").String(),
				"input": []any{map[string]any{"role": "user", "content": "next"}}})
			assert.Equal(t, "completed", b.response.Get("status").String(), "%v %s", b.events, b.err.Raw)
		})
	}
}

// A connection's latest response holds the memory it counts (its items):
// not the whole response its id was read from as well.
func TestAKeptResponseHoldsWhatItCounts(t *testing.T) {
	const size = 16 << 20
	var item atomic.Pointer[string]
	small := `{"type":"message","id":"msg_s","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}`
	item.Store(&small)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		it := *item.Load()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_k\",\"status\":\"in_progress\",\"output\":[]}}\n\n"+
			"data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":%s}\n\n"+
			"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_k\",\"status\":\"completed\",\"output\":[%s]}}\n\n", it, it)
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s1")
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	c.turn(map[string]any{"model": "m", "store": false, "input": "warm"}) // what every turn allocates once
	before := heap()
	big := `{"type":"message","id":"msg_b","role":"assistant","status":"completed","content":[{"type":"output_text","text":"` +
		strings.Repeat("x", size) + `","annotations":[]}]}`
	item.Store(&big)
	a := c.turn(map[string]any{"model": "m", "store": false, "input": "big"})
	require.Equal(t, "completed", a.response.Get("status").String())
	item.Store(&small)
	big, a = "", socketAnswer{}
	grew := int64(heap()) - int64(before)
	// (Only a bound above: what earlier tests leave may be let go meanwhile.)
	assert.Less(t, grew, int64(size)*3/2, "the response's items, %d bytes, and nothing the size of the response beside", size)
}

func TestSocketCutStreamClosesTheConnection(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	c := dialSocket(t, r.url, "s1")
	r.fault.Store(&fakeupstream.Fault{Kind: fakeupstream.FaultDrop, Events: 3})
	c.create(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	n := 0
	var err error
	for ; ; n++ {
		var ev gjson.Result
		if ev, err = c.next(); err != nil {
			break
		}
		require.NotContains(t, []string{"response.completed", "error"}, ev.Get("type").String())
	}
	assert.Equal(t, 3, n, "the events sent before the upstream's connection broke")
	assert.Equal(t, websocket.StatusCode(-1), websocket.CloseStatus(err), "no close frame: %v", err)
}

func TestSocketMessagesAreBoundedByMaxBodyBytes(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, func(c *Config) { c.MaxBodyBytes = 4096 })
	c := dialSocket(t, r.url, "s1")
	a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	require.Equal(t, "response.completed", a.events[len(a.events)-1])
	c.create(map[string]any{"model": "gpt-test", "store": false, "input": strings.Repeat("x", 5000)})
	_, err := c.next()
	assert.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err), "%v", err)
	assert.Equal(t, int64(1), r.fake.Calls())
}

func TestShutdownClosesSocketsAfterTheirTurn(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{EventDelay: 20 * time.Millisecond}, nil)
	c := dialSocket(t, r.url, "s1")
	idle := dialSocket(t, r.url, "s2")
	c.create(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
	ev, err := c.next()
	require.NoError(t, err)
	require.Equal(t, "response.created", ev.Get("type").String())
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- r.proxy.Shutdown(ctx)
	}()
	a := c.read()
	assert.Equal(t, "response.completed", a.events[len(a.events)-1], "the turn in flight ends")
	_, err = c.next()
	assert.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "%v", err)
	_, err = idle.next()
	assert.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "%v", err)
	require.NoError(t, <-done)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, r.url, nil)
	require.Error(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

func TestSocketRefusesAnotherOrigin(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, r.url, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://elsewhere.example"}}})
	require.Error(t, err)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	_, resp, err = websocket.Dial(ctx, strings.TrimSuffix(r.url, "/responses")+"/realtime", nil)
	require.Error(t, err)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestTurnHeader(t *testing.T) {
	h := turnHeader(http.Header{
		"Sec-Websocket-Key": {"k"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Extensions": {"permessage-deflate"},
		"Upgrade": {"websocket"}, "Connection": {"Upgrade"}, "Contproxy-Forward": {"t=1"},
		"Openai-Beta":   {"responses_websockets=2026-02-06, assistants=v2"},
		"Authorization": {"Bearer k"}, "Session-Id": {"s"},
	})
	assert.Equal(t, http.Header{"Openai-Beta": {"assistants=v2"}, "Authorization": {"Bearer k"}, "Session-Id": {"s"}}, h)
	assert.Empty(t, turnHeader(http.Header{"Openai-Beta": {"responses_websockets=2026-02-06"}}))
}

// CloseUnusedSocket closes the connection that has waited the longest
// without sending a message (1013, try again later), then the next; one
// that has sent a message it leaves.
func TestCloseUnusedSocketClosesTheOldestUnusedConnection(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	used := dialSocket(t, r.url, "s0")
	a := used.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hello"})
	require.Equal(t, "response.completed", a.events[len(a.events)-1])
	first := dialSocket(t, r.url, "s1")
	second := dialSocket(t, r.url, "s2")
	require.Eventually(t, func() bool {
		r.proxy.sockets.mu.Lock()
		defer r.proxy.sockets.mu.Unlock()
		return len(r.proxy.sockets.open) == 3
	}, 5*time.Second, 10*time.Millisecond, "the three connections served")
	for _, c := range []*socketClient{first, second} {
		require.True(t, r.proxy.CloseUnusedSocket())
		_, err := c.next()
		assert.Equal(t, websocket.StatusTryAgainLater, websocket.CloseStatus(err), "%v", err)
	}
	assert.False(t, r.proxy.CloseUnusedSocket(), "no unused connection left")
	a = used.turn(map[string]any{"model": "gpt-test", "store": false, "input": "again"})
	assert.Equal(t, "response.completed", a.events[len(a.events)-1], "a used connection is kept")
}

// An upstream's refusal reaches a client socket as an error event with
// the refusal's headers (Retry-After, the rate limits), as the upstream's
// own WebSocket mode sends them, over either transport.
func TestASocketsErrorEventCarriesTheRefusalsHeaders(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			r := newSocketRig(t, tr, fakeupstream.Options{}, nil)
			c := dialSocket(t, r.url, "s1")
			r.fault.Store(&fakeupstream.Fault{Kind: fakeupstream.FaultStatus, Status: http.StatusTooManyRequests})
			a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "hi"})
			assert.Equal(t, int64(429), a.err.Get("status").Int(), "%s", a.err.Raw)
			assert.Equal(t, "1", a.err.Get("headers.retry-after").String(), "%s", a.err.Raw)
			assert.Equal(t, "1s", a.err.Get("headers.x-ratelimit-reset-requests").String())
			assert.False(t, a.err.Get("headers.content-type").Exists(), "not the body's own")
		})
	}
}

func TestCloseIdleSocketClosesTheConnectionIdleTheLongest(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	hello := map[string]any{"model": "gpt-test", "store": false, "input": "hello"}
	first := dialSocket(t, r.url, "s1")
	second := dialSocket(t, r.url, "s2")
	busy := dialSocket(t, r.url, "s3")
	busyConns := func() int {
		r.proxy.sockets.mu.Lock()
		defer r.proxy.sockets.mu.Unlock()
		n := 0
		for s := range r.proxy.sockets.open {
			if s.busy.Load() > 0 {
				n++
			}
		}
		return n
	}
	for _, c := range []*socketClient{second, first, busy} { // first is idle since its answer, after second's
		a := c.turn(hello)
		require.Equal(t, "response.completed", a.events[len(a.events)-1])
		require.Eventually(t, func() bool { return busyConns() == 0 }, 5*time.Second, time.Millisecond, "the turn answered")
	}
	// A message begun and not yet whole is in flight: its connection is
	// not idle. (Its first frames go once they fill the writer's buffer.)
	w, err := busy.ws.Writer(t.Context(), websocket.MessageText)
	require.NoError(t, err)
	_, err = w.Write([]byte(`{"type":"response.create","model":"gpt-test","store":false,"input":"` + strings.Repeat("a", 64<<10)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return busyConns() == 1 }, 5*time.Second, 10*time.Millisecond, "the message begun")

	assert.False(t, r.proxy.CloseUnusedSocket(), "every connection was used")
	for _, c := range []*socketClient{second, first} {
		require.True(t, r.proxy.CloseIdleSocket())
		_, err := c.next()
		assert.Equal(t, websocket.StatusTryAgainLater, websocket.CloseStatus(err), "%v", err)
	}
	assert.False(t, r.proxy.CloseIdleSocket(), "no idle connection left")
	_, err = w.Write([]byte(`"}`))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	a := busy.read()
	assert.Equal(t, "response.completed", a.events[len(a.events)-1], "the connection with a message in flight is kept")
}

func TestClientSocketLifetimeIsChecked(t *testing.T) {
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	_, err = New(Config{Store: st, Upstream: up, ClientSocketLifetime: -time.Second})
	assert.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
}

func TestSocketTurnsAreForwardedToTheirSocket(t *testing.T) {
	rs := newReplicaSet(t, 2)
	wsURL := func(i int) string { return "ws" + strings.TrimPrefix(rs.servers[i].URL, "http") + "/v1/responses" }
	first := newSocketConversation(dialSocket(t, wsURL(0), "s1"), false, false)
	first.say("hello")
	// The client opens another connection, on the other replica: it sends
	// its whole history first, then only new items.
	second := newSocketConversation(dialSocket(t, wsURL(1), "s1"), false, false)
	second.history = first.history
	second.say("again")
	second.say("once more")
	turns := int64(len(first.answers) + len(second.answers))
	assert.Eventually(t, func() bool { return rs.total().Continued == turns-1 }, 5*time.Second, time.Millisecond,
		"every turn but the first continues: %+v", rs.total())
	s := rs.total()
	assert.Equal(t, turns, s.Turns)
	assert.Equal(t, int64(len(second.answers)), s.Forwarded, "the second connection's turns run on the first's upstream socket")
	assert.Zero(t, s.ForwardFailures)
	assert.Zero(t, s.FullContextRetries)
}

func TestSocketContinuesAStringInput(t *testing.T) {
	r := newSocketRig(t, overWebSocket, fakeupstream.Options{}, nil)
	c := dialSocket(t, r.url, "s1")
	a := c.turn(map[string]any{"model": "gpt-test", "store": false, "input": "say <hi> & go"})
	require.Equal(t, "response.completed", a.events[len(a.events)-1])
	a = c.turn(map[string]any{"model": "gpt-test", "store": false, "previous_response_id": a.response.Get("id").String(),
		"input": []any{map[string]any{"role": "user", "content": "more"}}})
	require.Equal(t, "response.completed", a.events[len(a.events)-1], "%s", a.err.Raw)
	calls := r.upstreamCalls()
	require.Len(t, calls, 2)
	assert.Equal(t, `[{"role":"user","content":"say \u003chi\u003e \u0026 go"}]`, calls[0].Get("input").Raw,
		"a string input goes as the user message it stands for, as the client wrote it")
	assert.NotEmpty(t, calls[1].Get("previous_response_id").String(), "continued")
	assert.Equal(t, "more", calls[1].Get("input.0.content").String())
}

func TestSocketSendsAJSONAnswerAsEvents(t *testing.T) {
	// An upstream that answers JSON whatever the request's stream says.
	fake := fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		body, err = sjson.DeleteBytes(body, "stream")
		require.NoError(t, err)
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	u, err := NewHTTPUpstream(up.URL+"/v1", nil)
	require.NoError(t, err)
	p, err := New(Config{Store: st, Upstream: u})
	require.NoError(t, err)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s1")

	a := c.turn(map[string]any{"model": "gpt-test", "input": "hi"})
	assert.Equal(t, []string{"response.completed"}, a.events)
	id := a.response.Get("id").String()
	require.NotEmpty(t, id)
	a = c.turn(map[string]any{"model": "gpt-test", "previous_response_id": id,
		"input": []any{map[string]any{"role": "user", "content": "more"}}})
	assert.Equal(t, []string{"response.completed"}, a.events, "%s", a.err.Raw)
	assert.Equal(t, id, a.response.Get("previous_response_id").String())
	assert.Eventually(t, func() bool { return p.Stats().Continued == 1 }, 5*time.Second, time.Millisecond)

	a = c.turn(map[string]any{"input": "no model"})
	assert.Equal(t, []string{"error"}, a.events)
	assert.Equal(t, int64(400), a.err.Get("status").Int())
	assert.Equal(t, "missing_required_parameter", a.err.Get("error.code").String())
	assert.Equal(t, "model", a.err.Get("error.param").String())
}

// An upstream's error about an item of a message that continues the
// connection's latest response names the item as the message counts it:
// the client sent the new items only, whether the turn went continued or
// with the full context (store false over HTTP).
func TestSocketErrorsCountTheMessagesItems(t *testing.T) {
	for _, c := range []struct {
		tr     transport
		stores bool
	}{{overHTTP, true}, {overHTTP, false}, {overWebSocket, false}} {
		tr := c.tr
		r := newSocketRig(t, tr, fakeupstream.Options{}, nil)
		conv := newSocketConversation(dialSocket(t, r.url, "s1"), c.stores, false)
		conv.say("hello")
		body := conv.body()
		body["input"] = append(body["input"].([]any), map[string]any{"role": "user", "content": "again"}, map[string]any{"note": "not an item"})
		a := conv.c.turn(body)
		require.True(t, a.err.Exists(), "%s: events %v", tr, a.events)
		assert.Contains(t, a.err.Get("error.message").String(), "input[1]", "%s, store %v: %s", tr, c.stores, a.err.Raw)
	}
}

// An event the relay passes on unread reaches a socket client as one
// message, its data, however its bytes are split, showing the client's
// own previous_response_id where the added one went by as null; comments
// and events without data send nothing.
func TestAnEventPassedOnReachesASocketClientAsOneMessage(t *testing.T) {
	stream := "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"previous_response_id\":null}}\r\n\r\n" +
		": keep-alive\n\n" +
		"data:{\"a\":1,\ndata: \"b\":2}\n\n" +
		"id: 7\nretry: 10\ndata:  x\r\r" +
		"event: e\n\n"
	want := []string{`{"type":"response.created","response":{"id":"r","previous_response_id":"resp_client"}}`,
		"{\"a\":1,\n\"b\":2}", " x"}

	server, got := socketPair(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range len(stream) + 300 {
		sw := &socketWriter{ctx: t.Context(), ws: server, timeout: 5 * time.Second,
			header: http.Header{"Content-Type": {"text/event-stream"}}, prev: "resp_client"}
		sw.WriteHeader(http.StatusOK)
		for rest := stream; rest != ""; {
			n := min(len(rest), 1+rng.IntN(8))
			if run < len(stream) {
				n = min(len(rest), max(1, run)) // pieces of every size, then random ones
			}
			_, err := sw.Write([]byte(rest[:n]))
			require.NoError(t, err)
			rest = rest[n:]
		}
		for _, w := range want {
			select {
			case m := <-got:
				require.Equal(t, w, m, "run %d", run)
			case <-time.After(5 * time.Second):
				t.Fatalf("run %d: no message %q", run, w)
			}
		}
		assert.Nil(t, sw.msg, "no message left open")
	}
	select {
	case m := <-got:
		t.Fatalf("a message more: %q", m)
	default:
	}

	// A data line handed on in one piece is not gathered to be read.
	sw := &socketWriter{ctx: t.Context(), ws: server, timeout: 5 * time.Second,
		header: http.Header{"Content-Type": {"text/event-stream"}}}
	sw.WriteHeader(http.StatusOK)
	big := `{"t":"` + strings.Repeat("x", 1<<20) + `"}`
	_, err := sw.Write([]byte("data: " + big + "\n\n"))
	require.NoError(t, err)
	assert.Equal(t, big, <-got)
	assert.LessOrEqual(t, cap(sw.line), 64, "what it gathered of the line")
}

// socketPair returns the server end of a WebSocket connection and the
// messages its client end reads.
func socketPair(t *testing.T) (*websocket.Conn, <-chan string) {
	accepted := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		accepted <- ws
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	client, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	client.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = client.CloseNow() })
	server := <-accepted
	t.Cleanup(func() { _ = server.CloseNow() })
	got := make(chan string, 16)
	go func() {
		for {
			_, data, err := client.Read(context.Background())
			if err != nil {
				close(got)
				return
			}
			got <- string(data)
		}
	}()
	return server, got
}

// A socket turn's output is kept in the turn's hold, once: the relay's
// collector is the connection's, and an answer the hold has no room to
// keep leaves the connection keeping nothing.
func TestASocketTurnKeepsItsOutputInTheBudget(t *testing.T) {
	server, got := socketPair(t)
	b := newBudget(1 << 20)
	item := `{"type":"message","id":"m","role":"assistant","content":[{"type":"output_text","text":"` + strings.Repeat("x", 2<<20) + `"}]}`
	events := []event{
		newEvent("", []byte(`{"type":"response.created","response":{"id":"r","object":"response","status":"in_progress","output":[]}}`)),
		newEvent("", []byte(`{"type":"response.output_item.done","output_index":0,"item":`+item+`}`)),
		newEvent("", []byte(`{"type":"response.completed","response":{"id":"r","object":"response","status":"completed","output":[`+item+`]}}`)),
	}
	rep := &reply{status: http.StatusOK, header: http.Header{}, held: &hold{b: b}, next: func() (event, error) {
		if len(events) == 0 {
			return event{}, io.EOF
		}
		ev := events[0]
		events = events[1:]
		return ev, nil
	}}
	sw := &socketWriter{ctx: t.Context(), ws: server, timeout: 5 * time.Second,
		header: http.Header{"Content-Type": {"text/event-stream"}}}
	sw.WriteHeader(http.StatusOK)
	first, _ := rep.next()
	out := writeEvents(sw, rep, "", first, nil, nil)
	for range 3 {
		<-got
	}
	assert.True(t, out.unkept)
	assert.False(t, sw.col.continuable(), "the connection keeps nothing")
	assert.LessOrEqual(t, b.cur, b.size)
}

// A client WebSocket message that continues its connection's latest
// response is expanded into the whole conversation, a body the turn reads
// and parses as a request's: it is held in the budget as one
// (MaxBytesInFlight), not as the small message it came as.
func TestAnExpandedSocketTurnIsHeldInTheBudget(t *testing.T) {
	var calls atomic.Int32
	reached, let := make(chan struct{}), make(chan struct{})
	fake := fakeupstream.New(fakeupstream.Options{Fault: func(req fakeupstream.Request) fakeupstream.Fault {
		if calls.Add(1) == 2 {
			close(reached)
			<-let
		}
		return fakeupstream.Fault{}
	}})
	up := httptest.NewServer(fake)
	t.Cleanup(up.Close)
	p := limitedProxy(t, nil, up.URL+"/v1", Config{MaxBodyBytes: 8 << 20, MaxBytesInFlight: 64 << 20})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	letGo := sync.OnceFunc(func() { close(let) })
	t.Cleanup(letGo) // however the test ends: the servers' Close waits for the fake
	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s-expand")

	big := strings.Repeat("y", 3<<20)
	first := c.turn(map[string]any{"model": "m", "store": false, "input": []any{map[string]any{"role": "user", "content": big}}})
	require.False(t, first.err.Exists(), "%s", first.err.Raw)
	id := first.response.Get("id").String()

	c.create(map[string]any{"model": "m", "store": false, "previous_response_id": id,
		"input": []any{map[string]any{"role": "user", "content": "more"}}})
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the second turn did not reach the upstream")
	}
	p.budget.mu.Lock()
	cur := p.budget.cur
	p.budget.mu.Unlock()
	letGo()
	second := c.read()
	require.False(t, second.err.Exists(), "%s", second.err.Raw)
	assert.GreaterOrEqual(t, cur, int64(2*len(big)), "the expanded body, held as a request's")
}

// A JSON answer the budget has no room for goes to an HTTP client as it
// comes; a socket's client takes an answer as one message, which would
// hold it whole past the budget: it gets 502 upstream_disconnected (the
// upstream ran the turn) at once, and nothing of the answer is held.
func TestAJSONAnswerWithNoRoomIsNotHeldForASocketClient(t *testing.T) {
	const sent = 48 << 20
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		chunk := []byte(strings.Repeat("x", 64<<10))
		for n := 0; n < sent; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(upstream.Close)
	p := limitedProxy(t, nil, upstream.URL+"/v1", Config{MaxBytesInFlight: 4 << 20, MaxBodyBytes: 1 << 20})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s1")
	c.create(map[string]any{"model": "m", "input": "hi"})
	ev, err := c.next()
	require.NoError(t, err)
	assert.Equal(t, "error", ev.Get("type").String(), ev.Raw)
	assert.Equal(t, int64(http.StatusBadGateway), ev.Get("status").Int(), ev.Raw)
	assert.Equal(t, "upstream_disconnected", ev.Get("error.code").String(), ev.Raw)
	// The connection serves the next turn.
	c.create(map[string]any{"model": "m", "input": "again"})
	ev, err = c.next()
	require.NoError(t, err)
	assert.Equal(t, "upstream_disconnected", ev.Get("error.code").String(), ev.Raw)
}
