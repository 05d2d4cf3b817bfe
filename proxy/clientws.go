package proxy

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// The Responses API's WebSocket mode, served to clients on GET
// /v1/responses (the Codex CLI's default transport for OpenAI):
//
//   - each text message {"type":"response.create", …the create-response
//     body…} is a turn, answered with the events the same turn streams over
//     HTTP, each as a text message holding the event's data, in order;
//   - turns run one at a time, in the order received: a response.create
//     sent while one runs waits for it;
//   - a turn is the request body it stands for ("type" dropped, "stream"
//     true, a string input as the user message it stands for) served by
//     ServeHTTP, so it is reserved, continued, recorded or aborted exactly
//     as a POST;
//   - the connection keeps its latest response: the full input of its
//     request, its output items and its id. A response.create whose
//     previous_response_id is that id, with the new input items only, is
//     served as the full context it stands for (that input, that output,
//     then the new items, without previous_response_id), and the store
//     decides how it goes upstream, as for any request. Any
//     other previous_response_id with "store": false gets the upstream's
//     error event, previous_response_not_found, and nothing goes upstream,
//     so that the client sends its full history again; with "store" true
//     or absent it goes upstream as sent, as the upstream may keep that
//     response. A failed turn drops what the connection keeps, and so
//     does one whose output or end went on unread, for want of room in
//     the budget (budget.go);
//   - a response.create with "generate": false (the client warming the
//     connection up) that holds the full context is answered here: a
//     completed response without output, which the connection keeps like
//     any other, so that the client's next request continues it (any other
//     goes upstream as sent);
//   - a response.processed message (the client's acknowledgement) gets no
//     answer;
//   - each message read holds its weight in Config.MaxBytesInFlight until
//     it is answered (budget.go); one that finds no room within a second
//     is answered in its turn with the error event of a POST's 503
//     (server_busy), or 413 when it could never fit;
//   - errors are error events, {"type":"error","status":400,"error":{…}},
//     after which the connection stays usable, but for a response whose
//     stream broke off upstream: the connection is then closed without a
//     close frame, as the upstream's was;
//   - a connection lasts Config.ClientSocketLifetime (60 minutes, as the
//     upstream's), then gets websocket_connection_limit_reached and is
//     closed; Proxy.CloseUnusedSocket closes the one that has waited the
//     longest without sending a message, and Proxy.CloseIdleSocket the
//     one idle the longest between messages (1013, try again later), for
//     a server at its connection limit to make room; Proxy.Shutdown closes
//     the connections (1001, going away) once their turn in flight is
//     over.

// defaultClientSocketLifetime is how long a client's connection lasts: the
// upstream's lifetime.
const defaultClientSocketLifetime = 60 * time.Minute

// socketQueue bounds the response.create messages read ahead of the turn
// running on a connection.
const socketQueue = 16

// connectionLimitCode is the error code that ends a connection at the end
// of its lifetime.
const connectionLimitCode = "websocket_connection_limit_reached"

// clientSocketLifetime returns how long a client's connection lasts.
func (p *Proxy) clientSocketLifetime() time.Duration {
	if p.cfg.ClientSocketLifetime > 0 {
		return p.cfg.ClientSocketLifetime
	}
	return defaultClientSocketLifetime
}

// serveSocket serves a WebSocket upgrade on /v1/responses: the WebSocket
// mode.
func (p *Proxy) serveSocket(w http.ResponseWriter, r *http.Request) {
	if p.sockets.isClosing() {
		writeError(w, http.StatusServiceUnavailable, "server_error", "", "",
			"The gateway is shutting down: open the connection again.")
		return
	}
	// Accept refuses a browser page of another origin: the upstream
	// credential may be the gateway's own.
	cw := &connCapture{ResponseWriter: w}
	opened := time.Now() // before the client learns it is open
	ws, err := websocket.Accept(cw, r, nil)
	if err != nil {
		return // Accept answered
	}
	defer ws.CloseNow()
	ws.SetReadLimit(p.cfg.MaxBodyBytes)
	s := &clientSocket{p: p, ws: ws, header: turnHeader(r.Header), target: r.URL.RequestURI(), remote: r.RemoteAddr,
		lg: p.cfg.Logger.With("socket", r.RemoteAddr), conn: cw.conn}
	s.idleSince.Store(opened.UnixNano())
	if !p.sockets.add(s) {
		s.goAway()
		return
	}
	defer p.sockets.remove(s)
	s.lg.Debug("client socket opened")
	s.serve(r.Context())
	s.lg.Debug("client socket closed")
}

