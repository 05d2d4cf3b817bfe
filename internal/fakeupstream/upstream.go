// Package fakeupstream is a scripted, deterministic stand-in for the OpenAI
// Responses API, faithful enough for real clients (the Codex CLI, the
// OpenAI JS SDK, the Agents SDK) to run their tool loops against it.
//
// Upstream.Create answers one create-response request: the Script decides
// the output items (reasoning, a function call of one of the request's
// tools, or an assistant message) from the conversation so far, and the
// result carries both the final response object and the streaming events
// that produce it, numbered as the real API numbers them. A transport
// writes either, and supplies through Request.Local the responses it keeps
// itself. Upstream.ServeHTTP serves both transports on one handler:
//
//   - HTTP: POST …/responses answers JSON, or Server-Sent Events when the
//     request says "stream": true.
//   - WebSocket mode: a GET …/responses WebSocket upgrade opens a
//     connection on which each text message {"type":"response.create",
//     …the create-response body…} is answered with the same events as JSON
//     text messages, one response at a time, in the order received. The
//     connection keeps its latest response, whatever "store" says, so the
//     next request may continue it with previous_response_id and only new
//     input; a request that fails forgets the response it referenced.
//     Errors are error events ({"type":"error","status":400,"error":{…}})
//     after which the connection stays usable, except that at the end of
//     Options.ConnectionLifetime (60 minutes) the connection gets
//     websocket_connection_limit_reached and is closed.
//
// previous_response_id: a request that stores its response ("store" true
// or absent, as with the real API) keeps its transcript in memory, and any
// later request with "store" true may continue it, over either transport.
// Otherwise only a WebSocket connection's latest response can be continued,
// on that connection: anything else fails with 400 and code
// previous_response_not_found.
//
// Options.KeepsNoResponses makes it an upstream that keeps no responses, as
// many OpenAI-compatible servers are: every previous_response_id fails with
// previous_response_not_found, over both transports. Upstream.Calls counts
// the create-response calls received.
//
// Over HTTP it also serves a few other endpoints, in the API's shapes: GET
// …/models; GET and DELETE …/responses/{id} and POST
// …/responses/{id}/cancel for the responses it stores; POST
// …/responses/input_tokens; POST …/chat/completions, streamed (data:
// chunks, then data: [DONE]) when the request says "stream": true. Any
// other path is 404. Upstream.Requests lists every request to those
// endpoints, served or not, as received.
//
// Options.Fault scripts failures, over both transports: an error status
// before any event, a response.failed or response.incomplete response, an
// error event, or a connection dropped after some events (see FaultKind).
// Options.EventDelay slows every event down.
//
// A Recorder, when set, gets one line per answered call: the owner, the
// identifying request headers, the request body as received, the output
// items as sent and the transport.
package fakeupstream

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Error codes clients act upon.
const (
	// ErrorCodeNotFound is the error code of an unknown previous_response_id.
	ErrorCodeNotFound = "previous_response_not_found"
	// ErrorCodeConnectionLimit is the error code of a WebSocket connection
	// at the end of its lifetime.
	ErrorCodeConnectionLimit = "websocket_connection_limit_reached"
)

// Transports, as Request.Transport and the trace name them.
const (
	// TransportHTTP is a POST, answered with JSON or Server-Sent Events.
	TransportHTTP = "http"
	// TransportWebSocket is a response.create message of a WebSocket mode
	// connection.
	TransportWebSocket = "websocket"
)

// DefaultConnectionLifetime is how long the real API keeps a WebSocket
// connection open.
const DefaultConnectionLifetime = 60 * time.Minute

