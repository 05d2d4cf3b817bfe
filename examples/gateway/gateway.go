package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contstore/contstore/examples/gateway/fakeupstream"
	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// Request headers the gateway reads, and the one it sends upstream.
const (
	sessionHeader    = "X-Session-Id"
	agentHeader      = "X-Agent-Id"
	connectionHeader = fakeupstream.ConnectionHeader
)

// notFoundCode is the upstream's error code for a previous_response_id it
// does not hold.
const notFoundCode = "previous_response_not_found"

// maxBody bounds a client request body.
const maxBody = 64 << 20

// Config configures a Gateway.
type Config struct {
	// Store decides continuations; its replica must be Replica.
	Store *store.Store
	// Replica names this gateway replica.
	Replica string
	// Upstream is the upstream's base URL; requests go to Upstream +
	// "/responses".
	Upstream string
	// Connections is how many logical upstream connections the replica
	// keeps, with ids 1..Connections.
	Connections int
	// Client sends upstream requests.
	Client *http.Client
	// Logger receives a debug record per turn and a warning per fallback.
	Logger *slog.Logger
}

// Gateway forwards Responses requests upstream, continuing conversations
// with previous_response_id and the new input items when the store allows
// and the previous response lives on one of its own connections.
type Gateway struct {
	cfg   Config
	conns []*connection
	// anon spreads requests without an owner over the connections.
	anon  atomic.Uint64
	stats counters
}

// connection is one logical upstream connection. Like a Responses
// WebSocket, it carries one response at a time and the upstream keeps only
// its latest response.
type connection struct {
	id uint64
	mu sync.Mutex
	// latest is the upstream's latest response on this connection, as far
	// as this replica knows; "" when it holds none.
	latest string
}

// New returns a gateway for cfg.
func New(cfg Config) (*Gateway, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("gateway: no store")
	case cfg.Store.Options().Replica != cfg.Replica:
		return nil, fmt.Errorf("gateway: store replica %q is not %q", cfg.Store.Options().Replica, cfg.Replica)
	case cfg.Connections < 1:
		return nil, fmt.Errorf("gateway: %d connections, need at least 1", cfg.Connections)
	case cfg.Client == nil || cfg.Logger == nil:
		return nil, errors.New("gateway: no HTTP client or logger")
	}
	g := &Gateway{cfg: cfg, conns: make([]*connection, cfg.Connections)}
	for i := range g.conns {
		g.conns[i] = &connection{id: uint64(i + 1)}
	}
	return g, nil
}

// Handler returns the gateway's HTTP handler: POST /v1/responses and
// GET /stats.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/responses", g.serveResponses)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, g.Stats())
	})
	return mux
}

// Stats counts what the gateway did since it started.
type Stats struct {
	// Turns counts client requests forwarded upstream.
	Turns int64 `json:"turns"`
	// Continued counts turns answered on a continuation.
	Continued int64 `json:"continued"`
	// NotFoundRetries counts continuations the upstream refused with
	// previous_response_not_found, resent with the full context.
	NotFoundRetries int64 `json:"not_found_retries"`
	// ItemsReceived counts input items in client requests.
	ItemsReceived int64 `json:"items_received"`
	// ItemsSent counts input items sent upstream, retries included.
	ItemsSent int64 `json:"items_sent"`
}

// counters holds Stats as atomics.
type counters struct {
	turns, continued, notFoundRetries, itemsReceived, itemsSent atomic.Int64
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	c := &g.stats
	return Stats{
		Turns:           c.turns.Load(),
		Continued:       c.continued.Load(),
		NotFoundRetries: c.notFoundRetries.Load(),
		ItemsReceived:   c.itemsReceived.Load(),
		ItemsSent:       c.itemsSent.Load(),
	}
}