// turnHeader returns the headers a socket's turns carry: the handshake's,
// without those of the handshake itself and without the WebSocket mode's
// beta flag, so that the turns go upstream as the same client's POSTs do.
func turnHeader(h http.Header) http.Header {
	out := h.Clone()
	for k := range out {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Sec-Websocket-") {
			delete(out, k)
		}
	}
	for _, k := range []string{"Upgrade", "Connection", "Origin", forwardHeader} {
		out.Del(k)
	}
	var beta []string
	for flag := range headerList(out, "OpenAI-Beta") {
		if !strings.HasPrefix(flag, "responses_websockets=") {
			beta = append(beta, flag)
		}
	}
	out.Del("OpenAI-Beta")
	if len(beta) > 0 {
		out.Set("OpenAI-Beta", strings.Join(beta, ","))
	}
	return out
}

// clientSocket is one client connection in the WebSocket mode.
type clientSocket struct {
	p      *Proxy
	ws     *websocket.Conn
	header http.Header // the turns' headers
	target string      // the turns' request URI: the handshake's
	remote string
	lg     *slog.Logger
	conn   net.Conn // the connection the handshake hijacked
	// used tells that a message began on the connection (CloseUnusedSocket).
	used atomic.Bool
	// busy counts the messages begun and not yet answered; idleSince is
	// when it last fell to 0, or when the connection opened (UnixNano).
	busy      atomic.Int32
	idleSince atomic.Int64
	// dropped tells that the connection was closed to make room.
	dropped atomic.Bool
	// latest is the connection's latest response, nil when it keeps none;
	// Proxy.kept may drop it meanwhile.
	latest *keptResponse
}

// keepLatest makes k the connection's latest response, unless it is over
// MaxBodyBytes or Config.MaxKeptBytes; nil keeps none.
func (s *clientSocket) keepLatest(k *keptResponse) {
	s.p.kept.drop(s.latest)
	s.latest = nil
	if k != nil && s.p.kept.keep(k, s.p.cfg.MaxBodyBytes) {
		s.latest = k
	}
}

// keptResponse is a response a connection keeps for the client to continue
// it: the full input of its request, its output items and its id. Once
// kept (keptResponses.keep) its fields are read and cleared under the
// set's lock.
type keptResponse struct {
	id            string
	input, output []json.RawMessage
	bytes         int64
	at            *list.Element // in keptResponses.order; nil once dropped
}

// keptResponses bounds what the client connections keep of their latest
// responses together (Config.MaxKeptBytes): past it, the responses kept
// the longest ago are dropped, and a turn that continues one is answered
// as if its connection kept none.
type keptResponses struct {
	mu    sync.Mutex
	limit int64
	bytes int64
	order list.List // of *keptResponse, the oldest first
}

