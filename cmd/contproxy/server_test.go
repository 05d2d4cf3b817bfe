package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
)

// The timeouts below are short, and the waits for them long: the drops
// they check happen within a second, on a loaded machine within a few.

// rawClient is one HTTP/1.1 connection to contproxy, written by hand.
type rawClient struct {
	net.Conn
	r *bufio.Reader
}

// dial connects to addr; the connection closes when the test ends.
func dial(t *testing.T, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &rawClient{Conn: conn, r: bufio.NewReader(conn)}
}

// get sends GET path on the connection, keeping it open, and returns the
// answer's status and body.
func (c *rawClient) get(t *testing.T, path string) (int, string) {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: gw\r\n\r\n", path)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Second))) // past a wait for a slot, on a loaded machine
	resp, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// closedWithin reads what the server sends until it closes the
// connection, for up to d; it tells whether the server closed it, and
// returns what it read.
func (c *rawClient) closedWithin(d time.Duration) (closed bool, got string) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c.r)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout(), string(b)
}

// answered plays one turn at addr and checks that it is answered.
func answered(t *testing.T, addr string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"m","input":"hi"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

func TestARequestBodyThatStallsIsDropped(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-body-timeout", "500ms")
	// A turn, and requests the proxy passes through, with a length and
	// chunked.
	for _, head := range []string{
		"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
		"POST /v1/responses/compact HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n",
	} {
		c := dial(t, addr)
		_, err := io.WriteString(c, head+`{"model":`)
		require.NoError(t, err)
		answered(t, addr) // meanwhile, other clients are served
		closed, answer := c.closedWithin(8 * time.Second)
		assert.True(t, closed, "%q: the connection is open 8 s after its body stalled", head)
		assert.Contains(t, answer, "HTTP/1.1 400 ", head)
		assert.Contains(t, answer, "Reading the request body: nothing came for 500ms", "%q: it was told why", head)
	}
}

// A body whose bytes keep coming is not cut, however slowly it arrives
// in all, with a length or chunked, even within one chunk, which a read
// of the body waits for whole.
func TestABodyWhoseBytesKeepComingIsServed(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-body-timeout", "500ms")
	body := `{"model":"m","input":"` + strings.Repeat("x", 60) + `"}`
	for _, tc := range []struct{ name, head, start, end string }{
		{"length", fmt.Sprintf("Content-Length: %d\r\n", len(body)), "", ""},
		{"chunked", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n", len(body)), "\r\n0\r\n\r\n"},
	} {
		c := dial(t, addr)
		_, err := io.WriteString(c, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"+
			tc.head+"Connection: close\r\n\r\n"+tc.start)
		require.NoError(t, err)
		for i := 0; i < len(body); i += 8 { // 8 bytes every 100 ms: over a second in all
			time.Sleep(100 * time.Millisecond)
			_, err = io.WriteString(c, body[i:min(i+8, len(body))])
			require.NoError(t, err, tc.name)
		}
		_, err = io.WriteString(c, tc.end)
		require.NoError(t, err)
		_, answer := c.closedWithin(10 * time.Second)
		assert.Contains(t, answer, "HTTP/1.1 200 ", tc.name)
	}
}

func TestAnIdleConnectionIsClosed(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-idle-timeout", "500ms")
	c := dial(t, addr)
	status, _ := c.get(t, "/healthz")
	require.Equal(t, http.StatusOK, status)
	closed, _ := c.closedWithin(8 * time.Second)
	assert.True(t, closed, "the idle connection is open 8 s after its answer")
}

// A client that asks for a stream and never reads it is dropped once a
// write to it blocks for -write-timeout, and the turn's upstream request
// is cancelled; other clients are served meanwhile.
func TestAStreamNobodyReadsIsDropped(t *testing.T) {
	fake := fakeupstream.New(fakeupstream.Options{})
	dropped := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Flood") == "" {
			fake.ServeHTTP(w, r)
			return
		}
		// 64 KB events until contproxy stops reading them (256 MB at most).
		w.Header().Set("Content-Type", "text/event-stream")
		event := `event: response.output_text.delta` + "\n" +
			`data: {"type":"response.output_text.delta","delta":"` + strings.Repeat("x", 64<<10) + `"}` + "\n\n"
		for range 4096 {
			if _, err := io.WriteString(w, event); err != nil {
				close(dropped)
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	addr, _, _ := start(t, "-upstream", up.URL+"/v1", "-write-timeout", "500ms", "-shutdown-timeout", "2s")

	c := dial(t, addr)
	body := `{"model":"m","stream":true,"input":"hi"}`
	_, err := fmt.Fprintf(c, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nX-Flood: 1\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	answered(t, addr)
	select {
	case <-dropped:
	case <-time.After(8 * time.Second):
		t.Fatal("the turn of a client that stopped reading still runs 8 s later")
	}
	closed, _ := c.closedWithin(8 * time.Second)
	assert.True(t, closed, "the connection of a client that stopped reading is open")
	answered(t, addr)
}

// A client that reads its stream keeps it however long the upstream
// stays quiet between events: the body and write timeouts bound the
// client's own waits, not the upstream's. The stream here has gaps of
// three times both timeouts, over a JSON body and a chunked one.
func TestAQuietStreamOutlivesTheTimeouts(t *testing.T) {
	const gap = 900 * time.Millisecond
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i, typ := range []string{"response.created", "response.in_progress"} {
			fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}}\n\n", typ, typ, i)
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[]}}\n\n")
	}))
	t.Cleanup(up.Close)
	addr, _, _ := start(t, "-upstream", up.URL+"/v1", "-body-timeout", "300ms", "-write-timeout", "300ms")
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`)
		if chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		resp, err := http.Post("http://"+addr+"/v1/responses", "application/json", body)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err, "chunked %v: the stream was cut: %s", chunked, got)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(got), "event: response.completed", "chunked %v", chunked)
	}
}

// A WebSocket connection outlives the write and body timeouts: the
// handler hijacks it past the limits' ResponseWriter.
func TestAWebSocketIsNotBoundByTheHTTPTimeouts(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-write-timeout", "300ms", "-body-timeout", "300ms")
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/responses", &websocket.DialOptions{
		HTTPHeader: http.Header{"X-Session-Id": {"s1"}}})
	require.NoError(t, err)
	defer ws.CloseNow()
	for turn := range 2 {
		if turn > 0 {
			time.Sleep(time.Second) // idle past both timeouts
		}
		require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","model":"m","input":"hi"}`)))
		for {
			_, msg, err := ws.Read(ctx)
			require.NoError(t, err, "turn %d", turn)
			if typ := gjson.GetBytes(msg, "type").String(); typ == "response.completed" {
				break
			} else if typ == "error" {
				t.Fatalf("turn %d: %s", turn, msg)
			}
		}
	}
}

