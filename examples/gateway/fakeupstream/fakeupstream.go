// Package fakeupstream is a stand-in for an OpenAI Responses upstream with
// store=false, for tests and demos of the gateway example.
//
// It serves POST /v1/responses and keeps, per connection (named by the
// ConnectionHeader request header), only the latest response and the
// transcript it closes, as the Responses WebSocket mode does with
// store=false. A request whose previous_response_id is not its connection's
// latest response fails with HTTP 400 and the error code
// previous_response_not_found, and the connection forgets its latest
// response, as the real upstream evicts the response a failed turn referenced.
// A request without the header runs on a connection of its own that keeps
// nothing.
//
// Every answer is deterministic: one assistant message whose text is Reply of
// the whole conversation the upstream reconstructed (the transcript of the
// previous response followed by the new input items, or the input alone), so
// a test can check that a continuation carried exactly the conversation the
// client sent.
package fakeupstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/contstore/contstore/fingerprint"
)

// ConnectionHeader names the upstream connection a request travels on.
const ConnectionHeader = "X-Upstream-Connection"

// ErrorCodeNotFound is the error code of a previous_response_id the
// connection does not hold.
const ErrorCodeNotFound = "previous_response_not_found"

// maxBody bounds a request body.
const maxBody = 64 << 20

// Call describes one request the upstream received.
type Call struct {
	// Connection is the ConnectionHeader value ("" when absent).
	Connection string
	// PreviousResponseID is the request's previous_response_id, if any.
	PreviousResponseID string
	// Items counts the input items the request carried.
	Items int
	// Status is the HTTP status answered.
	Status int
	// ResponseID is the response produced; empty on failure.
	ResponseID string
}

// latest is a connection's most recent response and the whole conversation
// it closes (input and output items).
type latest struct {
	id         string
	transcript []json.RawMessage
}

// Upstream is the fake upstream, an http.Handler. It is safe for concurrent
// use.
type Upstream struct {
	mu    sync.Mutex
	seq   int
	conns map[string]latest
	calls []Call
}

// New returns an upstream with no connection state.
func New() *Upstream {
	return &Upstream{conns: make(map[string]latest)}
}

// Forget drops the latest response of connection, as a reconnect does.
func (u *Upstream) Forget(connection string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.conns, connection)
}

// Calls returns every request received so far, oldest first.
func (u *Upstream) Calls() []Call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Call(nil), u.calls...)
}

// request is the part of a request body the upstream reads.
type request struct {
	Model              string          `json:"model"`
	PreviousResponseID string          `json:"previous_response_id"`
	Input              json.RawMessage `json:"input"`
}

// ServeHTTP answers POST /v1/responses.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/responses" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "no route for "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "use POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "reading body: "+err.Error())
		return
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "invalid JSON body: "+err.Error())
		return
	}
	items, err := inputItems(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", err.Error())
		return
	}
	conn := r.Header.Get(ConnectionHeader)

	u.mu.Lock()
	defer u.mu.Unlock()
	call := Call{Connection: conn, PreviousResponseID: req.PreviousResponseID, Items: len(items)}
	conversation := items
	if req.PreviousResponseID != "" {
		prev, ok := u.conns[conn]
		if !ok || prev.id != req.PreviousResponseID {
			delete(u.conns, conn)
			call.Status = http.StatusBadRequest
			u.calls = append(u.calls, call)
			writeError(w, call.Status, "invalid_request_error", ErrorCodeNotFound,
				fmt.Sprintf("Previous response with id '%s' not found.", req.PreviousResponseID))
			return
		}
		conversation = append(append([]json.RawMessage(nil), prev.transcript...), items...)
	}
	text, err := Reply(conversation)
	if err != nil {
		delete(u.conns, conn)
		call.Status = http.StatusBadRequest
		u.calls = append(u.calls, call)
		writeError(w, call.Status, "invalid_request_error", "", err.Error())
		return
	}
	u.seq++
	call.ResponseID = "resp_" + strconv.Itoa(u.seq)
	call.Status = http.StatusOK
	output, err := json.Marshal(message{
		ID:      "msg_" + strconv.Itoa(u.seq),
		Type:    "message",
		Role:    "assistant",
		Status:  "completed",
		Content: []outputText{{Type: "output_text", Text: text, Annotations: []any{}}},
	})
	if err != nil {
		panic(err) // a fixed struct always marshals
	}
	if conn != "" {
		u.conns[conn] = latest{id: call.ResponseID, transcript: append(conversation, output)}
	}
	u.calls = append(u.calls, call)
	inTokens := transcriptBytes(conversation) / 4
	outTokens := len(text) / 4
	writeJSON(w, http.StatusOK, response{
		ID:                 call.ResponseID,
		Object:             "response",
		CreatedAt:          time.Now().Unix(),
		Status:             "completed",
		Model:              req.Model,
		PreviousResponseID: req.PreviousResponseID,
		Store:              false,
		Output:             []json.RawMessage{output},
		Usage:              usage{InputTokens: inTokens, OutputTokens: outTokens, TotalTokens: inTokens + outTokens},
	})
}