// keep keeps k, dropping the responses kept the longest ago to make room;
// false when k alone is over the limit, or over most (a body it expands
// into could not be read).
func (ks *keptResponses) keep(k *keptResponse, most int64) bool {
	if k.bytes = k.size(); k.bytes > min(ks.limit, most) {
		return false
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for ks.bytes+k.bytes > ks.limit {
		ks.dropLocked(ks.order.Front().Value.(*keptResponse))
	}
	k.at = ks.order.PushBack(k)
	ks.bytes += k.bytes
	return true
}

// drop drops k (nil for none), if it is still kept.
func (ks *keptResponses) drop(k *keptResponse) {
	if k == nil {
		return
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.dropLocked(k)
}

func (ks *keptResponses) dropLocked(k *keptResponse) {
	if k.at == nil {
		return
	}
	ks.order.Remove(k.at)
	ks.bytes -= k.bytes
	k.id, k.input, k.output, k.at = "", nil, nil, nil
}

// continued returns the input and output of k (nil for none) when it is
// still kept and its id is id.
func (ks *keptResponses) continued(k *keptResponse, id string) (input, output []json.RawMessage, ok bool) {
	if k == nil {
		return nil, nil, false
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if k.at == nil || k.id != id {
		return nil, nil, false
	}
	return k.input, k.output, true
}

// message is a client's message read ahead, with what it holds of the
// proxy's budget until it is answered; or, when the budget refused it,
// the refusal (errBusy or errOverBudget), and no data.
type message struct {
	data    []byte
	held    *hold
	refused error
}

// readMessages reads the client's messages ahead of the turns, each held
// in the budget, until ctx ends or the client goes away (then it cancels
// ctx). The channel is closed once reading has stopped.
func (s *clientSocket) readMessages(ctx context.Context, cancel context.CancelFunc) <-chan message {
	messages := make(chan message, socketQueue)
	go func() {
		defer close(messages)
		defer cancel() // the client went away: a turn in flight sees it
		for {
			// A connection idles between turns: the wait for a message
			// to begin is not bounded, its reads are (readMessage).
			mctx, cancelMessage := context.WithCancel(ctx)
			typ, r, err := s.ws.Reader(mctx)
			s.used.Store(true)
			if err == nil {
				s.busy.Add(1) // answered in answer
			}
			var m message
			if err == nil {
				m.data, m.held, err = s.p.readMessage(mctx, cancelMessage, r)
			}
			cancelMessage()
			switch {
			case errors.Is(err, errBusy), errors.Is(err, errOverBudget):
				m.refused = err // answered in its turn, with the refusal
			case err != nil:
				return
			case typ == websocket.MessageText && !utf8.Valid(m.data):
				// A text message must be UTF-8 (RFC 6455 8.1): the
				// connection fails.
				m.held.release()
				s.busy.Add(-1)
				_ = s.ws.Close(websocket.StatusInvalidFramePayloadData, "a text message that is not UTF-8")
				return
			}
			messages <- m // serve reads them all, to the last
		}
	}()
	return messages
}

// answer answers a message read ahead, then gives back its hold; false
// when the connection is over. A refused message gets the error event of
// the error a POST gets, and the connection keeps its latest response,
// for the client's retry to continue.
func (s *clientSocket) answer(ctx context.Context, m message) bool {
	defer func() {
		m.held.release()
		if s.busy.Add(-1) == 0 {
			s.idleSince.Store(time.Now().UnixNano())
		}
	}()
	if m.refused != nil {
		return s.refuse(ctx, m.refused)
	}
	return s.handle(ctx, m.data, m.held)
}

// refuse answers a message the budget refused (errBusy or errOverBudget)
// with the refusal's error event; false when the connection is over.
func (s *clientSocket) refuse(ctx context.Context, err error) bool {
	rf := s.p.refusal(err)
	return s.send(ctx, errorEvent(rf.status, rf.typ, "", rf.code, rf.message))
}

// serve answers the client's messages in turn until the client goes away,
// the connection's lifetime ends or the proxy shuts down.
func (s *clientSocket) serve(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	messages := s.readMessages(ctx, cancel)
	defer func() {
		cancel()
		s.keepLatest(nil)
		for m := range messages {
			m.held.release() // read, never answered
		}
	}()
	expiry := time.NewTimer(s.p.clientSocketLifetime())
	defer expiry.Stop()
	closing := s.p.sockets.closingCh()
	for {
		// The lifetime may have ended, or the shutdown begun, during a
		// turn: that goes before any message queued meanwhile.
		select {
		case <-expiry.C:
			s.expire(ctx)
			return
		case <-closing:
			s.goAway()
			return
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			s.expire(ctx)
			return
		case <-closing:
			s.goAway()
			return
		case m, ok := <-messages:
			if !ok {
				return
			}
			if !s.answer(ctx, m) {
				return
			}
		}
	}
}

// goAway closes the connection as the gateway shuts down.
func (s *clientSocket) goAway() {
	_ = s.ws.Close(websocket.StatusGoingAway, "the gateway is shutting down")
}

// expire ends the connection at the end of its lifetime, as the upstream
// ends its own: the error event, then a normal closure.
func (s *clientSocket) expire(ctx context.Context) {
	d := s.p.clientSocketLifetime()
	limit := d.String()
	if d%time.Minute == 0 {
		limit = fmt.Sprintf("%d minutes", d/time.Minute)
		if d == time.Minute {
			limit = "1 minute"
		}
	}
	msg := fmt.Sprintf("Responses websocket connection limit reached (%s). Create a new websocket connection to continue.", limit)
	if s.send(ctx, errorEvent(http.StatusBadRequest, "invalid_request_error", "", connectionLimitCode, msg)) {
		_ = s.ws.Close(websocket.StatusNormalClosure, connectionLimitCode)
	}
}

// send writes one text message; false when the client is gone.
func (s *clientSocket) send(ctx context.Context, data []byte) bool {
	return writeMessage(ctx, s.ws, s.p.cfg.MessageTimeout, data)
}

// writeMessage writes one text message, parts one after the other, to a
// client's connection, which it closes when the client does not take
// gapRead bytes of it within each timeout, as a message that stalls does
// when it is read: a client that does not read its answers may not keep
// what they hold. A longer message goes in frames of gapRead bytes at
// most, each given timeout (messageWriter). False when the message was
// not written.
func writeMessage(ctx context.Context, ws *websocket.Conn, timeout time.Duration, parts ...[]byte) bool {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n <= gapRead {
		wctx, cancel := context.WithTimeout(ctx, timeout) // ends the write, and the connection
		defer cancel()
		data := parts[0]
		if len(parts) > 1 {
			data = bytes.Join(parts, nil)
		}
		return ws.Write(wctx, websocket.MessageText, data) == nil
	}
	m, err := openMessage(ctx, ws, timeout)
	if err != nil {
		return false
	}
	for _, p := range parts {
		if _, err := m.Write(p); err != nil {
			m.abandon()
			return false
		}
	}
	return m.Close() == nil
}

// messageWriter writes a text message to a client's connection as its
// parts come, in frames of gapRead bytes at most, each given timeout
// (writeMessage); the time between writes is not the client's.
type messageWriter struct {
	w       io.WriteCloser
	cancel  context.CancelFunc
	gap     *time.Timer
	timeout time.Duration
}

// openMessage begins a text message on ws.
func openMessage(ctx context.Context, ws *websocket.Conn, timeout time.Duration) (*messageWriter, error) {
	wctx, cancel := context.WithCancel(ctx)
	m := &messageWriter{cancel: cancel, gap: time.AfterFunc(timeout, cancel), timeout: timeout}
	w, err := ws.Writer(wctx, websocket.MessageText) // waits for a message being written, or a ping
	m.gap.Stop()
	if err != nil {
		cancel()
		return nil, err
	}
	m.w = w
	return m, nil
}

func (m *messageWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), gapRead)
		m.gap.Reset(m.timeout) // ends the write, and the connection
		_, err := m.w.Write(p[:k])
		m.gap.Stop()
		if err != nil {
			return n, err
		}
		n, p = n+k, p[k:]
	}
	return n, nil
}

