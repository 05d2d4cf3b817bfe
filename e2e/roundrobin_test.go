//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// clientCall is one create-response request a client sent through the
// round-robin proxy, and what the client got back.
type clientCall struct {
	// client is the label of the client run the request belongs to.
	client string
	// items and bytes measure the full context the client sent: the input
	// items and the body, decoded (see decodedBody).
	items, bytes int
	// encoding is the request's Content-Encoding header, "" without one.
	encoding string
	// prompt is the request's prompt (see promptOf).
	prompt string
	// body is the request's body, kept only while a hook is set (see
	// begin), which may want to read it.
	body []byte
	// failure describes an error the client was sent, in the status line,
	// the body or a streamed error event; "" when there was none.
	failure string
	// status is the answer's status code, 0 before it came.
	status int
	// holder is the replica the answer says holds the turn's upstream
	// socket (the Contproxy-Replica header), "" when it names none.
	holder string
	// retried counts the backends that failed to take the request before
	// one did.
	retried int
	// sent is when the request went to its first backend.
	sent time.Time
}

// routingHeader is the answer header naming the replica that holds the
// turn's upstream socket (contproxy's -routing-header default).
const routingHeader = "Contproxy-Replica"

// downFor is how long the round-robin proxy skips a backend it could not
// reach.
const downFor = 10 * time.Second

// roundRobin is a reverse proxy in front of the backends (contproxy
// replicas) that sends each request to the next backend in turn, streams
// responses as they come (Server-Sent Events flow) and records every
// create-response request. Like a load balancer with passive health
// checks, it sends a request that could not reach its backend (a
// connection error before any of the answer) to the next one, and skips
// the failed backend for downFor.
type roundRobin struct {
	proxy *httputil.ReverseProxy
	srv   *httptest.Server
	// inflight counts the requests being proxied, each until its answer
	// has been read to its end.
	inflight atomic.Int64

	mu       sync.Mutex
	backends []*backend
	next     int
	client   string
	calls    []*clientCall
	// before, when set, is called with n before the client's nth
	// create-response request goes to a backend.
	before func(n int)
}

// backend is one of the round-robin proxy's backends.
type backend struct {
	url       *url.URL
	downUntil time.Time // skipped until then
}

// callKey is the context key of a request's *clientCall.
type callKey struct{}

// newRoundRobin serves a round-robin proxy to backends on 127.0.0.1 until
// the test ends.
func newRoundRobin(t *testing.T, backends ...string) *roundRobin {
	t.Helper()
	rr := &roundRobin{}
	for _, b := range backends {
		u, err := url.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		rr.backends = append(rr.backends, &backend{url: u})
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(transport.CloseIdleConnections)
	rr.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(rr.pick(nil))
		},
		Transport:      &failover{rr: rr, next: transport},
		FlushInterval:  -1,
		ModifyResponse: rr.watch,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if c, ok := r.Context().Value(callKey{}).(*clientCall); ok {
				rr.fail(c, "round-robin proxy: "+err.Error())
			}
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	rr.srv = httptest.NewServer(http.HandlerFunc(rr.serve))
	t.Cleanup(rr.srv.Close)
	return rr
}

// baseURL is the proxy's OpenAI base URL, http://127.0.0.1:PORT/v1.
func (rr *roundRobin) baseURL() string { return rr.srv.URL + "/v1" }

// begin labels the requests that follow as client's, and sets the hook
// called before each of them (nil for none).
func (rr *roundRobin) begin(client string, before func(n int)) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.client, rr.before = client, before
}

// callsOf returns the recorded requests of client, in order.
func (rr *roundRobin) callsOf(client string) []clientCall {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	var out []clientCall
	for _, c := range rr.calls {
		if c.client == client {
			out = append(out, *c)
		}
	}
	return out
}

// pick returns the next backend in turn that is neither down nor in
// skip; when every backend not in skip is down, the first of those in
// turn; nil when skip holds every backend.
func (rr *roundRobin) pick(skip map[*url.URL]bool) *url.URL {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	now := time.Now()
	var down *url.URL
	for range rr.backends {
		b := rr.backends[rr.next%len(rr.backends)]
		rr.next++
		switch {
		case skip[b.url]:
		case now.Before(b.downUntil):
			if down == nil {
				down = b.url
			}
		default:
			return b.url
		}
	}
	return down
}

// markDown skips the backend at u for downFor.
func (rr *roundRobin) markDown(u *url.URL) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, b := range rr.backends {
		if b.url == u {
			b.downUntil = time.Now().Add(downFor)
		}
	}
}

