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
)

// clientCall is one create-response request a client sent through the
// round-robin proxy, and what the client got back.
type clientCall struct {
	// client is the label of the client run the request belongs to.
	client string
	// items and bytes measure the full context the client sent: the input
	// items and the body.
	items, bytes int
	// failure describes an error the client was sent, in the status line,
	// the body or a streamed error event; "" when there was none.
	failure string
}

// roundRobin is a reverse proxy in front of the backends (contproxy
// replicas) that sends each request to the next backend in turn, streams
// responses as they come (Server-Sent Events flow) and records every
// create-response request.
type roundRobin struct {
	targets []*url.URL
	next    atomic.Uint64
	proxy   *httputil.ReverseProxy
	srv     *httptest.Server

	mu     sync.Mutex
	client string
	calls  []*clientCall
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
		rr.targets = append(rr.targets, u)
	}
	rr.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(rr.targets[(rr.next.Add(1)-1)%uint64(len(rr.targets))])
		},
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

// begin labels the requests that follow as client's.
func (rr *roundRobin) begin(client string) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.client = client
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

// serve records create-response requests and proxies every request.
func (rr *roundRobin) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/responses") {
		rr.proxy.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rr.mu.Lock()
	c := &clientCall{client: rr.client, items: inputItems(body), bytes: len(body)}
	rr.calls = append(rr.calls, c)
	rr.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	rr.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
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