// Close ends the message.
func (m *messageWriter) Close() error {
	m.gap.Reset(m.timeout)
	err := m.w.Close()
	m.gap.Stop()
	m.cancel()
	return err
}

// abandon leaves the message unended, and the connection with it.
func (m *messageWriter) abandon() {
	m.gap.Stop()
	m.cancel()
}

// fail answers a response.create with an error event and drops the
// connection's latest response, as a failed request does upstream.
func (s *clientSocket) fail(ctx context.Context, status int, param, code, msg string) bool {
	s.keepLatest(nil)
	return s.reject(ctx, status, param, code, msg)
}

// reject answers a message with an error event. A message that is not a
// response.create (not a JSON object, or of a type the connection does not
// serve, such as a later version's) leaves the latest response kept.
func (s *clientSocket) reject(ctx context.Context, status int, param, code, msg string) bool {
	return s.send(ctx, errorEvent(status, "invalid_request_error", param, code, msg))
}

// handle answers one message; false when the connection is over.
func (s *clientSocket) handle(ctx context.Context, data []byte, held *hold) bool {
	msg := gjson.ParseBytes(data)
	if !gjson.ValidBytes(data) || !msg.IsObject() {
		return s.reject(ctx, http.StatusBadRequest, "", "",
			"We could not parse the JSON of your message: it is not a JSON object.")
	}
	switch typ := msg.Get("type").String(); typ {
	case "response.create":
	case "response.processed":
		return true // the client's acknowledgement of a response: nothing to answer
	default:
		return s.reject(ctx, http.StatusBadRequest, "type", "invalid_value",
			fmt.Sprintf("Invalid value: '%s'. Supported values are: 'response.create'.", typ))
	}
	if in := msg.Get("input"); in.Exists() && in.Type != gjson.Null && in.Type != gjson.String && !in.IsArray() {
		// Refused here as upstream: a continuation the connection expands
		// would otherwise go without it.
		return s.fail(ctx, http.StatusBadRequest, "input", "invalid_type",
			fmt.Sprintf("Invalid type for 'input': expected one of a string or an array of input items, but got %s instead.", jsonKind(in)))
	}
	if msg.Get("background").Bool() {
		return s.fail(ctx, http.StatusBadRequest, "background", "unsupported_parameter",
			"Unsupported parameter: 'background' is not supported in WebSocket mode.")
	}
	c, err := s.prepare(data, msg)
	if err != nil {
		return s.fail(ctx, http.StatusBadRequest, "", "", "Invalid message: "+err.Error())
	}
	s.lg.Debug("response.create", "previous_response_id", c.prev, "expanded", c.full && c.prev != "",
		"items", len(c.input), "generate", msg.Get("generate").Raw)
	if c.prev != "" && !c.full && msg.Get("store").Raw == "false" {
		return s.fail(ctx, http.StatusBadRequest, "previous_response_id", notFoundCode,
			fmt.Sprintf("Previous response with id '%s' not found.", c.prev))
	}
	if c.full && msg.Get("generate").Type == gjson.False {
		return s.warmUp(ctx, c, msg)
	}
	if c.prepended > 0 && held != nil {
		// Expanded into the whole conversation: the turn's body, read
		// and parsed as a request's, is held as one.
		if err := held.grow(ctx, weight(int64(len(c.body)), int64(len(c.input)))); err != nil {
			if !errors.Is(err, errBusy) && !errors.Is(err, errOverBudget) {
				return false // the connection is over
			}
			return s.refuse(ctx, err)
		}
	}
	return s.run(ctx, c, held)
}

// socketCreate is a response.create as the pipeline takes it.
type socketCreate struct {
	// body is the create-response body: "type" dropped, "stream" true.
	body []byte
	// prev is the client's previous_response_id, "" for none.
	prev string
	// full tells whether body holds the whole conversation (neither a
	// previous response nor a conversation of the upstream's), then
	// input.
	full  bool
	input []json.RawMessage
	// prepended is the number of items the connection's latest response
	// put before the message's own, when it continues that response.
	prepended int
}

