package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/store"
)

// endpointRig is a proxy in front of the fake upstream, whose base has a
// path prefix (/api/v1).
type endpointRig struct {
	fake *fakeupstream.Upstream
	// url is the proxy's address.
	url string
}

// newEndpointRig starts the fake upstream and a proxy over tr; opts, when
// not nil, are the WebSocket transport's.
func newEndpointRig(t *testing.T, tr transport, opts *WebSocketOptions) *endpointRig {
	t.Helper()
	fake := fakeupstream.New(fakeupstream.Options{})
	up := httptest.NewServer(fake)
	t.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	var p *Proxy
	if opts != nil {
		u, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/api/v1", *opts)
		require.NoError(t, err)
		p, err = New(Config{Store: st, Upstream: u})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
	} else {
		p = newProxy(t, tr, st, up.URL+"/api/v1")
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return &endpointRig{fake: fake, url: srv.URL}
}

// do sends a request to the proxy and returns the answer, its body read.
func do(t *testing.T, method, url, body string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// last returns the last request that reached the fake upstream's other
// endpoints.
func (r *endpointRig) last(t *testing.T) fakeupstream.HTTPRequest {
	t.Helper()
	reqs := r.fake.Requests()
	require.NotEmpty(t, reqs, "nothing reached the upstream")
	return reqs[len(reqs)-1]
}

func TestEndpointsPassThroughUnchanged(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			r := newEndpointRig(t, tr, nil)
			auth := http.Header{"Authorization": {"Bearer sk-client"}, "Content-Type": {"application/json"}}
			// A turn, stored upstream, for the endpoints that name a response.
			resp, b := do(t, http.MethodPost, r.url+"/v1/responses", `{"model":"m","input":"hi"}`, auth)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			id := gjson.GetBytes(b, "id").String()
			require.Empty(t, r.fake.Requests(), "a turn is not passed through")

			for _, tc := range []struct {
				method, path, query, body string
				status                    int
				want                      string // in the answer
			}{
				{http.MethodGet, "/models", "", "", http.StatusOK, `"object":"list"`},
				{http.MethodGet, "/responses/" + id, "include%5B%5D=x&stream=false", "", http.StatusOK, `"id":"` + id + `"`},
				{http.MethodPost, "/responses/" + id + "/cancel", "", "", http.StatusOK, `"status":"completed"`},
				{http.MethodPost, "/responses/input_tokens", "", `{"model":"m","input":"count me"}`, http.StatusOK, `"object":"response.input_tokens"`},
				{http.MethodDelete, "/responses/" + id, "", "", http.StatusOK, `"deleted":true`},
				{http.MethodGet, "/responses/" + id, "", "", http.StatusNotFound, "not found"},
				// Not served by the fake: its 404 comes back as it is.
				{http.MethodPost, "/responses/compact", "", `{"model":"m","input":[{"role":"user","content":"x"}]}`, http.StatusNotFound, "Invalid URL"},
				{http.MethodPost, "/embeddings", "", `{"model":"e","input":"x"}`, http.StatusNotFound, "Invalid URL"},
				{http.MethodPost, "/chat/completions", "", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, http.StatusOK, "data: [DONE]"},
			} {
				url := r.url + "/v1" + tc.path
				if tc.query != "" {
					url += "?" + tc.query
				}
				resp, b := do(t, tc.method, url, tc.body, auth)
				assert.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.method, tc.path, b)
				assert.Contains(t, string(b), tc.want, "%s %s", tc.method, tc.path)
				got := r.last(t)
				assert.Equal(t, tc.method, got.Method)
				assert.Equal(t, "/api/v1"+tc.path, got.Path, "the path under the upstream's HTTP base")
				assert.Equal(t, tc.query, got.RawQuery)
				assert.Equal(t, tc.body, string(got.Body))
				assert.Equal(t, "Bearer sk-client", got.Header.Get("Authorization"))
			}
			assert.Len(t, r.fake.Requests(), 9)
		})
	}
}

func TestEndpointHeadersAreATurnsHeaders(t *testing.T) {
	r := newEndpointRig(t, overHTTP, nil)
	resp, b := do(t, http.MethodGet, r.url+"/v1/models", "", http.Header{
		"Authorization":       {"Bearer sk-client"},
		"Api-Key":             {"azure-key"},
		"Openai-Organization": {"org-1"},
		"Openai-Beta":         {"responses=v1"},
		"X-Session-Id":        {"s1"},
		"Connection":          {"X-Hop"},
		"X-Hop":               {"1"},
		"Proxy-Authorization": {"Basic cHJveHk="},
		"Contproxy-Forward":   {"t=1, socket=1, prev=resp_x, sig=00"},
	})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	h := r.last(t).Header
	for k, v := range map[string]string{"Authorization": "Bearer sk-client", "Api-Key": "azure-key",
		"Openai-Organization": "org-1", "Openai-Beta": "responses=v1", "X-Session-Id": "s1"} {
		assert.Equal(t, v, h.Get(k), k)
	}
	for _, k := range []string{"X-Hop", "Proxy-Authorization", "Contproxy-Forward"} {
		assert.Empty(t, h.Values(k), k)
	}
}

