package fakeupstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const execCommandTool = `{"type":"function","name":"exec_command","description":"Runs a command.","strict":false,
	"parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"},
	"yield_time_ms":{"type":"number"}},"required":["cmd"],"additionalProperties":false}}`

const shellTool = `{"type":"function","name":"shell","parameters":{"type":"object",
	"properties":{"command":{"type":"array","items":{"type":"string"}},"timeout_ms":{"type":"number"}},
	"required":["command"]}}`

func newTestUpstream(t *testing.T, script Script, rec *Recorder) (*Upstream, *httptest.Server) {
	t.Helper()
	up := New(Options{Script: script, Recorder: rec, IDSeed: "test",
		Now: func() time.Time { return time.Unix(1760000000, 0) }})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return up, srv
}

func post(t *testing.T, url, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

type sseEvent struct {
	name string
	data map[string]any
	raw  string
}

func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var events []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.raw = strings.TrimPrefix(line, "data: ")
			require.NoError(t, json.Unmarshal([]byte(cur.raw), &cur.data))
		case line == "":
			require.NotEmpty(t, cur.name, "an event without a name")
			events = append(events, cur)
			cur = sseEvent{}
		}
	}
	require.NoError(t, sc.Err())
	return events
}

func body(t *testing.T, members map[string]any) string {
	t.Helper()
	b, err := json.Marshal(members)
	require.NoError(t, err)
	return string(b)
}

func userMessage(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

func decode(t *testing.T, raw string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &m))
	return m
}

func TestStreamFollowsTheDocumentedEventSequence(t *testing.T) {
	_, srv := newTestUpstream(t, Script{ToolCalls: 1, Chunks: 4}, nil)
	base := map[string]any{
		"model":        "gpt-test",
		"instructions": "Be brief.",
		"tools":        []any{json.RawMessage(execCommandTool)},
		"store":        false,
		"stream":       true,
		"include":      []string{"reasoning.encrypted_content"},
		"reasoning":    map[string]any{"effort": "low", "summary": "auto"},
		"input":        []any{userMessage("hi")},
	}
	resp := post(t, srv.URL+"/v1/responses", body(t, base))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	events := readSSE(t, resp.Body)

	var types []string
	for i, ev := range events {
		require.Equal(t, ev.name, ev.data["type"], "event %d: the event line names its type", i)
		require.EqualValues(t, i, ev.data["sequence_number"], "event %d", i)
		require.True(t, strings.HasPrefix(ev.raw, `{"type":`), "type comes first: %s", ev.raw)
		types = append(types, ev.name)
	}
	deltas := func(name string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = name
		}
		return out
	}
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.reasoning_summary_part.added"}
	want = append(want, deltas("response.reasoning_summary_text.delta", 4)...)
	want = append(want, "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
		"response.output_item.done", "response.output_item.added")
	want = append(want, deltas("response.function_call_arguments.delta", 4)...)
	want = append(want, "response.function_call_arguments.done", "response.output_item.done", "response.completed")
	require.Equal(t, want, types)

	// Item events name their item and output index.
	var doneItems []any
	for _, ev := range events {
		switch ev.name {
		case "response.output_item.added", "response.output_item.done":
			item := ev.data["item"].(map[string]any)
			require.NotEmpty(t, item["id"])
			if ev.name == "response.output_item.done" {
				require.EqualValues(t, len(doneItems), ev.data["output_index"])
				doneItems = append(doneItems, item)
			}
		case "response.created", "response.in_progress", "response.completed":
		default:
			require.Contains(t, ev.data, "item_id", ev.name)
			require.Contains(t, ev.data, "output_index", ev.name)
		}
	}
	require.Len(t, doneItems, 2)
	reasoning := doneItems[0].(map[string]any)
	require.Equal(t, "reasoning", reasoning["type"])
	require.True(t, strings.HasPrefix(reasoning["id"].(string), "rs_"))
	require.NotEmpty(t, reasoning["encrypted_content"])
	require.Len(t, reasoning["summary"], 1)
	call := doneItems[1].(map[string]any)
	require.Equal(t, "function_call", call["type"])
	require.Equal(t, "completed", call["status"])
	require.Equal(t, "exec_command", call["name"])
	require.True(t, strings.HasPrefix(call["call_id"].(string), "call_"))
	require.JSONEq(t, `{"cmd":"echo hello"}`, call["arguments"].(string))

	// The deltas add up to the done texts.
	var summary, args strings.Builder
	for _, ev := range events {
		switch ev.name {
		case "response.reasoning_summary_text.delta":
			summary.WriteString(ev.data["delta"].(string))
		case "response.function_call_arguments.delta":
			args.WriteString(ev.data["delta"].(string))
		}
	}
	require.Equal(t, reasoning["summary"].([]any)[0].(map[string]any)["text"], summary.String())
	require.Equal(t, call["arguments"], args.String())

	created := events[0].data["response"].(map[string]any)
	require.Equal(t, "in_progress", created["status"])
	require.Empty(t, created["output"])
	require.Nil(t, created["usage"])

	completed := events[len(events)-1].data["response"].(map[string]any)
	require.True(t, strings.HasPrefix(completed["id"].(string), "resp_"))
	require.Equal(t, created["id"], completed["id"])
	require.Equal(t, "response", completed["object"])
	require.Equal(t, "completed", completed["status"])
	require.EqualValues(t, 1760000000, completed["created_at"])
	require.Equal(t, "gpt-test", completed["model"])
	require.Equal(t, doneItems, completed["output"])
	// Echoed parameters, and defaults for the others.
	require.Equal(t, "Be brief.", completed["instructions"])
	require.Equal(t, false, completed["store"])
	require.Equal(t, map[string]any{"effort": "low", "summary": "auto"}, completed["reasoning"])
	require.Len(t, completed["tools"], 1)
	require.Equal(t, "auto", completed["tool_choice"])
	require.Equal(t, true, completed["parallel_tool_calls"])
	require.Nil(t, completed["previous_response_id"])
	require.Equal(t, map[string]any{"format": map[string]any{"type": "text"}, "verbosity": "medium"}, completed["text"])
	usage := completed["usage"].(map[string]any)
	for _, k := range []string{"input_tokens", "output_tokens", "total_tokens"} {
		require.Greater(t, usage[k].(float64), 0.0, k)
	}
	require.Contains(t, usage["input_tokens_details"], "cached_tokens")
	require.Contains(t, usage["output_tokens_details"], "reasoning_tokens")
	require.Equal(t, usage["input_tokens"].(float64)+usage["output_tokens"].(float64), usage["total_tokens"])
}

