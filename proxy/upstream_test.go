package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/store"
)

// countingServer is an httptest server that counts the TCP connections
// it accepts, and can hold requests until a number of them are in flight.
type countingServer struct {
	*httptest.Server
	dials atomic.Int64
	// held, when not nil, holds each request until conc are in flight.
	held    atomic.Pointer[chan struct{}]
	arrived atomic.Int64
}

func newCountingServer(t *testing.T, h http.Handler, conc int) *countingServer {
	t.Helper()
	cs := &countingServer{}
	cs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if held := cs.held.Load(); held != nil {
			if cs.arrived.Add(1) == int64(conc) {
				close(*held)
			}
			select {
			case <-*held:
			case <-time.After(5 * time.Second):
			}
		}
		h.ServeHTTP(w, r)
	}))
	cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			cs.dials.Add(1)
		}
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

// warmUp runs conc calls of f at once, each held by the server until all
// are in flight, so that conc connections are open at the end, and
// returns the connections opened so far.
func (cs *countingServer) warmUp(conc int, f func(i int)) int64 {
	held := make(chan struct{})
	cs.held.Store(&held)
	concurrently(conc, conc, f)
	cs.held.Store(nil)
	return cs.dials.Load()
}

// concurrently runs n calls of f, c at a time.
func concurrently(n, c int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range c {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// The upstream's connections are reused across turns: 400 turns, 64 at a
// time, after a first round of 64 opened the connections.
func TestUpstreamConnectionsAreReused(t *testing.T) {
	const turns, conc = 400, 64
	upstream := newCountingServer(t, fakeupstream.New(fakeupstream.Options{}), conc)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overHTTP, st, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	// The clients keep their own connections to the proxy.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	t.Cleanup(client.CloseIdleConnections)
	turn := func(i int) {
		body := fmt.Sprintf(`{"model":"m","store":true,"input":"turn %d"}`, i)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(body))
		if !assert.NoError(t, err) {
			return
		}
		req.Header.Set("X-Session-Id", fmt.Sprint("s", i%conc))
		resp, err := client.Do(req)
		if !assert.NoError(t, err) {
			return
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		assert.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	warm := upstream.warmUp(conc, turn)
	concurrently(turns, conc, turn)
	opened := upstream.dials.Load() - warm
	t.Logf("%d upstream connections for the first %d turns, %d for the next %d (%.3f a turn)",
		warm, conc, opened, turns, float64(opened)/turns)
	assert.LessOrEqual(t, float64(opened)/turns, 0.05, "new upstream connections a turn")
}

// Forwarded turns reuse their connections to the origin replica: 400
// forwards, 64 at a time, after a first round of 64.
func TestForwardedTurnsReuseConnections(t *testing.T) {
	const turns, conc = 400, 64
	origin := newCountingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Accepted, then told to go (Forwarding).
		_, _ = io.CopyN(io.Discard, r.Body, r.ContentLength-1)
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		startEvents(w, http.StatusOK)
		_ = rc.Flush()
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "data: {\"type\":\"contproxy.forward\",\"carried\":true}\n\n"+
			"data: {\"type\":\"response.completed\"}\n\n")
	}), conc)
	dir, err := directory.NewMemory(directory.Options{})
	require.NoError(t, err)
	f := &Forwarding{Directory: dir, Secret: testSecret}
	require.NoError(t, f.check())
	t.Cleanup(f.Client.CloseIdleConnections)
	addr := strings.TrimPrefix(origin.URL, "http://")
	forward := func(i int) {
		c := &forwardConn{f: f, addr: addr, origin: store.Socket{Replica: "r2", ID: 1}, prev: "resp_1",
			tg: &target{header: http.Header{}}}
		rep, err := c.send(context.Background(), []byte(fmt.Sprintf(`{"input":"turn %d"}`, i)), true)
		if !assert.NoError(t, err) {
			return
		}
		defer rep.close()
		for {
			if _, err := rep.next(); err != nil {
				assert.ErrorIs(t, err, io.EOF)
				return
			}
		}
	}
	warm := origin.warmUp(conc, forward)
	concurrently(turns, conc, forward)
	opened := origin.dials.Load() - warm
	t.Logf("%d connections to the origin for the first %d forwards, %d for the next %d (%.3f a forward)",
		warm, conc, opened, turns, float64(opened)/turns)
	assert.LessOrEqual(t, float64(opened)/turns, 0.05, "new connections a forward")
}