// prepare turns a response.create into the body it stands for: the full
// context when it continues the connection's latest response.
func (s *clientSocket) prepare(data []byte, msg gjson.Result) (socketCreate, error) {
	c := socketCreate{prev: msg.Get("previous_response_id").String()}
	body, err := sjson.DeleteBytes(data, "type")
	if err == nil && msg.Get("generate").Type == gjson.True {
		body, err = sjson.DeleteBytes(body, "generate") // the default
	}
	if err == nil {
		body, err = sjson.SetBytes(body, "stream", true)
	}
	if err != nil {
		return c, err
	}
	items := inputItems(msg.Get("input"))
	keptIn, keptOut, continues := s.p.kept.continued(s.latest, c.prev)
	switch {
	case c.prev != "" && continues:
		full := make([]json.RawMessage, 0, len(keptIn)+len(keptOut)+len(items))
		full = append(append(append(full, keptIn...), keptOut...), items...)
		body, err = sjson.SetRawBytes(body, "input", jsonArray(full))
		if err == nil {
			body, err = sjson.DeleteBytes(body, "previous_response_id")
		}
		if err != nil {
			return c, err
		}
		c.full, c.input, c.prepended = true, full, len(keptIn)+len(keptOut)
	case c.prev == "" && !msg.Get("conversation").Exists():
		c.full, c.input = true, items
		if msg.Get("input").Type == gjson.String {
			// As the user message it stands for, so that the next request
			// continues it item for item.
			if body, err = sjson.SetRawBytes(body, "input", jsonArray(items)); err != nil {
				return c, err
			}
		}
	}
	c.body = body
	return c, nil
}

// inputItems returns the items of an input member: an array's elements, a
// string as the user message it stands for.
func inputItems(input gjson.Result) []json.RawMessage {
	switch {
	case input.IsArray():
		return rawArray(input)
	case input.Type == gjson.String:
		// The string stays as the client wrote it.
		msg := `{"role":"user","content":` + input.Raw + `}`
		return []json.RawMessage{json.RawMessage(msg)}
	}
	return nil
}

// jsonArray returns the JSON array of items, each as it was written.
func jsonArray(items []json.RawMessage) []byte {
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it...)
	}
	return append(b, ']')
}

// run serves one turn through ServeHTTP and keeps its response when the
// client may continue it; false when the connection is over.
func (s *clientSocket) run(ctx context.Context, c socketCreate, held *hold) bool {
	// The message's hold covers the turn, and its answer.
	req, err := http.NewRequestWithContext(context.WithValue(ctx, socketTurn{}, socketTurnOf{prepended: c.prepended, held: held}), http.MethodPost, s.target,
		bytes.NewReader(c.body))
	if err != nil {
		return s.fail(ctx, http.StatusBadRequest, "", "", "Invalid message: "+err.Error())
	}
	req.Header = s.header.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = s.remote
	sw := &socketWriter{ctx: ctx, ws: s.ws, timeout: s.p.cfg.MessageTimeout, header: http.Header{}, prev: c.prev}
	sw.serve(s.p, req)
	s.keepLatest(nil)
	switch {
	case sw.gone:
		return false
	case sw.cut:
		_ = s.ws.CloseNow() // as the upstream's connection was
		return false
	}
	col := &sw.col
	if c.full && col.continuable() {
		s.keepLatest(&keptResponse{id: col.id, input: c.input, output: col.outcome(http.StatusOK).output})
	}
	return true
}

// size is the bytes of the items a response keeps.
func (k *keptResponse) size() int64 {
	var n int64
	for _, list := range [][]json.RawMessage{k.input, k.output} {
		for _, it := range list {
			n += int64(len(it)) + 1
		}
	}
	return n
}

// warmUp answers a response.create with "generate": false that holds the
// full context: a completed response without output, kept for the
// client's next request to continue.
func (s *clientSocket) warmUp(ctx context.Context, c socketCreate, msg gjson.Result) bool {
	var b [24]byte
	_, _ = rand.Read(b[:])
	id := "resp_" + hex.EncodeToString(b[:])
	now := time.Now().Unix()
	prev := any(nil)
	if c.prev != "" {
		prev = c.prev
	}
	resp := map[string]any{
		"id": id, "object": "response", "created_at": now, "status": "in_progress",
		"model": msg.Get("model").String(), "output": []any{}, "previous_response_id": prev,
		"store": msg.Get("store").Raw != "false", "usage": nil,
	}
	created, _ := json.Marshal(map[string]any{"type": "response.created", "sequence_number": 0, "response": resp})
	resp["status"], resp["completed_at"] = "completed", now
	completed, _ := json.Marshal(map[string]any{"type": "response.completed", "sequence_number": 1, "response": resp})
	if !s.send(ctx, created) || !s.send(ctx, completed) {
		return false
	}
	s.keepLatest(&keptResponse{id: id, input: c.input})
	return true
}

