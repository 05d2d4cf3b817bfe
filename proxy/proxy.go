// Package proxy is a Responses gateway in one http.Handler: it serves
// POST /v1/responses in front of a Responses upstream and, when the
// continuation store says a request only appends to the previous turn of
// the same conversation, sends the upstream previous_response_id and the
// new input items instead of the whole history.
//
// For each request the proxy reads the owner (Identity), parses the body
// and reserves a turn (store.Store.Reserve); a turn nothing could
// continue ("store": false over an HTTP upstream, without forwarding)
// reserves nothing and records nothing. It continues when the
// reservation offers a continuation that the turn's upstream connection
// can continue (Upstream), else it sends the full context. It streams the
// upstream's events to the client as they arrive (stream true) or relays
// its JSON answer. It records a completed response, or one cut short
// (incomplete), which the upstream keeps all the same (store.Store.Record),
// before the client gets its end (the terminal event, or the JSON body),
// so that a client sending its next turn at once finds it; on a store
// that is not in process, it records it as the client gets it with
// Config.Affinity, or when the turn went on the store's guess (the owner
// stays on this replica). It aborts the turn (store.Store.Abort) on
// anything else, and after the record when the client never got the end.
// An upstream that refuses a continuation before anything reached the
// client gets the same turn again with the full context, unseen by the
// client; after a few refusals in a row for one model, that model's turns
// go with the full context for a while (Learning), and
// Config.NoContinuation never continues. The client sees what it would
// see without the proxy: when a turn was continued, the
// previous_response_id the proxy added is shown as null.
//
// A turn's body may be compressed (encoding.go): it is read decoded and
// sent upstream so. A request that carries its own previous_response_id
// or conversation is forwarded as sent, outside the store, and so is one
// whose owner Identity cannot read; a body the fingerprint refuses goes
// upstream as received (decoded, when it came compressed), counted in
// Stats.Unread. The client gets the upstream's answer. A client's
// WebSocket message or a forwarded turn the fingerprint refuses gets the
// proxy's 400. Store failures never fail a
// request: the store fails open and the full context goes upstream.
//
// Every other request under /v1 (GET /v1/models, POST
// /v1/responses/compact, GET /v1/responses/{id}, POST
// /v1/chat/completions, …) goes to the upstream's HTTP base as the client
// sent it, with a turn's headers, both bodies streamed through; a path
// outside /v1 is answered 404.
//
// A WebSocket upgrade on /v1/responses opens the Responses API's WebSocket
// mode (clientws.go): each response.create message is a turn served as the
// POST it stands for, its events sent back on the connection, and a
// response.create that continues the connection's latest response with
// only new input is served with the full context the connection kept.
// Proxy.Shutdown closes those connections when the server stops.
//
// Embedding it:
//
//	st, _ := store.NewRedis(client, store.Options{Replica: "gw-1"})
//	up, _ := proxy.NewHTTPUpstream("https://api.openai.com/v1", nil)
//	p, _ := proxy.New(proxy.Config{Store: st, Upstream: up})
//	defer p.Close()
//	http.Handle("/v1/", p)
//	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
package proxy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/route"
	"github.com/contstore/contstore/store"
)

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("proxy: invalid config")

// Defaults of Config.
const (
	defaultMaxBodyBytes    = 64 << 20
	defaultMaxPassthrough  = 512 << 20
	defaultUpstreamTimeout = 10 * time.Minute
	defaultMessageTimeout  = 30 * time.Second
	defaultMaxKeptBytes    = 512 << 20
)

// Config configures a Proxy.
type Config struct {
	// Store decides continuations. Required.
	Store *store.Store
	// Upstream carries the turns. Required.
	Upstream Upstream
	// Identity says where requests name their owner. Zero: DefaultIdentity.
	Identity Identity
	// MaxBodyBytes bounds a turn's body, decoded when compressed (413
	// above). Default 64 MiB.
	MaxBodyBytes int64
	// MaxPassthroughBytes bounds the body of a request to another
	// endpoint (a file upload), which goes upstream as it streams in and
	// is never held (413 above). Default 512 MiB, the largest file the
	// Files API takes.
	MaxPassthroughBytes int64
	// UpstreamTimeout bounds one turn upstream, streaming included.
	// Default 10 minutes.
	UpstreamTimeout time.Duration
	// Observer, when set, sees each turn's steps (Event).
	Observer Observer
	// Logger gets a debug record per turn, and warnings (upstream,
	// directory, store writes) at most a line a second per cause, with
	// how many were left out. A store that fails open is the store's
	// Observer's to log (store/storelog). Default: discard.
	Logger *slog.Logger
	// Forwarding, when set, hands turns whose socket is another
	// replica's to that replica.
	Forwarding *Forwarding
	// RoutingHeader names the answer header that carries the replica
	// holding the socket a response lives on, for load balancers that can
	// follow it (header affinity). Default "Contproxy-Replica"; "-" for
	// none.
	RoutingHeader string
	// Learning says when continuing stops for a model whose
	// continuations the upstream refuses, and for how long. Zero:
	// defaults (see Learning).
	Learning Learning
	// Affinity tells that the load balancer sends an owner's turns to the
	// replica that served its last one (session affinity, or header
	// affinity on RoutingHeader). A completed response that ran on this
	// replica's upstream is then recorded, in a store that is not in
	// process, while its end reaches the client, who no longer waits for
	// the store's round trip; the owner's next turn on this replica
	// reserves once the record is in. A next turn sent at once to another
	// replica may miss the record and go with the full context. A turn
	// forwarded to the replica holding its socket, where header affinity
	// sends the next one, is recorded before its end. Without Affinity, a
	// record is in before the client gets the end, for a next turn on any
	// replica, but that of a turn sent on a guess (below), whose owner
	// stays here.
	//
	// On a store that is not in process and keeps guesses
	// (store.Options.GuessOwners), with or without Affinity, a turn that
	// continues this replica's last record of an owner that stays here, a
	// response the HTTP upstream keeps, goes upstream while the store
	// reserves it (store.Store.Guess), and keeps the upstream's answer
	// whatever the reservation says: when it disagrees (another replica
	// served the owner since, counted in Stats.GuessesOverruled), that
	// answer continues an older response of the conversation than the
	// reservation's, and the turn's record is in before its end. The
	// store guesses only while owners stay on this replica, so that
	// behind a load balancer that spreads an owner's turns it does not
	// guess, or stops after a few overruled guesses.
	Affinity bool
	// NoContinuation never continues: for an upstream that keeps no
	// responses. Every request goes upstream as the client sent it,
	// outside the store (nothing is reserved or recorded) and without
	// reading its owner.
	NoContinuation bool
	// ClientSocketLifetime bounds a client's WebSocket connection (the
	// WebSocket mode on GET /v1/responses, clientws.go): at its end the
	// client gets websocket_connection_limit_reached, as from the
	// upstream. Default 60 minutes, the upstream's.
	ClientSocketLifetime time.Duration
	// MessageTimeout bounds each wait for the next bytes of a client's
	// WebSocket message once it has begun (a connection may idle between
	// messages for as long as it lives): a message that stalls that long,
	// less than 64 KiB of it arriving, closes the connection, as a stalled
	// body does over HTTP; so does an answer's event the client does not
	// take at that pace. Default 30 seconds.
	MessageTimeout time.Duration
	// MaxBytesInFlight bounds the memory the requests read in full hold
	// at once on this replica: each turn's body until its turn ends (its
	// record, when it is in after the end), each WebSocket message until
	// it is answered, a body weighing twice its size plus 80 bytes an
	// input item (budget.go); a body still arriving holds what has
	// arrived, not the length it claims (the bodies of known length
	// allocated at once, before their bytes arrive, take at most a quarter
	// of it beside). A turn that finds no room first stops the bodies that
	// have been arriving for a second or more and now arrive slowly, then
	// waits; if it finds none within a second it gets 503, code
	// server_busy, with Retry-After: 1 (an error event with status 503 in
	// the WebSocket mode, whose connection stops reading meanwhile), as
	// the bodies it stopped do; one that could never fit gets 413 at once.
	// A turn's answer joins its body's weight (a WebSocket turn's, its
	// message's) until the client has it: a JSON answer three times its
	// bytes, held as it is read, and relayed unkept (not recorded) as it
	// comes once no room comes for it; a stream's event as it is read and
	// its output items and final response twice theirs, while there is
	// room, an event there is none for going on as it arrives, the turn
	// unkept when it held output or the end (to a WebSocket client, in its
	// message's frames, and the connection does not keep that response).
	// Default 256 MiB.
	MaxBytesInFlight int64
	// MaxKeptBytes bounds what the client WebSocket connections keep of
	// their latest responses together, for their clients to continue with
	// previous_response_id and the new items only (clientws.go), an item
	// counted by its bytes: past it, the responses kept the longest ago
	// are dropped, and a turn that continues one is answered as if its
	// connection kept none (with "store": false, previous_response_not_found,
	// and the client sends its full context again). Default 512 MiB.
	MaxKeptBytes int64
}