// Options configure an Upstream.
type Options struct {
	// Script is the fake model.
	Script Script
	// Recorder, when not nil, records every answered call.
	Recorder *Recorder
	// Now is the clock for created_at and completed_at (time.Now when nil).
	Now func() time.Time
	// IDSeed is mixed into every id: upstreams with different seeds make
	// different ids, one seed always the same ids in the same order.
	IDSeed string
	// EventDelay is the wait before each event is sent, over both
	// transports (a JSON answer waits as long as its events would); zero
	// sends them at once.
	EventDelay time.Duration
	// ConnectionLifetime is how long a WebSocket connection lasts
	// (DefaultConnectionLifetime when zero or less).
	ConnectionLifetime time.Duration
	// Fault, when not nil, scripts the failure of each call that passes
	// validation (its previous_response_id resolved); it may be called
	// concurrently.
	Fault func(Request) Fault
	// KeepsNoResponses refuses every previous_response_id, whatever
	// "store" says and over both transports, with 400 and code
	// previous_response_not_found (an error event over WebSocket).
	KeepsNoResponses bool
}

// Upstream is the fake Responses upstream. It is safe for concurrent use.
type Upstream struct {
	script     Script
	recorder   *Recorder
	now        func() time.Time
	seed       string
	eventDelay time.Duration
	lifetime   time.Duration
	fault      func(Request) Fault
	keepsNone  bool

	calls    atomic.Int64
	mu       sync.Mutex
	seq      uint64
	stored   map[string][]json.RawMessage // response id → transcript, for store=true
	objects  map[string]json.RawMessage   // response id → response object, for store=true
	requests []HTTPRequest                // see Requests
}

// New returns an upstream with nothing stored.
func New(opts Options) *Upstream {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	lifetime := opts.ConnectionLifetime
	if lifetime <= 0 {
		lifetime = DefaultConnectionLifetime
	}
	return &Upstream{script: opts.Script, recorder: opts.Recorder, now: now, seed: opts.IDSeed,
		eventDelay: opts.EventDelay, lifetime: lifetime, fault: opts.Fault, keepsNone: opts.KeepsNoResponses,
		stored: make(map[string][]json.RawMessage), objects: make(map[string]json.RawMessage)}
}

// Calls returns how many create-response calls the upstream received, over
// both transports, answered or refused.
func (u *Upstream) Calls() int64 { return u.calls.Load() }

// Request is one create-response call, whatever its transport.
type Request struct {
	// Body is the request body, a create-response JSON object.
	Body []byte
	// Header holds the request headers (for the recorder).
	Header http.Header
	// Transport is TransportHTTP or TransportWebSocket (for the recorder).
	Transport string
	// Local, when not nil, resolves a previous_response_id to the
	// transcript of a response the transport itself keeps (a WebSocket
	// connection's latest response). It is asked before the store.
	Local func(id string) ([]json.RawMessage, bool)
}

// Result is an answered call.
type Result struct {
	// ID is the response id, "resp_…".
	ID string
	// Stream tells whether the request asked for a stream of events.
	Stream bool
	// Response is the final response object: completed, or failed or
	// incomplete as Fault says; nil when the events end with an error.
	Response json.RawMessage
	// Events are the streaming events, from response.created to
	// response.completed (or the event Fault ends them with), numbered
	// from 0.
	Events []Event
	// Output are the output items, as Response and the events carry them.
	Output []json.RawMessage
	// Transcript is the conversation the response closes: the resolved
	// input followed by Output.
	Transcript []json.RawMessage
	// Fault is the call's scripted fault; the transport carries out a
	// FaultDrop.
	Fault Fault
}

// continuable tells whether a later request may continue the response.
func (r *Result) continuable() bool {
	return r.Fault.Kind != FaultFailed && r.Fault.Kind != FaultError
}

// Event is one streaming event: its type and its JSON object.
type Event struct {
	Type string
	Data json.RawMessage
}

// Error is a failed call, answered as the real API's error object.
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string // "" is written as null
	Code    string // "" is written as null
	// Headers are the answer's headers: an HTTP answer's, and the
	// "headers" member of an error event, as the real API sends a rate
	// limit's.
	Headers map[string]string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// MarshalJSON writes {"error":{"message":…,"type":…,"param":…,"code":…}}.
