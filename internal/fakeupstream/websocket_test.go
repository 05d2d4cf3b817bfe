package fakeupstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

// wsClient is a WebSocket mode client.
type wsClient struct {
	t   *testing.T
	ctx context.Context
	c   *websocket.Conn
}

func dialPath(t *testing.T, srv *httptest.Server, path string, headers ...string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	h := http.Header{}
	for i := 0; i+1 < len(headers); i += 2 {
		h.Set(headers[i], headers[i+1])
	}
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+path, &websocket.DialOptions{HTTPHeader: h})
	require.NoError(t, err)
	c.SetReadLimit(-1)
	t.Cleanup(func() { c.CloseNow() })
	return &wsClient{t: t, ctx: ctx, c: c}
}

func dial(t *testing.T, srv *httptest.Server, headers ...string) *wsClient {
	t.Helper()
	return dialPath(t, srv, "/v1/responses", headers...)
}

func (w *wsClient) sendRaw(s string) {
	w.t.Helper()
	require.NoError(w.t, w.c.Write(w.ctx, websocket.MessageText, []byte(s)))
}

// send sends a response.create with members.
func (w *wsClient) send(members map[string]any) {
	w.t.Helper()
	m := map[string]any{"type": "response.create"}
	for k, v := range members {
		m[k] = v
	}
	w.sendRaw(body(w.t, m))
}

func (w *wsClient) readRaw() (string, error) {
	typ, data, err := w.c.Read(w.ctx)
	if err == nil && typ != websocket.MessageText {
		err = fmt.Errorf("a %v message", typ)
	}
	return string(data), err
}

func (w *wsClient) read() map[string]any {
	w.t.Helper()
	raw, err := w.readRaw()
	require.NoError(w.t, err)
	return decode(w.t, raw)
}

// ends tells whether an event is the last one of a response.
func ends(ev map[string]any) bool {
	switch ev["type"] {
	case "response.completed", "response.failed", "response.incomplete", "error":
		return true
	}
	return false
}

// events reads the events of one response, up to its last.
func (w *wsClient) events() []map[string]any {
	w.t.Helper()
	var out []map[string]any
	for {
		ev := w.read()
		out = append(out, ev)
		if ends(ev) {
			return out
		}
	}
}

// turn sends a response.create and reads its events.
func (w *wsClient) turn(members map[string]any) []map[string]any {
	w.t.Helper()
	w.send(members)
	return w.events()
}

// completed returns the response of a turn that must have completed.
func (w *wsClient) completed(members map[string]any) map[string]any {
	w.t.Helper()
	events := w.turn(members)
	last := events[len(events)-1]
	require.Equal(w.t, "response.completed", last["type"], "%v", last)
	return last["response"].(map[string]any)
}

// notFound checks the error event of a previous_response_id the
// connection cannot resolve.
func (w *wsClient) notFound(members map[string]any) {
	w.t.Helper()
	events := w.turn(members)
	require.Len(w.t, events, 1)
	raw, err := json.Marshal(events[0])
	require.NoError(w.t, err)
	require.JSONEq(w.t, `{"type":"error","status":400,"error":{"type":"invalid_request_error",
		"code":"previous_response_not_found","message":"Previous response with id '`+
		members["previous_response_id"].(string)+`' not found.","param":"previous_response_id"}}`, string(raw))
}