// owner returns the conversation owner of a request: the X-Session-Id
// header (with X-Agent-Id for a sub-agent) when present, else the body's
// metadata.session_id (with metadata.agent_id), else the zero owner.
func owner(h http.Header, top map[string]json.RawMessage) (identity.Owner, error) {
	session, agent := h.Get(sessionHeader), h.Get(agentHeader)
	if session == "" && agent != "" {
		return identity.Owner{}, fmt.Errorf("%s needs %s", agentHeader, sessionHeader)
	}
	if session == "" {
		var meta struct {
			SessionID string `json:"session_id"`
			AgentID   string `json:"agent_id"`
		}
		if raw, ok := top["metadata"]; ok && json.Unmarshal(raw, &meta) == nil {
			session, agent = meta.SessionID, meta.AgentID
		}
	}
	switch {
	case session == "":
		return identity.Owner{}, nil
	case agent == "":
		return identity.Main(session)
	default:
		return identity.Agent(session, agent)
	}
}

// connectionFor returns the connection an owner's turns use: chosen by a
// hash of the owner's key, so that every turn of a conversation that stays
// on this replica finds its previous response on the same connection.
// Requests without an owner take the connections in turn.
func (g *Gateway) connectionFor(o identity.Owner) *connection {
	if o.IsZero() {
		return g.conns[g.anon.Add(1)%uint64(len(g.conns))]
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, o.Key())
	return g.conns[h.Sum64()%uint64(len(g.conns))]
}

// local returns this replica's connection named by origin, or nil when
// origin is another replica's or names no connection here.
func (g *Gateway) local(origin store.Socket) *connection {
	if origin.Replica != g.cfg.Replica || origin.ID < 1 || origin.ID > uint64(len(g.conns)) {
		return nil
	}
	return g.conns[origin.ID-1]
}

// serveResponses handles one turn: reserve it, forward the continuation or
// the full context, retry once with the full context when the upstream
// lost the previous response, then record or abort the turn and relay the
// upstream's answer unchanged.
func (g *Gateway) serveResponses(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method "+r.Method+" not allowed; use POST")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		status := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			status = http.StatusRequestEntityTooLarge
		}
		writeError(w, status, "invalid_request_error", "reading body: "+err.Error())
		return
	}
	req, err := g.cfg.Store.ParseRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if string(top["stream"]) == "true" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "stream=true is not supported by this gateway")
		return
	}
	who, err := owner(r.Header, top)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	for _, k := range []string{"previous_response_id", "conversation"} {
		if v, ok := top[k]; ok && string(v) != "null" {
			// The client keeps the conversation upstream itself: forward
			// the request as is, outside the store.
			who = identity.Owner{}
		}
	}
	g.turn(w, r, who, req, body)
}

