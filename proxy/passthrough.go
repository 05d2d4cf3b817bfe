package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
)

// The API's other endpoints: every request under /v1 but the turns (POST
// /v1/responses) and the WebSocket mode's upgrades (GET /v1/responses)
// goes to the upstream's HTTP base as the client sent it, its path under
// /v1 (dot segments resolved) appended to the base's path, its query
// merged with the base's: GET /v1/models, POST /v1/responses/compact, GET
// or DELETE /v1/responses/{id}, POST /v1/chat/completions, the Realtime
// API's WebSocket upgrade and any other. Both bodies stream through
// unbuffered, the answer flushed as it arrives. The headers that go
// upstream are those of a turn over HTTP (copyHeader), without the proxy's
// own; over the WebSocket mode the HTTP base has the socket's host and
// path, and WebSocketOptions.Header's credential, when it has one,
// replaces the client's as it does on the handshakes. Nothing is reserved
// or recorded, and no counter of Stats moves but Unread, for a turn in a
// content coding the proxy does not decode, which goes this way too.

// turnPath is the path of the turns.
const turnPath = "/v1/responses"

// isTurnPath tells whether a request path names the turns: turnPath, also
// spelled with a trailing slash or doubled slashes, as a client's base URL
// may make it.
func isTurnPath(p string) bool { return p == turnPath || path.Clean(p) == turnPath }

// isTurn tells whether r is a turn: a POST on the turns' path.
func isTurn(r *http.Request) bool { return r.Method == http.MethodPost && isTurnPath(r.URL.Path) }

// underV1 tells whether a request path, its dot segments resolved, is
// /v1 or under it.
func underV1(p string) bool {
	p = path.Clean("/" + p)
	return p == "/v1" || strings.HasPrefix(p, "/v1/")
}

// resolved returns a path with its dot segments and doubled slashes
// resolved (RFC 3986 5.2.4), its trailing slash kept: what goes upstream
// stays under the upstream's base.
func resolved(p string) string {
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// passTarget is where the requests other than turns go.
type passTarget struct {
	// base is the upstream's HTTP base URL, such as
	// https://api.openai.com/v1.
	base *url.URL
	// transport carries the requests.
	transport http.RoundTripper
	// credential, when not nil, replaces the client's credential headers.
	credential http.Header
}

// httpBase returns the HTTP base of an upstream's turn URL (base +
// "/responses"): ws becomes http and wss https.
func httpBase(turnURL string) *url.URL {
	u, err := url.Parse(turnURL)
	if err != nil {
		panic(err) // responsesURL checked it
	}
	u.Path = strings.TrimSuffix(u.Path, "/responses")
	if u.RawPath != "" {
		u.RawPath = strings.TrimSuffix(u.RawPath, "/responses")
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	return u
}

// transportOf returns the round tripper of client, or the default one.
func transportOf(client *http.Client) http.RoundTripper {
	if client != nil && client.Transport != nil {
		return client.Transport
	}
	return http.DefaultTransport
}

func (u *httpUpstream) passthroughTarget() passTarget {
	return passTarget{base: httpBase(u.url), transport: transportOf(u.client)}
}

func (u *wsUpstream) passthroughTarget() passTarget {
	t := passTarget{base: httpBase(u.url), transport: transportOf(u.opts.Client)}
	if carriesCredential(u.opts.Header) {
		t.credential = u.opts.Header
	}
	return t
}

// rewrite points a request at the target, with a turn's headers.
func (t passTarget) rewrite(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out
	out.URL.Scheme, out.URL.Host, out.Host = t.base.Scheme, t.base.Host, ""
	out.URL.Path = strings.TrimSuffix(t.base.Path, "/") + strings.TrimPrefix(resolved(in.URL.Path), "/v1")
	out.URL.RawPath = ""
	out.URL.RawQuery = mergeQuery(t.base.RawQuery, in.URL.RawQuery)
	if in.URL.RawPath != "" {
		out.URL.RawPath = strings.TrimSuffix(t.base.EscapedPath(), "/") + strings.TrimPrefix(resolved(in.URL.RawPath), "/v1")
	}
	h := make(http.Header, len(in.Header))
	copyHeader(h, in.Header) // as a turn: hop-by-hop headers stay here
	h.Del(forwardHeader)
	if t.credential != nil {
		for _, k := range accountHeaders {
			h.Del(k)
			if vs := t.credential.Values(k); len(vs) > 0 {
				h[k] = append([]string(nil), vs...)
			}
		}
	}
	if up := pr.Out.Header.Get("Upgrade"); up != "" {
		// The upgrade httputil.ReverseProxy keeps (the Realtime API's
		// WebSocket): it relays the connection once the upstream switches.
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", up)
	}
	out.Header = h
}

// asksWebSocketUpgrade tells whether a request asks for a WebSocket
// upgrade (RFC 6455): a GET whose Connection names upgrade and whose
// Upgrade names websocket.
func asksWebSocketUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && hasToken(r.Header, "Connection", "upgrade") && hasToken(r.Header, "Upgrade", "websocket")
}

// hasToken tells whether a header of h lists token, compared without case.
func hasToken(h http.Header, name, token string) bool {
	for t := range headerList(h, name) {
		if strings.EqualFold(t, token) {
			return true
		}
	}
	return false
}

// serveEndpoint serves a request that is not a turn and returns true;
// false for a turn, left to ServeHTTP (which serves a WebSocket upgrade on
// the turns' path before); an upgrade on another path (the Realtime API's)
// goes upstream as any other request. A turn whose
// body has a coding the proxy does not decode (encoding.go) is served as
// the other endpoints are. A path outside /v1 is answered 404.
func (p *Proxy) serveEndpoint(w http.ResponseWriter, r *http.Request) bool {
	turn := isTurn(r)
	switch {
	case turn && decodes(r.Header):
		return false
	case !underV1(r.URL.Path):
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "",
			fmt.Sprintf("Invalid URL (%s %s): this gateway serves the API under /v1.", r.Method, r.URL.Path))
		return true
	case turn:
		p.stats.add(cUnread, 1) // a turn in a coding the proxy does not decode
	}
	p.relayEndpoint(w, r)
	return true
}