// Proxy is the gateway handler. It is safe for concurrent use.
type Proxy struct {
	cfg     Config
	replica string // the store's replica id
	stats   counters
	learn   *learner
	warns   warnings  // at most a line a second per cause
	notKept sync.Once // the line on the first turn the upstream keeps no response of
	sockets socketSet
	budget  *budget // MaxBytesInFlight
	kept    *keptResponses
	records records // the recordings in flight
}

// New returns a proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if most := cfg.MaxBytesInFlight / bodyCopies; cfg.MaxBodyBytes > most {
		cfg.Logger.Warn("turn bodies over half of MaxBytesInFlight (-max-bytes-in-flight) never fit, whatever MaxBodyBytes (-max-body) allows: they get 413",
			"max_body_bytes", cfg.MaxBodyBytes, "max_bytes_in_flight", cfg.MaxBytesInFlight, "largest_turn_body", most)
	}
	return &Proxy{cfg: cfg, replica: cfg.Store.Options().Replica, learn: newLearner(cfg.Learning),
		budget: newBudget(cfg.MaxBytesInFlight), kept: &keptResponses{limit: cfg.MaxKeptBytes}}, nil
}

// fill checks cfg and fills its defaults.
func (cfg *Config) fill() error {
	switch {
	case cfg.Store == nil:
		return fmt.Errorf("%w: no Store", ErrInvalidConfig)
	case cfg.Upstream == nil:
		return fmt.Errorf("%w: no Upstream", ErrInvalidConfig)
	case cfg.MaxBodyBytes < 0:
		return fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidConfig, cfg.MaxBodyBytes)
	case cfg.MaxPassthroughBytes < 0:
		return fmt.Errorf("%w: MaxPassthroughBytes %d is negative", ErrInvalidConfig, cfg.MaxPassthroughBytes)
	case cfg.UpstreamTimeout < 0:
		return fmt.Errorf("%w: UpstreamTimeout %v is negative", ErrInvalidConfig, cfg.UpstreamTimeout)
	case cfg.ClientSocketLifetime < 0:
		return fmt.Errorf("%w: ClientSocketLifetime %v is negative", ErrInvalidConfig, cfg.ClientSocketLifetime)
	case cfg.MessageTimeout < 0:
		return fmt.Errorf("%w: MessageTimeout %v is negative", ErrInvalidConfig, cfg.MessageTimeout)
	case cfg.MaxBytesInFlight < 0:
		return fmt.Errorf("%w: MaxBytesInFlight %d is negative", ErrInvalidConfig, cfg.MaxBytesInFlight)
	case cfg.MaxKeptBytes < 0:
		return fmt.Errorf("%w: MaxKeptBytes %d is negative", ErrInvalidConfig, cfg.MaxKeptBytes)
	}
	if cfg.Identity.Session == nil && cfg.Identity.Agent == nil {
		cfg.Identity = DefaultIdentity
	}
	if err := cfg.Identity.validate(); err != nil {
		return err
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, defaultMaxBodyBytes)
	cfg.MaxPassthroughBytes = cmp.Or(cfg.MaxPassthroughBytes, defaultMaxPassthrough)
	cfg.UpstreamTimeout = cmp.Or(cfg.UpstreamTimeout, defaultUpstreamTimeout)
	cfg.MaxBytesInFlight = cmp.Or(cfg.MaxBytesInFlight, defaultMaxBytesInFlight)
	cfg.MessageTimeout = cmp.Or(cfg.MessageTimeout, defaultMessageTimeout)
	cfg.MaxKeptBytes = cmp.Or(cfg.MaxKeptBytes, defaultMaxKeptBytes)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.RoutingHeader = cmp.Or(cfg.RoutingHeader, defaultRoutingHeader)
	if cfg.Forwarding != nil {
		f := *cfg.Forwarding
		if err := f.check(); err != nil {
			return err
		}
		cfg.Forwarding = &f
	}
	return cfg.Learning.check()
}

// Close waits for the records in flight on goroutines of their own
// (see Config.Affinity) to end, each within the store's timeouts, and closes
// the upstream connections the proxy keeps: upstream sockets whose close
// the upstream has not answered within a second finish closing in the
// background. Call it after the HTTP server has shut down, so that no
// turn is in flight.
func (p *Proxy) Close() error {
	p.records.waitAll()
	return p.cfg.Upstream.close()
}

// target is what an upstream connection is acquired for: whose request,
// whether the upstream keeps its response, and the socket and response
// it continues, if any. A turn another replica handed over is a target
// alone (serveForwarded).
type target struct {
	// header holds the client's request headers.
	header http.Header
	// query is the client's query string, which goes upstream with the
	// turn over HTTP (Azure's api-version).
	query string
	// own is the previous_response_id the client sent itself, "" for
	// none: no socket whose latest response it is carries the turn, so
	// that a response the upstream does not keep (store false) is
	// continued on no other client's behalf (websocket.go).
	own string
	// stores tells whether the upstream keeps the response ("store" true
	// or absent).
	stores bool
	// want and prev are the socket and the response the turn continues
	// from, when it does.
	want store.Socket
	prev string
	// forwarded tells whether another replica handed the turn over: it
	// runs on want only, and only while want holds prev.
	forwarded bool
	// answers is where the upstream's answer is held as the relay keeps
	// it (the turn's hold, or a WebSocket turn's message's); nil for
	// none.
	answers *hold
}

// turn is one client request on its way upstream.
type turn struct {
	target
	// stream tells whether the client asked for events.
	stream bool
	// res is the turn's reservation; nil for a passthrough request.
	res *store.Reservation
	// hold is the turn's body's weight in the budget (MaxBytesInFlight),
	// released when the turn is over.
	hold *hold
	// early is the turn sent on a guess while the store reserved it; nil
	// when it was not.
	early *early
	// storeless tells that nothing could continue the turn, nor its
	// response a later turn, so that the store was not asked
	// (Proxy.reserve).
	storeless bool
	// arrived is when the request came: a turn's latency counts from it.
	arrived time.Time
	// unowned says why a turn has no owner, for its log line: "passthrough"
	// (it carries its own previous_response_id or conversation) or
	// "invalid_identity"; "" when it has one, or none to name.
	unowned string
}

