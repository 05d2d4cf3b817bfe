package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// transport names an upstream transport under test.
type transport string

const (
	overHTTP      transport = "http"
	overWebSocket transport = "websocket"
)

// rig is a proxy in front of the fake upstream.
type rig struct {
	proxy    *Proxy
	url      string // the proxy's /v1/responses
	upstream *httptest.Server
	fault    atomic.Pointer[func(fakeupstream.Request) fakeupstream.Fault]
}

// newRig starts the fake upstream and a proxy on st (an in-process store
// when nil) over tr.
func newRig(t testing.TB, tr transport, st *store.Store) *rig {
	t.Helper()
	r := &rig{}
	fake := fakeupstream.New(fakeupstream.Options{
		Script: fakeupstream.Script{ToolCalls: 2},
		Fault: func(req fakeupstream.Request) fakeupstream.Fault {
			if f := r.fault.Load(); f != nil {
				return (*f)(req)
			}
			return fakeupstream.Fault{}
		},
	})
	r.upstream = httptest.NewServer(fake)
	t.Cleanup(r.upstream.Close)
	r.proxy = newProxy(t, tr, st, r.upstream.URL+"/v1")
	srv := httptest.NewServer(r.proxy)
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/v1/responses"
	return r
}

// newProxy returns a proxy on st (an in-process store when nil) in front
// of base over tr.
func newProxy(t testing.TB, tr transport, st *store.Store, base string) *Proxy {
	t.Helper()
	var up Upstream
	var err error
	if st == nil {
		st, err = store.NewMemory(store.Options{Replica: "r1"})
		require.NoError(t, err)
	}
	switch tr {
	case overHTTP:
		up, err = NewHTTPUpstream(base, nil)
	case overWebSocket:
		up, err = NewWebSocketUpstream("ws"+strings.TrimPrefix(base, "http"),
			WebSocketOptions{Replica: st.Options().Replica, Sockets: 2})
	}
	require.NoError(t, err)
	p, err := New(Config{Store: st, Upstream: up})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// limitedProxy returns a proxy on st (an in-process store when nil) in
// front of base over HTTP, with cfg's limits and settings.
func limitedProxy(t testing.TB, st *store.Store, base string, cfg Config) *Proxy {
	t.Helper()
	var err error
	if st == nil {
		st, err = store.NewMemory(store.Options{Replica: "r1"})
		require.NoError(t, err)
	}
	cfg.Store = st
	cfg.Upstream, err = NewHTTPUpstream(base, nil)
	require.NoError(t, err)
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// hangsUp is an upstream that reads each request whole, counts it in
// posts and closes the connection without an answer.
func hangsUp(posts *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Add(1)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}
}

// setFault makes the fake upstream answer calls with f.
func (r *rig) setFault(f func(fakeupstream.Request) fakeupstream.Fault) { r.fault.Store(&f) }

// answer is a response as the client saw it.
type answer struct {
	status int
	// events are the SSE events' types, for a stream.
	events   []string
	response map[string]json.RawMessage // the final response object
	output   []json.RawMessage
	body     []byte
}

// next returns the input of a conversation's next turn: input, a's output
// items, then a user message saying text.
func (a answer) next(input []any, text string) []any {
	for _, it := range a.output {
		input = append(input, it)
	}
	return append(input, map[string]any{"role": "user", "content": text})
}

// post sends one request as the client would, its body compressed as
// header's Content-Encoding says (encode).
func post(t testing.TB, url string, header http.Header, body map[string]any) answer {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	b = encode(t, b, header.Get("Content-Encoding"))
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	require.NoError(t, err)
	if header != nil {
		req.Header = header.Clone()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		a.body, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		if a.status == http.StatusOK {
			require.NoError(t, json.Unmarshal(a.body, &a.response), "%s", a.body)
			require.NoError(t, json.Unmarshal(a.response["output"], &a.output))
		}
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		var ev struct {
			Type     string                     `json:"type"`
			Item     json.RawMessage            `json:"item"`
			Response map[string]json.RawMessage `json:"response"`
		}
		require.NoError(t, json.Unmarshal([]byte(line[len("data: "):]), &ev))
		a.events = append(a.events, ev.Type)
		switch ev.Type {
		case "response.output_item.done":
			a.output = append(a.output, ev.Item)
		case "response.completed", "response.failed", "response.incomplete":
			a.response = ev.Response
		}
	}
	return a
}

// conversation plays a client's tool loop: user turns, each answered after
// function calls, the whole history sent every time.
type conversation struct {
	t       testing.TB
	url     string
	header  http.Header
	params  map[string]any
	history []any
	// answers are every answer the client got.
	answers []answer
}

func newConversation(t testing.TB, url, session string, stream, stores bool) *conversation {
	return &conversation{t: t, url: url, header: http.Header{"X-Session-Id": {session}}, params: map[string]any{
		"model": "gpt-test", "stream": stream, "store": stores,
		"tools": []any{map[string]any{"type": "function", "name": "run_command", "parameters": map[string]any{
			"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}},
			"required": []any{"command"}}}},
	}}
}

// say sends a user message and runs the tool loop until the model answers.
func (c *conversation) say(text string) {
	c.t.Helper()
	c.history = append(c.history, map[string]any{"role": "user", "content": text})
	for step := 0; ; step++ {
		require.Less(c.t, step, 10, "the tool loop did not end")
		a := c.send(nil, c.history...)
		c.answers = append(c.answers, a)
		require.Equal(c.t, "null", string(a.response["previous_response_id"]), "the client sent no previous_response_id")
		var call bool
		for _, raw := range a.output {
			var it map[string]any
			require.NoError(c.t, json.Unmarshal(raw, &it))
			c.history = append(c.history, it)
			if it["type"] == "function_call" {
				call = true
				c.history = append(c.history, map[string]any{"type": "function_call_output",
					"call_id": it["call_id"], "output": "ok"})
			}
		}
		if !call {
			return
		}
	}
}

func TestConversationsContinue(t *testing.T) {
	for _, tc := range []struct {
		tr            transport
		stream, store bool
		continues     bool
	}{
		{overHTTP, false, true, true},
		{overHTTP, true, true, true},
		{overHTTP, true, false, false}, // the HTTP upstream cannot continue store=false
		{overWebSocket, true, false, true},
		{overWebSocket, false, false, true},
		{overWebSocket, true, true, true},
	} {
		t.Run(fmt.Sprintf("%s/stream=%v/store=%v", tc.tr, tc.stream, tc.store), func(t *testing.T) {
			r := newRig(t, tc.tr, nil)
			c := newConversation(t, r.url, "s1", tc.stream, tc.store)
			c.say("hello")
			c.say("again")
			turns := int64(len(c.answers))
			require.Equal(t, int64(6), turns, "2 user turns of 2 tool calls and a reply")
			st := r.proxy.Stats()
			assert.Equal(t, turns, st.Turns)
			if tc.continues {
				assert.Equal(t, turns-1, st.Continued, "every turn after the first continues")
				assert.Less(t, st.ItemsSent, st.ItemsReceived)
			} else {
				assert.Zero(t, st.Continued)
				assert.Equal(t, st.ItemsReceived, st.ItemsSent)
			}
			assert.Zero(t, st.FullContextRetries)
			if tc.stream {
				a := c.answers[len(c.answers)-1]
				assert.Equal(t, "response.created", a.events[0])
				assert.Equal(t, "response.completed", a.events[len(a.events)-1])
			}
		})
	}
}

// An error event in the middle of a continued turn's stream names the item
// as the client's request counts it too.
func TestLateErrorEventsOfContinuedTurnsCountTheClientsItems(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		resp := `{"id":"resp_1","object":"response","status":"in_progress","output":[]}`
		_, _ = io.WriteString(w, "data: {\"type\":\"response.created\",\"response\":"+resp+"}\n\n")
		if gjson.GetBytes(body, "previous_response_id").Exists() {
			_, _ = io.WriteString(w, `data: {"type":"error","code":"invalid_value","message":"Invalid 'input[0].content'.","param":"input[0].content"}`+"\n\n")
			return
		}
		done := `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hello"}]}]}`
		_, _ = io.WriteString(w, "data: {\"type\":\"response.completed\",\"response\":"+done+"}\n\n")
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	h := http.Header{"X-Session-Id": {"s1"}}
	input := []any{map[string]any{"role": "user", "content": "hi"}}
	first := post(t, srv.URL+"/v1/responses", h, map[string]any{"model": "m", "stream": true, "input": input})
	require.Equal(t, http.StatusOK, first.status)
	input = append(input, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "hello"}}},
		map[string]any{"role": "user", "content": "again"})
	body, err := json.Marshal(map[string]any{"model": "m", "stream": true, "input": input})
	require.NoError(t, err)
	resp, b := do(t, http.MethodPost, srv.URL+"/v1/responses", string(body), h)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), `"param":"input[2].content"`, "the third item of the client's request: %s", b)
}