func TestEndpointsOverWebSocketTakeTheConfiguredCredential(t *testing.T) {
	r := newEndpointRig(t, overWebSocket, &WebSocketOptions{Replica: "r1",
		Header: http.Header{"Authorization": {"Bearer sk-gateway"}, "Openai-Project": {"proj-gw"}}})
	resp, b := do(t, http.MethodGet, r.url+"/v1/models", "", http.Header{
		"Authorization": {"Bearer sk-client"}, "Api-Key": {"k"}, "Openai-Organization": {"org-client"},
		"X-Session-Id": {"s1"},
	})
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	h := r.last(t).Header
	assert.Equal(t, "Bearer sk-gateway", h.Get("Authorization"))
	assert.Equal(t, "proj-gw", h.Get("Openai-Project"))
	assert.Empty(t, h.Values("Api-Key"))
	assert.Empty(t, h.Values("Openai-Organization"))
	assert.Equal(t, "s1", h.Get("X-Session-Id"), "the other headers go as sent")
}

func TestEndpointsStreamBothWays(t *testing.T) {
	gotFirst, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	seen := make(chan string, 1) // the body as the upstream read it
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "/v1/chat/completions", r.URL.Path)
		body := bufio.NewReader(r.Body)
		line, err := body.ReadString('\n')
		assert.NoError(t, err)
		close(gotFirst) // the client has not sent the rest yet
		rest, err := io.ReadAll(body)
		assert.NoError(t, err)
		seen <- line + string(rest)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		<-release // the client reads the first chunk before the upstream goes on
		_, _ = io.WriteString(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(let) // before the upstream closes, on failure
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overHTTP, st, up.URL+"/v1"))
	t.Cleanup(srv.Close)

	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", pr)
	require.NoError(t, err)
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		assert.NoError(t, err)
		answered <- resp
	}()
	_, err = io.WriteString(pw, `{"model":"m","stream":true,`+"\n")
	require.NoError(t, err)
	select {
	case <-gotFirst:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not get the body's first part before the client sent the rest")
	}
	_, err = io.WriteString(pw, `"messages":[]}`)
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	resp := <-answered
	require.NotNil(t, resp)
	defer resp.Body.Close()
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	rd := bufio.NewReader(resp.Body)
	firstLine := make(chan string, 1)
	go func() {
		l, _ := rd.ReadString('\n')
		firstLine <- l
	}()
	select {
	case first := <-firstLine:
		assert.Equal(t, "data: {\"n\":1}\n", first)
	case <-time.After(10 * time.Second):
		t.Fatal("the first chunk did not arrive while the upstream held the rest")
	}
	let()
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: {\"n\":2}\n\ndata: [DONE]\n\n", string(rest))
	assert.Equal(t, "{\"model\":\"m\",\"stream\":true,\n\"messages\":[]}", <-seen)
}

func TestEndpointUnreachableUpstreamIs502(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			srv := deadUpstreamProxy(t, tr)
			resp, b := do(t, http.MethodGet, srv.URL+"/v1/models", "", nil)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
			assert.Equal(t, "upstream_unreachable", gjson.GetBytes(b, "error.code").String())
			assert.Equal(t, "upstream_error", gjson.GetBytes(b, "error.type").String())
			assertTellsNoAddress(t, b)
		})
	}
}

func TestEndpointBodiesAreBounded(t *testing.T) {
	fake := fakeupstream.New(fakeupstream.Options{})
	up := httptest.NewServer(fake)
	t.Cleanup(up.Close)
	p := limitedProxy(t, nil, up.URL+"/v1", Config{MaxBodyBytes: 16, MaxPassthroughBytes: 32})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	big := `{"model":"e","input":"` + strings.Repeat("x", 64) + `"}`

	resp, b := do(t, http.MethodPost, srv.URL+"/v1/embeddings", big, nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", b)
	assert.Empty(t, fake.Requests(), "refused from its Content-Length")

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/embeddings", io.MultiReader(strings.NewReader(big)))
	require.NoError(t, err)
	req.ContentLength = -1 // chunked: the bound is met while the body streams
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", b)
	assert.Equal(t, "request_too_large", gjson.GetBytes(b, "error.code").String())

	resp, b = do(t, http.MethodPost, srv.URL+"/v1/embeddings", `{"model":"e"}`, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "within the bound, it goes: %s", b)
	over := `{"model":"e","input":"x"}` // over MaxBodyBytes, within MaxPassthroughBytes
	resp, b = do(t, http.MethodPost, srv.URL+"/v1/embeddings", over, nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "a turn's bound is not another endpoint's: %s", b)
	resp, b = do(t, http.MethodPost, srv.URL+"/v1/responses", over, http.Header{"Content-Encoding": {"compress"}})
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "a turn the proxy does not read has a turn's bound: %s", b)
	assert.Contains(t, gjson.GetBytes(b, "error.message").String(), "larger than 16 bytes")
	assert.Equal(t, int64(3), p.Stats().TooLarge, "the 413s counted")
}