// ServeHTTP serves the turns, POST /v1/responses, and passes every other
// request under /v1 through to the upstream (passthrough.go); mount it on
// /v1/.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	if asksWebSocketUpgrade(r) && isTurnPath(r.URL.Path) {
		p.serveSocket(w, r) // the WebSocket mode (clientws.go)
		return
	}
	if p.serveEndpoint(w, r) {
		return // not a turn
	}
	// The body is parsed once, by the fingerprint scanner, once it is in
	// (its input array matched to a recent one as it arrives): every
	// member the proxy reads comes from that pass (Request.Member).
	var goes io.Reader // a forwarded turn's go, its body's last byte (Forwarding)
	if r.Header.Get(forwardHeader) != "" {
		if p.cfg.Forwarding == nil {
			writeError(w, http.StatusForbidden, "invalid_request_error", "", "forward_refused",
				"This replica does not take forwarded turns.")
			return
		}
		var drain func()
		goes, drain = p.splitGo(w, r)
		defer drain()
	}
	req, h, ok := p.readRequest(w, r)
	if !ok {
		return
	}
	defer h.release()
	if goes != nil {
		h.trim(weight(int64(len(req.Body())), int64(req.Len())))
		p.serveForwarded(w, r, req, h, goes)
		return
	}
	if _, sockets := p.cfg.Upstream.(*wsUpstream); sockets && rawMember(req, "background") == "true" {
		// The WebSocket mode has no background responses: such a turn
		// goes over HTTP as sent, as an endpoint's request does, and its
		// response is fetched and cancelled there.
		p.relayRead(w, r, req.Body())
		return
	}
	if b, ok := req.MessageInputBody(); ok && !p.cfg.NoContinuation && !passthrough(req) {
		// A string input goes as the user message it stands for, the
		// opening the client's next request resends (as the WebSocket
		// mode does).
		if m, err := p.cfg.Store.ParseRequest(b); err == nil {
			req = m
		}
	}
	body := req.Body()
	h.trim(weight(int64(len(body)), int64(req.Len())))
	t := &turn{target: target{header: r.Header, query: r.URL.RawQuery, stores: rawMember(req, "store") != "false",
		own: member(req, "previous_response_id").String()}, stream: rawMember(req, "stream") == "true",
		hold: h, arrived: arrived}
	t.answers = h
	if st, ok := r.Context().Value(socketTurn{}).(socketTurnOf); ok && st.held != nil {
		t.answers = st.held
	}
	p.stats.add(cTurns, 1)
	p.stats.add(cBytesReceived, int64(len(body)))
	// A request that keeps its conversation upstream itself, or any with
	// NoContinuation, has no owner: the store reserves nothing, and the
	// body goes upstream as received, by the same path as every turn.
	var who identity.Owner
	var err error
	switch {
	case passthrough(req):
		p.stats.add(cPassthrough, 1)
		t.unowned = "passthrough"
	case !p.cfg.NoContinuation:
		if who, err = p.cfg.Identity.Owner(r.Header, r.URL.RawQuery, req); err != nil {
			// The upstream takes what names no owner here: the turn goes
			// with its full context, outside the store.
			p.warns.warn(p.cfg.Logger, "a turn names its owner in a way the proxy cannot read; sent with its full context", "err", err)
			who, t.unowned = identity.Owner{}, "invalid_identity"
		}
	}
	p.stats.add(cItemsReceived, int64(req.Len()))
	t.res = p.reserve(r, t, who, req)
	if t.res.Continues() {
		t.want, t.prev = t.res.Origin, t.res.PreviousResponseID
	}
	p.run(w, r, t, who)
}

// readRequest reads and parses a turn's body (readTurn) and holds its
// weight in the budget (budget.go) until the caller releases the hold; or
// answers the error and reports false.
func (p *Proxy) readRequest(w http.ResponseWriter, r *http.Request) (*fingerprint.Request, *hold, bool) {
	if r.ContentLength > p.cfg.MaxBodyBytes {
		p.tooLarge(w, p.cfg.MaxBodyBytes) // unread
		return nil, nil, false
	}
	req, h, err := p.readTurn(w, r)
	var un *unparsed
	if errors.As(err, &un) {
		// Released however the relay ends: httputil.ReverseProxy panics
		// with http.ErrAbortHandler when the answer breaks off.
		defer un.hold.release()
	}
	forwarded := r.Header.Get(forwardHeader) != ""
	switch {
	case forwarded && (errors.As(err, &un) || errors.Is(err, fingerprint.ErrInvalidRequest)):
		// A replica forwards only what it read: this header is not one.
		writeError(w, http.StatusForbidden, "invalid_request_error", "", "forward_refused",
			"A forwarded turn's body no replica could have sent.")
	case errors.As(err, &un) && r.Context().Value(socketTurn{}) == nil && !forwarded:
		// The upstream answers what the fingerprint cannot read
		// (duplicate keys, a lone surrogate, a null input…), as it
		// would without the proxy. A client's WebSocket message, which
		// a replica read, gets the proxy's 400.
		p.cfg.Logger.Debug("a turn the fingerprint cannot read goes upstream as sent", "err", un.err)
		p.stats.add(cUnread, 1)
		p.relayRead(w, r, un.body)
	case errors.Is(err, fingerprint.ErrInvalidRequest):
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "invalid_request", err.Error())
	case err != nil:
		p.refuseBody(w, err)
	default:
		return req, h, true
	}
	return nil, nil, false
}

// relayRead relays r upstream as sent, as an endpoint's request is
// (relayEndpoint), with body, its body as the proxy read it.
func (p *Proxy) relayRead(w http.ResponseWriter, r *http.Request, body []byte) {
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	p.relayEndpoint(w, r)
}

// run sends a turn upstream, relays the answer and ends the turn: every
// request that creates a response, reserved or not (passthrough, NoContinuation).
func (p *Proxy) run(w http.ResponseWriter, r *http.Request, t *turn, who identity.Owner) {
	start := t.arrived
	sctx := context.WithoutCancel(r.Context())
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	defer cancel()
	if t.early != nil {
		defer t.early.cancel()
	}
	g := p.gate(t)
	defer g.done()
	res := t.res
	if g.paused {
		res = res.FullContextRetry() // the upstream refuses this model's continuations
		p.stats.add(cPaused, 1)
		p.observe(Event{Step: StepFallback, Owner: who, Turn: res.Turn, Cause: "paused"})
	}
	lg := p.cfg.Logger.With("owner", who, "turn", res.Turn)
	a, err := p.attempt(ctx, t, who, res, lg, g)
	turnAttrs := []any{"route", a.where(), "model", modelName(member(a.res.Request(), "model").String()), "stream", t.stream}
	if err != nil {
		lg = lg.With(turnAttrs...)
		end := p.giveBack(sctx, lg, a.res) // the turn went as a.res, or went nowhere
		if clientLeft(ctx) {
			lg.Debug("the client went away before the upstream answered", "err", err)
			// Unread by a client that is gone; one that only closed its
			// side (a half-close, which ends the request's context too)
			// reads it instead of an empty 200.
			writeError(w, statusClientClosed, "invalid_request_error", "", "client_closed_request",
				"The client closed its side of the connection before the answer began.")
		} else {
			end = "failed"
			p.upstreamError(w, lg, err)
		}
		lg.Debug("turn", "end", end, "latency", time.Since(start))
		p.observe(Event{Step: StepEnd, Owner: who, Turn: res.Turn, Result: end, Err: err, Latency: time.Since(start)})
		return
	}
	defer a.c.release()
	defer a.rep.close()
	if at := a.c.socket(); at.Replica != "" && p.cfg.RoutingHeader != "-" {
		name := at.Replica
		if fc, ok := a.c.(*forwardConn); ok && fc.name != "" {
			name = fc.name // the store names other replicas by a reference
		}
		w.Header().Set(p.cfg.RoutingHeader, name)
	}
	reason := g.reason(a.res.Reason)
	switch {
	case a.unreachable && !a.continued:
		reason = reasonUnreachable
	case t.storeless:
		reason = reasonStoreless
	case t.unowned != "":
		reason = t.unowned
	}
	lg = lg.With(append(turnAttrs, "reason", reason, "continued", a.continued, "items", a.res.Request().Len(),
		"sent", a.res.UpstreamItems)...)
	out := p.deliver(ctx, w, t, a, lg, g, Event{Step: StepEnd, Owner: who, Turn: res.Turn}, start)
	if out.cut {
		cutStream(w)
	}
}