// errorEvent is the WebSocket mode's error event:
// {"type":"error","status":…,"error":{"type":…,"code":…,"message":…,"param":…}}.
func errorEvent(status int, typ, param, code, msg string) []byte {
	return errorEventWith(status, typ, param, code, msg, nil)
}

// errorEventWith is errorEvent carrying the answer's headers h, as the
// upstream's error events carry theirs (Retry-After, the rate limits, the
// request id): each end-to-end header but the body's own, under its
// lowercase name, its values joined by ", ".
func errorEventWith(status int, typ, param, code, msg string, h http.Header) []byte {
	headers := map[string]string{}
	kept := http.Header{}
	copyHeader(kept, h)
	for k, vs := range kept {
		if k != "Content-Type" && k != "Content-Encoding" {
			headers[strings.ToLower(k)] = strings.Join(vs, ", ")
		}
	}
	b, _ := json.Marshal(struct {
		Type    string            `json:"type"`
		Status  int               `json:"status"`
		Error   map[string]any    `json:"error"`
		Headers map[string]string `json:"headers,omitempty"`
	}{"error", status, apiError(typ, param, code, msg), headers})
	return b
}

// socketWriter is the http.ResponseWriter a socket's turn is served with:
// it sends each event of the stream the relay writes as a text message,
// the event's data, and an error answer as the error event the upstream
// would have sent. The relay hands it the events it read whole
// (relayEvent); one the relay passes on unread comes as a Server-Sent
// Event, whose data goes on as it comes, in the frames of a message, so
// that the writer holds no more of it than the relay's reads do.
type socketWriter struct {
	ctx     context.Context
	ws      *websocket.Conn
	timeout time.Duration // MessageTimeout (writeMessage)
	header  http.Header
	// prev is the client's previous_response_id, which the response
	// objects show.
	prev   string
	status int
	events bool   // the answer is an event stream
	buf    []byte // an answer that is not an event stream
	// col is what the answer was: the relay's collector (writeEvents),
	// which keeps the output in the turn's hold, or the writer's own.
	col collector
	// The Server-Sent Event being written: the start of the line being
	// read, until it tells what the line is, and what the rest of the
	// line is (lineStart until it tells); the message its data goes on
	// in, nil before its first data line, and what writes that data
	// (msg, or a previousIDWriter over it that shows prev).
	line    []byte
	in      int
	afterCR bool
	msg     *messageWriter
	data    io.Writer
	// gone tells that a message could not be written: the client is gone.
	gone bool
	// cut tells that the stream broke off upstream.
	cut bool
}

// What the rest of the line a socketWriter reads is.
const (
	lineStart = iota // to be told: too little of the line came
	lineData         // a data line's value, which goes on as it comes
	lineOther        // anything else, passed over
)

// errClientGone is returned by writes after the client went away.
var errClientGone = errors.New("proxy: the client's socket is gone")

// serve runs the turn req through p, then sends what it answered.
func (w *socketWriter) serve(p *Proxy, req *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			w.cut = true
		}
	}()
	p.ServeHTTP(w, req)
	w.finish()
}

func (w *socketWriter) Header() http.Header { return w.header }

// takesAnswersWhole: a JSON answer goes to the client as one message
// (finish).
func (w *socketWriter) takesAnswersWhole() {}

func (w *socketWriter) WriteHeader(status int) {
	if w.status != 0 {
		return
	}
	w.status = status
	w.events = status/100 == 2 && isEventStream(w.header) // 201 and 202 too, in the upstream's media type
}

// Write takes an answer that is not an event stream whole (finish), and
// an event stream's bytes line by line, however they are split.
func (w *socketWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.gone {
		return 0, errClientGone
	}
	if !w.events {
		w.buf = append(w.buf, b...)
		return len(b), nil
	}
	n := len(b)
	for len(b) > 0 {
		if w.afterCR {
			w.afterCR = false
			if b[0] == '\n' { // a CRLF ends one line
				b = b[1:]
				continue
			}
		}
		seg, end := b, false
		if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
			seg, end, w.afterCR = b[:i], true, b[i] == '\r'
			b = b[i+1:]
		} else {
			b = nil
		}
		if err := w.takeLine(seg, end); err != nil {
			w.gone = true
			return 0, errClientGone
		}
	}
	return n, nil
}

// takeLine takes seg, the next bytes of the line being read, which end it
// when end: a data line's value goes on in the event's message, a blank
// line ends the event, and anything else (its name, a comment) is passed
// over.
func (w *socketWriter) takeLine(seg []byte, end bool) error {
	var err error
	switch w.in {
	case lineData:
		_, err = w.data.Write(seg)
	case lineStart:
		// What tells the line: "data:" and the byte after it, which may be
		// a space to pass over.
		k := min(len(seg), len("data: ")-len(w.line))
		w.line, seg = append(w.line, seg[:k]...), seg[k:]
		told := end || len(w.line) == len("data: ")
		switch {
		case end && len(w.line) == 0:
			err = w.endEvent()
		case told && bytes.HasPrefix(w.line, []byte("data:")):
			err = w.dataLine(bytes.TrimPrefix(w.line[len("data:"):], []byte(" ")))
			if err == nil {
				_, err = w.data.Write(seg)
			}
			w.in = lineData
		case told:
			w.in = lineOther
		}
		if told {
			w.line = w.line[:0]
		}
	}
	if end {
		w.in = lineStart
	}
	return err
}