// An event whose data spans lines (SSE allows it; a WebSocket upstream's
// indented JSON holds them) reaches the client whole: each line on a data
// line of its own. A stream client parses every event, and the turn
// completes and is recorded.
func TestEventsOfManyLinesReachTheClientWhole(t *testing.T) {
	created := "{\n  \"type\": \"response.created\",\r\n  \"response\": {\"id\": \"resp_ml\", \"object\": \"response\", \"status\": \"in_progress\", \"output\": []}\r}"
	var buf bytes.Buffer
	writeEvent(&buf, "response.created", []byte(created))
	ev, ok := parseEvent(bytes.TrimSuffix(buf.Bytes(), []byte("\n\n")))
	require.True(t, ok, "%q", buf.String())
	assert.Equal(t, "response.created", ev.typ)
	assert.JSONEq(t, created, string(ev.data))

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, data := range []string{
			`{"type": "response.created", "response": {"id": "resp_ml", "object": "response", "status": "in_progress", "output": []}}`,
			`{"type": "response.completed", "response": {"id": "resp_ml", "object": "response", "status": "completed", "output": []}}`,
		} {
			_, _ = io.WriteString(w, "data: "+strings.ReplaceAll(data, ", ", ",\ndata:   ")+"\n\n")
		}
	}))
	t.Cleanup(upstream.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	srv := httptest.NewServer(newProxy(t, overHTTP, st, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var types []string
	for _, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		ev, ok := parseEvent([]byte(block))
		require.True(t, ok, "%q", block)
		require.True(t, json.Valid(ev.data), "%q", block)
		types = append(types, gjson.GetBytes(ev.data, "type").String())
	}
	assert.Equal(t, []string{"response.created", "response.completed"}, types)
}

// An event stream whose lines end with CR alone (SSE allows it) is read as
// one whose lines end with LF, each event passed on as soon as its blank
// line arrives, and the upstream's keep-alive comments reach the client as
// they come, flushed, between the events.
func TestEventStreamsEndLinesAnyWayAndKeepAlive(t *testing.T) {
	gaps := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		eol := r.URL.Query().Get("eol")
		gap := func() { // the client has what came before the stream goes on
			w.(http.Flusher).Flush()
			select {
			case <-gaps:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "event: response.created"+eol+`data: {"type":"response.created","response":{"id":"resp_cr","object":"response","status":"in_progress","output":[]}}`+eol+eol)
		gap()
		_, _ = io.WriteString(w, ": keep-alive"+eol+eol)
		gap()
		_, _ = io.WriteString(w, `data: {"type":"response.completed","response":{"id":"resp_cr","object":"response","status":"completed","output":[]}}`+eol+eol)
	}))
	t.Cleanup(upstream.Close)
	for _, eol := range []string{"\r", "\r\n", "\n"} {
		srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1?eol="+url.QueryEscape(eol)))
		client := &http.Client{Timeout: 10 * time.Second} // an event held back fails, not hangs
		resp, err := client.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
		require.NoError(t, err, "eol %q", eol)
		require.Equal(t, http.StatusOK, resp.StatusCode, "eol %q", eol)
		r := bufio.NewReader(resp.Body)
		readUntil := func(want string) {
			for {
				line, err := r.ReadString('\n')
				require.NoError(t, err, "eol %q, waiting for %q", eol, want)
				if strings.HasPrefix(line, want) {
					return
				}
			}
		}
		readUntil(`data: {"type":"response.created"`)
		gaps <- struct{}{}
		readUntil(": keep-alive")
		gaps <- struct{}{}
		rest, err := io.ReadAll(r)
		require.NoError(t, err)
		_ = resp.Body.Close()
		srv.Close()
		assert.Contains(t, string(rest), `"type":"response.completed"`, "eol %q", eol)
	}
}