// A conversation that opens with a string input and sends its history as
// an array after that, the string as the user message it stands for,
// continues from its first turn, with or without a session id.
func TestAStringOpeningContinues(t *testing.T) {
	for _, header := range []http.Header{nil, {"X-Session-Id": {"s1"}}} {
		r := newRig(t, overHTTP, nil)
		params := map[string]any{"model": "gpt-test", "input": "hello"}
		first := post(t, r.url, header, params)
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		params["input"] = first.next([]any{map[string]any{"role": "user", "content": "hello"}}, "again")
		second := post(t, r.url, header, params)
		require.Equal(t, http.StatusOK, second.status, "%s", second.body)
		assert.Equal(t, int64(1), r.proxy.Stats().Continued, "header %v", header)
	}
}

// An upstream's error about an item of a continued turn names the item
// as the client's request counts it, not as the delta sent upstream does:
// the client gets the error the full request gets.
func TestErrorsOfContinuedTurnsCountTheClientsItems(t *testing.T) {
	for _, c := range []struct {
		tr     transport
		stream bool
	}{{overHTTP, false}, {overHTTP, true}, {overWebSocket, false}, {overWebSocket, true}} {
		stream := c.stream
		r := newRig(t, c.tr, nil)
		h := http.Header{"X-Session-Id": {"s1"}}
		first := post(t, r.url, h, map[string]any{"model": "m", "stream": stream, "input": []any{map[string]any{"role": "user", "content": "hi"}}})
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		body := map[string]any{"model": "m", "stream": stream,
			"input": append(first.next([]any{map[string]any{"role": "user", "content": "hi"}}, "again"), map[string]any{"note": "not an item"})}
		before := r.proxy.Stats()
		got := post(t, r.url, h, body)
		after := r.proxy.Stats()
		require.Less(t, after.ItemsSent-before.ItemsSent, after.ItemsReceived-before.ItemsReceived,
			"%s, stream %v: the turn was continued", c.tr, stream)
		direct := post(t, r.upstream.URL+"/v1/responses", h, body)
		require.Equal(t, http.StatusBadRequest, direct.status, "%s", direct.body)
		assert.Equal(t, direct.status, got.status)
		assert.JSONEq(t, string(direct.body), string(got.body), "%s, stream %v", c.tr, stream)
	}
}

// A session id may name many conversations, as a prompt_cache_key an
// application sets per user does: interleaved, each continues its own.
func TestConversationsUnderOneSessionIDContinueInterleaved(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	a := newConversation(t, r.url, "per-user", false, true)
	b := newConversation(t, r.url, "per-user", false, true)
	for i := range 3 {
		a.say(fmt.Sprintf("first conversation, turn %d", i))
		b.say(fmt.Sprintf("second conversation, turn %d", i))
	}
	turns := int64(len(a.answers) + len(b.answers))
	st := r.proxy.Stats()
	require.Equal(t, turns, st.Turns)
	assert.Equal(t, turns-2, st.Continued, "every turn after each conversation's first continues")
}