// dataLine begins a data line whose value begins with v: the event's
// message begins with its first, and each other begins on a new line.
func (w *socketWriter) dataLine(v []byte) error {
	if w.msg == nil {
		m, err := openMessage(w.ctx, w.ws, w.timeout)
		if err != nil {
			return err
		}
		w.msg, w.data = m, m
		if w.prev != "" {
			// The added previous_response_id went by as null (passTo).
			prev, _ := json.Marshal(w.prev)
			w.data = &previousIDWriter{w: m, old: []byte("null"), with: prev}
		}
	} else if _, err := w.data.Write([]byte("\n")); err != nil {
		return err
	}
	_, err := w.data.Write(v)
	return err
}

// endEvent ends the message of the event read, if it has data.
func (w *socketWriter) endEvent() error {
	m := w.msg
	if m == nil {
		return nil // a comment, or an event without data
	}
	w.msg = nil
	if r, ok := w.data.(*previousIDWriter); ok {
		if err := r.Flush(); err != nil {
			m.abandon()
			return err
		}
	}
	return m.Close()
}

// Flush is a no-op: every event is sent as it is written, an event passed
// on in frames as they fill.
func (w *socketWriter) Flush() {}

// cutStream notes a stream that broke off upstream (see run).
func (w *socketWriter) cutStream() { w.cut = true }

// relayEvent takes the relay's next event, which the relay's collector,
// col, has seen (writeEvents): one it read is sent, its response object
// showing the client's own previous_response_id, else hide, the one the
// proxy added, as null; one it passed on unread came through Write. False
// when the client is gone.
func (w *socketWriter) relayEvent(ev event, hide string) bool {
	if !ev.passed && !w.gone && !writeMessage(w.ctx, w.ws, w.timeout, w.shown(ev.data, hide)...) {
		w.gone = true
	}
	return !w.gone
}

// sendEvent sends an event of the writer's own (finish).
func (w *socketWriter) sendEvent(ev event) {
	w.col.see(ev)
	w.relayEvent(ev, "")
}

// shown returns the parts of data, an event's, that the client is shown
// (sendEvent): data itself, or around the value of its response's
// previous_response_id, the value the client is shown.
func (w *socketWriter) shown(data []byte, hide string) [][]byte {
	if w.prev == "" && (hide == "" || absent(data, hide)) {
		return [][]byte{data}
	}
	v := gjson.GetBytes(data, "response.previous_response_id")
	want := []byte("null")
	switch {
	case w.prev != "":
		want, _ = json.Marshal(w.prev)
	case v.String() != hide:
		return [][]byte{data}
	}
	if v.Index > 0 {
		return [][]byte{data[:v.Index], want, data[v.Index+len(v.Raw):]}
	}
	if !gjson.GetBytes(data, "response").IsObject() {
		return [][]byte{data}
	}
	d, err := sjson.SetRawBytes(data, "response.previous_response_id", want) // a member it lacks
	if err != nil {
		return [][]byte{data}
	}
	return [][]byte{d}
}

// finish sends an answer that was not an event stream as events: a
// response object as its terminal event, an error as an error event. An
// event stream that ended without a terminal event broke off.
func (w *socketWriter) finish() {
	if w.msg != nil { // the stream broke off inside an event
		w.msg.abandon()
		w.msg, w.cut = nil, true
	}
	if w.gone || w.cut {
		return
	}
	if w.events {
		if w.col.terminal == "" {
			w.cut = true
		}
		return
	}
	body := gjson.ParseBytes(w.buf)
	if w.status/100 == 2 && body.Get("object").String() == "response" {
		switch st := body.Get("status").String(); st {
		case "completed", "failed", "incomplete":
			data, _ := sjson.SetRawBytes([]byte(`{"type":"response.`+st+`"}`), "response", []byte(body.Raw))
			w.sendEvent(event{typ: "response." + st, data: data})
			return
		}
	}
	status := w.status
	if status < 400 || status > 599 {
		status = http.StatusBadGateway
	}
	e := body.Get("error")
	msg := e.Get("message").String()
	if !e.IsObject() {
		msg = "The upstream answered " + http.StatusText(w.status) + "."
	}
	data := errorEventWith(status, e.Get("type").String(), e.Get("param").String(), e.Get("code").String(), msg, w.header)
	w.sendEvent(event{typ: "error", data: data})
}