// An event stream's events read the same whatever their lines' ends and
// however the bytes arrive, one at a time included.
func TestEventStreamLines(t *testing.T) {
	lines := []string{"\uFEFFevent: a", "data: b", "", ": c", "", "id: 1", "data:d", "data:  e", "retry: 5", "", "data: f"}
	for _, eol := range []string{"\r", "\n", "\r\n"} {
		stream := strings.Join(lines, eol) + eol + eol
		for _, r := range []io.Reader{strings.NewReader(stream), iotest.OneByteReader(strings.NewReader(stream))} {
			var comments []string
			rep := &reply{comments: func(line []byte) { comments = append(comments, string(line)) }}
			next := newEventReader(r, rep).next
			var got []string
			for {
				ev, err := next()
				if err != nil {
					require.ErrorIs(t, err, io.EOF, "eol %q", eol)
					break
				}
				got = append(got, ev.name+"|"+string(ev.data))
			}
			assert.Equal(t, []string{"a|b", "|d\n e", "|f"}, got, "eol %q", eol)
			assert.Equal(t, []string{": c"}, comments, "eol %q", eol)
		}
	}
}

// A redirect from the upstream reaches the client as sent, the turn sent
// once; an event stream is one whatever the case of its media type.
func TestUpstreamRedirectsAndMediaTypes(t *testing.T) {
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/moved/v1/responses" {
			http.Redirect(w, r, "/v1/responses", http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "Text/Event-Stream; Charset=UTF-8")
		for _, data := range []string{
			`{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`,
			`{"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","output":[]}}`,
		} {
			_, _ = io.WriteString(w, "data: "+data+"\n\n")
		}
	}))
	t.Cleanup(upstream.Close)
	for _, tc := range []struct {
		name, base string
		status     int
		calls      int64
	}{{"redirect", upstream.URL + "/moved/v1", http.StatusTemporaryRedirect, 1}, {"media type", upstream.URL + "/v1", http.StatusOK, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			calls.Store(0)
			st, err := store.NewMemory(store.Options{Replica: "r1"})
			require.NoError(t, err)
			p := newProxy(t, overHTTP, st, tc.base)
			srv := httptest.NewServer(p)
			t.Cleanup(srv.Close)
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
			require.NoError(t, err)
			req.Header.Set("X-Session-Id", "s1")
			resp, err := client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			assert.Equal(t, tc.status, resp.StatusCode, "%s", body)
			assert.Equal(t, tc.calls, calls.Load())
			if tc.status == http.StatusOK {
				assert.True(t, isEventStream(resp.Header))
				assert.Contains(t, string(body), "event: response.completed")
				next, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses",
					strings.NewReader(`{"model":"m","stream":true,"input":[{"role":"user","content":"hi"},{"role":"user","content":"again"}]}`))
				require.NoError(t, err)
				next.Header.Set("X-Session-Id", "s1")
				resp, err := client.Do(next)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, int64(1), p.Stats().Continued, "the stream completed, and was recorded")
			}
		})
	}
}