// waitIdle polls until no request is in flight through the proxy, or
// fails once timeout has passed. A request is in flight until its answer
// has been read to its end: a backend has finished its handler by then.
func (rr *roundRobin) waitIdle(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for rr.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d requests still in flight through the round-robin proxy after %v", rr.inflight.Load(), timeout)
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// serve records create-response requests and proxies every request.
func (rr *roundRobin) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/responses") {
		rr.inflight.Add(1)
		defer rr.inflight.Add(-1)
		rr.proxy.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	encoding := r.Header.Get("Content-Encoding")
	plain := decodedBody(encoding, body)
	rr.mu.Lock()
	c := &clientCall{client: rr.client, items: inputItems(plain), bytes: len(plain), prompt: promptOf(plain), encoding: encoding}
	if rr.before != nil {
		c.body = body
	}
	rr.calls = append(rr.calls, c)
	n := 0
	for _, o := range rr.calls {
		if o.client == c.client {
			n++
		}
	}
	before := rr.before
	rr.mu.Unlock()
	if before != nil {
		before(n)
	}
	rr.mu.Lock()
	c.sent = time.Now()
	rr.mu.Unlock()
	rr.inflight.Add(1)
	defer rr.inflight.Add(-1)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	rr.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
}

// failover sends a request to the backend the round-robin proxy chose,
// then, while the backends it tries cannot be reached, to the next ones,
// each at most once. A request whose body cannot be sent again is not
// retried.
type failover struct {
	rr   *roundRobin
	next http.RoundTripper
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	tried := map[*url.URL]bool{}
	for {
		resp, err := f.next.RoundTrip(req)
		if err == nil || req.Context().Err() != nil || (req.Body != nil && req.GetBody == nil) {
			return resp, err
		}
		u := f.backendOf(req)
		if u == nil {
			return nil, err
		}
		f.rr.markDown(u)
		tried[u] = true
		to := f.rr.pick(tried)
		if to == nil {
			return nil, err
		}
		again := req.Clone(req.Context())
		again.URL.Scheme, again.URL.Host = to.Scheme, to.Host
		if req.GetBody != nil {
			if again.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		if c, ok := req.Context().Value(callKey{}).(*clientCall); ok {
			f.rr.mu.Lock()
			c.retried++
			f.rr.mu.Unlock()
		}
		req = again
	}
}

// backendOf returns the backend req was sent to, nil when it is none of
// them.
func (f *failover) backendOf(req *http.Request) *url.URL {
	f.rr.mu.Lock()
	defer f.rr.mu.Unlock()
	for _, b := range f.rr.backends {
		if b.url.Scheme == req.URL.Scheme && b.url.Host == req.URL.Host {
			return b.url
		}
	}
	return nil
}

// fail records a failure of c, keeping the first.
func (rr *roundRobin) fail(c *clientCall, failure string) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if c.failure == "" {
		c.failure = failure
	}
}

// watch records a failed create-response answer: an error status, or an
// error event in a stream.
func (rr *roundRobin) watch(resp *http.Response) error {
	c, ok := resp.Request.Context().Value(callKey{}).(*clientCall)
	if !ok {
		return nil
	}
	rr.mu.Lock()
	c.status = resp.StatusCode
	c.holder = resp.Header.Get(routingHeader)
	rr.mu.Unlock()
	if resp.StatusCode >= 400 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		rr.fail(c, fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(body)))
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		return nil
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &eventWatcher{ReadCloser: resp.Body, report: func(event string) {
			rr.fail(c, "streamed "+clip(event, 2000))
		}}
	}
	return nil
}

// eventWatcher passes a Server-Sent Events stream on and reports each
// event whose data is of type "error", "response.failed" or
// "response.incomplete", or whose event field is one of them.
type eventWatcher struct {
	io.ReadCloser
	report func(event string)
	line   []byte
}

func (e *eventWatcher) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	for _, b := range p[:n] {
		if b != '\n' {
			e.line = append(e.line, b)
			continue
		}
		e.check(bytes.TrimSuffix(e.line, []byte("\r")))
		e.line = e.line[:0]
	}
	return n, err
}

// failedEvents are the event types that tell the client its request failed.
var failedEvents = map[string]bool{"error": true, "response.failed": true, "response.incomplete": true}

func (e *eventWatcher) check(line []byte) {
	field, value, _ := bytes.Cut(line, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(field) {
	case "event":
		if failedEvents[string(value)] {
			e.report(string(line))
		}
	case "data":
		var ev struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(value, &ev) == nil && failedEvents[ev.Type] {
			e.report(string(value))
		}
	}
}

// zstdDecoder decodes the zstd bodies Codex sends when signed in with
// ChatGPT; DecodeAll is safe for concurrent use.
var zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))

// decodedBody returns a create-response body as the client meant it: a
// zstd body decoded, any other as sent (the body goes on as sent, and a
// zstd body that does not decode is measured as it is, for contproxy to
// refuse).
func decodedBody(encoding string, body []byte) []byte {
	if !strings.EqualFold(strings.TrimSpace(encoding), "zstd") {
		return body
	}
	plain, err := zstdDecoder.DecodeAll(body, nil)
	if err != nil {
		return body
	}
	return plain
}

// inputItems counts the input items of a create-response body: the
// elements of an input array, 1 for an input string.
func inputItems(body []byte) int {
	var req struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Input) == 0 || string(req.Input) == "null" {
		return 0
	}
	var items []json.RawMessage
	if json.Unmarshal(req.Input, &items) == nil {
		return len(items)
	}
	return 1
}