func TestPathsOutsideV1Are404(t *testing.T) {
	r := newEndpointRig(t, overHTTP, nil)
	for _, path := range []string{"/v2/models", "/", "/v10/models", "/healthz"} {
		resp, b := do(t, http.MethodGet, r.url+path, "", nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		assert.Equal(t, "invalid_request_error", gjson.GetBytes(b, "error.type").String(), path)
	}
	assert.Empty(t, r.fake.Requests())
}

// A query string goes upstream with a turn as with any other request
// (Azure's api-version), and the upstream URL's own query goes with every
// request, but for the parameters the client names itself.
func TestQueriesGoUpstream(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[]}`)
	}))
	t.Cleanup(up.Close)
	turn := `{"model":"m","input":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		base, path string
		want       string
	}{
		{"/openai/v1", "/v1/responses?api-version=2025-04-01-preview", "POST /openai/v1/responses?api-version=2025-04-01-preview"},
		{"/openai/v1?api-version=p", "/v1/responses", "POST /openai/v1/responses?api-version=p"},
		{"/openai/v1/?api-version=p", "/v1/responses?api-version=q&x=1", "POST /openai/v1/responses?api-version=q&x=1"},
		{"/openai/v1?api-version=p&y=2", "/v1/responses?x=1", "POST /openai/v1/responses?api-version=p&y=2&x=1"},
		{"/openai/v1?api-version=p", "/v1/models?x=1", "GET /openai/v1/models?api-version=p&x=1"},
	} {
		st, err := store.NewMemory(store.Options{})
		require.NoError(t, err)
		srv := httptest.NewServer(newProxy(t, overHTTP, st, up.URL+tc.base))
		method, body := http.MethodPost, turn
		if strings.Contains(tc.want, "GET") {
			method, body = http.MethodGet, ""
		}
		resp, b := do(t, method, srv.URL+tc.path, body, http.Header{"Content-Type": {"application/json"}})
		srv.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		mu.Lock()
		assert.Equal(t, tc.want, got[len(got)-1], "base %s, %s", tc.base, tc.path)
		mu.Unlock()
	}
}

// A WebSocket upgrade on another path than the turns' (the Realtime API's
// /v1/realtime) goes upstream as any other request, and the connection is
// relayed once the upstream switches; an Upgrade header on a POST that
// asks for no upgrade (no Connection: upgrade) leaves it a turn.
func TestOtherWebSocketsAndStrayUpgradeHeaders(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/realtime" || r.URL.RawQuery != "model=m" {
			http.NotFound(w, r)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		typ, msg, err := ws.Read(r.Context())
		if err == nil {
			_ = ws.Write(r.Context(), typ, append([]byte("echo "), msg...))
		}
	}))
	t.Cleanup(upstream.Close)
	r := newRig(t, overHTTP, nil)
	p := newProxy(t, overHTTP, nil, upstream.URL+"/v1")
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/realtime?model=m", nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(`{"type":"session.update"}`)))
	_, got, err := ws.Read(ctx)
	require.NoError(t, err)
	assert.Equal(t, `echo {"type":"session.update"}`, string(got))
	assert.Equal(t, int64(1), p.Stats().Endpoints, "the relayed upgrade is an endpoint's request")

	resp, b := do(t, http.MethodPost, r.url, `{"model":"m","input":"hi"}`,
		http.Header{"Upgrade": {"websocket"}, "Content-Type": {"application/json"}})
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, int64(1), r.proxy.Stats().Turns)
}

// A request relayed as sent (an endpoint's, or a turn the fingerprint
// cannot read) that the upstream took whole and hung up on may have run:
// upstream_disconnected, as for a turn, not upstream_unreachable.
func TestARelayedRequestTheUpstreamTookAndDroppedIsNotUnreachable(t *testing.T) {
	var posts atomic.Int32
	up := httptest.NewServer(hangsUp(&posts))
	t.Cleanup(up.Close)
	p := newProxy(t, overHTTP, nil, up.URL+"/v1")
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"m","model":"m","input":"hi"}`}, // duplicate keys: relayed unread
		{"/v1/embeddings", `{"model":"e","input":"hi"}`},
	} {
		resp, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode, tc.path)
		assert.Equal(t, "upstream_disconnected", gjson.GetBytes(body, "error.code").String(), "%s: %s", tc.path, body)
	}
	assert.Equal(t, int64(1), p.Stats().Unread)
	assert.Equal(t, int32(2), posts.Load(), "each went once")
}