// Event streams an HTTP upstream may answer that are unusual but read as
// the OpenAI SDKs read them (an event is what its data's type says; a
// byte order mark may begin the stream; an error event over HTTP is an
// event, whatever it carries) reach a stream client as events, and the
// turn is recorded when its response completed. The upstream's headers
// reach the client, on an answer the proxy writes itself too.
func TestUnusualEventStreamsFromAnHTTPUpstream(t *testing.T) {
	const (
		created   = `{"type":"response.created","response":{"id":"resp_u","object":"response","status":"in_progress","output":[]}}`
		completed = `{"type":"response.completed","response":{"id":"resp_u","object":"response","status":"completed","output":[]}}`
		failed    = `{"type":"response.failed","response":{"id":"resp_u","object":"response","status":"failed","output":[],"error":{"code":"server_error","message":"m"}}}`
		rateError = `{"type":"error","status":429,"code":"rate_limit_exceeded","message":"Slow down.","param":null}`
	)
	named := func(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }
	type streamCase struct {
		name        string
		contentType string // "-" for none
		stream      string
		status      int
		types       []string // the data types of the events the client gets
		continues   bool     // whether the next turn continues from resp_u
	}
	cases := []streamCase{
		{"a byte order mark first", "text/event-stream", "\uFEFFdata: " + created + "\n\ndata: " + completed + "\n\n",
			http.StatusOK, []string{"response.created", "response.completed"}, true},
		{"no content type", "-", named("response.created", created) + named("response.completed", completed),
			http.StatusOK, []string{"response.created", "response.completed"}, true},
		{"octet-stream", "application/octet-stream", named("response.created", created) + named("response.completed", completed),
			http.StatusOK, []string{"response.created", "response.completed"}, true},
		{"an error event with a status first", "text/event-stream", named("error", rateError),
			http.StatusOK, []string{"error"}, false},
		{"a completion named otherwise", "text/event-stream", named("response.created", created) + named("response.output_text.delta", completed),
			http.StatusOK, []string{"response.created", "response.completed"}, true},
		{"a failure named a completion", "text/event-stream", named("response.created", created) + named("response.completed", failed),
			http.StatusOK, []string{"response.created", "response.failed"}, false},
		{"a completion cut short, framed", "text/event-stream", named("response.created", created) + named("response.completed", completed[:len(completed)-10]),
			http.StatusOK, []string{"response.created", "response.completed"}, false},
		{"no event at all", "text/event-stream", "", http.StatusBadGateway, nil, false},
		{"no event at all, in a coding", "text/event-stream", "", http.StatusBadGateway, nil, false},
	}
	var prev atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Request-Id", "req_u")
		if p := gjson.GetBytes(body, "previous_response_id"); gjson.GetBytes(body, "input.#").Int() != 1 || p.Exists() {
			prev.Store(p.String()) // the next turn
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, named("response.created", created)+named("response.completed", completed))
			return
		}
		var tc streamCase
		for _, c := range cases {
			if c.name == r.URL.Query().Get("case") {
				tc = c
			}
		}
		if strings.HasSuffix(tc.name, "in a coding") {
			w.Header().Set("Content-Encoding", "br") // which the proxy's error answer is not in
		}
		if tc.contentType == "-" {
			w.Header()["Content-Type"] = nil // not sniffed either
		} else {
			w.Header().Set("Content-Type", tc.contentType)
		}
		_, _ = io.WriteString(w, tc.stream)
	}))
	t.Cleanup(upstream.Close)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1?case="+url.QueryEscape(tc.name)))
			t.Cleanup(srv.Close)
			resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode, "%s", body)
			assert.Equal(t, "req_u", resp.Header.Get("X-Request-Id"))
			if tc.status == http.StatusOK {
				var types []string
				for _, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
					ev, ok := parseEvent([]byte(block))
					require.True(t, ok, "%q", block)
					types = append(types, gjson.GetBytes(ev.data, "type").String())
				}
				assert.Equal(t, tc.types, types, "%s", body)
			} else {
				assert.Empty(t, resp.Header.Get("Content-Encoding"), "the proxy's own answer")
				assert.Equal(t, "upstream_disconnected", gjson.GetBytes(body, "error.code").String(), "%s", body)
			}
			prev.Store("")
			next, err := http.Post(srv.URL+"/v1/responses", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"input":[{"role":"user","content":"hi"},{"role":"user","content":"next"}]}`))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, next.Body)
			_ = next.Body.Close()
			want := ""
			if tc.continues {
				want = "resp_u"
			}
			assert.Equal(t, want, prev.Load(), "the next turn's previous_response_id")
		})
	}
}

// A continued turn whose upstream refused the continuation inside its
// stream (a failed response, previous_response_not_found) does not give it
// back: sent again, the turn goes with its full context; such refusals
// count as the ones before an answer do, three in a row pausing
// continuations for the model. One the upstream closed the connection on
// before answering gives it back: sent again, it continues.
func TestAContinuationRefusedMidStreamIsNotGivenBack(t *testing.T) {
	const (
		created   = `{"type":"response.created","response":{"id":"resp_%d","object":"response","status":"in_progress","output":[]}}`
		completed = `{"type":"response.completed","response":{"id":"resp_%d","object":"response","status":"completed","output":[]}}`
		refusal   = `{"type":"response.failed","response":{"id":"resp_%d","object":"response","status":"failed","output":[],"error":{"code":"previous_response_not_found","message":"Previous response not found."}}}`
	)
	var (
		mu    sync.Mutex
		calls int
		mode  string   // how the next continued call fails: "refuse", "hang up" or ""
		prevs []string // each call's previous_response_id
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		prev := gjson.GetBytes(body, "previous_response_id").String()
		mu.Lock()
		calls++
		n, fail := calls, mode
		prevs = append(prevs, prev)
		if prev != "" && mode != "refuse always" {
			mode = ""
		}
		mu.Unlock()
		if prev != "" && fail == "hang up" {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = c.Close()
			}
			return
		}
		if !gjson.GetBytes(body, "stream").Bool() { // the response object, as JSON
			ev := fmt.Sprintf(completed, n)
			if prev != "" && strings.HasPrefix(fail, "refuse") {
				ev = fmt.Sprintf(refusal, n)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, gjson.Get(ev, "response").Raw)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "data: "+created+"\n\n", n)
		if prev != "" && strings.HasPrefix(fail, "refuse") {
			_, _ = fmt.Fprintf(w, "data: "+refusal+"\n\n", n)
			return
		}
		_, _ = fmt.Fprintf(w, "data: "+completed+"\n\n", n)
	}))
	t.Cleanup(upstream.Close)
	for _, tc := range []struct {
		fail, want string // the second call's previous_response_id when sent again
		stream     bool
	}{{"refuse", "", true}, {"hang up", "resp_1", true}, {"refuse", "", false}} {
		t.Run(fmt.Sprintf("%s/stream=%v", tc.fail, tc.stream), func(t *testing.T) {
			mu.Lock()
			calls, mode, prevs = 0, "", nil
			mu.Unlock()
			srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
			t.Cleanup(srv.Close)
			send := func(body string) []byte {
				resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(body))
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				return b
			}
			stream := fmt.Sprintf(`"stream":%v`, tc.stream)
			send(`{"model":"m",` + stream + `,"input":"hi"}`)
			mu.Lock()
			mode = tc.fail
			mu.Unlock()
			next := `{"model":"m",` + stream + `,"input":[{"role":"user","content":"hi"},{"role":"user","content":"next"}]}`
			got := send(next) // continued from resp_1, and failed
			if !tc.stream {
				// The client waits for the whole answer: the refusal is
				// seen before it, and the turn sent again with its full
				// context, unseen.
				assert.Equal(t, "completed", gjson.GetBytes(got, "status").String(), "%s", got)
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, prevs, 3)
				assert.Equal(t, []string{"", "resp_1", ""}, prevs)
				return
			}
			send(next) // sent again
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, prevs, 3)
			assert.Equal(t, "resp_1", prevs[1], "the turn continued")
			assert.Equal(t, tc.want, prevs[2], "the turn sent again")
		})
	}
	t.Run("refused every time", func(t *testing.T) {
		mu.Lock()
		calls, mode, prevs = 0, "refuse always", nil
		mu.Unlock()
		srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
		t.Cleanup(srv.Close)
		input := []string{`{"role":"user","content":"hi"}`}
		for i := range 12 {
			input = append(input, fmt.Sprintf(`{"role":"user","content":"%d"}`, i))
			resp, err := http.Post(srv.URL+"/v1/responses", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"input":[`+strings.Join(input, ",")+`]}`))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		continued := 0
		for _, p := range prevs {
			if p != "" {
				continued++
			}
		}
		assert.Equal(t, 3, continued, "three refusals in a row pause continuing for the model")
	})
}