// deliver relays a's answer to the client and settles the turn (settle).
// A completed response's record starts just before the client gets the
// end (relay's seal) and is told, once the end is written, whether the
// client got it. end, StepEnd with its owner and turn, is reported once
// the turn is over: for a recorded turn, when its record is; its latency
// is the client's, to the end of the relay. ctx is the turn's: an answer
// that broke off once it ended, the client having gone, is the client's
// doing, not the upstream's.
func (p *Proxy) deliver(ctx context.Context, w http.ResponseWriter, t *turn, a *sent, lg *slog.Logger, g *gate,
	end Event, start time.Time) outcome {
	sctx := context.WithoutCancel(ctx) // the store's calls outlive the client
	hide, from := "", 0
	if a.continued {
		hide, from = a.res.PreviousResponseID, a.res.Request().Len()-a.res.UpstreamItems
	}
	// The errors name the client's items: those after the ones a
	// continuation left out, and of a WebSocket message continuing its
	// connection's latest response, only the new ones it holds.
	st, _ := ctx.Value(socketTurn{}).(socketTurnOf)
	a.rep.countClientItems(from - st.prepended)
	var rec *recording
	defer func() {
		if rec != nil {
			rec.end(false, nil) // the relay panicked: the turn is aborted after its record
		}
	}()
	sealed, result := false, ""
	out := relay(w, t, a.rep, hide, func(o outcome) { sealed = true; result, rec = p.settle(sctx, &lg, t, a, o, g) })
	if out.err != nil && clientLeft(ctx) {
		out.err, out.cut, out.clientGone = nil, false, true
	}
	if !sealed {
		result, rec = p.settle(sctx, &lg, t, a, out, g)
	}
	end.Err, end.Latency = out.err, time.Since(start)
	finish := func(lg *slog.Logger, result string) {
		end.Result = result
		lg.Debug("turn", "status", out.status, "end", result, "latency", end.Latency)
		p.observe(end)
	}
	switch {
	case rec != nil:
		r := rec
		rec = nil // ended once, even if finish panics
		r.end(!out.clientGone, finish)
	case sealed && out.clientGone:
		finish(lg, "aborted") // completed, but the client never got the end: nothing was recorded
	default:
		finish(lg, result)
	}
	return out
}

// sent is a turn's answer from upstream: the connection it went on, the
// reservation as sent (continuing or with the full context), and the reply.
type sent struct {
	c         conn
	res       *store.Reservation
	continued bool
	// stays tells that the turn went upstream on its guess and the
	// reservation agreed, or decided nothing: the owner stays on this
	// replica.
	stays bool
	// unreachable tells that the continuation offered was on no
	// connection the turn could take: it went with the full context.
	unreachable bool
	rep         *reply
	// refusal is how the upstream refused the turn's continuation;
	// doubted, that the turn went again with the full context after an
	// error that may have been the continuation's (refusedMaybe).
	refusal continuationRefusal
	doubted bool
}

// reasonUnreachable is the reason the log line of a turn gives when its
// continuation was on no connection it could take
// (Stats.ContinuationsUnreachable).
const reasonUnreachable = "continuation_unreachable"

// A try is how one send of a turn went.
type try int

const (
	answered        try = iota // the reply is the turn's answer
	unreachable                // the upstream could not be reached: the turn fails
	notCarried                 // the origin replica refused the forward, or did not accept it in time: it ran nothing
	refusedUpstream            // the upstream refused the continuation before anything reached the client
	clientGone                 // the client went away before an answer: the turn ends unanswered
)

// attempt sends the turn where it goes (route), or keeps the send made on
// its guess while the store reserved it (early.go), and, while a try
// leaves the turn unanswered, sends it again with the full context from
// this replica: after a forward the origin did not carry, and after a
// continuation the upstream refused, wherever it was refused. Each resend
// continues nothing, so the loop ends by the second try. Its events name
// who, the turn's owner. On an error, a holds no connection and no reply,
// and a.res is the reservation last sent (res when none was).
func (p *Proxy) attempt(ctx context.Context, t *turn, who identity.Owner, res *store.Reservation, lg *slog.Logger, g *gate) (*sent, error) {
	guessed, stays := t.early != nil, false
	var c conn
	var err error
	if guessed {
		c = t.early.c
		if res, stays = t.early.keep(res, t.answers); !stays {
			p.stats.add(cGuessesOverruled, 1)
		}
	} else if c, err = p.route(ctx, t); err != nil {
		return &sent{res: res}, err
	}
	a := &sent{c: c, res: res, continued: c.continues(res), stays: stays}
	if res.Continues() && !a.continued {
		a.res, a.unreachable = res.FullContextRetry(), true // offered, but not on this connection
		p.stats.add(cUnreachable, 1)
	}
	p.observe(Event{Step: StepRoute, Owner: who, Turn: res.Turn, Result: a.where()})
	for {
		if guessed {
			a.rep, err, guessed = t.early.rep, t.early.err, false // the first try went while the store reserved
		} else {
			a.rep, err = p.send(ctx, a.c, a.res, t.stream)
		}
		tr := p.judge(ctx, a, err, t.stream)
		p.observe(Event{Step: StepAttempt, Owner: who, Turn: res.Turn, Result: tryNames[tr], Err: err})
		switch tr {
		case answered:
			return a, nil
		case unreachable, clientGone:
			a.c.release()
			return a, err
		case notCarried:
			lg.Info("forwarding failed; serving the turn here with full context", "origin", a.res.Origin.Replica, "err", err)
			p.stats.add(cForwardFailures, 1)
		case refusedUpstream:
			a.rep.close()
			p.stats.add(cRetries, 1)
			if a.refusal == refusedMaybe {
				a.doubted = true
				lg.Info("upstream answered the continued turn an error; resending full context",
					"previous_response_id", a.res.PreviousResponseID, "status", a.rep.status)
				break
			}
			p.warns.warn(lg, "upstream refused the continuation, resending full context",
				"previous_response_id", a.res.PreviousResponseID)
			g.refused()
		}
		p.observe(Event{Step: StepFallback, Owner: who, Turn: res.Turn, Cause: tryNames[tr]})
		// A forward holds nothing to release; the origin's socket no
		// longer holds the response: the full context goes from here.
		a.res, a.continued = a.res.FullContextRetry(), false
		if a.c, err = p.localConn(ctx, t, a.c); err != nil {
			return a, err
		}
	}
}

// where names where a turn went (StepRoute).
func (a *sent) where() string {
	switch _, forwarded := a.c.(*forwardConn); {
	case forwarded:
		return route.Forward.String()
	case !a.continued:
		return route.Full.String()
	case a.res.Origin.Any:
		return route.Stored.String()
	}
	return route.Local.String()
}

// route returns the connection a turn goes on: a forward to the replica
// holding its socket (forwardTarget), or one of this replica's upstream.
func (p *Proxy) route(ctx context.Context, t *turn) (conn, error) {
	if fc := p.forwardTarget(ctx, &t.target); fc != nil {
		return fc, nil
	}
	return p.cfg.Upstream.acquire(ctx, &t.target)
}

// statusClientClosed answers a turn whose client closed the connection,
// or its side of it, before the answer began (nginx's 499).
const statusClientClosed = 499

// clientLeft tells whether ctx, a turn's, ended because its client went
// away (not because the turn ran out of time).
func clientLeft(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }

// judge says how a send made under ctx, the turn's, went; stream tells
// whether the client asked for a stream.
func (p *Proxy) judge(ctx context.Context, a *sent, err error, stream bool) try {
	_, forwarded := a.c.(*forwardConn)
	switch {
	case err != nil && clientLeft(ctx):
		return clientGone // not the upstream's doing, nor a reason to resend
	case err != nil && forwarded && !errors.Is(err, errForwardLost):
		return notCarried
	case err != nil:
		return unreachable
	case a.continued:
		if a.refusal = refused(a.rep, !stream, a.res.PreviousResponseID); a.refusal != notRefused {
			return refusedUpstream
		}
	}
	return answered
}

// settle ends a relayed turn: it starts recording a completed response
// the client is getting as the owner's continuation (record), and aborts
// the turn otherwise. It adds what it did to *lg and returns how the turn
// ended (StepEnd), or the recording that will tell.
func (p *Proxy) settle(ctx context.Context, lg **slog.Logger, t *turn, a *sent, out outcome, g *gate) (string, *recording) {
	if out.failed {
		p.stats.add(cErrorAnswers, 1)
	}
	if a.doubted && out.status/100 == 2 && !out.failed && out.err == nil {
		g.refused() // the full context went where the continuation did not
	}
	switch {
	case out.err != nil:
		p.stats.add(cUpstreamErrors, 1)
		p.warns.warn(*lg, "upstream answer cut short; turn aborted", "err", out.err)
		return p.giveBack(ctx, *lg, a.res), nil
	case out.unkept && !out.clientGone:
		p.giveBack(ctx, *lg, a.res) // the client has the answer, which nothing records
		return "relayed_unkept", nil
	case out.refused && a.continued:
		// The continuation is gone upstream, refused once the answer had
		// begun, too late to send the turn again: the refusal counts.
		p.abort(ctx, *lg, a.res)
		g.refused()
		return "aborted", nil
	case !out.continuable || out.clientGone:
		// Nothing to continue, or the client never saw it.
		return p.giveBack(ctx, *lg, a.res), nil
	}
	if a.continued {
		p.stats.add(cContinued, 1)
		g.accepted()
	}
	if _, forwarded := a.c.(*forwardConn); forwarded {
		p.stats.add(cForwarded, 1)
	}
	if a.res.Turn == 0 && !t.storeless {
		return "not_reserved", nil // no owner, or the store unavailable: nothing to record
	}
	if a.c.socket() == (store.Socket{}) {
		// store:false over HTTP: nothing upstream to continue from; the
		// turn is storeless, or reserved for a forward (Proxy.reserve)
		p.abort(ctx, *lg, a.res)
		*lg = (*lg).With("response_id", out.id, "outcome", "not_recorded", "why", "the upstream keeps no responses (store:false)")
		return "not_recorded", nil
	}
	return "", p.record(ctx, *lg, t.hold, a, out) // the recording tells how the turn ended
}