func with(base map[string]any, kv ...any) map[string]any {
	m := map[string]any{}
	for k, v := range base {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func messageOf(resp map[string]any) string {
	var b strings.Builder
	for _, it := range resp["output"].([]any) {
		item := it.(map[string]any)
		if item["type"] == "message" {
			for _, part := range item["content"].([]any) {
				b.WriteString(part.(map[string]any)["text"].(string))
			}
		}
	}
	return b.String()
}

func TestWebSocketSendsTheStreamEvents(t *testing.T) {
	req := map[string]any{
		"model": "m", "store": false, "tools": []any{json.RawMessage(execCommandTool)},
		"reasoning": map[string]any{"summary": "auto"}, "include": []string{"reasoning.encrypted_content"},
		"input": []any{userMessage("hi")},
	}
	_, httpSrv := newTestUpstream(t, Script{ToolCalls: 1}, nil)
	resp := post(t, httpSrv.URL+"/v1/responses", body(t, with(req, "stream", true)))
	var want []string
	for _, ev := range readSSE(t, resp.Body) {
		want = append(want, ev.raw)
	}

	_, wsSrv := newTestUpstream(t, Script{ToolCalls: 1}, nil) // the same seed: the same ids
	ws := dial(t, wsSrv)
	ws.send(req)
	var got []string
	for len(got) < len(want) {
		raw, err := ws.readRaw()
		require.NoError(t, err)
		got = append(got, raw)
	}
	require.Equal(t, want, got)
}

func TestWebSocketToolLoopWithStoreFalse(t *testing.T) {
	_, srv := newTestUpstream(t, Script{ToolCalls: 2}, nil)
	ws := dialPath(t, srv, "/api/openai/responses")
	base := map[string]any{"model": "m", "store": false, "tools": []any{json.RawMessage(shellTool)}}
	input := []any{userMessage("go")}
	prev := ""
	var kindsSeen []string
	for range 3 {
		req := with(base, "input", input)
		if prev != "" {
			req["previous_response_id"] = prev
		}
		resp := ws.completed(req)
		require.Equal(t, false, resp["store"])
		prev = resp["id"].(string)
		input = nil
		for _, it := range resp["output"].([]any) {
			item := it.(map[string]any)
			kindsSeen = append(kindsSeen, item["type"].(string))
			if item["type"] == "function_call" {
				input = append(input, map[string]any{"type": "function_call_output", "call_id": item["call_id"], "output": "ok"})
			}
		}
		if len(input) == 0 {
			// The answer saw the whole conversation: the user message and
			// two calls with their outputs.
			require.Contains(t, messageOf(resp), "after 2 tool calls (5 items seen)")
		}
	}
	require.Equal(t, []string{"function_call", "function_call", "message"}, kindsSeen)
}

func TestWebSocketCacheIsConnectionLocal(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	first, second := dial(t, srv), dial(t, srv)
	r1 := first.completed(map[string]any{"model": "m", "store": false, "input": "one"})
	id := r1["id"].(string)

	second.notFound(map[string]any{"model": "m", "store": false, "previous_response_id": id, "input": "two"})
	second.notFound(map[string]any{"model": "m", "previous_response_id": id, "input": "two"}) // never stored
	// The connection stays usable.
	require.Contains(t, messageOf(second.completed(map[string]any{"model": "m", "store": false, "input": "three"})),
		"(1 items seen)")

	// The first connection still continues it.
	r2 := first.completed(map[string]any{"model": "m", "store": false, "previous_response_id": id, "input": "two"})
	require.Equal(t, id, r2["previous_response_id"])
	require.Contains(t, messageOf(r2), "(3 items seen)")
}

func TestWebSocketStoredResponsesContinueAnywhere(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	first, second := dial(t, srv), dial(t, srv)
	r1 := first.completed(map[string]any{"model": "m", "store": true, "input": "one"})
	id := r1["id"].(string)

	// Hydrated from the store, on another connection...
	r2 := second.completed(map[string]any{"model": "m", "previous_response_id": id, "input": "two"})
	require.Contains(t, messageOf(r2), "(3 items seen)")
	// ... and over HTTP.
	resp := post(t, srv.URL+"/v1/responses", `{"model":"m","previous_response_id":"`+id+`","input":"two"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	// But not for a store=false request.
	dial(t, srv).notFound(map[string]any{"model": "m", "store": false, "previous_response_id": id, "input": "two"})
}

func TestWebSocketKeepsOnlyTheLatestResponse(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	ws := dial(t, srv)
	a := ws.completed(map[string]any{"model": "m", "store": false, "input": "a"})["id"].(string)
	b := ws.completed(map[string]any{"model": "m", "store": false, "input": "b"})["id"].(string)
	ws.notFound(map[string]any{"model": "m", "store": false, "previous_response_id": a, "input": "a2"})
	require.Contains(t, messageOf(ws.completed(map[string]any{"model": "m", "store": false, "previous_response_id": b, "input": "b2"})),
		"(3 items seen)")
}

func TestWebSocketFailedTurnEvictsTheResponseItReferenced(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	ws := dial(t, srv)
	a := ws.completed(map[string]any{"model": "m", "store": false, "input": "a"})["id"].(string)

	// A failure that references nothing keeps the cache.
	events := ws.turn(map[string]any{"store": false, "input": "no model"})
	require.Len(t, events, 1)
	require.EqualValues(t, 400, events[0]["status"])
	require.Equal(t, "missing_required_parameter", events[0]["error"].(map[string]any)["code"])

	// A failure that references the latest response evicts it.
	events = ws.turn(map[string]any{"store": false, "previous_response_id": a, "input": "no model"})
	require.Equal(t, "missing_required_parameter", events[0]["error"].(map[string]any)["code"])
	ws.notFound(map[string]any{"model": "m", "store": false, "previous_response_id": a, "input": "again"})
}

func TestWebSocketBadMessages(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	ws := dial(t, srv)
	for _, tc := range []struct{ send, want string }{
		{`not json`, `{"type":"error","status":400,"error":{"type":"invalid_request_error","code":null,
			"message":"We could not parse the JSON of your message: invalid character 'o' in literal null (expecting 'u')","param":null}}`},
		{`{"type":"response.cancel"}`, `{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"invalid_value",
			"message":"Invalid value: 'response.cancel'. Supported values are: 'response.create'.","param":"type"}}`},
		{`{"type":"response.create","model":"m","input":"x","background":true}`, `{"type":"error","status":400,"error":{
			"type":"invalid_request_error","code":"unsupported_parameter",
			"message":"Unsupported parameter: 'background' is not supported in WebSocket mode.","param":"background"}}`},
	} {
		ws.sendRaw(tc.send)
		raw, err := ws.readRaw()
		require.NoError(t, err)
		require.JSONEq(t, tc.want, raw, tc.send)
	}
	// Still open; a stream member is ignored.
	ws.completed(map[string]any{"model": "m", "input": "x", "stream": false})
}

func TestWebSocketLifetime(t *testing.T) {
	up := New(Options{ConnectionLifetime: time.Millisecond})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	ws := dial(t, srv)
	raw, err := ws.readRaw()
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"error","status":400,"error":{"type":"invalid_request_error",
		"code":"websocket_connection_limit_reached",
		"message":"Responses websocket connection limit reached (1ms). Create a new websocket connection to continue.",
		"param":null}}`, raw)
	_, err = ws.readRaw()
	require.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "%v", err)

	require.Equal(t, "60 minutes", minutes(DefaultConnectionLifetime))
	require.Equal(t, "1 minute", minutes(time.Minute))
}