// A JSON answer that is not whole JSON (cut, framed all the same) reaches
// the client as it came, and the next turn does not continue from it.
func TestAGarbledJSONAnswerIsNotContinued(t *testing.T) {
	var prev atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		prev.Store(gjson.GetBytes(body, "previous_response_id").String())
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_j","object":"response","status":"completed","output":[]`)
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	for i, input := range []string{`"hi"`, `[{"role":"user","content":"hi"},{"role":"user","content":"next"}]`} {
		resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":`+input+`}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `{"id":"resp_j","object":"response","status":"completed","output":[]`, string(body), "as it came")
		assert.Empty(t, prev.Load(), "turn %d went whole", i)
	}
}

// An event stream reaches the client as the upstream sent it: its 2xx
// status and how it may be cached; the keep-alives that come before the
// first event, at once, beginning the client's stream; and the events
// after the terminal one (a failed response after an error event).
func TestAStreamReachesTheClientAsTheUpstreamSentIt(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, ": PROCESSING\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release: // the client saw the keep-alive
		case <-time.After(5 * time.Second):
		}
		_, _ = io.WriteString(w, "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s\",\"status\":\"in_progress\"}}\n\n"+
			"data: {\"type\":\"error\",\"code\":\"context_length_exceeded\",\"message\":\"too long\"}\n\n"+
			"data: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_s\",\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\"}}}\n\n")
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, ": PROCESSING\n", line, "the keep-alive first")
	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	var types []string
	for l := range strings.Lines(string(rest)) {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			types = append(types, gjson.Get(d, "type").String())
		}
	}
	assert.Equal(t, []string{"response.created", "error", "response.failed"}, types)

	// A socket client gets the same events, whatever the stream's 2xx.
	c := dialSocket(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/responses", "s1")
	c.create(map[string]any{"model": "m", "input": "again"})
	ev, err := c.next()
	require.NoError(t, err)
	assert.Equal(t, "response.created", ev.Get("type").String(), ev.Raw)
}