// localConn returns c, or, when c forwards the turn, a connection of this
// replica's upstream for it: the forward holds nothing to release.
func (p *Proxy) localConn(ctx context.Context, t *turn, c conn) (conn, error) {
	if _, forwarded := c.(*forwardConn); !forwarded {
		return c, nil
	}
	return p.cfg.Upstream.acquire(ctx, &t.target)
}

// cutStream ends a response whose event stream broke off upstream by
// aborting the connection, so that the client sees the stream cut, as it
// would from the upstream, and never a stream that ended as if complete.
func cutStream(w http.ResponseWriter) {
	if c, ok := w.(interface{ cutStream() }); ok {
		c.cutStream()
		return
	}
	panic(http.ErrAbortHandler)
}

// send sends res's upstream body on c, counting what goes upstream: a
// forward the origin did not take sent nothing.
func (p *Proxy) send(ctx context.Context, c conn, res *store.Reservation, stream bool) (*reply, error) {
	body := res.UpstreamBody()
	rep, err := c.send(ctx, body, stream)
	if _, forwarded := c.(*forwardConn); err == nil || !forwarded {
		p.stats.add(cItemsSent, int64(res.UpstreamItems))
		p.stats.add(cBytesSent, int64(len(body)))
	}
	return rep, err
}

// giveBack ends a turn that went upstream as res and published nothing
// the client got: when res continued from a response the upstream keeps,
// the owner gets that continuation back (Store.Restore), for the client's
// next try to continue from it too (the upstream answered an error, or the
// client did not get the stream to its end); any other turn aborts. It
// returns how the turn ended (StepEnd): "given_back" or "aborted".
func (p *Proxy) giveBack(ctx context.Context, lg *slog.Logger, res *store.Reservation) string {
	out, err := p.cfg.Store.Restore(ctx, res)
	switch {
	case err != nil:
		p.warns.warn(lg, "restore failed", "err", err)
	case out == store.OutcomeIgnored:
		p.abort(ctx, lg, res)
	case out == store.OutcomePublished:
		lg.Debug("continuation given back", "previous_response_id", res.PreviousResponseID)
		return "given_back"
	}
	return "aborted"
}

// abort ends a turn that published nothing.
func (p *Proxy) abort(ctx context.Context, lg *slog.Logger, res *store.Reservation) {
	if _, err := p.cfg.Store.Abort(ctx, res); err != nil {
		p.warns.warn(lg, "abort failed", "err", err)
	}
}

// upstreamError answers a turn the upstream could not be reached for, or
// whose socket's handshake it refused (an error answer).
func (p *Proxy) upstreamError(w http.ResponseWriter, lg *slog.Logger, err error) {
	if _, ok := errors.AsType[*upstreamRefusal](err); ok {
		p.stats.add(cErrorAnswers, 1)
	} else {
		p.stats.add(cUpstreamErrors, 1)
	}
	p.warns.warn(lg, "upstream request failed", "err", err)
	writeUnreachable(w, err)
}

// writeUnreachable answers a request the upstream could not be reached
// for, or that it took and left unanswered: 504 when it timed out, else
// 502. The client learns what went wrong, not where: the upstream's
// address, the dial error and the replicas' names stay in the log.
func writeUnreachable(w http.ResponseWriter, err error) {
	if rf, ok := errors.AsType[*upstreamRefusal](err); ok {
		rf.write(w)
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		writeError(w, http.StatusGatewayTimeout, "upstream_error", "", "upstream_timeout",
			"The upstream did not answer in time.")
		return
	}
	if errors.Is(err, errNoAnswer) || errors.Is(err, errForwardLost) {
		// It may have run the turn: a client that sends it again pays
		// for it twice.
		writeError(w, http.StatusBadGateway, "upstream_error", "", "upstream_disconnected",
			"The upstream took the request and gave no answer that could be passed on.")
		return
	}
	writeError(w, http.StatusBadGateway, "upstream_error", "", "upstream_unreachable", "The upstream is unavailable.")
}

// A continuationRefusal is how an upstream answer, before anything
// reached the client, refused a continued turn.
type continuationRefusal int

const (
	notRefused continuationRefusal = iota
	// refusedNamed: the answer names the continuation
	// (refusesContinuation, or an error naming the previous response
	// sent or previous_response_id anywhere, as a validation error
	// does), or is a response that continues another one, or none: an
	// upstream that passed over the previous_response_id answered
	// without the turn's history.
	refusedNamed
	// refusedMaybe: an error a continuation may cause (400, 404, 422)
	// naming no other parameter, as OpenAI-compatible servers word a
	// previous response they do not hold. Sent again with the full
	// context, it counts as a refusal only if that send is answered.
	refusedMaybe
)

// refused tells whether and how an upstream answer to a turn continued
// from prev, before anything reached the client, refuses the
// continuation, answered as an error, a failed response or a response
// that continues another. It peeks at a stream's first event, and, when
// the client waits for the whole answer (whole), past the events that
// only begin a response, and keeps them for the relay.
func refused(rep *reply, whole bool, prev string) continuationRefusal {
	if rep.next == nil {
		r := gjson.ParseBytes(rep.body)
		switch {
		case rep.status/100 == 2 && r.Get("status").String() == "failed" && refusesContinuation(r.Get("error")):
			return refusedNamed
		case rep.status/100 == 2:
			return continuesAnother(r, prev)
		case rep.status/100 == 4:
			return refusedBy(rep.status, r, prev)
		}
		return notRefused
	}
	var kept []event
	ev, err := rep.next()
	first := ev
	for whole && err == nil && (ev.typ == "response.created" || ev.typ == "response.in_progress") && len(kept) < 4 {
		kept = append(kept, ev)
		ev, err = rep.next()
	}
	kept = append(kept, ev)
	next := rep.next
	rep.next = func() (event, error) { // the events peeked, then the rest
		if len(kept) > 0 {
			e := kept[0]
			if kept = kept[1:]; len(kept) == 0 {
				return e, err
			}
			return e, nil
		}
		return next()
	}
	if first.typ == "response.created" && continuesAnother(gjson.GetBytes(first.data, "response"), prev) != notRefused {
		return refusedNamed
	}
	if err != nil {
		return notRefused
	}
	switch ev.typ {
	case "error":
		if refusesContinuation(eventError(ev.data)) {
			return refusedNamed
		}
	case "response.failed":
		if refusesContinuation(gjson.GetBytes(ev.data, "response.error")) {
			return refusedNamed
		}
	}
	return notRefused
}

// repeats tells whether the object r holds any of names more than once.
// Parsers differ on which one counts (gjson takes the first, most others
// the last): the client may read another response than the one the
// proxy would record.
func repeats(r gjson.Result, names ...string) bool {
	seen, twice := 0, false // seen: bit i for names[i]
	r.ForEach(func(k, _ gjson.Result) bool {
		if i := slices.Index(names, k.Str); i >= 0 {
			twice = seen&(1<<i) != 0
			seen |= 1 << i
		}
		return !twice
	})
	return twice
}

// continuesAnother tells whether the response r, answering a turn
// continued from prev, says it continues another response, or none.
func continuesAnother(r gjson.Result, prev string) continuationRefusal {
	if got := r.Get("previous_response_id"); got.Exists() && got.String() != prev {
		return refusedNamed
	}
	return notRefused
}