// The turns' path with a trailing slash or doubled slashes, as a client's
// base URL may make it, still names the turns: they continue.
func TestTheTurnsPathHoweverSlashed(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	base := strings.TrimSuffix(r.url, "/v1/responses")
	for i, url := range []string{base + "/v1/responses/", base + "//v1//responses", base + "/v1/responses/"} {
		c := newConversation(t, url, "slashes", false, true)
		c.say(fmt.Sprintf("hello %d", i))
		c.say("again")
	}
	st := r.proxy.Stats()
	assert.Equal(t, int64(18), st.Turns, "3 conversations of 2 user turns of 2 tool calls and a reply")
	assert.Equal(t, int64(15), st.Continued)
	assert.Zero(t, st.Passthrough)
}

func TestRefusedContinuationIsRetriedWithFullContext(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			st, err := store.NewMemory(store.Options{Replica: "r1"})
			require.NoError(t, err)
			r := newRig(t, overHTTP, st)
			c := newConversation(t, r.url, "s1", stream, true)
			c.say("hello")
			// A new upstream holds none of the old one's responses.
			fresh := httptest.NewServer(fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}}))
			t.Cleanup(fresh.Close)
			p := newProxy(t, overHTTP, st, fresh.URL+"/v1")
			srv := httptest.NewServer(p)
			t.Cleanup(srv.Close)
			c.url = srv.URL + "/v1/responses"
			c.say("again")
			s := p.Stats()
			assert.Equal(t, int64(1), s.FullContextRetries, "the first turn on the new upstream is refused, then resent")
			assert.Equal(t, s.Turns-1, s.Continued, "the later turns continue on the new upstream")
		})
	}
}

func TestWebSocketContinuesOnlyOnTheSocketHoldingTheResponse(t *testing.T) {
	r := newLearnRig(t, overWebSocket, fakeupstream.New(fakeupstream.Options{}), Config{})
	a := newConversation(t, r.url, "a", true, false)
	b := newConversation(t, r.url, "b", true, false)
	a.say("hello")
	b.say("hello")
	a.say("again")
	b.say("again")
	st := r.proxy.Stats()
	// Two sockets, two conversations taking turns: each keeps its socket.
	assert.Equal(t, st.Turns-2, st.Continued)
	assert.Zero(t, st.FullContextRetries)

	// Three conversations on two sockets: a turn whose socket moved on
	// sends the full context, and nothing is refused; its log line says
	// why.
	c := newConversation(t, r.url, "c", true, false)
	c.say("hello")
	a.say("third")
	st = r.proxy.Stats()
	assert.Zero(t, st.FullContextRetries)
	assert.Equal(t, int64(1), st.ContinuationsUnreachable)
	assert.Equal(t, 1, r.log.count("reason=continuation_unreachable"))
	assert.Zero(t, r.log.count("reason=full_context_retry"))
}

func TestFailedResponsesAreAbortedAndShownAsSent(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tr, stream), func(t *testing.T) {
				r := newRig(t, tr, nil)
				c := newConversation(t, r.url, "s1", stream, tr == overHTTP)
				c.say("hello")
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
					return fakeupstream.Fault{Kind: fakeupstream.FaultFailed}
				})
				body := map[string]any{"input": append(c.history, map[string]any{"role": "user", "content": "x"})}
				for k, v := range c.params {
					body[k] = v
				}
				a := post(t, r.url, c.header, body)
				require.Equal(t, http.StatusOK, a.status)
				assert.Equal(t, `"failed"`, string(a.response["status"]))
				assert.Equal(t, "null", string(a.response["previous_response_id"]))
				if stream {
					assert.Equal(t, "response.failed", a.events[len(a.events)-1])
				}
				// The failed turn was aborted: the next one still continues
				// from the last completed response.
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return fakeupstream.Fault{} })
				before := r.proxy.Stats().Continued
				c.say("again")
				assert.Greater(t, r.proxy.Stats().Continued, before)
			})
		}
	}
}

// A continued turn the upstream answered with an error, or with a stream
// the client did not get to its end, gives its continuation back: sent
// again as it was (an SDK's retry), it continues from the same response.
func TestAFailedContinuedTurnSentAgainContinues(t *testing.T) {
	for _, f := range []fakeupstream.Fault{
		{Kind: fakeupstream.FaultStatus, Status: http.StatusInternalServerError},
		{Kind: fakeupstream.FaultStatus, Status: http.StatusTooManyRequests},
		{Kind: fakeupstream.FaultError},
		{Kind: fakeupstream.FaultFailed},
		{Kind: fakeupstream.FaultDrop, Events: 3},
	} {
		for _, stream := range []bool{false, true} {
			if f.Kind == fakeupstream.FaultDrop && !stream {
				continue // a JSON answer dropped is never answered
			}
			t.Run(fmt.Sprintf("fault=%d/%d/stream=%v", f.Kind, f.Status, stream), func(t *testing.T) {
				r := newRig(t, overHTTP, nil)
				c := newConversation(t, r.url, "s1", stream, true)
				c.say("hello")
				body := map[string]any{"input": append(c.history, map[string]any{"role": "user", "content": "x"})}
				for k, v := range c.params {
					body[k] = v
				}
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return f })
				before := r.proxy.Stats().Continued
				var steps stepLog
				r.proxy.cfg.Observer = &steps
				_ = post(t, r.url, c.header, body)
				require.Eventually(t, func() bool { return slices.Contains(steps.take(), "end:given_back") },
					5*time.Second, 10*time.Millisecond, "the failed turn ends given_back")
				if f.Kind != fakeupstream.FaultDrop {
					assert.Equal(t, int64(1), r.proxy.Stats().ErrorAnswers, "an error answer is counted")
				}
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return fakeupstream.Fault{} })
				again := post(t, r.url, c.header, body)
				require.Equal(t, http.StatusOK, again.status, "%s", again.body)
				assert.Equal(t, before+1, r.proxy.Stats().Continued, "the turn sent again continued (a failed one counts not)")
			})
		}
	}
}