// relayEndpoint sends a request upstream as the client sent it and streams
// the answer back, within UpstreamTimeout (a WebSocket upgrade, relayed
// once the upstream switches, for as long as both sides keep it open) and
// MaxPassthroughBytes (MaxBodyBytes for a turn the proxy does not read).
func (p *Proxy) relayEndpoint(w http.ResponseWriter, r *http.Request) {
	turn := isTurn(r)
	limit := p.cfg.MaxPassthroughBytes
	if turn {
		limit = p.cfg.MaxBodyBytes
	}
	if r.ContentLength > limit {
		p.tooLarge(w, limit)
		return
	}
	if !turn {
		p.stats.add(cEndpoints, 1)
	}
	start := time.Now()
	client := r.Context()
	var ctx context.Context
	var cancel context.CancelFunc
	if asksWebSocketUpgrade(r) {
		// A connection relayed once the upstream switches lasts until
		// either side closes it, as through any reverse proxy.
		ctx, cancel = context.WithCancel(client)
	} else {
		ctx, cancel = context.WithTimeout(client, p.cfg.UpstreamTimeout)
	}
	defer cancel()
	ctx, unanswered := traceWritten(ctx)
	out := r.WithContext(ctx)
	var body *watchedBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &watchedBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit), ended: make(chan struct{})}
		out.Body = body
	}
	lg := p.cfg.Logger.With("method", r.Method, "path", r.URL.Path)
	t := p.cfg.Upstream.passthroughTarget()
	rp := &httputil.ReverseProxy{
		Rewrite:       t.rewrite,
		Transport:     t.transport,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(lg.Handler(), slog.LevelWarn),
		ModifyResponse: func(resp *http.Response) error {
			lg.Debug("passthrough", "status", resp.StatusCode, "latency", time.Since(start))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if bodyErr := body.failure(client); bodyErr != nil {
				p.refuseBody(w, bodyErr) // the client's body failed, not the upstream: 413, or 400 naming it
				return
			}
			if client.Err() != nil {
				lg.Debug("passthrough: the client went away", "err", err)
				return
			}
			p.warns.warn(lg, "passthrough: upstream request failed", "err", err)
			writeUnreachable(w, unanswered(err))
		},
	}
	rp.ServeHTTP(w, out)
}

// watchedBody is a request body on its way upstream that tells how reading
// it ended: ended is closed once a read fails or reaches the end, or the
// body is closed with no read in progress (a read in progress when it is
// closed ends it when it returns, with its error).
type watchedBody struct {
	io.ReadCloser
	mu                    sync.Mutex
	reading, closed, done bool
	err                   error // the failed read's error, set before ended is closed
	ended                 chan struct{}
}

// Read implements io.Reader.
func (b *watchedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.reading = true
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reading = false
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	if err != nil || b.closed {
		b.end()
	}
	return n, err
}

// Close implements io.Closer.
func (b *watchedBody) Close() error {
	b.mu.Lock()
	b.closed = true
	if !b.reading {
		b.end()
	}
	b.mu.Unlock()
	return b.ReadCloser.Close()
}

// end closes ended, once; b.mu is held.
func (b *watchedBody) end() {
	if !b.done {
		b.done = true
		close(b.ended)
	}
}

// failure returns the error reading the body failed with, if it did: the
// body is over its bound, or the client stopped sending it. A read that
// fails also ends the client's context, which can end the upstream call
// before the read returns: once client has ended, failure waits for the
// read, briefly. nil for no body.
func (b *watchedBody) failure(client context.Context) error {
	if b == nil {
		return nil
	}
	if client.Err() != nil {
		select {
		case <-b.ended:
		case <-time.After(bodyEndWait):
		}
	}
	select {
	case <-b.ended:
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.err
	default:
		return nil
	}
}

// bodyEndWait bounds watchedBody.failure's wait.
const bodyEndWait = time.Second

// tooLarge answers a request whose body is larger than limit.
func (p *Proxy) tooLarge(w http.ResponseWriter, limit int64) {
	p.stats.add(cTooLarge, 1)
	writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", "request_too_large",
		fmt.Sprintf("The request body is larger than %d bytes.", limit))
}