// refusedBy tells how the error answer r, of status, to a turn continued
// from prev, refuses it.
func refusedBy(status int, r gjson.Result, prev string) continuationRefusal {
	e := r.Get("error")
	switch {
	case refusesContinuation(e), strings.Contains(r.Raw, "previous_response"), prev != "" && strings.Contains(r.Raw, prev):
		return refusedNamed
	case e.Get("param").String() != "":
		return notRefused // about another parameter
	case status == http.StatusBadRequest, status == http.StatusNotFound, status == http.StatusUnprocessableEntity:
		return refusedMaybe
	}
	return notRefused
}

// refusesContinuation tells whether an upstream error refuses a turn's
// continuation: previous_response_not_found, or an error about the
// previous_response_id parameter.
func refusesContinuation(e gjson.Result) bool {
	return e.Get("code").String() == notFoundCode || e.Get("param").String() == "previous_response_id"
}

// eventError returns the error an error event carries: its "error"
// member, or the event itself (the SSE error event is flat).
func eventError(data []byte) gjson.Result {
	if e := gjson.GetBytes(data, "error"); e.Exists() {
		return e
	}
	return gjson.ParseBytes(data)
}

// notFoundCode is the upstream's error code for a previous response it
// does not hold.
const notFoundCode = "previous_response_not_found"

// outcome is what a relayed answer was.
type outcome struct {
	status int
	// continuable tells whether the response ended as the next turn may
	// continue it: completed, or incomplete (cut short by
	// max_output_tokens or a content filter, kept upstream all the same);
	// id and output are then its id and output items.
	continuable bool
	id          string
	output      []json.RawMessage
	// failed tells that the upstream answered an error: an HTTP error
	// status, a failed response or an error event; refused, that it
	// refused the continuation so (refusesContinuation), after the
	// answer began.
	failed, refused bool
	// clientGone tells whether writing to the client failed; unkept,
	// that the answer was relayed as it came, for want of room to keep
	// it (readAnswer).
	clientGone, unkept bool
	// err is set when the upstream's answer broke off; cut, when it did
	// after the client's stream began.
	err error
	cut bool
}

// relay writes the upstream's answer to the client: the events as SSE when
// the client asked for a stream, else JSON. hide is the previous response
// id the proxy added, shown to the client as null; "" when none was added.
// seal, when not nil, is called with a completed response's outcome just
// before the client gets its end (the terminal event, or the JSON body),
// while the client is still there.
func relay(w http.ResponseWriter, t *turn, rep *reply, hide string, seal func(outcome)) outcome {
	rep.held = t.answers
	if rep.next == nil {
		return relayBody(w, rep, hide, seal)
	}
	if !t.stream {
		return relayAssembled(w, rep, hide, seal)
	}
	return relayStream(w, rep, hide, seal)
}

// wholeAnswers is a client's writer that takes a JSON answer whole before
// it passes any of it on (a client socket's, which sends it as one
// message): one the proxy has no room to keep cannot go to it as it
// comes.
type wholeAnswers interface{ takesAnswersWhole() }

// relayBody relays a whole JSON answer.
func relayBody(w http.ResponseWriter, rep *reply, hide string, seal func(outcome)) outcome {
	out := outcome{status: rep.status, failed: rep.status >= 400}
	body := rep.body
	if rep.cut != nil {
		// Cut short upstream: what came, then the connection cut (the
		// caller's cutStream), as the client would see it from the
		// upstream; not recorded.
		copyHeader(w.Header(), rep.header)
		w.WriteHeader(rep.status)
		_, _ = w.Write(body)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		out.err, out.cut = rep.cut, true
		return out
	}
	if _, whole := w.(wholeAnswers); whole && rep.rest != nil {
		// No room to keep it, for a client that would have it whole
		// first: the upstream ran the turn, and its answer cannot be
		// passed on.
		err := fmt.Errorf("%w: no room to hold its answer for a client that takes it whole", errNoAnswer)
		writeUnreachable(w, err)
		return outcome{status: http.StatusBadGateway, err: err}
	}
	if rep.rest != nil {
		// No room to keep it: relayed as it comes, as a reverse proxy
		// relays it, and not recorded.
		out.unkept = true
		copyHeader(w.Header(), rep.header)
		w.WriteHeader(rep.status)
		if _, err := w.Write(body); err != nil {
			out.clientGone = true
		} else if _, err := io.Copy(w, rep.rest); err != nil {
			out.err, out.cut = err, true
		}
		return out
	}
	if !rep.charged {
		// Kept until the client has it: the body, its output items and
		// the copy it is shown as.
		rep.held.force(answerCopies * int64(len(body)))
	}
	switch {
	case rep.status/100 != 2:
	case !gjson.ValidBytes(body):
		out.failed = true // cut or garbled: no response to continue
	default:
		r := gjson.ParseBytes(body)
		out.id = strings.Clone(r.Get("id").String()) // not the whole answer it is cut from
		status := r.Get("status").String()
		out.continuable = continues("response."+status) && out.id != "" && !repeats(r, "id", "status", "output")
		out.failed = status == "failed"
		out.refused = refusesContinuation(r.Get("error"))
		out.output = rawArray(r.Get("output"))
		body = hideID(body, "previous_response_id", hide)
	}
	if out.continuable && seal != nil {
		seal(out)
	}
	copyHeader(w.Header(), rep.header)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(rep.status)
	if _, err := w.Write(body); err != nil {
		out.clientGone = true
	}
	return out
}

// answerCopies is how many times the budget counts an upstream's JSON
// answer while the relay keeps it.
const answerCopies = 3

// collector gathers a stream's output as the events go by, holding what
// it keeps in held while the room has it (hold.take). When the room does
// not, or an event it keeps from went by unread (event.passed: an output
// item's, the terminal event, or one of a type untold), it keeps nothing
// more (unkept): the turn is relayed and not recorded. Other events that
// go by unread (response.created, deltas) take nothing from it.
type collector struct {
	held *hold
	// must tells that what it keeps is the answer itself
	// (relayAssembled): it is held past the budget when the room does not
	// have it.
	must      bool
	unkept    bool
	kept      int64 // what it holds in held
	items     map[int64]json.RawMessage
	order     []int64
	terminal  string // the terminal event's type, "" until one is seen
	id        string
	final     []json.RawMessage // response.completed's output
	finalResp []byte            // the terminal event's response object
	refused   bool              // a failed response's error refuses its continuation
	errEvent  []byte            // an error event's data
}

// see notes one event; it returns true after a terminal event.
func (c *collector) see(ev event) bool {
	if ev.passed {
		terminal := continues(ev.typ) || ev.typ == "response.failed" || ev.typ == "error"
		if terminal || ev.typ == "response.output_item.done" || ev.typ == "" {
			c.drop() // what it would have kept went by
		}
		if terminal {
			c.terminal = ev.typ
		}
		return terminal
	}
	switch ev.typ {
	case "response.output_item.done":
		if c.unkept {
			return false
		}
		r := gjson.ParseBytes(ev.data)
		i := r.Get("output_index").Int()
		item := json.RawMessage(r.Get("item").Raw)
		if !c.keep(int64(len(item))) {
			return false
		}
		if c.items == nil {
			c.items = map[int64]json.RawMessage{}
		}
		if _, ok := c.items[i]; !ok {
			c.order = append(c.order, i)
		}
		c.items[i] = item
	case "response.completed", "response.failed", "response.incomplete":
		if !gjson.ValidBytes(ev.data) {
			// Cut or garbled: whatever it says, no response to continue.
			c.terminal, c.finalResp = "response.failed", nil
			return true
		}
		resp := gjson.GetBytes(ev.data, "response")
		c.terminal, c.id = ev.typ, strings.Clone(resp.Get("id").String()) // not the whole response it is cut from
		if repeats(gjson.ParseBytes(ev.data), "response") || repeats(resp, "id", "status", "output") {
			c.id = "" // nothing to continue
		}
		c.refused = ev.typ == "response.failed" && refusesContinuation(resp.Get("error"))
		if c.keep(2 * int64(len(resp.Raw))) { // the response, and its output items
			c.finalResp, c.final = []byte(resp.Raw), rawArray(resp.Get("output"))
		}
		return true
	case "error":
		c.terminal, c.errEvent = ev.typ, ev.data
		return true
	}
	return false
}