// A response cut short (incomplete: max_output_tokens, a content filter)
// is kept upstream as any other: the client's next turn, which sends its
// output back, continues it.
func TestIncompleteResponsesAreContinued(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tr, stream), func(t *testing.T) {
				r := newRig(t, tr, nil)
				h := http.Header{"X-Session-Id": {"s1"}}
				params := map[string]any{"model": "m", "stream": stream, "store": tr == overHTTP}
				params["input"] = []any{map[string]any{"role": "user", "content": "hello"}}
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
					return fakeupstream.Fault{Kind: fakeupstream.FaultIncomplete}
				})
				first := post(t, r.url, h, params)
				require.Equal(t, http.StatusOK, first.status, "%s", first.body)
				require.Equal(t, `"incomplete"`, string(first.response["status"]))
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return fakeupstream.Fault{} })
				params["input"] = first.next(params["input"].([]any), "go on")
				second := post(t, r.url, h, params)
				require.Equal(t, http.StatusOK, second.status, "%s", second.body)
				assert.Equal(t, int64(1), r.proxy.Stats().Continued)
			})
		}
	}
}

func TestDroppedStreamAbortsTheTurn(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			r := newRig(t, tr, nil)
			c := newConversation(t, r.url, "s1", true, tr == overHTTP)
			c.say("hello")
			r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
				return fakeupstream.Fault{Kind: fakeupstream.FaultDrop, Events: 3}
			})
			body := map[string]any{"input": append(c.history, map[string]any{"role": "user", "content": "x"})}
			for k, v := range c.params {
				body[k] = v
			}
			a := post(t, r.url, c.header, body)
			require.Equal(t, http.StatusOK, a.status)
			assert.Len(t, a.events, 3, "the client sees what the upstream sent, then the end")
			assert.Equal(t, int64(1), r.proxy.Stats().UpstreamErrors)
			r.setFault(func(fakeupstream.Request) fakeupstream.Fault { return fakeupstream.Fault{} })
			c.say("again") // the dropped socket is replaced
		})
	}
}

func TestUpstreamErrorsReachTheClient(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tr, stream), func(t *testing.T) {
				r := newRig(t, tr, nil)
				r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
					return fakeupstream.Fault{Kind: fakeupstream.FaultStatus, Status: http.StatusTooManyRequests}
				})
				c := newConversation(t, r.url, "s1", stream, true)
				body := map[string]any{"input": []any{map[string]any{"role": "user", "content": "x"}}}
				for k, v := range c.params {
					body[k] = v
				}
				a := post(t, r.url, c.header, body)
				assert.Equal(t, http.StatusTooManyRequests, a.status)
				assert.Contains(t, string(a.body), "rate_limit_exceeded")
			})
		}
	}
}