// An event that goes on to the client unread, for want of room, shows the
// previous response id the proxy added as null, as the events it reads
// do, wherever the reads split it.
func TestAnEventPassedUnreadHidesTheAddedPreviousResponseID(t *testing.T) {
	const prev = "resp_added"
	response := `{"id":"resp_n","object":"response","status":"%s","previous_response_id":"` + prev + `","output":[],"instructions":"` + strings.Repeat("i", 4<<10) + `"}`
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":" + fmt.Sprintf(response, "in_progress") + "}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + fmt.Sprintf(response, "completed") + "}\n\n"
	for _, r := range []func() io.Reader{
		func() io.Reader { return strings.NewReader(stream) },
		func() io.Reader { return iotest.OneByteReader(strings.NewReader(stream)) },
	} {
		rep := &reply{status: http.StatusOK, header: http.Header{}, stream: &waitReader{r: r()}, held: &hold{b: newBudget(1 << 10)}}
		rep.next = newEventReader(rep.stream, rep).next
		w := httptest.NewRecorder()
		out := relayStream(w, rep, prev, nil)
		assert.True(t, out.unkept, "the events went on unread")
		assert.NoError(t, out.err)
		got := w.Body.String()
		assert.NotContains(t, got, prev)
		assert.Equal(t, 2, strings.Count(got, `"previous_response_id":null`))
		assert.Equal(t, strings.ReplaceAll(stream, `"previous_response_id":"`+prev+`"`, `"previous_response_id":null`), got)
	}
}

// A JSON answer the upstream cuts short, shorter than its length, reaches
// the client as far as it came, then cut, as through a reverse proxy:
// never as an answer that ended whole; and it is not continued.
func TestAJSONAnswerCutShortReachesTheClientCut(t *testing.T) {
	var prev atomic.Value
	const whole = `{"id":"resp_c","object":"response","status":"completed","output":[]}`
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		prev.Store(gjson.GetBytes(body, "previous_response_id").String())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(whole)))
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, whole[:40])
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		if conn, _, err := rc.Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	for i, input := range []string{`"hi"`, `[{"role":"user","content":"hi"},{"role":"user","content":"next"}]`} {
		resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","store":true,"input":`+input+`}`))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "turn %d: cut", i)
		assert.Equal(t, whole[:40], string(body), "turn %d: as far as it came", i)
		assert.Empty(t, prev.Load(), "turn %d went whole", i)
	}
}