// keep holds n more, or drops what the collector kept when the room does
// not have it; false when the collector keeps nothing.
func (c *collector) keep(n int64) bool {
	switch {
	case c.unkept:
		return false
	case c.must:
		c.held.force(n)
	case !c.held.take(n):
		c.drop()
		return false
	}
	c.kept += n
	return true
}

// drop gives back what the collector kept, which it keeps no more.
func (c *collector) drop() {
	c.held.giveBack(c.kept)
	c.unkept, c.kept = true, 0
	c.items, c.order, c.final, c.finalResp = nil, nil, nil, nil
}

// continuable tells whether the stream ended with a response the next
// turn may continue (outcome.continuable).
func (c *collector) continuable() bool { return continues(c.terminal) && c.id != "" && !c.unkept }

// continues tells whether a terminal event ends a response the next turn
// may continue: completed, or incomplete (cut short, kept all the same).
func continues(terminal string) bool {
	return terminal == "response.completed" || terminal == "response.incomplete"
}

// outcome returns what the stream was.
func (c *collector) outcome(status int) outcome {
	out := outcome{status: status, continuable: c.continuable(), id: c.id, unkept: c.unkept}
	switch c.terminal {
	case "response.failed":
		out.failed, out.refused = true, c.refused
	case "error":
		out.failed, out.refused = true, refusesContinuation(eventError(c.errEvent))
	}
	out.output = c.final
	if len(out.output) == 0 && len(c.items) > 0 {
		slices.Sort(c.order)
		for _, i := range c.order {
			out.output = append(out.output, c.items[i])
		}
	}
	return out
}

