package fakeupstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// HTTPRequest is a request to an endpoint other than creating a response,
// as received.
type HTTPRequest struct {
	Method string
	// Path is the URL path, such as "/v1/models"; RawQuery the query
	// without "?".
	Path, RawQuery string
	Header         http.Header
	Body           []byte
}

// LoggedRequest is one line of the fake upstream command's request log
// (its -requests flag, JSON): a request to an endpoint other than creating
// a response, as received, and its answer.
type LoggedRequest struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Header http.Header `json:"header"`
	Body   string      `json:"body"`
	Status int         `json:"status"`
	Answer string      `json:"answer"`
}

// Requests returns the requests to endpoints other than creating a
// response (POST …/responses) and the WebSocket mode, served or not, in
// the order they arrived.
func (u *Upstream) Requests() []HTTPRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.requests)
}

// serveEndpoint logs a request to another endpoint than creating a
// response and answers it: see the package documentation for the
// endpoints served.
func (u *Upstream) serveEndpoint(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	u.mu.Lock()
	u.requests = append(u.requests, HTTPRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: body})
	u.mu.Unlock()
	if err != nil {
		writeError(w, invalid("", "", "Reading the request body: %v", err))
		return
	}
	seg := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	n := len(seg)
	at := func(i int) string { // the i-th segment from the end, 1-based
		if i > n {
			return ""
		}
		return seg[n-i]
	}
	switch {
	case at(1) == "models" && r.Method == http.MethodGet:
		serveModels(w)
	case at(2) == "chat" && at(1) == "completions" && r.Method == http.MethodPost:
		u.serveChat(w, r, body)
	case at(2) == "responses" && at(1) == "input_tokens" && r.Method == http.MethodPost:
		u.serveInputTokens(w, body)
	case at(3) == "responses" && at(1) == "cancel" && r.Method == http.MethodPost:
		u.serveStored(w, at(2), false)
	case at(2) == "responses" && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		u.serveStored(w, at(1), r.Method == http.MethodDelete)
	default:
		writeError(w, &Error{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path)})
	}
}

// serveStored answers GET …/responses/{id} and POST …/responses/{id}/cancel
// with the stored response object (a response here has ended before it is
// answered: cancelling one returns it as it is), and DELETE
// …/responses/{id} with the deletion object, forgetting the response.
func (u *Upstream) serveStored(w http.ResponseWriter, id string, remove bool) {
	u.mu.Lock()
	obj, ok := u.objects[id]
	if ok && remove {
		delete(u.objects, id)
		delete(u.stored, id)
	}
	u.mu.Unlock()
	switch {
	case !ok:
		writeError(w, &Error{Status: http.StatusNotFound, Type: "invalid_request_error",
			Message: fmt.Sprintf("Response with id '%s' not found.", id)})
	case remove:
		writeJSON(w, http.StatusOK, object{{"id", id}, {"object", "response"}, {"deleted", true}}.bytes())
	default:
		writeJSON(w, http.StatusOK, obj)
	}
}

// serveInputTokens answers POST …/responses/input_tokens: the tokens the
// create-response body would send, previous response included, counted as
// the usage of a response counts them.
func (u *Upstream) serveInputTokens(w http.ResponseWriter, body []byte) {
	var req createRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, invalid("", "", "We could not parse the JSON body of your request: %v", err))
		return
	}
	input, err := parseInput(req.Input)
	if err != nil {
		writeError(w, invalid("input", "", "Invalid 'input': %v.", err))
		return
	}
	conversation, apiErr := u.resolve(Request{}, &req, input)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	tokens := 0
	for _, it := range conversation {
		tokens += len(it)
	}
	writeJSON(w, http.StatusOK, object{{"object", "response.input_tokens"}, {"input_tokens", tokens/4 + 1}}.bytes())
}

// chatRequest is the part of a chat completions body the upstream reads.
type chatRequest struct {
	Model         string            `json:"model"`
	Messages      []json.RawMessage `json:"messages"`
	Stream        bool              `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// serveChat answers POST …/chat/completions with one assistant message
// quoting the last message: a chat.completion object, or for "stream":
// true its chat.completion.chunk objects as data-only Server-Sent Events
// ended by data: [DONE], each after the event delay.
func (u *Upstream) serveChat(w http.ResponseWriter, r *http.Request, body []byte) {
	var req chatRequest
	switch err := json.Unmarshal(body, &req); {
	case err != nil:
		writeError(w, invalid("", "", "We could not parse the JSON body of your request: %v", err))
		return
	case req.Model == "":
		writeError(w, invalid("model", "missing_required_parameter", "Missing required parameter: 'model'."))
		return
	case len(req.Messages) == 0:
		writeError(w, invalid("messages", "missing_required_parameter", "Missing required parameter: 'messages'."))
		return
	}
	u.mu.Lock()
	u.seq++
	n := u.seq
	u.mu.Unlock()
	id := "chatcmpl-" + makeID(u.seed, "chatcmpl", n)[len("chatcmpl_"):][:29]
	text := "You said: " + clip(messageText(req.Messages[len(req.Messages)-1]), 80)
	prompt := 0
	for _, m := range req.Messages {
		prompt += len(m)
	}
	prompt = prompt/4 + 1
	completion := len(text)/4 + 1
	usage := object{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}}
	created := u.now().Unix()
	if !req.Stream {
		if !u.pause(r.Context()) {
			return
		}
		msg := object{{"role", "assistant"}, {"content", text}, {"refusal", nil}, {"annotations", []any{}}}
		writeJSON(w, http.StatusOK, object{
			{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", req.Model},
			{"choices", []any{object{{"index", 0}, {"message", msg}, {"logprobs", nil}, {"finish_reason", "stop"}}}},
			{"usage", usage},
		}.bytes())
		return
	}
	chunk := func(delta object, finish any) object {
		c := object{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", req.Model},
			{"choices", []any{object{{"index", 0}, {"delta", delta}, {"logprobs", nil}, {"finish_reason", finish}}}}}
		if req.StreamOptions.IncludeUsage {
			c = append(c, member{"usage", nil})
		}
		return c
	}
	chunks := []object{chunk(object{{"role", "assistant"}, {"content", ""}, {"refusal", nil}}, nil)}
	for _, piece := range split(text, u.script.chunks()) {
		chunks = append(chunks, chunk(object{{"content", piece}}, nil))
	}
	chunks = append(chunks, chunk(object{}, "stop"))
	if req.StreamOptions.IncludeUsage {
		chunks = append(chunks, object{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created},
			{"model", req.Model}, {"choices", []any{}}, {"usage", usage}})
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(data []byte) bool {
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "data: %s\n\n", data)
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false // the client went away
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, c := range chunks {
		if !u.pause(r.Context()) || !send(c.bytes()) {
			return
		}
	}
	send([]byte("[DONE]"))
}