func TestWebSocketAnswersOneResponseAtATime(t *testing.T) {
	up := New(Options{EventDelay: time.Millisecond})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	ws := dial(t, srv)
	ws.send(map[string]any{"model": "m", "input": "one"})
	ws.send(map[string]any{"model": "m", "input": "two"})
	for _, text := range []string{"one", "two"} {
		events := ws.events()
		for i, ev := range events {
			require.EqualValues(t, i, ev["sequence_number"])
		}
		last := events[len(events)-1]
		require.Equal(t, "response.completed", last["type"])
		require.Contains(t, messageOf(last["response"].(map[string]any)), "You said: "+text)
	}
}

// faults scripts a fault by a marker in the request.
func faults(r Request) Fault {
	for marker, f := range map[string]Fault{
		"fault-500":        {Kind: FaultStatus},
		"fault-429":        {Kind: FaultStatus, Status: http.StatusTooManyRequests},
		"fault-failed":     {Kind: FaultFailed},
		"fault-incomplete": {Kind: FaultIncomplete},
		"fault-error":      {Kind: FaultError},
		"fault-drop":       {Kind: FaultDrop, Events: 3},
	} {
		if bytes.Contains(r.Body, []byte(marker)) {
			return f
		}
	}
	return Fault{}
}

// answer is what a client got for one call.
type answer struct {
	status int              // the HTTP status, 0 over WebSocket
	header http.Header      // the HTTP answer's headers
	body   string           // the JSON answer
	events []map[string]any // the events, SSE or WebSocket
	err    error            // the transport error of a dropped connection
}

const (
	overJSON = "json"
	overSSE  = "sse"
	overWS   = "websocket"
)

var transports = []string{overJSON, overSSE, overWS}

func newFaultUpstream(t *testing.T) (*httptest.Server, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	up := New(Options{Recorder: NewRecorder(&buf), IDSeed: "test", Fault: faults})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return srv, &buf
}

// call makes one call with text as its input, on a new connection.
func call(t *testing.T, srv *httptest.Server, over, text string) answer {
	t.Helper()
	req := map[string]any{"model": "m", "input": text}
	if over == overWS {
		ws := dial(t, srv)
		ws.send(req)
		var a answer
		for {
			raw, err := ws.readRaw()
			if err != nil {
				a.err = err
				return a
			}
			ev := decode(t, raw)
			a.events = append(a.events, ev)
			if ends(ev) {
				return a
			}
		}
	}
	if over == overSSE {
		req["stream"] = true
	}
	resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(body(t, req)))
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, err: err}
	if over == overSSE && resp.StatusCode == http.StatusOK {
		for _, ev := range readSSE(t, bytes.NewReader(raw)) {
			require.Equal(t, ev.name, ev.data["type"])
			a.events = append(a.events, ev.data)
		}
	} else {
		a.body = string(raw)
	}
	return a
}