// A turn the proxy cannot read, its body refused by the fingerprint or
// its owner named in a way the proxy cannot take, gets the upstream's own
// answer, as without the proxy: the body goes upstream as sent, outside the
// store. Only the proxy's own limits are its answers (413 here).
func TestTurnsTheProxyCannotReadGetTheUpstreamsAnswer(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	valid := `{"model":"m","input":[{"role":"user","content":"hi"}]}`
	send := func(url string, header http.Header, body string) (int, []byte) {
		resp, b := do(t, http.MethodPost, url, body, header)
		return resp.StatusCode, b
	}
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
	}{
		{"not JSON", nil, `{"model":`},
		{"not an object", nil, `["model"]`},
		{"too many members", nil, manyMembers(2000)},
		{"invalid input", nil, `{"model":"m","input":[{"a":1,"a":2}]}`},
		{"duplicate input", nil, `{"model":"m","input":[],"input":[{"role":"user","content":"hi"}]}`},
		{"null input", nil, `{"model":"m","input":null}`},
		{"lone surrogate", nil, `{"model":"m","input":[{"role":"user","content":"\ud83d"}]}`},
		{"empty session header", http.Header{"X-Session-Id": {""}}, valid},
		{"empty agent header", http.Header{"X-Session-Id": {"s"}, "X-Agent-Id": {""}}, valid},
		{"agent without session", http.Header{"X-Agent-Id": {"a"}}, valid},
		{"session not a string", nil, `{"model":"m","metadata":{"session_id":3},"input":[{"role":"user","content":"hi"}]}`},
		{"session too long", http.Header{"Session-Id": {strings.Repeat("x", 300)}}, valid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, b := send(r.url, tc.header, tc.body)
			direct, want := send(r.upstream.URL+"/v1/responses", tc.header, tc.body)
			require.Equal(t, direct, status, "%s", b)
			if status != http.StatusOK {
				assert.JSONEq(t, string(want), string(b))
			}
		})
	}
	assert.Equal(t, int64(7), r.proxy.Stats().Unread, "the seven bodies the fingerprint refuses")

	status, b := send(r.url, nil, `{"model":"m","input":"`+strings.Repeat("x", defaultMaxBodyBytes)+`"}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Contains(t, string(b), "larger than")
}

// deadUpstreamProxy serves a proxy over tr whose upstream cannot be
// reached.
func deadUpstreamProxy(t *testing.T, tr transport) *httptest.Server {
	t.Helper()
	dead := httptest.NewServer(http.NotFoundHandler())
	base := dead.URL + "/v1"
	dead.Close()
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, tr, st, base))
	t.Cleanup(srv.Close)
	return srv
}

// The log names an unreachable upstream's URL without its query, which
// may carry a credential: the operator's in the upstream URL, or the
// client's (?key=), over both transports.
func TestUpstreamErrorsLogNoQuery(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			dead := httptest.NewServer(http.NotFoundHandler())
			base := dead.URL + "/v1?api-key=OPERATORSECRET"
			dead.Close()
			p := newProxy(t, tr, nil, base)
			logs := &logBuffer{}
			p.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			srv := httptest.NewServer(p)
			t.Cleanup(srv.Close)
			a := post(t, srv.URL+"/v1/responses?key=CLIENTSECRET", nil, map[string]any{"model": "m", "input": "hi"})
			require.Equal(t, http.StatusBadGateway, a.status, "%s", a.body)
			assert.Positive(t, logs.count(strings.TrimPrefix(dead.URL, "http://")+"/v1/responses"), "the log names where")
			assert.Zero(t, logs.count("SECRET"), "%s", logs.b.String())
		})
	}
}

// A MaxBodyBytes that MaxBytesInFlight can never hold is warned of.
func TestABodyBoundTheBudgetCannotHoldIsWarnedOf(t *testing.T) {
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	for body, warned := range map[int64]int{1000: 1, 500: 0} {
		logs := &logBuffer{}
		p, err := New(Config{Store: st, Upstream: up, MaxBodyBytes: body, MaxBytesInFlight: 1000,
			Logger: slog.New(slog.NewTextHandler(logs, nil))})
		require.NoError(t, err)
		assert.Equal(t, warned, logs.count("never fit"), "MaxBodyBytes %d", body)
		_ = p.Close()
	}
}

// An upstream URL the proxy refuses is named without what may carry a
// credential: user information, query, fragment.
func TestARefusedUpstreamURLShowsNoCredential(t *testing.T) {
	for _, u := range []string{"https://u:PW@api.example/v1?api-key=SECRET", "https://api.example/v1?api-key=SECRET#PW",
		"ftp://api.example/v1?api-key=SECRET", "http://[::1?api-key=SECRET"} {
		_, err := NewHTTPUpstream(u, nil)
		require.ErrorIs(t, err, ErrInvalidConfig, u)
		assert.NotContains(t, err.Error(), "SECRET")
		assert.NotContains(t, err.Error(), "PW")
		_, err = NewWebSocketUpstream(strings.Replace(u, "https", "wss", 1), WebSocketOptions{Replica: "r1"})
		require.ErrorIs(t, err, ErrInvalidConfig, u)
		assert.NotContains(t, err.Error(), "SECRET")
	}
}

// assertTellsNoAddress checks that an error body shows the client no
// address, dial error or replica name: those go to the log.
func assertTellsNoAddress(t *testing.T, body []byte) {
	t.Helper()
	for _, leak := range []string{"127.0.0.1", "localhost", "dial", "refused", "http://", "ws://", "r1"} {
		assert.NotContains(t, string(body), leak)
	}
}

func TestUnreachableUpstreamIs502(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			srv := deadUpstreamProxy(t, tr)
			a := post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s"}},
				map[string]any{"model": "m", "input": "hi"})
			assert.Equal(t, http.StatusBadGateway, a.status)
			assert.Contains(t, string(a.body), "upstream_unreachable")
			assertTellsNoAddress(t, a.body)
		})
	}
}

// An upstream that takes a turn and closes the connection without an
// answer may have run it: the client is told so (upstream_disconnected),
// not that the upstream could not be reached, and the turn went once.
func TestAnUpstreamThatTakesATurnAndHangsUpIsNotUnreachable(t *testing.T) {
	var posts atomic.Int32
	up := httptest.NewServer(hangsUp(&posts))
	t.Cleanup(up.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, up.URL+"/v1"))
	t.Cleanup(srv.Close)
	for _, stream := range []bool{false, true} {
		a := post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s"}},
			map[string]any{"model": "m", "stream": stream, "input": "hi"})
		assert.Equal(t, http.StatusBadGateway, a.status)
		assert.Equal(t, "upstream_disconnected", gjson.GetBytes(a.body, "error.code").String(), "%s", a.body)
		assertTellsNoAddress(t, a.body)
	}
	assert.Equal(t, int32(2), posts.Load(), "each turn went once")
}

// A client that goes away, before the upstream answers or while it
// streams, ends its turn aborted: no upstream failure is counted or
// logged, since none happened.
func TestAClientGoneIsNoUpstreamFailure(t *testing.T) {
	// stalls answers a stream's first event, then nothing until its
	// client goes.
	stalls := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"+
			"\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(stalls.Close)
	for _, tc := range []struct {
		name string
		tr   transport
		mid  bool // gone mid-stream, after the first event
	}{{"before the answer", overHTTP, false}, {"before the answer", overWebSocket, false}, {"mid-stream", overHTTP, true}} {
		t.Run(fmt.Sprintf("%s/%s", tc.name, tc.tr), func(t *testing.T) {
			r := newRig(t, tc.tr, nil)
			if tc.mid {
				st, err := store.NewMemory(store.Options{Replica: "r1"})
				require.NoError(t, err)
				r.proxy = newProxy(t, overHTTP, st, stalls.URL+"/v1")
				srv := httptest.NewServer(r.proxy)
				t.Cleanup(srv.Close)
				r.url = srv.URL + "/v1/responses"
			}
			var reached <-chan struct{}
			release := func() {}
			if !tc.mid {
				reached, release = r.holdUpstream(t)
			}
			var steps stepLog
			r.proxy.cfg.Observer = &steps
			logs := &logBuffer{}
			r.proxy.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))

			body, err := json.Marshal(map[string]any{"model": "gpt-test", "stream": true, "input": "hi"})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("X-Session-Id", "s1")
			if tc.mid {
				hangUpAfterFirstLine(t, req, cancel)
			} else {
				go func() { <-reached; cancel() }()
				_, err := http.DefaultClient.Do(req)
				require.ErrorIs(t, err, context.Canceled)
				if tc.tr == overWebSocket {
					// A WebSocket upstream's answer is read to its end, the
					// client gone or not, so that the socket carries the
					// next turn. Whether the relay still finds the client
					// there depends on when the server noticed it went.
					release()
				}
			}
			var seen []string
			ended := func() bool {
				return slices.Contains(seen, "end:aborted") || tc.tr == overWebSocket && slices.Contains(seen, "end:recorded")
			}
			if !assert.Eventually(t, func() bool {
				seen = append(seen, steps.take()...)
				return ended()
			}, 10*time.Second, 5*time.Millisecond) {
				t.Fatalf("steps seen: %v", seen)
			}
			assert.NotContains(t, seen, "attempt:unreachable")
			assert.Zero(t, r.proxy.Stats().UpstreamErrors)
			assert.Zero(t, logs.count("level=WARN"), "%s", logs.b.String())
		})
	}
}

// An upstream that does not begin its answer within UpstreamTimeout gets
// its client a 504, over either transport, stream or not: no stream is
// begun and cut.
func TestASilentUpstreamIs504(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tr, stream), func(t *testing.T) {
				r := newRig(t, tr, nil)
				r.proxy.cfg.UpstreamTimeout = 200 * time.Millisecond
				r.holdUpstream(t)
				a := post(t, r.url, http.Header{"X-Session-Id": {"s"}}, map[string]any{"model": "m", "input": "hi", "stream": stream})
				assert.Equal(t, http.StatusGatewayTimeout, a.status, "%s", a.body)
				assert.Equal(t, "upstream_timeout", gjson.GetBytes(a.body, "error.code").String(), "%s", a.body)
			})
		}
	}
}

// hangUpAfterFirstLine sends req, whose context cancel ends, reads the
// first line of its answer (its first event began) and hangs up.
func hangUpAfterFirstLine(t *testing.T, req *http.Request, cancel context.CancelFunc) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
}

func TestClientHangingUpAbortsTheTurn(t *testing.T) {
	r := newRig(t, overWebSocket, nil)
	c := newConversation(t, r.url, "s1", true, false)
	c.say("hello")
	body, err := json.Marshal(map[string]any{"model": "gpt-test", "stream": true, "store": false,
		"input": append(c.history, map[string]any{"role": "user", "content": "x"}), "tools": c.params["tools"]})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header = c.header.Clone()
	hangUpAfterFirstLine(t, req, cancel)
	// The socket is read to its end and reused; the conversation goes on.
	require.Eventually(t, func() bool { return r.proxy.Stats().Turns == int64(len(c.answers))+1 }, 10*time.Second, time.Millisecond)
	c.say("again")
}

// firstResponse answers a first request without a session through r and
// returns its response's id.
func (r *rig) firstResponse(t *testing.T) string {
	t.Helper()
	first := post(t, r.url, nil, map[string]any{"model": "m", "input": "hi"})
	require.Equal(t, http.StatusOK, first.status)
	var id string
	require.NoError(t, json.Unmarshal(first.response["id"], &id))
	return id
}

func TestPassthroughRequestsSkipTheStore(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	id := r.firstResponse(t)
	a := post(t, r.url, nil, map[string]any{"model": "m", "input": "again", "previous_response_id": id})
	require.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, `"`+id+`"`, string(a.response["previous_response_id"]), "the client's own id is shown")
	assert.Equal(t, int64(1), r.proxy.Stats().Passthrough)
}

// A request that names its previous response before its input takes no
// decision, and its input is not read: an item the scanner would refuse
// (a duplicate key, which JSON decoders accept) goes upstream as received,
// and no item is counted.
func TestPassthroughRequestsAreNotFingerprinted(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	id := r.firstResponse(t)
	items := `[{"role":"user","content":"again","content":"again"}]`
	status, _, _, err := postBytes(t.Context(), r.url, "s1", []byte(`{"model":"m","previous_response_id":"`+id+`","input":`+items+`}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	s := r.proxy.Stats()
	assert.Equal(t, int64(1), s.Passthrough)
	assert.Equal(t, int64(1), s.ItemsReceived, "the first turn's item only")

	// Named after the input, the previous response comes too late: the
	// input was read, and refused; the body goes upstream as received all
	// the same (TestTurnsTheProxyCannotReadGetTheUpstreamsAnswer).
	status, _, _, err = postBytes(t.Context(), r.url, "s1", []byte(`{"model":"m","input":`+items+`,"previous_response_id":"`+id+`"}`))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, int64(1), r.proxy.Stats().ItemsReceived, "its items were not counted")
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	st, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	for name, cfg := range map[string]Config{
		"no store":     {Upstream: up},
		"no upstream":  {Store: st},
		"bad source":   {Store: st, Upstream: up, Identity: Identity{Session: []Source{{}}}},
		"neg body":     {Store: st, Upstream: up, MaxBodyBytes: -1},
		"neg timeouts": {Store: st, Upstream: up, UpstreamTimeout: -1},
	} {
		_, err := New(cfg)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
	for _, u := range []string{"ftp://x/v1", "http:///v1", "::"} {
		_, err := NewHTTPUpstream(u, nil)
		assert.ErrorIs(t, err, ErrInvalidConfig, u)
	}
	_, err = NewWebSocketUpstream("http://x/v1", WebSocketOptions{Replica: "r"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewWebSocketUpstream("ws://x/v1", WebSocketOptions{})
	assert.ErrorIs(t, err, ErrInvalidConfig, "no replica")
}

func TestAFailingStoreFailsOpen(t *testing.T) {
	st, err := store.NewRedis(redistest.Failing(t), store.Options{Replica: "r1", OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	r := newRig(t, overHTTP, st)
	c := newConversation(t, r.url, "s1", true, true)
	c.say("hello") // every turn answered, with the full context
	s := r.proxy.Stats()
	assert.Zero(t, s.Continued)
	assert.Equal(t, s.ItemsReceived, s.ItemsSent)
}

// manyMembers is a body with n top-level members besides its input.
func manyMembers(n int) string {
	var b strings.Builder
	b.WriteString(`{"input":[]`)
	for i := range n {
		fmt.Fprintf(&b, `,"m%d":1`, i)
	}
	return b.String() + "}"
}

// A client that sends its next turn the moment it reads the end of the
// previous one (before the stream's own end) still continues: the proxy
// records a completed response before the client gets its terminal event.
func TestTheNextTurnSentAtTheTerminalEventContinues(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			r := newRig(t, tr, nil)
			input := []any{map[string]any{"role": "user", "content": "hi"}}
			for turn := range 20 {
				body, _ := json.Marshal(map[string]any{"model": "gpt-test", "stream": true, "store": tr == overHTTP, "input": input})
				req, _ := http.NewRequest(http.MethodPost, r.url, bytes.NewReader(body))
				req.Header.Set("X-Session-Id", "s-eager")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(nil, 1<<20)
				var completed gjson.Result
				for sc.Scan() {
					if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok && gjson.Get(line, "type").String() == "response.completed" {
						completed = gjson.Get(line, "response")
						break // the next turn goes now, the stream not yet read to its end
					}
				}
				require.True(t, completed.Exists(), "turn %d completed", turn)
				for _, it := range completed.Get("output").Array() {
					input = append(input, json.RawMessage(it.Raw))
				}
				input = append(input, map[string]any{"role": "user", "content": fmt.Sprint("more ", turn)})
				defer resp.Body.Close()
			}
			st := r.proxy.Stats()
			assert.Equal(t, st.Turns-1, st.Continued, "every turn after the first continues")
		})
	}
}

// heldCalls is a go-redis hook that holds each call of a script before
// it reaches the server until the test lets it go, and notes one nobody
// let go within five seconds. It holds FCALL and EVALSHA, not the EVAL
// that follows an EVALSHA the server did not know, so a call is held
// once.
type heldCalls struct {
	script  *lua.Script // whose calls it holds
	release chan struct{}
	stuck   atomic.Bool
}

func (*heldCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*heldCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *heldCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && slices.Contains([]any{h.script.Function(), h.script.Hash()}, args[1]) {
			select {
			case <-h.release:
			case <-time.After(5 * time.Second):
				h.stuck.Store(true)
			}
		}
		return next(ctx, cmd)
	}
}