// Past -max-conns a connection waits, unserved, until another closes,
// when every connection is busy.
func TestConnectionsPastMaxConnsWait(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-max-conns", "2")
	var open []*rawClient
	for range 2 {
		c := dial(t, addr)
		// Busy: a request whose body is on its way (a connection idle
		// between requests would make room).
		_, err := io.WriteString(c, "POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
		require.NoError(t, err)
		open = append(open, c)
	}
	third := dial(t, addr)
	_, err := io.WriteString(third, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, third.SetReadDeadline(time.Now().Add(time.Second)))
	_, err = third.r.Peek(1)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a third connection was served: %v", err)

	require.NoError(t, open[0].Close())
	require.NoError(t, third.SetReadDeadline(time.Now().Add(8*time.Second)))
	resp, err := http.ReadResponse(third.r, nil)
	require.NoError(t, err, "the third connection is served once the first closes")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// At -max-conns, a new connection takes the place of the WebSocket
// connection that has waited the longest without sending a message: a
// client holding every slot with connections it never uses does not keep
// the others out.
func TestAnUnusedWebSocketMakesRoomAtMaxConns(t *testing.T) {
	var log syncBuffer
	addr, _, _ := startWith(t, noEnv, &log, "-fake-upstream", "-max-conns", "2", "-log-level", "debug")
	t.Cleanup(func() { t.Log(log.String()) })
	var idle []*websocket.Conn
	for range 2 {
		ws, _, err := websocket.Dial(t.Context(), "ws://"+addr+"/v1/responses", nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ws.CloseNow() })
		idle = append(idle, ws)
		// Served (registered) before the next opens: the older is the first.
		require.Eventually(t, func() bool { return strings.Count(log.String(), "client socket opened") == len(idle) },
			10*time.Second, time.Millisecond)
	}
	c := dial(t, addr)
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	status, _ := c.get(t, "/healthz")
	assert.Equal(t, http.StatusOK, status, "served in an unused connection's place")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, _, err := idle[0].Read(ctx)
	assert.Equal(t, websocket.StatusTryAgainLater, websocket.CloseStatus(err), "the oldest closed: %v", err)
}

func TestIdleKeepAliveConnectionsMakeRoomAtMaxConns(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-max-conns", "2")
	for range 2 {
		status, _ := dial(t, addr).get(t, "/healthz")
		require.Equal(t, http.StatusOK, status)
	}
	// Both connections now sit idle, kept alive for -idle-timeout (2
	// minutes): a third is served in the place of one.
	status, _ := dial(t, addr).get(t, "/healthz")
	assert.Equal(t, http.StatusOK, status, "served in an idle connection's place")
}

func TestAWebSocketIdleBetweenTurnsMakesRoomAtMaxConns(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-max-conns", "2")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a loaded machine
	defer cancel()
	var used []*websocket.Conn
	for range 2 {
		ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/responses", nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ws.CloseNow() })
		require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","model":"m","input":"hi"}`)))
		for {
			_, msg, err := ws.Read(ctx)
			require.NoError(t, err)
			if gjson.GetBytes(msg, "type").String() == "response.completed" {
				break
			}
		}
		used = append(used, ws)
	}
	// Both connections sat idle since their turn: a third is served in
	// the place of the one idle the longest.
	status, _ := dial(t, addr).get(t, "/healthz")
	assert.Equal(t, http.StatusOK, status, "served in an idle WebSocket connection's place")
	_, _, err := used[0].Read(ctx)
	assert.Equal(t, websocket.StatusTryAgainLater, websocket.CloseStatus(err), "the idlest closed: %v", err)
}

// At -max-conns, with no connection idle, a new connection takes the
// place of the request whose body arrives the slowest: a byte now and
// then keeps a body within -body-timeout, but may not keep the others out.
func TestASlowBodyMakesRoomAtMaxConns(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-max-conns", "2")
	slow := make([]*rawClient, 2)
	for i := range slow {
		c := dial(t, addr)
		path := "/v1/files"
		if i == 1 {
			path = "/v1/responses" // a turn, whose body the budget holds too
		}
		_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", path)
		require.NoError(t, err)
		slow[i] = c
		go func() { // a byte every 200 ms, until the server stops it
			for range 100 {
				time.Sleep(200 * time.Millisecond)
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
	}
	third := dial(t, addr)
	start := time.Now()
	_, err := io.WriteString(third, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, third.SetReadDeadline(time.Now().Add(20*time.Second))) // slowAfter, on a loaded machine
	resp, err := http.ReadResponse(third.r, nil)
	require.NoError(t, err, "served in a slow body's place")
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	t.Logf("served after %v", time.Since(start))
	stopped := 0
	for _, c := range slow { // the one stopped has its answer by now
		require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
		if resp, err := http.ReadResponse(c.r, nil); err == nil {
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			_ = resp.Body.Close()
			stopped++
		}
	}
	assert.Positive(t, stopped, "a slow request is answered")
}

// So does a connection that has sent part of its headers for 5 s, as
// net/http takes it for idle: a byte of headers now and then may not keep
// the others out for -read-header-timeout.
func TestSlowHeadersMakeRoomAtMaxConns(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream", "-max-conns", "2", "-read-header-timeout", "60s")
	for range 2 {
		c := dial(t, addr)
		_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: gw\r\n")
		require.NoError(t, err)
		go func() { // a header byte every 200 ms
			for range 300 {
				time.Sleep(200 * time.Millisecond)
				if _, err := c.Write([]byte("X")); err != nil {
					return
				}
			}
		}()
	}
	start := time.Now()
	status, _ := dial(t, addr).get(t, "/healthz")
	assert.Equal(t, http.StatusOK, status, "served in a slow header's place")
	t.Logf("served after %v", time.Since(start))
}

func TestMetricsAreOnTheOperationsPortOnly(t *testing.T) {
	addr, ops, _ := start(t, "-fake-upstream")
	for _, c := range []struct {
		addr, path string
		status     int
		want       string
	}{
		{ops, "/metrics", http.StatusOK, "contproxy_turns_total 0"},
		{ops, "/healthz", http.StatusOK, "ok\n"},
		{addr, "/healthz", http.StatusOK, "ok\n"},
		{addr, "/metrics", http.StatusNotFound, "invalid_request_error"},
	} {
		status, body := dial(t, c.addr).get(t, c.path)
		assert.Equal(t, c.status, status, "%s%s", c.addr, c.path)
		assert.True(t, strings.Contains(body, c.want), "%s%s answers %.300q", c.addr, c.path, body)
	}

	var log syncBuffer
	startWith(t, noEnv, &log, "-fake-upstream", "-ops-listen", "", "-log-level", "info")
	assert.Contains(t, log.String(), ` ops="" `, "-ops-listen empty serves no operations port")
}

// A path a client's base URL spells oddly is served as written, not
// redirected, as through any reverse proxy; one that cleans to a path
// outside /v1 is 404.
func TestOddPathsAreServedNotRedirected(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream")
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/v1//responses", http.StatusOK},
		{"POST", "/v1/responses//", http.StatusOK},
		{"POST", "/v1/x/../responses", http.StatusOK},
		{"POST", "/v1/./responses", http.StatusOK},
		{"GET", "/v1//models", http.StatusOK},
		{"GET", "/v1/../metrics", http.StatusNotFound},
		{"GET", "/v2/models", http.StatusNotFound},
	} {
		conn := dial(t, addr)
		body := `{"model":"m","input":"hi"}`
		_, err := fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			c.method, c.path, len(body), body)
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(conn.r, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, c.status, resp.StatusCode, "%s %s: %.200s", c.method, c.path, b)
	}
}

// -max-conns leaves room in the open-file limit for an upstream
// connection a client connection, and for the files kept apart.
func TestMaxConnsFitsTheOpenFileLimit(t *testing.T) {
	assert.Equal(t, 480, connsWithin(4096, 1024))
	assert.Equal(t, 10, connsWithin(10, 1024))
	assert.Equal(t, 4096, connsWithin(4096, 0), "limit unknown")
	assert.Equal(t, 4096, connsWithin(4096, 1<<20))
	assert.Equal(t, 33, connsWithin(4096, 10), "a tiny limit still leaves some")
}

// Replicas started with -fake-upstream, or one started again, give out
// response ids of their own: sharing a Redis, they must not take one
// fake's responses for another's.
func TestFakeUpstreamsGiveIDsOfTheirOwn(t *testing.T) {
	ids := map[string]bool{}
	for range 2 {
		addr, _, _ := start(t, "-fake-upstream")
		resp, err := http.Post("http://"+addr+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hi"}`))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		ids[gjson.GetBytes(b, "id").String()] = true
	}
	assert.Len(t, ids, 2, "the two fakes' first responses have ids of their own")
}