func TestStreamedMessage(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	resp := post(t, srv.URL+"/v1/responses", `{"model":"m","stream":true,"input":"hello there"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	events := readSSE(t, resp.Body)
	var types []string
	var text strings.Builder
	for _, ev := range events {
		types = append(types, ev.name)
		if ev.name == "response.output_text.delta" {
			require.EqualValues(t, 0, ev.data["content_index"])
			text.WriteString(ev.data["delta"].(string))
		}
	}
	require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed"}, types)
	added := events[2].data["item"].(map[string]any)
	require.Equal(t, "in_progress", added["status"])
	require.Empty(t, added["content"])
	msg := events[9].data["item"].(map[string]any)
	require.True(t, strings.HasPrefix(msg["id"].(string), "msg_"))
	require.Equal(t, "completed", msg["status"])
	require.Equal(t, "assistant", msg["role"])
	part := msg["content"].([]any)[0].(map[string]any)
	require.Equal(t, map[string]any{"type": "output_text", "text": text.String(), "annotations": []any{}, "logprobs": []any{}}, part)
	require.Contains(t, text.String(), "hello there")
	require.Equal(t, text.String(), events[7].data["text"])
}

func TestJSONModeAnswersTheCompletedResponse(t *testing.T) {
	_, srv := newTestUpstream(t, Script{ToolCalls: 1}, nil)
	resp := post(t, srv.URL+"/v1/responses", body(t, map[string]any{
		"model": "m", "input": []any{userMessage("hi")}, "tools": []any{json.RawMessage(execCommandTool)},
		"reasoning": map[string]any{"effort": "low"},
	}))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	got := decode(t, string(raw))
	require.Equal(t, "completed", got["status"])
	require.Equal(t, true, got["store"], "store defaults to true")
	out := got["output"].([]any)
	require.Len(t, out, 2)
	reasoning := out[0].(map[string]any)
	require.Equal(t, []any{}, reasoning["summary"], "no summary asked for")
	require.NotContains(t, reasoning, "encrypted_content", "not included")
	require.Equal(t, "function_call", out[1].(map[string]any)["type"])
}

// loop plays a client that sends the full history each time and answers
// every function call.
type loop struct {
	t       *testing.T
	url     string
	base    map[string]any
	history []any
}

func (l *loop) send() []map[string]any {
	l.t.Helper()
	req := map[string]any{"input": l.history}
	for k, v := range l.base {
		req[k] = v
	}
	resp := post(l.t, l.url, body(l.t, req))
	require.Equal(l.t, http.StatusOK, resp.StatusCode)
	var got struct {
		Output []map[string]any `json:"output"`
	}
	require.NoError(l.t, json.NewDecoder(resp.Body).Decode(&got))
	for _, item := range got.Output {
		l.history = append(l.history, item)
		if item["type"] == "function_call" {
			l.history = append(l.history, map[string]any{"type": "function_call_output", "call_id": item["call_id"], "output": "ok"})
		}
	}
	return got.Output
}

func kinds(items []map[string]any) []string {
	var out []string
	for _, it := range items {
		out = append(out, it["type"].(string))
	}
	return out
}

func TestToolLoop(t *testing.T) {
	_, srv := newTestUpstream(t, Script{ToolCalls: 2, Commands: []string{"echo hello", "ls", "pwd"}}, nil)
	l := &loop{t: t, url: srv.URL + "/v1/responses", base: map[string]any{
		"model": "m", "store": false, "include": []string{"reasoning.encrypted_content"},
		"tools": []any{json.RawMessage(`{"type":"web_search"}`), json.RawMessage(shellTool)},
	}}
	var commands []any
	for turn := 1; turn <= 2; turn++ {
		l.history = append(l.history, userMessage("go"))
		for step := 0; step < 2; step++ {
			out := l.send()
			require.Equal(t, []string{"reasoning", "function_call"}, kinds(out), "turn %d step %d", turn, step)
			require.Equal(t, "shell", out[1]["name"])
			var args struct {
				Command []any `json:"command"`
			}
			require.NoError(t, json.Unmarshal([]byte(out[1]["arguments"].(string)), &args))
			require.Len(t, args.Command, 3)
			commands = append(commands, args.Command[2])
		}
		out := l.send()
		require.Equal(t, []string{"reasoning", "message"}, kinds(out), "turn %d answer", turn)
	}
	require.Equal(t, []any{"echo hello", "ls", "pwd", "echo hello"}, commands)
}

func TestNoToolsNoReasoningAnswersAMessage(t *testing.T) {
	_, srv := newTestUpstream(t, Script{ToolCalls: 3}, nil)
	l := &loop{t: t, url: srv.URL + "/v1/responses", base: map[string]any{"model": "m"}}
	l.history = append(l.history, userMessage("hello"))
	require.Equal(t, []string{"message"}, kinds(l.send()))
}

func TestArgumentsFitTheSchema(t *testing.T) {
	for _, tc := range []struct {
		tool string
		want string
	}{
		{execCommandTool, `{"cmd":"ls"}`},
		{shellTool, `{"command":["bash","-lc","ls"]}`},
		{`{"type":"function","name":"lookup","parameters":{"type":"object","properties":{"city":{"type":"string"},
			"units":{"type":"string","enum":["c","f"]},"days":{"type":["integer","null"],"minimum":1},
			"when":{"type":"object","properties":{"tz":{"type":"string"}},"required":["tz"]}},
			"required":["city","units","days","when"]}}`, `{"city":"hello","days":1,"units":"c","when":{"tz":"hello"}}`},
		{`{"type":"function","name":"noargs"}`, `{}`},
	} {
		var ft FunctionTool
		require.NoError(t, json.Unmarshal([]byte(tc.tool), &ft))
		require.JSONEq(t, tc.want, arguments(ft, "ls"), ft.Name)
	}
}

func TestPreviousResponseID(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	url := srv.URL + "/v1/responses"

	// store=false: nothing to continue over HTTP.
	first := post(t, url, `{"model":"m","store":false,"input":"one"}`)
	var r1 struct{ ID string }
	require.NoError(t, json.NewDecoder(first.Body).Decode(&r1))
	resp := post(t, url, `{"model":"m","store":false,"previous_response_id":"`+r1.ID+`","input":"two"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	raw, _ := io.ReadAll(resp.Body)
	require.JSONEq(t, `{"error":{"message":"Previous response with id '`+r1.ID+`' not found.",
		"type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, string(raw))

	// A store=false response is not kept, even for a store=true follow-up.
	resp = post(t, url, `{"model":"m","previous_response_id":"`+r1.ID+`","input":"two"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// store=true: any stored response continues, the conversation grows.
	stored := post(t, url, `{"model":"m","store":true,"input":"one"}`)
	var r2 struct {
		ID     string
		Output []map[string]any
	}
	require.NoError(t, json.NewDecoder(stored.Body).Decode(&r2))
	next := post(t, url, `{"model":"m","previous_response_id":"`+r2.ID+`","input":"two"}`)
	require.Equal(t, http.StatusOK, next.StatusCode)
	var r3 struct {
		PreviousResponseID string `json:"previous_response_id"`
		Output             []struct {
			Content []struct{ Text string }
		}
	}
	require.NoError(t, json.NewDecoder(next.Body).Decode(&r3))
	require.Equal(t, r2.ID, r3.PreviousResponseID)
	require.Contains(t, r3.Output[0].Content[0].Text, "(3 items seen)", "one, the answer, two")

	resp = post(t, url, `{"model":"m","previous_response_id":"resp_unknown","input":"x"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestLocalTranscriptsComeFirst(t *testing.T) {
	up := New(Options{})
	first, apiErr := up.Create(Request{Body: []byte(`{"model":"m","store":false,"input":"one"}`)})
	require.Nil(t, apiErr)
	local := func(id string) ([]json.RawMessage, bool) {
		if id == first.ID {
			return first.Transcript, true
		}
		return nil, false
	}
	res, apiErr := up.Create(Request{Body: []byte(`{"model":"m","store":false,"previous_response_id":"` + first.ID + `","input":"two"}`), Local: local})
	require.Nil(t, apiErr)
	require.Contains(t, string(res.Output[0]), "(3 items seen)")
}

func TestBadRequests(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	for _, b := range []string{`not json`, `{"input":"x"}`, `{"model":"m","input":42}`, `{"model":"m","input":[{"content":"x"}]}`} {
		resp := post(t, srv.URL+"/v1/responses", b)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, b)
		var e struct {
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		require.Equal(t, "invalid_request_error", e.Error.Type)
		require.NotEmpty(t, e.Error.Message)
	}
}

func TestRoutes(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	resp := post(t, srv.URL+"/api/openai/responses", `{"model":"m","input":"x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = post(t, srv.URL+"/v1/completions", `{"model":"m"}`)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	for _, path := range []string{"/v1/models", "/models"} {
		got, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		var list struct {
			Object string
			Data   []struct{ ID string }
		}
		require.NoError(t, json.NewDecoder(got.Body).Decode(&list))
		got.Body.Close()
		require.Equal(t, "list", list.Object)
		require.NotEmpty(t, list.Data)
	}
	got, err := http.Get(srv.URL + "/v1/responses")
	require.NoError(t, err)
	got.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, got.StatusCode)
}

func TestRecorder(t *testing.T) {
	var buf bytes.Buffer
	rec := NewRecorder(&buf)
	_, srv := newTestUpstream(t, Script{}, rec)
	url := srv.URL + "/v1/responses"
	sent := "{\"model\":\"m\",  \"input\":\"a <b> & c\"}"
	post(t, url, sent, "X-Session-Id", "s1", "X-Agent-Id", "a1", "Authorization", "Bearer sk-secret", "Chatgpt-Account-Id", "acct")
	post(t, url, `{"model":"m","input":"x"}`, "Session-Id", "codex-session", "Thread-Id", "t1", "X-Codex-Turn-Metadata", `{"turn_id":"u1"}`,
		"Originator", "codex_exec", "X-Openai-Subagent", "review")
	post(t, url, `{"model":"m","input":"x","client_metadata":{"session_id":"from-body"}}`)
	post(t, url, `{"model":"m","input":"x","metadata":{"session_id":"from-metadata"}}`)
	post(t, url, `{"model":"m","stream":true,"input":"x"}`)

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 5)
	require.NotContains(t, buf.String(), "sk-secret")
	require.NotContains(t, buf.String(), "acct")

	var l0 TraceLine
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &l0))
	require.Equal(t, Owner{Session: "s1", Agent: "a1"}, l0.Owner)
	require.Equal(t, map[string]string{"x-session-id": "s1", "x-agent-id": "a1", "user-agent": "Go-http-client/1.1"}, l0.Headers)
	require.Contains(t, lines[0], `"request":`+sent+`,`, "the body as received")
	require.True(t, strings.HasPrefix(l0.ResponseID, "resp_"))
	require.Len(t, l0.Output, 1)

	var l1 TraceLine
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &l1))
	require.Equal(t, Owner{Session: "codex-session"}, l1.Owner)
	require.Equal(t, "t1", l1.Headers["thread-id"])
	require.Equal(t, `{"turn_id":"u1"}`, l1.Headers["x-codex-turn-metadata"])
	require.Equal(t, "codex_exec", l1.Headers["originator"])
	require.Equal(t, "review", l1.Headers["x-openai-subagent"])

	for i, want := range []string{"from-body", "from-metadata", ""} {
		var l TraceLine
		require.NoError(t, json.Unmarshal([]byte(lines[2+i]), &l))
		require.Equal(t, want, l.Owner.Session)
	}
	// The streamed call's output, as sent in its events.
	var l4 TraceLine
	require.NoError(t, json.Unmarshal([]byte(lines[4]), &l4))
	require.Equal(t, "message", decode(t, string(l4.Output[0]))["type"])
	require.NoError(t, rec.Err())
}

func TestIDsAreDeterministicPerSeed(t *testing.T) {
	ids := func(seed string) []string {
		up := New(Options{IDSeed: seed})
		var out []string
		for range 3 {
			res, err := up.Create(Request{Body: []byte(`{"model":"m","input":"x"}`)})
			require.Nil(t, err)
			out = append(out, res.ID)
		}
		return out
	}
	a := ids("a")
	require.Equal(t, a, ids("a"))
	require.NotEqual(t, a, ids("b"))
	require.Len(t, a[0], len("resp_")+48)
}