// turn runs a parsed request through the store and the upstream.
func (g *Gateway) turn(w http.ResponseWriter, r *http.Request, who identity.Owner, req *fingerprint.Request, body []byte) {
	start := time.Now()
	// Store operations outlive a client that hangs up: the upstream may
	// already have answered, and the turn must be recorded or aborted.
	ctx := context.WithoutCancel(r.Context())
	st := g.cfg.Store
	res := st.Reserve(ctx, who, req)
	if res.Reason == store.ReasonStoreUnavailable {
		g.cfg.Logger.Warn("store unavailable, sending full context", "owner", who, "err", res.Err)
	}
	offered := res.Origin // where the offered continuation lives; zero if none
	var origin *connection
	if res.Continues() {
		origin = g.local(res.Origin)
	}
	conn := origin
	if conn == nil {
		conn = g.connectionFor(who)
	}
	conn.mu.Lock()
	defer conn.mu.Unlock()

	// The upstream keeps only a connection's latest response, and the
	// connection may have answered another owner since.
	continued := origin != nil && conn.latest == res.PreviousResponseID
	upBody := body
	if continued {
		upBody = res.UpstreamBody()
	} else if res.Continues() {
		res = res.FullContextRetry()
	}
	g.stats.turns.Add(1)
	g.stats.itemsReceived.Add(int64(req.Len()))
	g.stats.itemsSent.Add(int64(res.DeltaCount))
	status, header, respBody, err := g.send(r, conn, upBody)
	if err == nil && continued && notFound(status, respBody) {
		g.cfg.Logger.Warn("upstream lost the previous response, resending full context",
			"owner", who, "turn", res.Turn, "previous_response_id", res.PreviousResponseID, "connection", conn.id)
		g.stats.notFoundRetries.Add(1)
		conn.latest = ""
		res, continued = res.FullContextRetry(), false
		g.stats.itemsSent.Add(int64(res.DeltaCount))
		status, header, respBody, err = g.send(r, conn, body)
	}
	lg := g.cfg.Logger.With("owner", who, "turn", res.Turn, "reason", res.Reason, "continued", continued,
		"items", req.Len(), "sent", res.DeltaCount, "connection", conn.id)
	if !offered.IsZero() {
		lg = lg.With("offered_origin", offered.Replica+"/"+strconv.FormatUint(offered.ID, 10))
	}
	if err != nil {
		conn.latest = ""
		g.abort(ctx, lg, res)
		lg.Warn("upstream request failed", "err", err)
		writeError(w, http.StatusBadGateway, "upstream_error", "upstream request failed: "+err.Error())
		return
	}
	var out struct {
		ID     string            `json:"id"`
		Output []json.RawMessage `json:"output"`
	}
	switch {
	case status/100 != 2:
		conn.latest = ""
		g.abort(ctx, lg, res)
	case json.Unmarshal(respBody, &out) != nil || out.ID == "":
		conn.latest = ""
		g.abort(ctx, lg, res)
		lg.Warn("upstream answer has no response id; turn aborted")
	default:
		conn.latest = out.ID
		if continued {
			g.stats.continued.Add(1)
		}
		outcome, err := st.Record(ctx, res, store.Result{
			ResponseID: out.ID,
			Socket:     store.Socket{ID: conn.id},
			Output:     out.Output,
		})
		if err != nil {
			lg.Warn("record failed; the next turn sends full context", "err", err)
		}
		lg = lg.With("response_id", out.ID, "outcome", outcome)
	}
	lg.Debug("turn", "status", status, "latency", time.Since(start))
	if ct := header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(status)
	_, _ = w.Write(respBody)
}

// abort ends a turn the upstream did not answer.
func (g *Gateway) abort(ctx context.Context, lg *slog.Logger, res *store.Reservation) {
	if _, err := g.cfg.Store.Abort(ctx, res); err != nil {
		lg.Warn("abort failed", "err", err)
	}
}

// forwarded lists the client headers passed upstream besides the
// OpenAI-* ones.
var forwarded = []string{"Authorization", "Accept"}

// send posts body upstream on conn and returns the upstream's status,
// headers and body.
func (g *Gateway) send(r *http.Request, conn *connection, body []byte) (int, http.Header, []byte, error) {
	up, err := http.NewRequestWithContext(r.Context(), http.MethodPost,
		strings.TrimSuffix(g.cfg.Upstream, "/")+"/responses", bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for _, k := range forwarded {
		if v := r.Header.Get(k); v != "" {
			up.Header.Set(k, v)
		}
	}
	for k, v := range r.Header {
		if strings.HasPrefix(k, "Openai-") {
			up.Header[k] = v
		}
	}
	up.Header.Set("Content-Type", "application/json")
	up.Header.Set(connectionHeader, g.cfg.Replica+"/"+strconv.FormatUint(conn.id, 10))
	resp, err := g.cfg.Client.Do(up)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("reading upstream answer: %w", err)
	}
	return resp.StatusCode, resp.Header, b, nil
}

// notFound reports whether an upstream answer is the error
// previous_response_not_found.
func notFound(status int, body []byte) bool {
	if status != http.StatusBadRequest {
		return false
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &e) == nil && e.Error.Code == notFoundCode
}

// writeError answers an OpenAI-style error.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = msg, typ
	writeJSON(w, status, e)
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