func (e *Error) MarshalJSON() ([]byte, error) {
	return object{{"error", object{
		{"message", e.Message},
		{"type", e.Type},
		{"param", nullable(e.Param)},
		{"code", nullable(e.Code)},
	}}}.MarshalJSON()
}

// detail is the error object of a WebSocket error event:
// {"type":…,"code":…,"message":…,"param":…}.
func (e *Error) detail() object {
	return object{
		{"type", e.Type},
		{"code", nullable(e.Code)},
		{"message", e.Message},
		{"param", nullable(e.Param)},
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func invalid(param, code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: code,
		Message: fmt.Sprintf(format, args...)}
}

// createRequest is the part of a request body the upstream reads.
type createRequest struct {
	Model     string            `json:"model"`
	Input     json.RawMessage   `json:"input"`
	Tools     []json.RawMessage `json:"tools"`
	Store     *bool             `json:"store"`
	Stream    bool              `json:"stream"`
	Include   []string          `json:"include"`
	Reasoning *struct {
		Summary *string `json:"summary"`
	} `json:"reasoning"`
	PreviousResponseID string `json:"previous_response_id"`
}

// stores tells whether the response is kept for later continuation.
func (r *createRequest) stores() bool { return r.Store == nil || *r.Store }

// reasons tells whether the answer starts with a reasoning item.
func (r *createRequest) reasons() bool {
	return r.Reasoning != nil || slices.Contains(r.Include, "reasoning.encrypted_content")
}

// summarises tells whether reasoning items carry a summary.
func (r *createRequest) summarises() bool {
	return r.Reasoning != nil && r.Reasoning.Summary != nil && *r.Reasoning.Summary != "none"
}

// functionTools returns the request's tools of type "function".
func (r *createRequest) functionTools() []FunctionTool {
	var tools []FunctionTool
	for _, raw := range r.Tools {
		var t struct {
			Type string `json:"type"`
			FunctionTool
		}
		if json.Unmarshal(raw, &t) == nil && t.Type == "function" && t.Name != "" {
			tools = append(tools, t.FunctionTool)
		}
	}
	return tools
}

// Create answers one call. It never writes anything: the transport does.
func (u *Upstream) Create(r Request) (*Result, *Error) {
	u.calls.Add(1)
	var req createRequest
	if err := json.Unmarshal(r.Body, &req); err != nil {
		return nil, invalid("", "", "We could not parse the JSON body of your request: %v", err)
	}
	var params map[string]json.RawMessage
	_ = json.Unmarshal(r.Body, &params) // the body is an object: req parsed
	if req.Model == "" {
		return nil, invalid("model", "missing_required_parameter", "Missing required parameter: 'model'.")
	}
	input, err := parseInput(req.Input)
	if err != nil {
		return nil, invalid("input", "", "Invalid 'input': %v.", err)
	}
	conversation, apiErr := u.resolve(r, &req, input)
	if apiErr != nil {
		return nil, apiErr
	}
	var fault Fault
	if u.fault != nil {
		fault = u.fault(r)
	}
	if fault.Kind == FaultStatus {
		return nil, statusError(fault.Status)
	}

	move := u.script.Next(Conversation{Items: conversation, Tools: req.functionTools()})
	if !req.reasons() {
		move.Reason = ""
	}
	id, items := u.ids(move)
	b := &builder{req: &req, params: params, id: id, createdAt: u.now().Unix(), chunks: u.script.chunks()}
	b.start()
	res := &Result{ID: id, Stream: req.Stream, Output: []json.RawMessage{}, Fault: fault}
	switch fault.Kind {
	case FaultFailed:
		res.Response = b.response("failed", nil, nil, 0, failure)
		b.emit("response.failed", member{"response", res.Response})
	case FaultError:
		e := streamError()
		b.emit("error", member{"code", e.Code}, member{"message", e.Message}, member{"param", nil})
	case FaultIncomplete:
		res.Output = b.items(move, items)
		res.Response = b.response("incomplete", res.Output, u.usage(conversation, res.Output, move), 0, truncation)
		b.emit("response.incomplete", member{"response", res.Response})
	default:
		res.Output = b.items(move, items)
		res.Response = b.response("completed", res.Output, u.usage(conversation, res.Output, move), u.now().Unix())
		b.emit("response.completed", member{"response", res.Response})
	}
	res.Events = b.events
	res.Transcript = append(slices.Clip(conversation), res.Output...)
	if req.stores() && !u.keepsNone {
		u.mu.Lock()
		if res.continuable() {
			u.stored[id] = res.Transcript
		}
		if res.Response != nil {
			u.objects[id] = res.Response
		}
		u.mu.Unlock()
	}
	if u.recorder != nil && res.Response != nil && fault.Kind != FaultDrop {
		u.recorder.Record(r, res)
	}
	return res, nil
}

// pause waits the event delay before an event; false when ctx ends first.
func (u *Upstream) pause(ctx context.Context) bool {
	if u.eventDelay <= 0 {
		return true
	}
	t := time.NewTimer(u.eventDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// resolve returns the whole conversation of a request: the transcript of
// the response it continues, if any, followed by its input.
func (u *Upstream) resolve(r Request, req *createRequest, input []json.RawMessage) ([]json.RawMessage, *Error) {
	prev := req.PreviousResponseID
	if prev == "" {
		return input, nil
	}
	var transcript []json.RawMessage
	ok := false
	if r.Local != nil && !u.keepsNone {
		transcript, ok = r.Local(prev)
	}
	if !ok && req.stores() && !u.keepsNone {
		u.mu.Lock()
		transcript, ok = u.stored[prev]
		u.mu.Unlock()
	}
	if !ok {
		return nil, invalid("previous_response_id", ErrorCodeNotFound, "Previous response with id '%s' not found.", prev)
	}
	return append(slices.Clip(transcript), input...), nil
}

// itemIDs are the ids of one response and its items.
type itemIDs struct {
	reasoning, item, callID string
}

// ids numbers a new response and names its items.
func (u *Upstream) ids(move Move) (string, itemIDs) {
	u.mu.Lock()
	u.seq++
	n := u.seq
	u.mu.Unlock()
	id := func(prefix string) string { return makeID(u.seed, prefix, n) }
	var ids itemIDs
	if move.Reason != "" {
		ids.reasoning = id("rs")
	}
	if move.Call != nil {
		ids.item, ids.callID = id("fc"), id("call")[:len("call_")+24]
	} else {
		ids.item = id("msg")
	}
	return id("resp"), ids
}

// makeID returns prefix_ and 48 hex digits derived from seed, prefix and
// n, as long as the real API's ids.
func makeID(seed, prefix string, n uint64) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%s/%d", seed, prefix, n)))
	return prefix + "_" + hex.EncodeToString(sum[:24])
}

// encryptedContent is a reasoning item's opaque state: base64, as long as a
// short real one.
func encryptedContent(id string) string {
	sum := sha256.Sum256([]byte(id))
	blob := append([]byte("gAAAAAB"), sum[:]...)
	for len(blob) < 180 {
		next := sha256.Sum256(blob)
		blob = append(blob, next[:]...)
	}
	return base64.StdEncoding.EncodeToString(blob)
}

// usage counts about four bytes a token.
func (u *Upstream) usage(conversation, output []json.RawMessage, move Move) object {
	in, out := 0, 0
	for _, it := range conversation {
		in += len(it)
	}
	for _, it := range output {
		out += len(it)
	}
	in, out = in/4+1, out/4+1
	reasoning := 0
	if move.Reason != "" {
		reasoning = len(move.Reason)/4 + 16
		out += reasoning
	}
	return object{
		{"input_tokens", in},
		{"input_tokens_details", object{{"cached_tokens", 0}}},
		{"output_tokens", out},
		{"output_tokens_details", object{{"reasoning_tokens", reasoning}}},
		{"total_tokens", in + out},
	}
}