// final makes a call over a transport and returns its answer and the
// response object it ends with: the JSON body, or the last event's.
func final(t *testing.T, srv *httptest.Server, over, text string) (answer, map[string]any) {
	t.Helper()
	a := call(t, srv, over, text)
	require.NoError(t, a.err)
	if over == overJSON {
		require.Equal(t, http.StatusOK, a.status)
		return a, decode(t, a.body)
	}
	return a, a.events[len(a.events)-1]["response"].(map[string]any)
}

func types(events []map[string]any) []string {
	var out []string
	for _, ev := range events {
		out = append(out, ev["type"].(string))
	}
	return out
}

// traceLines returns the recorded lines, and empties the buffer.
func traceLines(t *testing.T, buf *bytes.Buffer) []TraceLine {
	t.Helper()
	var lines []TraceLine
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		if l == "" {
			continue
		}
		var tl TraceLine
		require.NoError(t, json.Unmarshal([]byte(l), &tl))
		lines = append(lines, tl)
	}
	buf.Reset()
	return lines
}

func TestFaultStatus(t *testing.T) {
	srv, trace := newFaultUpstream(t)
	for _, over := range transports {
		for _, tc := range []struct {
			text    string
			status  int
			detail  string
			headers string // as an error event carries them
		}{
			{"fault-500", 500, `"type":"server_error","code":null,"message":"` + serverErrorMessage + `","param":null`, ""},
			{"fault-429", 429, `"type":"requests","code":"rate_limit_exceeded",
				"message":"Rate limit reached for requests. Please try again later.","param":null`,
				`,"headers":{"retry-after":"1","x-ratelimit-limit-requests":"60","x-ratelimit-remaining-requests":"0","x-ratelimit-reset-requests":"1s"}`},
		} {
			a := call(t, srv, over, tc.text)
			require.NoError(t, a.err)
			if over == overWS {
				require.Len(t, a.events, 1)
				got, _ := json.Marshal(a.events[0])
				require.JSONEq(t, fmt.Sprintf(`{"type":"error","status":%d,"error":{%s}%s}`, tc.status, tc.detail, tc.headers), string(got))
				continue
			}
			require.Equal(t, tc.status, a.status, over)
			require.JSONEq(t, `{"error":{`+tc.detail+`}}`, a.body, over)
			if tc.headers != "" {
				require.Equal(t, "1", a.header.Get("Retry-After"), over)
			}
		}
	}
	require.Empty(t, traceLines(t, trace), "errors are not answered calls")
}

func TestFaultFailed(t *testing.T) {
	srv, trace := newFaultUpstream(t)
	for _, over := range transports {
		a, resp := final(t, srv, over, "fault-failed")
		if over != overJSON {
			require.Equal(t, []string{"response.created", "response.in_progress", "response.failed"}, types(a.events), over)
		}
		require.Equal(t, "failed", resp["status"], over)
		require.Equal(t, map[string]any{"code": "server_error", "message": serverErrorMessage}, resp["error"], over)
		require.Equal(t, []any{}, resp["output"], over)
		require.Nil(t, resp["usage"], over)

		// A failed response is not stored.
		got := post(t, srv.URL+"/v1/responses", `{"model":"m","previous_response_id":"`+resp["id"].(string)+`","input":"x"}`)
		require.Equal(t, http.StatusBadRequest, got.StatusCode)
	}
	lines := traceLines(t, trace)
	require.Len(t, lines, 3, "answered with a failed response")
	require.Equal(t, []string{"http", "http", "websocket"}, []string{lines[0].Transport, lines[1].Transport, lines[2].Transport})
	require.Empty(t, lines[0].Output)
}

func TestFaultIncomplete(t *testing.T) {
	srv, trace := newFaultUpstream(t)
	for _, over := range transports {
		a, resp := final(t, srv, over, "fault-incomplete")
		if over != overJSON {
			require.Equal(t, "response.incomplete", a.events[len(a.events)-1]["type"], over)
			require.Equal(t, "response.output_item.done", a.events[len(a.events)-2]["type"], over)
		}
		require.Equal(t, "incomplete", resp["status"], over)
		require.Equal(t, map[string]any{"reason": "max_output_tokens"}, resp["incomplete_details"], over)
		require.Nil(t, resp["error"], over)
		require.Contains(t, messageOf(resp), "You said: fault-incomplete", over)

		// An incomplete response can be continued.
		got := post(t, srv.URL+"/v1/responses", `{"model":"m","previous_response_id":"`+resp["id"].(string)+`","input":"x"}`)
		require.Equal(t, http.StatusOK, got.StatusCode)
	}
	require.Len(t, traceLines(t, trace), 6, "three incomplete responses and their continuations")
}

