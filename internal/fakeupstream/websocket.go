package fakeupstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// The WebSocket mode, as OpenAI's guide describes it
// (developers.openai.com/api/docs/guides/websocket-mode):
//
//   - each turn is a response.create message with the create-response body,
//     without the transport fields stream and background;
//   - the server events and their order are those of the HTTP stream;
//   - the connection keeps its most recent response in memory, which works
//     with store=false; an id it does not hold is hydrated from the store
//     with store=true, and fails with previous_response_not_found with
//     store=false;
//   - a failed turn (4xx or 5xx) evicts the previous_response_id it
//     referenced from that cache;
//   - responses run one at a time, in order, with no multiplexing;
//   - a connection lasts at most 60 minutes, then gets
//     websocket_connection_limit_reached.
//
// Error events have the guide's shape, {"type":"error","status":400,
// "error":{"type":…,"code":…,"message":…,"param":…}}; the error event that
// ends a stream carries its sequence_number instead of a status, as the
// WebSocket events reference has it.

// upgradesToWebSocket tells whether a request asks for a WebSocket upgrade.
func upgradesToWebSocket(r *http.Request) bool {
	for _, v := range r.Header.Values("Upgrade") {
		for _, token := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(token), "websocket") {
				return true
			}
		}
	}
	return false
}

// serveWebSocket is the WebSocket transport: it accepts the upgrade and
// serves the connection until either side ends it.
func (u *Upstream) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	// Any origin: the real API authenticates its clients by key.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept has answered the request
	}
	defer c.CloseNow()
	c.SetReadLimit(maxBody)
	s := &session{u: u, c: c, header: r.Header}
	s.serve(r.Context())
}

// session is one WebSocket connection.
type session struct {
	u      *Upstream
	c      *websocket.Conn
	header http.Header // of the upgrade request, for the recorder

	// The connection's latest response, latestID "" when none.
	latestID         string
	latestTranscript []json.RawMessage
}

// serve answers the client's messages in turn until the client goes away or
// the connection's lifetime ends.
func (s *session) serve(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a read in progress closes the connection
	messages := make(chan []byte)
	go func() {
		defer cancel()
		for {
			_, data, err := s.c.Read(ctx)
			if err != nil {
				return // the client closed the connection, or serve did
			}
			select {
			case messages <- data:
			case <-ctx.Done():
				return
			}
		}
	}()
	expiry := time.NewTimer(s.u.lifetime)
	defer expiry.Stop()
	for {
		// The lifetime may have ended while a response was being sent: it
		// goes before any message queued meanwhile.
		select {
		case <-expiry.C:
			s.expire(ctx)
			return
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			s.expire(ctx)
			return
		case data := <-messages:
			if !s.handle(ctx, data) {
				return
			}
		}
	}
}

// expire ends the connection at the end of its lifetime. The guide gives the
// error, not when it comes; clients get it on idle connections too, so the
// server sends it as soon as the lifetime ends (once the response in
// flight, if any, is sent) and closes the connection (code 1000, as the
// documented message says to open another).
func (s *session) expire(ctx context.Context) {
	e := invalid("", ErrorCodeConnectionLimit,
		"Responses websocket connection limit reached (%s). Create a new websocket connection to continue.",
		minutes(s.u.lifetime))
	if s.send(ctx, requestError(e)) {
		_ = s.c.Close(websocket.StatusNormalClosure, ErrorCodeConnectionLimit)
	}
}

// handle answers one message; false when the connection is over.
func (s *session) handle(ctx context.Context, data []byte) bool {
	var msg struct {
		Type               string `json:"type"`
		Background         bool   `json:"background"`
		PreviousResponseID string `json:"previous_response_id"`
	}
	if err := json.Unmarshal(data, &msg); err != nil {
		return s.send(ctx, requestError(invalid("", "", "We could not parse the JSON of your message: %v", err)))
	}
	if msg.Type != "response.create" {
		return s.send(ctx, requestError(invalid("type", "invalid_value",
			"Invalid value: '%s'. Supported values are: 'response.create'.", msg.Type)))
	}
	// A stream member is ignored: every response is streamed.
	if msg.Background {
		s.forget(msg.PreviousResponseID)
		return s.send(ctx, requestError(invalid("background", "unsupported_parameter",
			"Unsupported parameter: 'background' is not supported in WebSocket mode.")))
	}
	req := Request{Body: data, Header: s.header, Transport: TransportWebSocket, Local: s.local}
	res, apiErr := s.u.Create(req)
	if apiErr != nil {
		s.forget(msg.PreviousResponseID)
		return s.send(ctx, requestError(apiErr))
	}
	events := res.Events
	if res.Fault.Kind == FaultDrop {
		events = events[:min(res.Fault.Events, len(events))]
	}
	for i, ev := range events {
		frame := ev.Data
		if ev.Type == "error" {
			frame = streamErrorEvent(i, streamError())
		}
		if !s.u.pause(ctx) || !s.send(ctx, frame) {
			return false
		}
	}
	if res.Fault.Kind == FaultDrop {
		return false // serveWebSocket closes the TCP connection, no close frame
	}
	if res.continuable() {
		s.latestID, s.latestTranscript = res.ID, res.Transcript
	} else {
		s.forget(msg.PreviousResponseID)
	}
	return true
}

// local resolves the connection's latest response.
func (s *session) local(id string) ([]json.RawMessage, bool) {
	if id != s.latestID {
		return nil, false
	}
	return s.latestTranscript, true
}

// forget evicts the latest response when a failed request referenced it.
func (s *session) forget(id string) {
	if id == s.latestID {
		s.latestID, s.latestTranscript = "", nil
	}
}

// send writes one text message; false when the connection is gone.
func (s *session) send(ctx context.Context, data []byte) bool {
	return s.c.Write(ctx, websocket.MessageText, data) == nil
}

// requestError is the error event of a message that could not be answered.
func requestError(e *Error) json.RawMessage {
	o := object{{"type", "error"}, {"status", e.Status}, {"error", e.detail()}}
	if len(e.Headers) > 0 {
		o = append(o, member{"headers", e.Headers})
	}
	return o.bytes()
}

// streamErrorEvent is the error event ending the stream of a response, its
// seq-th event.
func streamErrorEvent(seq int, e *Error) json.RawMessage {
	return object{{"type", "error"}, {"sequence_number", seq}, {"error", e.detail()}}.bytes()
}

// minutes writes a lifetime as the limit's message does, "60 minutes".
func minutes(d time.Duration) string {
	switch {
	case d%time.Minute != 0:
		return d.String()
	case d == time.Minute:
		return "1 minute"
	default:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	}
}