// inputItems splits a request's input member into items: an array gives its
// elements, a string is one item, a missing input none.
func inputItems(input json.RawMessage) ([]json.RawMessage, error) {
	if len(input) == 0 {
		return nil, nil
	}
	if input[0] == '"' {
		return []json.RawMessage{input}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil || items == nil {
		return nil, errors.New("input must be a string or an array of items")
	}
	return items, nil
}

// Reply returns the text the upstream answers to conversation, the whole
// sequence of items it reconstructed: the item count, the chain digest of
// the items (package fingerprint, default profile) and the text of the last
// user message, as in "seen 3 items, digest 6f1c0e...; last user message:
// hello". Two conversations get the same reply only if they hold the same
// items.
func Reply(conversation []json.RawMessage) (string, error) {
	body, err := json.Marshal(map[string]any{"input": conversation})
	if err != nil {
		return "", err
	}
	r, err := replyParser.Parse(body)
	if err != nil {
		return "", err
	}
	last := ""
	for _, item := range conversation {
		if text, ok := userText(item); ok {
			last = text
		}
	}
	return fmt.Sprintf("seen %d items, digest %016x; last user message: %s", r.Len(), r.Prefix(r.Len()), last), nil
}

// replyParser computes Reply's digests.
var replyParser, _ = fingerprint.New(fingerprint.V2(), fingerprint.Key{})

// userText returns the text of a user message item: a bare string, or an
// object with role "user" whose content is a string or a list of parts
// with text.
func userText(item json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(item, &s) == nil {
		return s, true
	}
	var msg struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(item, &msg) != nil || msg.Role != "user" {
		return "", false
	}
	if json.Unmarshal(msg.Content, &s) == nil {
		return s, true
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(msg.Content, &parts) != nil {
		return "", false
	}
	text := ""
	for _, p := range parts {
		text += p.Text
	}
	return text, true
}

// transcriptBytes sums the sizes of items, for a rough token count.
func transcriptBytes(items []json.RawMessage) int {
	n := 0
	for _, item := range items {
		n += len(item)
	}
	return n
}

// message is an assistant output message.
type message struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

// outputText is one text part of an output message.
type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// usage is a response's token accounting (about four bytes a token).
type usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// response is a completed response object.
type response struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Model              string            `json:"model"`
	PreviousResponseID string            `json:"previous_response_id,omitempty"`
	Store              bool              `json:"store"`
	Output             []json.RawMessage `json:"output"`
	Usage              usage             `json:"usage"`
}

// apiError is the body of an OpenAI-style error answer.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
	} `json:"error"`
}

// writeError answers an OpenAI-style error.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, code
	writeJSON(w, status, e)
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