// let releases the call held after d, on a goroutine of its own.
func (h *heldCalls) let(t *testing.T, d time.Duration) {
	go func() {
		time.Sleep(d)
		select {
		case h.release <- struct{}{}:
		case <-time.After(5 * time.Second):
			t.Error("no call held")
		}
	}()
}

// newHeldRig returns a rig on a store on miniredis (namespace, guesses as
// in opts: a store that keeps guesses has found that owners stay) whose
// calls of script wait for held to let them go, with Affinity as given,
// and the miniredis.
func newHeldRig(t *testing.T, script *lua.Script, opts store.Options, affinity bool) (*rig, *heldCalls, *miniredis.Miniredis) {
	t.Helper()
	held := &heldCalls{script: script, release: make(chan struct{})}
	mr, rc := redistest.Miniredis(t)
	opts.Replica, opts.OpTimeout = "r1", 10*time.Second
	st, err := store.NewRedis(rc, opts)
	require.NoError(t, err)
	if opts.GuessOwners > 0 {
		storetest.OwnersStay(t, st) // the store guesses from the start
	}
	rc.AddHook(held)
	r := newRig(t, overHTTP, st)
	r.proxy.cfg.Affinity = affinity
	return r, held, mr
}

// With Affinity, or for a turn sent on its guess, the client gets a
// completed response's end while its record is still in flight, which
// keeps the body's weight in the budget; the owner's next turn, sent at
// once, waits for the record and continues; Close waits for the records
// in flight. Otherwise the client gets the end once the record is in.
func TestWithAffinityOrAGuessTheClientDoesNotWaitForTheRecord(t *testing.T) {
	const hold = 30 * time.Millisecond
	for _, mode := range []struct {
		name        string
		affinity    bool
		guessOwners int
	}{{"plain", false, 0}, {"guesses", false, 16}, {"affinity", true, 0}} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", mode.name, stream), func(t *testing.T) {
				r, held, _ := newHeldRig(t, lua.Record, store.Options{Namespace: "held", GuessOwners: mode.guessOwners}, mode.affinity)
				handled := make(chan struct{}, 1) // a turn's handler has returned
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					r.proxy.ServeHTTP(w, req)
					handled <- struct{}{}
				}))
				t.Cleanup(srv.Close)
				// inFlight tells whether turn's record is in flight as the
				// client gets its end: with Affinity, or on its guess.
				inFlight := func(turn int) bool { return mode.affinity || mode.guessOwners > 0 && turn > 0 }
				input := []any{map[string]any{"role": "user", "content": "hi"}}
				const turns = 6
				for turn := range turns {
					sent := time.Now()
					if !inFlight(turn) || turn > 0 && inFlight(turn-1) {
						held.let(t, hold) // this turn's record, or the previous turn's after this turn's request went
					}
					a := post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s-held"}},
						map[string]any{"model": "gpt-test", "stream": stream, "input": input})
					require.Equal(t, http.StatusOK, a.status, "%s", a.body)
					require.Equal(t, `"completed"`, string(a.response["status"]), "turn %d completed", turn)
					select {
					case <-handled:
					case <-time.After(5 * time.Second):
						t.Fatalf("turn %d: the handler did not return", turn)
					}
					if inFlight(turn) {
						require.False(t, held.stuck.Load(), "turn %d: the client got the end only after its record", turn)
					} else {
						require.GreaterOrEqual(t, time.Since(sent), hold, "turn %d: the client got the end before its record", turn)
					}
					input = a.next(input, fmt.Sprint("more ", turn))
				}
				stats := r.proxy.Stats()
				assert.Equal(t, stats.Turns-1, stats.Continued, "every turn after the first continues")
				if mode.guessOwners > 0 {
					assert.Equal(t, stats.Turns-1, stats.Guessed, "every turn after the first goes on its guess")
				}
				if !inFlight(turns - 1) {
					assert.True(t, budgetFree(r.proxy), "a turn's body leaves the budget once its handler returned")
					return
				}
				assert.False(t, budgetFree(r.proxy), "the record in flight keeps its body's weight after its handler returned")
				closed := make(chan struct{})
				go func() { _ = r.proxy.Close(); close(closed) }()
				select {
				case <-closed:
					t.Fatal("Close returned with a record in flight")
				case <-time.After(hold):
				}
				held.let(t, 0)
				select {
				case <-closed:
				case <-time.After(5 * time.Second):
					t.Fatal("Close did not return once the record ended")
				}
				assert.True(t, budgetFree(r.proxy), "the record gave its body's weight back")
			})
		}
	}
}