// socketSet is the client connections a proxy serves, for Shutdown.
type socketSet struct {
	mu      sync.Mutex
	open    map[*clientSocket]struct{}
	closing chan struct{} // closed by Shutdown
	closed  bool
	empty   chan struct{} // closed when the last connection ends after Shutdown began
}

// closingCh returns the channel Shutdown closes.
func (ss *socketSet) closingCh() <-chan struct{} {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closing == nil {
		ss.closing = make(chan struct{})
	}
	return ss.closing
}

func (ss *socketSet) isClosing() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closed
}

// add registers a connection; false once Shutdown has begun.
func (ss *socketSet) add(s *clientSocket) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	if ss.open == nil {
		ss.open = map[*clientSocket]struct{}{}
	}
	ss.open[s] = struct{}{}
	return true
}

func (ss *socketSet) remove(s *clientSocket) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.open, s)
	if len(ss.open) == 0 && ss.empty != nil {
		close(ss.empty)
		ss.empty = nil
	}
}

// CloseUnusedSocket closes the client WebSocket connection that has waited
// the longest for its first message (1013, try again later), and reports
// whether there was one. A server at its connection limit calls it to
// make room for a new connection: connections opened and never used
// would otherwise hold the limit for as long as they live (a client
// that opens its connection early and sends later reconnects when it
// needs it; the OpenAI SDKs reconnect after 1013).
func (p *Proxy) CloseUnusedSocket() bool {
	return p.sockets.closeIdlest("never used", func(s *clientSocket) bool { return !s.used.Load() })
}

// CloseIdleSocket closes the client WebSocket connection, used or not,
// that has been idle the longest: no message in flight, and none begun
// since the longest ago, or since it opened (1013, try again later). It
// reports whether there was one. A server at its connection limit calls
// it when no connection is idler (CloseUnusedSocket, keep-alive
// connections between requests): a connection that sent one message
// would otherwise hold the limit for its lifetime. The client opens a
// new one for its next turn, whose continuation a socket of this
// connection may no longer hold.
func (p *Proxy) CloseIdleSocket() bool {
	return p.sockets.closeIdlest("idle", func(s *clientSocket) bool { return s.busy.Load() == 0 })
}

// closeIdlest closes the connection that eligible takes and that has been
// idle the longest, logging why; false when there is none.
func (ss *socketSet) closeIdlest(why string, eligible func(*clientSocket) bool) bool {
	ss.mu.Lock()
	var idlest *clientSocket
	for s := range ss.open {
		if !s.dropped.Load() && eligible(s) && (idlest == nil || s.idleSince.Load() < idlest.idleSince.Load()) {
			idlest = s
		}
	}
	if idlest != nil {
		idlest.dropped.Store(true) // closed once
	}
	ss.mu.Unlock()
	if idlest == nil {
		return false
	}
	idlest.lg.Debug("client socket closed: its slot wanted", "reason", why,
		"idle", time.Since(time.Unix(0, idlest.idleSince.Load())).Round(time.Millisecond))
	// The close frame goes at once; the slot is free once the connection
	// closes, which a client that reads nothing would not answer.
	go func() { _ = idlest.ws.Close(websocket.StatusTryAgainLater, "the gateway is at its connection limit") }()
	time.AfterFunc(roomCloseWait, func() { _ = idlest.conn.Close() })
	return true
}

// connCapture is a ResponseWriter that keeps the connection a WebSocket
// handshake hijacks: closeIdlest closes it without waiting for the client
// to answer the close frame, which the WebSocket library does.
type connCapture struct {
	http.ResponseWriter
	conn net.Conn
}

// Hijack implements http.Hijacker.
func (c *connCapture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(c.ResponseWriter).Hijack()
	c.conn = conn
	return conn, rw, err
}

// Unwrap returns the server's ResponseWriter, for
// http.NewResponseController.
func (c *connCapture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// roomCloseWait is how long a connection closed to make room
// (closeIdlest) has to answer the close frame before it is closed.
const roomCloseWait = 100 * time.Millisecond

// Shutdown closes the clients' WebSocket connections (going away, 1001),
// each once its turn in flight is over, refuses new ones, and waits until
// they are closed or ctx ends; then it closes those left and returns ctx's
// error. Call it when the HTTP server shuts down (http.Server.Shutdown
// does not wait for connections it no longer manages), before Close.
func (p *Proxy) Shutdown(ctx context.Context) error {
	ss := &p.sockets
	ss.closingCh()
	ss.mu.Lock()
	if !ss.closed {
		ss.closed = true
		close(ss.closing)
	}
	if len(ss.open) == 0 {
		ss.mu.Unlock()
		return nil
	}
	if ss.empty == nil {
		ss.empty = make(chan struct{})
	}
	empty := ss.empty
	ss.mu.Unlock()
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
		ss.mu.Lock()
		for s := range ss.open {
			_ = s.ws.CloseNow()
		}
		ss.mu.Unlock()
		return ctx.Err()
	}
}