// relayStream relays events as Server-Sent Events, flushed one by one.
func relayStream(w http.ResponseWriter, rep *reply, hide string, seal func(outcome)) outcome {
	started := false
	start := func() {
		if !started {
			started = true
			copyHeader(w.Header(), rep.header)
			status := http.StatusOK
			if rep.status/100 == 2 && !rep.socket {
				status = rep.status // 201, 202 as the upstream answered
			}
			startEvents(w, status)
		}
	}
	through := passTo(w, hide)
	rep.pass = func(b []byte) { // the first event, when it goes on unread
		start()
		through(b)
	}
	if !rep.socket {
		// An HTTP upstream's stream begins with its status: the keep-alives
		// that come before the first event (a request queued upstream)
		// begin the client's, which a client or a balancer that would
		// close a quiet request sees.
		rep.comments = func(line []byte) {
			start()
			_, _ = w.Write(append(slices.Clip(line), '\n', '\n'))
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
	}
	ev, err := rep.next()
	switch {
	case err != nil && !started:
		copyHeader(w.Header(), rep.header) // the upstream's request id, for whoever looks into it
		return writeBrokenOff(w, err)      // before the first event: nothing to cut
	case rep.socket && ev.typ == "error" && gjson.GetBytes(ev.data, "status").Exists():
		// A WebSocket upstream refusing the request: over HTTP it would
		// have answered this status and error before any event.
		return writeErrorEvent(w, ev.data)
	}
	start()
	return writeEvents(w, rep, hide, ev, err, seal)
}

// startEvents answers status with the headers of a Server-Sent Events
// stream beside w's: its media type, unless w names one of an event
// stream, and no-cache, unless w says how to cache.
func startEvents(w http.ResponseWriter, status int) {
	if !isEventStream(w.Header()) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	}
	if w.Header().Get("Cache-Control") == "" {
		w.Header().Set("Cache-Control", "no-cache")
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
}

// writeEvents writes the events of rep, from ev (read with err) on, as
// Server-Sent Events flushed one by one, after the response's headers;
// seal is relay's.
func writeEvents(w http.ResponseWriter, rep *reply, hide string, ev event, err error, seal func(outcome)) outcome {
	col := &collector{held: rep.held}
	sock, _ := w.(*socketWriter) // takes the events themselves, not their SSE
	if sock != nil {
		// Its connection keeps what the collector keeps.
		sock.col.held = rep.held
		col = &sock.col
	}
	flush := func() {}
	if f, ok := w.(http.Flusher); ok {
		flush = f.Flush
	}
	// Events the upstream sent together go out together: what was written
	// is flushed before the relay reads more of the upstream's stream,
	// before the turn is recorded, and after the last event. An upstream
	// that hands over events one by one has each flushed.
	together := rep.stream != nil
	if together {
		rep.stream.wait = flush
		defer func() { rep.stream.wait = nil }()
	}
	cw := &clientWriter{w: w}
	rep.pass = passTo(cw, hide)
	rep.comments = func(line []byte) {
		// Passed on as they come: a client or a balancer that would close
		// a quiet stream sees what the upstream keeps it with.
		if _, werr := cw.Write(append(slices.Clip(line), '\n', '\n')); werr == nil {
			flush()
		}
	}
	defer func() { rep.comments, rep.pass = nil, nil }()
	write := func(ev event) {
		// After a failed write the relay keeps reading: the turn ends when
		// the upstream's does.
		switch {
		case cw.gone:
		case sock != nil:
			cw.gone = !sock.relayEvent(ev, hide)
		case !ev.passed:
			writeEvent(cw, ev.wireName(), hideID(ev.data, "response.previous_response_id", hide))
			if !together {
				flush()
			}
		}
	}
	for ; err == nil; ev, err = rep.next() {
		done := col.see(ev)
		if done && !cw.gone && seal != nil && col.continuable() {
			flush() // what came before the end, while the turn is recorded
			seal(col.outcome(http.StatusOK))
		}
		write(ev)
		if done {
			break
		}
	}
	if err == nil {
		// After the terminal event, up to the stream's end: the events
		// that come reach the client too, as through a reverse proxy (a
		// failed response after an error event, or the other way round);
		// keep-alives no longer.
		rep.comments, rep.pass = nil, nil
		if !cw.gone {
			flush()
		}
		rep.drain(write)
	}
	if !cw.gone {
		flush() // events that came with the stream's end or error
	}
	out := col.outcome(http.StatusOK)
	out.clientGone = cw.gone
	if err != nil && !errors.Is(err, io.EOF) {
		out.err = err
	} else if col.terminal == "" {
		out.err = io.ErrUnexpectedEOF // the upstream ended the stream without a terminal event
	}
	out.cut = out.err != nil
	return out
}

// passTo returns what an event that goes on unread is written to w by
// (reply.pass), the previous response id the proxy added, hide, shown as
// null as the bytes go by, as hideID shows it (previousIDWriter).
func passTo(w io.Writer, hide string) func(b []byte) {
	if hide == "" {
		return func(b []byte) { _, _ = w.Write(b) }
	}
	r := &previousIDWriter{w: w, old: []byte(`"` + hide + `"`), with: []byte("null")}
	return func(b []byte) { _, _ = r.Write(b) }
}

// previousIDWriter writes what it is given on to w, each
// "previous_response_id" member whose value is old shown with the value
// with, however the writes split the member: it holds back an end of what
// came that may begin one until what comes next tells (Flush writes it).
// Only a member matches: a JSON string holds no bare quote. Blanks may
// stand around its colon, up to maxBlanks on each side.
type previousIDWriter struct {
	w         io.Writer
	old, with []byte
	held      []byte
}

// previousIDKey is the member's name, as JSON writes it.
var previousIDKey = []byte(`"previous_response_id"`)

// maxBlanks bounds the blanks a previousIDWriter takes on each side of the
// member's colon.
const maxBlanks = 32

func (r *previousIDWriter) Write(b []byte) (int, error) {
	buf := b
	if len(r.held) > 0 {
		buf = append(r.held, b...)
	}
	done, from, keep := 0, 0, -1 // written up to; searched from; held from
	for keep < 0 {
		i := bytes.Index(buf[from:], previousIDKey)
		if i < 0 {
			break
		}
		at := from + i
		v := valueAt(buf, at+len(previousIDKey))
		switch {
		case v < 0:
			from = at + len(previousIDKey)
		case len(buf)-v < len(r.old) && bytes.HasPrefix(r.old, buf[v:]):
			keep = at // what comes next tells
		case bytes.HasPrefix(buf[v:], r.old):
			if err := r.write(buf[done:v], r.with); err != nil {
				return 0, err
			}
			done = v + len(r.old)
			from = done
		default:
			from = at + len(previousIDKey)
		}
	}
	if keep < 0 {
		// An end that may begin the member's name.
		k := min(len(buf)-done, len(previousIDKey)-1)
		for k > 0 && !bytes.HasPrefix(previousIDKey, buf[len(buf)-k:]) {
			k--
		}
		keep = len(buf) - k
	}
	err := r.write(buf[done:keep])
	r.held = append(r.held[:0], buf[keep:]...)
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// valueAt returns where the value of the member whose name ends at i in
// b begins, past blanks, a colon and blanks: len(b) when b ends before
// that tells, -1 when what follows the name is no colon or more than
// maxBlanks blanks.
func valueAt(b []byte, i int) int {
	for colon := true; ; colon = false {
		j := i
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			if j++; j-i > maxBlanks {
				return -1
			}
		}
		switch {
		case j == len(b) || !colon:
			return j
		case b[j] != ':':
			return -1
		}
		i = j + 1
	}
}

// Flush writes what r holds back.
func (r *previousIDWriter) Flush() error {
	err := r.write(r.held)
	r.held = r.held[:0]
	return err
}

func (r *previousIDWriter) write(parts ...[]byte) error {
	for _, p := range parts {
		if len(p) > 0 {
			if _, err := r.w.Write(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// clientWriter writes to w until a write fails: the client is gone.
type clientWriter struct {
	w    io.Writer
	gone bool
}

func (c *clientWriter) Write(b []byte) (int, error) {
	if c.gone {
		return 0, errClientGone
	}
	n, err := c.w.Write(b)
	c.gone = err != nil
	return n, err
}

// writeEvent writes a Server-Sent Event of type typ (none when empty) and
// data to w, data as it is, not copied: each line of data on a "data:"
// line of its own, as the upstream may have sent them (eventReader joins
// them), or as a WebSocket upstream's indented JSON holds them. What w
// answers is for w to keep (clientWriter).
func writeEvent(w io.Writer, typ string, data []byte) {
	if typ != "" {
		_, _ = io.WriteString(w, "event: "+typ+"\n")
	}
	_, _ = io.WriteString(w, "data: ")
	writeLines(w, data)
	_, _ = io.WriteString(w, "\n\n")
}

// writeLines writes b, a part of an event's data, to w, each line break
// (CR, LF or CRLF, each ends a line in SSE) beginning a new data line.
func writeLines(w io.Writer, b []byte) {
	for {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			_, _ = w.Write(b)
			return
		}
		_, _ = w.Write(b[:i])
		_, _ = io.WriteString(w, "\ndata: ")
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
	}
}

// writeFunc is a function that takes bytes (reply.pass) as an io.Writer.
type writeFunc func(b []byte)

func (f writeFunc) Write(b []byte) (int, error) {
	f(b)
	return len(b), nil
}

// relayAssembled answers a client that asked for JSON from an upstream
// that streams (WebSocket mode): the terminal event's response object, or
// the error an error event carries.
func relayAssembled(w http.ResponseWriter, rep *reply, hide string, seal func(outcome)) outcome {
	col := collector{held: rep.held, must: true}
	var err error
	for {
		var ev event
		if ev, err = rep.next(); err != nil || col.see(ev) {
			break
		}
	}
	if err != nil {
		return writeBrokenOff(w, err)
	}
	if col.terminal == "error" {
		return writeErrorEvent(w, col.errEvent)
	}
	if len(col.finalResp) == 0 {
		// Cut or garbled: no response to answer with.
		return writeBrokenOff(w, fmt.Errorf("the upstream's %s event holds no response", col.terminal))
	}
	out := col.outcome(http.StatusOK)
	if out.continuable && seal != nil {
		seal(out)
	}
	body := hideID(col.finalResp, "previous_response_id", hide)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, werr := w.Write(body); werr != nil {
		out.clientGone = true
	}
	return out
}

// writeBrokenOff answers a turn whose upstream answer broke off, with err,
// before anything reached the client: 504 when the answer did not come in
// time, else 502.
func writeBrokenOff(w http.ResponseWriter, err error) outcome {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if errors.Is(err, context.DeadlineExceeded) {
		writeUnreachable(w, err) // as an upstream that never answered
		return outcome{status: http.StatusGatewayTimeout, err: err}
	}
	writeError(w, http.StatusBadGateway, "upstream_error", "", "upstream_disconnected",
		"The upstream ended the response early.")
	return outcome{status: http.StatusBadGateway, err: err}
}

// writeErrorEvent answers an error event as the HTTP API answers an
// error: its status (500 when it has none), the response headers the
// event carries (a WebSocket upstream's "headers": Retry-After, the rate
// limits, the request id) and {"error": {…}}.
func writeErrorEvent(w http.ResponseWriter, data []byte) outcome {
	r := gjson.ParseBytes(data)
	copyHeader(w.Header(), eventHeaders(r.Get("headers")))
	status := int(r.Get("status").Int())
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	e, typ := r.Get("error"), ""
	if e.Exists() {
		typ = e.Get("type").String()
	} else {
		e = r // a flat error event, whose type is the event's: the error's is the default
	}
	writeError(w, status, typ, e.Get("param").String(), e.Get("code").String(), e.Get("message").String())
	return outcome{status: status, failed: true}
}

// eventHeaders returns the headers an error event carries, an object
// of strings (or numbers, or arrays of them): those with a valid name and
// value, but for the body's own (Content-Type, Content-Encoding), which
// its HTTP answer sets.
func eventHeaders(obj gjson.Result) http.Header {
	h := http.Header{}
	obj.ForEach(func(k, v gjson.Result) bool {
		name := http.CanonicalHeaderKey(k.String())
		if !validHeaderName(name) || name == "Content-Type" || name == "Content-Encoding" {
			return true
		}
		vs := []gjson.Result{v}
		if v.IsArray() {
			vs = v.Array()
		}
		for _, x := range vs {
			if s := x.String(); (x.Type == gjson.String || x.Type == gjson.Number) && !strings.ContainsAny(s, "\r\n\x00") {
				h.Add(name, s)
			}
		}
		return true
	})
	return h
}

// validHeaderName reports whether name is a header field name: a token
// (RFC 9110 5.1).
func validHeaderName(name string) bool {
	return name != "" && !strings.ContainsFunc(name, func(c rune) bool {
		return c > '~' || c <= ' ' || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", c)
	})
}

// hideID shows the member at path as null when it holds id.
func hideID(data []byte, path, id string) []byte {
	if id == "" || absent(data, id) {
		return data
	}
	v := gjson.GetBytes(data, path)
	if v.String() != id {
		return data
	}
	if v.Index == 0 { // where the value is, gjson could not tell
		out, err := sjson.SetRawBytes(data, path, []byte("null"))
		if err != nil {
			return data
		}
		return out
	}
	out := make([]byte, 0, len(data)-len(v.Raw)+len("null"))
	out = append(out, data[:v.Index]...)
	out = append(out, "null"...)
	return append(out, data[v.Index+len(v.Raw):]...)
}

// absent reports whether data, JSON, certainly has no string s: s is
// not in it, and no escape could spell it otherwise.
func absent(data []byte, s string) bool {
	return !bytes.Contains(data, []byte(s)) && bytes.IndexByte(data, '\\') < 0
}

// rawArray returns the elements of a JSON array.
func rawArray(r gjson.Result) []json.RawMessage {
	if !r.IsArray() {
		return nil
	}
	var items []json.RawMessage
	r.ForEach(func(_, v gjson.Result) bool {
		items = append(items, json.RawMessage(v.Raw))
		return true
	})
	return items
}

// apiError is the error object of the Responses API: message, type
// (server_error when empty), param and code (null when empty).
func apiError(typ, param, code, msg string) map[string]any {
	nullable := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	if typ == "" {
		typ = "server_error"
	}
	return map[string]any{"message": msg, "type": typ, "param": nullable(param), "code": nullable(code)}
}

// writeError answers an error in the Responses API's shape:
// {"error":{"message":…,"type":…,"param":…,"code":…}}, with null for an
// empty param or code.
func writeError(w http.ResponseWriter, status int, typ, param, code, msg string) {
	body, _ := json.Marshal(map[string]any{"error": apiError(typ, param, code, msg)})
	w.Header().Del("Content-Encoding") // an upstream's, whose body this is not
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