// A turn reaches the upstream once, even with an Idempotency-Key, which
// would have Go's transport send it again when a reused connection closes
// after taking it.
func TestATurnWithAnIdempotencyKeyIsNotSentTwice(t *testing.T) {
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 2 { // the second turn, on the first's connection
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_i","object":"response","status":"completed","output":[]}`)
	}))
	t.Cleanup(upstream.Close)
	srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
	t.Cleanup(srv.Close)
	for i, want := range []int{http.StatusOK, http.StatusBadGateway} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(`{"model":"m","store":false,"input":"hi"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", fmt.Sprint("key-", i))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "turn %d", i)
	}
	assert.Equal(t, int64(2), calls.Load(), "each turn went upstream once")
}

// parseEvent parses one Server-Sent Event: its name and data (newEvent).
func parseEvent(block []byte) (event, bool) {
	var name string
	var data [][]byte
	for _, line := range bytes.Split(block, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		switch {
		case bytes.HasPrefix(line, []byte("event:")):
			name = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data, bytes.TrimPrefix(line[len("data:"):], []byte(" ")))
		}
	}
	if data == nil {
		return event{}, false // a comment
	}
	return newEvent(name, bytes.Join(data, []byte("\n"))), true
}

// A stream's byte order mark goes no further when its first event goes
// on unread.
func TestAByteOrderMarkIsNotPassedOn(t *testing.T) {
	for _, room := range []int64{1 << 20, 100} { // some of the line read, or none
		rep := &reply{held: &hold{b: newBudget(room)}}
		var passed bytes.Buffer
		rep.pass = func(b []byte) { passed.Write(b) }
		data := `{"type":"response.created","t":"` + strings.Repeat("x", 2<<20) + `"}`
		ev, err := newEventReader(strings.NewReader("\uFEFFdata: "+data+"\n\n"), rep).next()
		require.NoError(t, err)
		assert.True(t, ev.passed)
		assert.Equal(t, "response.created", ev.typ, "room %d", room)
		assert.Equal(t, "data: "+data+"\n\n", passed.String(), "room %d", room)
	}
}

// An event passed on unread is of the type its data ends with when its
// head tells none: an upstream that writes the members in the order of
// their names sends the type last.
func TestAPassedEventsTypeMayComeLast(t *testing.T) {
	for _, name := range []string{"", "message"} {
		rep := &reply{held: &hold{b: newBudget(1 << 20)}, pass: func([]byte) {}}
		data := `{"response":{"id":"r","output":[{"type":"message","text":"` + strings.Repeat("x", 2<<20) +
			`"}]},"sequence_number":3,"type":"response.completed"}`
		stream := "data: " + data + "\n\n"
		if name != "" {
			stream = "event: " + name + "\n" + stream
		}
		ev, err := newEventReader(strings.NewReader(stream), rep).next()
		require.NoError(t, err)
		assert.True(t, ev.passed)
		assert.Equal(t, "response.completed", ev.typ, "named %q", name)
	}
}

// A previousIDWriter shows each previous_response_id member whose value
// is the one it looks for with its own, blanks around the colon or not,
// however the writes split it; it leaves anything else as it came.
func TestAPreviousIDWriterShowsTheMemberWhateverItsBlanks(t *testing.T) {
	in := `{"previous_response_id":"resp_a","x":{"previous_response_id" : "resp_a"},` +
		`"s":"\"previous_response_id\":\"resp_a\"","previous_response_id":"resp_ab",` +
		"\"previous_response_id\":\n\t\"resp_a\",\"previous_response_id\":null,\"previous_response_id\"" +
		strings.Repeat(" ", maxBlanks+1) + `:"resp_a","previous_response_id"`
	want := `{"previous_response_id":null,"x":{"previous_response_id" : null},` +
		`"s":"\"previous_response_id\":\"resp_a\"","previous_response_id":"resp_ab",` +
		"\"previous_response_id\":\n\tnull,\"previous_response_id\":null,\"previous_response_id\"" +
		strings.Repeat(" ", maxBlanks+1) + `:"resp_a","previous_response_id"`
	for size := 1; size <= len(in); size++ {
		var out bytes.Buffer
		r := &previousIDWriter{w: &out, old: []byte(`"resp_a"`), with: []byte("null")}
		for rest := in; rest != ""; rest = rest[min(size, len(rest)):] {
			_, err := r.Write([]byte(rest[:min(size, len(rest))]))
			require.NoError(t, err)
		}
		require.NoError(t, r.Flush())
		require.Equal(t, want, out.String(), "written %d bytes at a time", size)
	}
}

// An event that goes on unread and carries nothing the turn keeps (a
// response.created echoing long instructions, a delta) leaves the turn to
// be kept: only an output item's or the terminal event's going by unread
// does not.
func TestAPassedEventTheTurnKeepsNothingOfLeavesItKept(t *testing.T) {
	long := `{"id":"resp_k","object":"response","status":"in_progress","instructions":"` + strings.Repeat("i", 8<<10) + `","output":[]}`
	item := `{"type":"message","id":"msg_k","role":"assistant","status":"completed","content":[{"type":"output_text","text":"ok"}]}`
	stream := "data: {\"type\":\"response.created\",\"response\":" + long + "}\n\n" +
		"data: {\"type\":\"response.output_text.delta\",\"delta\":\"" + strings.Repeat("d", 8<<10) + "\"}\n\n" +
		"data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":" + item + "}\n\n" +
		"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_k\",\"object\":\"response\",\"status\":\"completed\",\"output\":[" + item + "]}}\n\n"
	rep := &reply{status: http.StatusOK, header: http.Header{}, stream: &waitReader{r: strings.NewReader(stream)}, held: &hold{b: newBudget(4 << 10)}}
	rep.next = newEventReader(rep.stream, rep).next
	w := httptest.NewRecorder()
	out := relayStream(w, rep, "", nil)
	require.NoError(t, out.err)
	assert.Equal(t, 4, strings.Count(w.Body.String(), "data: "), "every event reached the client")
	assert.False(t, out.unkept)
	assert.True(t, out.continuable)
	assert.Equal(t, "resp_k", out.id)
	assert.Len(t, out.output, 1)
}

// A JSON answer is read into a buffer of its length when the upstream
// tells it, and of answerStep when it does not: a few-kilobyte answer,
// the usual one, takes no buffer of readStep. Larger answers of unknown
// length are read whole, step after step.
func TestAJSONAnswerIsReadIntoABufferOfItsSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size, told int
		most       int // the buffer's capacity at most, but for its size class
	}{
		{"told", 3000, 3000, 3001},
		{"empty, told", 0, 0, 8}, // the smallest allocation
		{"untold", 3000, -1, answerStep},
		{"told, over a step", 3 * readStep, 3 * readStep, 8 * readStep},
		{"untold, over a step", 3 * readStep, -1, 8 * readStep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := bytes.Repeat([]byte("x"), tc.size)
			body, rest, err := readAnswer(t.Context(), bytes.NewReader(want), int64(tc.told), nil)
			require.NoError(t, err)
			assert.False(t, rest)
			assert.Equal(t, want, body)
			assert.LessOrEqual(t, cap(body), tc.most+tc.most/8, "within the allocator's size class")
		})
	}
}