// Events that the upstream sends together reach the client together; an
// event after which the upstream waits reaches the client before the
// upstream goes on.
func TestEventsReachTheClientBeforeTheUpstreamGoesOn(t *testing.T) {
	release := make(chan struct{})
	let := sync.OnceFunc(func() { close(release) })
	events := func(w io.Writer, evs ...string) {
		for _, ev := range evs {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", gjson.Get(ev, "type").String(), ev)
		}
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		events(w,
			`{"type":"response.created","response":{"id":"resp_1","status":"in_progress","output":[]}}`,
			`{"type":"response.in_progress","response":{"id":"resp_1","status":"in_progress","output":[]}}`)
		w.(http.Flusher).Flush()
		select {
		case <-release: // the client has read both
		case <-time.After(10 * time.Second):
			return
		}
		item := `{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}`
		events(w,
			`{"type":"response.output_item.done","output_index":0,"item":`+item+`}`,
			`{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[`+item+`]}}`)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(let)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overHTTP, st, up.URL+"/v1"))
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses",
		strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
	require.NoError(t, err)
	req.Header.Set("X-Session-Id", "s1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var seen []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if typ, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			seen = append(seen, typ)
			if typ == "response.in_progress" {
				let()
			}
		}
	}
	assert.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.done", "response.completed"}, seen)
}

