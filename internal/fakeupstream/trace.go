package fakeupstream

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Recorder writes one JSON line per answered call, a call answered with a
// response (completed, incomplete or failed; not an error, an error event
// or a dropped connection):
//
//	{"owner":{"session":S,"agent":A},"headers":{…},"request":<body>,"response_id":"resp_…","output":[…],"transport":"http"}
//
// headers holds the request headers that identify sessions, agents and
// turns (names lowercased, several values joined with ", "), never
// credentials, of the HTTP request or of the WebSocket upgrade; request is
// the body exactly as received (compacted only if it spans several lines),
// over WebSocket the whole response.create message; output holds the
// output items exactly as sent; transport is "http" or "websocket".
type Recorder struct {
	mu  sync.Mutex
	w   io.Writer
	err error

	// AllHeaders records every request header but credentials, to find out
	// what a client sends.
	AllHeaders bool
}

// NewRecorder returns a recorder writing to w.
func NewRecorder(w io.Writer) *Recorder { return &Recorder{w: w} }

// Err returns the first write error, if any.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Owner is the conversation owner a call is attributed to.
type Owner struct {
	Session string `json:"session"`
	Agent   string `json:"agent"`
}

// TraceLine is one recorded call, as Recorder writes it.
type TraceLine struct {
	Owner      Owner             `json:"owner"`
	Headers    map[string]string `json:"headers"`
	Request    json.RawMessage   `json:"request"`
	ResponseID string            `json:"response_id"`
	Output     []json.RawMessage `json:"output"`
	Transport  string            `json:"transport"`
}

// Identifying headers, recorded by name or by prefix.
var (
	traceHeaders = []string{
		"x-session-id", "x-agent-id", "session_id", "session-id", "conversation_id", "conversation-id",
		"thread_id", "thread-id", "originator", "openai-beta", "user-agent", "x-client-request-id",
		"x-openai-subagent", "version",
	}
	tracePrefixes = []string{"x-codex-", "x-openai-"}
)

// secret tells whether a header may carry a credential.
func secret(name string) bool {
	if name == "authorization" || name == "proxy-authorization" || name == "cookie" {
		return true
	}
	for _, s := range []string{"auth", "key", "token", "secret", "cookie", "password", "account"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func (r *Recorder) wanted(name string) bool {
	if secret(name) {
		return false
	}
	if r.AllHeaders || slices.Contains(traceHeaders, name) {
		return true
	}
	for _, p := range tracePrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// OwnerOf attributes a call: the session is the x-session-id header, else
// Codex's session_id (or session-id) header, else client_metadata.session_id
// or metadata.session_id in the body; the agent is the x-agent-id header.
func OwnerOf(h http.Header, body []byte) Owner {
	o := Owner{Agent: h.Get("X-Agent-Id")}
	for _, name := range []string{"X-Session-Id", "Session_id", "Session-Id"} {
		if v := headerValue(h, name); v != "" {
			o.Session = v
			return o
		}
	}
	var meta struct {
		ClientMetadata map[string]any `json:"client_metadata"`
		Metadata       map[string]any `json:"metadata"`
	}
	_ = json.Unmarshal(body, &meta)
	for _, m := range []map[string]any{meta.ClientMetadata, meta.Metadata} {
		if s, ok := m["session_id"].(string); ok && s != "" {
			o.Session = s
			return o
		}
	}
	return o
}

// headerValue reads a header by case-insensitive name, also when its name
// holds an underscore (Go keeps such names as sent, uncanonicalised).
func headerValue(h http.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, vs := range h {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// Record writes the line of one answered call.
func (r *Recorder) Record(req Request, res *Result) {
	headers := map[string]string{}
	for name, values := range req.Header {
		if n := strings.ToLower(name); r.wanted(n) {
			headers[n] = strings.Join(values, ", ")
		}
	}
	body := req.Body
	if bytes.ContainsAny(body, "\r\n") {
		var buf bytes.Buffer
		if json.Compact(&buf, body) == nil {
			body = buf.Bytes()
		}
	}
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	hs := make(object, 0, len(keys))
	for _, k := range keys {
		hs = append(hs, member{k, headers[k]})
	}
	line := object{
		{"owner", OwnerOf(req.Header, req.Body)},
		{"headers", hs},
		{"request", json.RawMessage(body)},
		{"response_id", res.ID},
		{"output", res.Output},
		{"transport", req.Transport},
	}.bytes()
	line = append(line, '\n')

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		_, r.err = r.w.Write(line)
	}
}