// An answer that ends with its connection (HTTP/1 without a length or
// chunks) cannot tell a cut from its end by its framing: one whose JSON
// ends early reaches the client cut, one whose JSON is whole as an end.
func TestACloseDelimitedJSONAnswerCutShortReachesTheClientCut(t *testing.T) {
	const whole = `{"id":"resp_c","object":"response","status":"completed","output":[]}`
	for _, tc := range []struct {
		name, sent string
		cut        bool
	}{{"cut", whole[:40], true}, {"whole", whole, false}} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + tc.sent)
				_ = buf.Flush()
			}))
			t.Cleanup(upstream.Close)
			srv := httptest.NewServer(newProxy(t, overHTTP, nil, upstream.URL+"/v1"))
			t.Cleanup(srv.Close)
			resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hi"}`))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, tc.sent, string(body), "as far as it came")
			if tc.cut {
				assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut")
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

// An answer larger than the proxy reads (64 MiB) comes from an upstream
// that ran the turn: 502 upstream_disconnected, which says it may have
// run, not upstream_unreachable, which says a retry is free.
func TestAnAnswerTooLargeToReadIsNotToldUnreachable(t *testing.T) {
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"`)
		chunk := strings.Repeat("x", 1<<20)
		for range maxUpstreamBody >> 20 {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, `"}]}]}`)
	}))
	t.Cleanup(upstream.Close)
	p := limitedProxy(t, nil, upstream.URL+"/v1", Config{MaxBytesInFlight: 1 << 30})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	a := post(t, srv.URL+"/v1/responses", nil, map[string]any{"model": "m", "input": "hi"})
	assert.Equal(t, http.StatusBadGateway, a.status)
	assert.Equal(t, "upstream_disconnected", gjson.GetBytes(a.body, "error.code").String(), "%s", a.body)
	assert.Equal(t, int64(1), calls.Load(), "the turn went once")
}

// An answer that names its id (or its status, or its output) twice is
// not recorded: the proxy would read the first, a client most likely the
// last, and the next turn could continue a response the client never
// saw, another conversation's.
func TestAnAnswerNamingItsIDTwiceIsNotRecorded(t *testing.T) {
	var prevs []string
	var mu sync.Mutex
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		prevs = append(prevs, gjson.GetBytes(b, "previous_response_id").String())
		n := len(prevs)
		prev := "null"
		if p := prevs[n-1]; p != "" {
			prev = `"` + p + `"`
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"resp_other","object":"response","status":"completed","id":"resp_%d","previous_response_id":%s,"output":[{"type":"message","id":"msg_%d","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]}`, n, prev, n)
	}))
	t.Cleanup(upstream.Close)
	p := limitedProxy(t, nil, upstream.URL+"/v1", Config{})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	c := newConversation(t, srv.URL+"/v1/responses", "s1", false, true)
	c.say("one")
	c.say("two")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"", ""}, prevs, "nothing continued")
	assert.Zero(t, p.Stats().Continued)
}