// The previous_response_id the proxy sent shows as null in the events,
// however the upstream spells it; other ids, and events without it, pass
// unchanged.
func TestHideIDHoweverSpelled(t *testing.T) {
	for data, want := range map[string]string{
		`{"response":{"id":"resp_2","previous_response_id":"resp_1"}}`:                           `{"response":{"id":"resp_2","previous_response_id":null}}`,
		`{"response":{"id":"resp_2","previous_response_id":"resp\u005f1"}}`:                      `{"response":{"id":"resp_2","previous_response_id":null}}`,
		`{"response":{"id":"resp_2","previous_response_id":"resp_9"}}`:                           `{"response":{"id":"resp_2","previous_response_id":"resp_9"}}`,
		`{"type":"response.output_text.delta","delta":"resp_1"}`:                                 `{"type":"response.output_text.delta","delta":"resp_1"}`,
		"{\n  \"response\": {\n    \"previous_response_id\" : \"resp_1\",\n    \"x\": 1\n  }\n}": "{\n  \"response\": {\n    \"previous_response_id\" : null,\n    \"x\": 1\n  }\n}",
	} {
		assert.Equal(t, want, string(hideID([]byte(data), "response.previous_response_id", "resp_1")), data)
	}
}

// flushRecorder records what a handler wrote and what of it was flushed.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushed string
}

func (f *flushRecorder) Flush() { f.flushed = f.Body.String() }

// Events that came together with the stream's end, or before its terminal
// event, reach the client before the turn is recorded and before a cut
// stream ends: none waits in the relay's buffer.
func TestEventsAreFlushedBeforeTheRecordAndTheCut(t *testing.T) {
	events := func(evs ...event) *reply {
		rep := &reply{stream: &waitReader{r: strings.NewReader("")}}
		rep.next = func() (event, error) {
			if len(evs) == 0 {
				return event{}, io.ErrUnexpectedEOF // came with the last events: no read waits
			}
			ev := evs[0]
			evs = evs[1:]
			return ev, nil
		}
		return rep
	}
	delta := event{typ: "response.output_text.delta", data: []byte(`{"type":"response.output_text.delta","delta":"hi"}`)}
	completed := event{typ: "response.completed", data: []byte(`{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[]}}`)}

	w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	rep := events(delta, delta)
	ev, err := rep.next()
	out := writeEvents(w, rep, "", ev, err, nil)
	assert.True(t, out.cut)
	assert.Equal(t, 2, strings.Count(w.flushed, "event: response.output_text.delta"), "both events before the cut")

	w = &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	rep = events(delta, completed)
	ev, err = rep.next()
	var atSeal string
	writeEvents(w, rep, "", ev, err, func(outcome) { atSeal = w.flushed })
	assert.Contains(t, atSeal, "event: response.output_text.delta", "the delta reached the client before the record")
	assert.Contains(t, w.flushed, "event: response.completed")
}

// A streamed turn reads the upstream's stream to its end, after the
// terminal event, so that the next turn finds the connection idle rather
// than dialing; an upstream that keeps the stream open after its terminal
// event does not hold the client's turn beyond a moment.
func TestStreamedTurnsKeepTheirUpstreamConnection(t *testing.T) {
	var conns atomic.Int64
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	var holdOpen atomic.Bool
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		item := `{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}`
		fmt.Fprintf(w, "event: response.completed\ndata: %s\n\n",
			`{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[`+item+`]}}`)
		w.(http.Flusher).Flush()
		if holdOpen.Load() {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			return
		}
		// The stream's end comes after its last event: a moment later,
		// well within what the proxy waits for it (drainWait) even on a
		// busy machine.
		time.Sleep(time.Millisecond)
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overHTTP, st, up.URL+"/v1"))
	t.Cleanup(srv.Close)
	turn := func() {
		t.Helper()
		status, _, _, err := postBytes(t.Context(), srv.URL+"/v1/responses", "s1", []byte(`{"model":"m","stream":true,"input":"hi"}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
	}
	for range 5 {
		turn()
	}
	assert.Equal(t, int64(1), conns.Load(), "five streamed turns on one connection")

	holdOpen.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); turn() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a stream kept open after its terminal event held the turn")
	}
}

// A client that sends its turn and closes its side of the connection (a
// half-close, which ends the request's context) reads an error, not an
// empty 200, when its turn ends before the answer began.
func TestAClientThatHalfClosesReadsAnError(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // answers nothing while its client is there
	}))
	t.Cleanup(up.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, up.URL+"/v1"))
	t.Cleanup(srv.Close)
	body := `{"model":"m","input":"hi"}`
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	assert.Equal(t, statusClientClosed, resp.StatusCode, "%s", got)
	assert.Equal(t, "client_closed_request", gjson.GetBytes(got, "error.code").String(), "%s", got)
}

// An answer whose headers are larger than a client can read is not passed
// on: the turn fails as one the upstream took and did not answer.
func TestAnAnswerWithHugeHeadersIsNotPassedOn(t *testing.T) {
	var posts atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Add(1)
		w.Header().Set("X-Big", strings.Repeat("x", 2*maxResponseHeaderBytes))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[]}`)
	}))
	t.Cleanup(up.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, up.URL+"/v1"))
	t.Cleanup(srv.Close)
	a := post(t, srv.URL+"/v1/responses", http.Header{"X-Session-Id": {"s"}}, map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusBadGateway, a.status)
	assert.Equal(t, "upstream_disconnected", gjson.GetBytes(a.body, "error.code").String(), "%s", a.body)
	assert.Equal(t, int32(1), posts.Load(), "the turn went once")
}