func TestFaultError(t *testing.T) {
	srv, trace := newFaultUpstream(t)
	for _, over := range transports {
		a := call(t, srv, over, "fault-error")
		require.NoError(t, a.err)
		switch over {
		case overJSON:
			require.Equal(t, http.StatusInternalServerError, a.status)
			require.JSONEq(t, `{"error":{"message":"`+serverErrorMessage+`","type":"server_error","param":null,"code":"server_error"}}`, a.body)
		case overSSE:
			require.Equal(t, []string{"response.created", "response.in_progress", "error"}, types(a.events))
			require.Equal(t, map[string]any{"type": "error", "sequence_number": 2.0, "code": "server_error",
				"message": serverErrorMessage, "param": nil}, a.events[2])
		case overWS:
			require.Equal(t, []string{"response.created", "response.in_progress", "error"}, types(a.events))
			require.Equal(t, map[string]any{"type": "error", "sequence_number": 2.0, "error": map[string]any{
				"type": "server_error", "code": "server_error", "message": serverErrorMessage, "param": nil}}, a.events[2])
		}
	}
	require.Empty(t, traceLines(t, trace), "no response was answered")
}

func TestFaultDrop(t *testing.T) {
	srv, trace := newFaultUpstream(t)
	for _, over := range transports {
		a := call(t, srv, over, "fault-drop")
		require.Error(t, a.err, over)
		switch over {
		case overJSON:
			require.Zero(t, a.status, "never answered")
		case overSSE:
			require.Equal(t, http.StatusOK, a.status)
			require.ErrorIs(t, a.err, io.ErrUnexpectedEOF)
			require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added"}, types(a.events))
		case overWS:
			require.Len(t, a.events, 3)
			require.Equal(t, websocket.StatusCode(-1), websocket.CloseStatus(a.err), "no close frame: %v", a.err)
		}
	}
	require.Empty(t, traceLines(t, trace), "dropped calls are not answered")
}

func TestWebSocketFaultsEvictTheReferencedResponse(t *testing.T) {
	srv, _ := newFaultUpstream(t)
	for _, text := range []string{"fault-500", "fault-failed", "fault-error"} {
		ws := dial(t, srv)
		a := ws.completed(map[string]any{"model": "m", "store": false, "input": "a"})["id"].(string)
		events := ws.turn(map[string]any{"model": "m", "store": false, "previous_response_id": a, "input": text})
		require.True(t, ends(events[len(events)-1]), text)
		ws.notFound(map[string]any{"model": "m", "store": false, "previous_response_id": a, "input": "again"})
	}
	// An incomplete response is the connection's latest.
	ws := dial(t, srv)
	events := ws.turn(map[string]any{"model": "m", "store": false, "input": "fault-incomplete"})
	id := events[len(events)-1]["response"].(map[string]any)["id"].(string)
	require.Contains(t, messageOf(ws.completed(map[string]any{"model": "m", "store": false, "previous_response_id": id, "input": "b"})),
		"(3 items seen)")
}

func TestRecorderNamesTheTransport(t *testing.T) {
	var buf bytes.Buffer
	_, srv := newTestUpstream(t, Script{}, NewRecorder(&buf))
	post(t, srv.URL+"/v1/responses", `{"model":"m","input":"x"}`, "X-Session-Id", "s1")
	ws := dial(t, srv, "X-Session-Id", "s2", "Authorization", "Bearer sk-secret")
	sent := `{"type":"response.create","model":"m","input":"y"}`
	ws.sendRaw(sent)
	ws.events()

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	require.True(t, strings.HasSuffix(lines[0], `,"transport":"http"}`), lines[0])
	require.True(t, strings.HasSuffix(lines[1], `,"transport":"websocket"}`), lines[1])
	require.NotContains(t, buf.String(), "sk-secret")
	var l TraceLine
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &l))
	require.Equal(t, Owner{Session: "s2"}, l.Owner)
	require.Contains(t, lines[1], `"request":`+sent+`,`, "the message as received")
	require.Len(t, l.Output, 1)
}
