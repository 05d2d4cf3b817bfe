package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store/prommetrics"
)

// noEnv is an empty environment.
func noEnv(string) (string, bool) { return "", false }

func TestFlagsComeFromTheEnvironmentUnlessGiven(t *testing.T) {
	env := map[string]string{"CONTPROXY_UPSTREAM": "wss://up.example/v1", "CONTPROXY_SOCKETS": "4",
		"CONTPROXY_REPLICA": "from-env"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := parse([]string{"-replica", "from-flag"}, lookup, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "wss://up.example/v1", c.upstream)
	assert.Equal(t, "websocket", c.transport, "from the URL's scheme")
	assert.Equal(t, 4, c.sockets)
	assert.Equal(t, "from-flag", c.replica)

	env["CONTPROXY_SOCKETS"] = "many"
	_, err = parse(nil, lookup, io.Discard)
	assert.ErrorContains(t, err, "CONTPROXY_SOCKETS")
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-fake-upstream", "-upstream", "http://x/v1"},
		{"-fake-upstream", "-redis", "redis://x", "-redis-cluster", "a:1"},
		{"-fake-upstream", "-transport", "carrier-pigeon"},
		{"-fake-upstream", "-sockets", "0"},
		{"-fake-upstream", "-redis", "redis://x", "-redis-client", "redigo"},
		{"-fake-upstream", "-redis-client", "rueidis"},
		{"-fake-upstream", "stray"},
	} {
		_, err := parse(args, noEnv, io.Discard)
		assert.Error(t, err, "%q", args)
	}
}

// The store on go-redis reads -redis as go-redis does, whatever rueidis
// would make of it: go-redis takes a bare number of seconds as a timeout,
// rueidis refuses it.
func TestRedisURLIsReadByTheChosenClient(t *testing.T) {
	const url = "redis://127.0.0.1:1/0?dial_timeout=3"
	for client, ok := range map[string]bool{"go-redis": true, "rueidis": false} {
		c, err := parse([]string{"-fake-upstream", "-redis", url, "-redis-client", client}, noEnv, io.Discard)
		require.NoError(t, err)
		st, _, closeStore, err := openStore(c, prommetrics.New(prommetrics.Options{}))
		if !ok {
			assert.ErrorContains(t, err, "-redis for -redis-client rueidis", client)
			continue
		}
		require.NoError(t, err, client)
		assert.NotNil(t, st)
		closeStore()
	}
}

// start runs contproxy with args until the test ends or stop is called.
func start(t *testing.T, args ...string) (addr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-listen", "127.0.0.1:0", "-log-level", "warn"}, args...), noEnv, io.Discard,
			func(a string) { ready <- a })
	}()
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("contproxy stopped: %v", err)
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return addr, stop
}

func TestServesTheFakeUpstreamOverBothTransports(t *testing.T) {
	for _, tr := range []string{"http", "websocket"} {
		t.Run(tr, func(t *testing.T) {
			addr, _ := start(t, "-fake-upstream", "-transport", tr)
			resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"store":false,"input":"hi"}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Contains(t, string(b), "event: response.completed")

			for path, want := range map[string]string{"/healthz": "ok", "/metrics": "contproxy_turns_total 1"} {
				resp, err := http.Get("http://" + addr + path)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Contains(t, string(b), want, path)
			}
			resp, err = http.Get("http://" + addr + "/v2/other")
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		})
	}
}

func TestShutdownLetsAStreamInFlightFinish(t *testing.T) {
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{EventDelay: 20 * time.Millisecond}))
	t.Cleanup(up.Close)
	addr, stop := start(t, "-upstream", up.URL+"/v1")
	resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"input":"hi"}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	_, err = r.ReadString('\n') // the stream has begun
	require.NoError(t, err)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Contains(t, string(rest), "event: response.completed", "the turn in flight finished")
	require.NoError(t, <-stopped)
}

func TestReplicasOnRedisForwardTurnsToTheirSocket(t *testing.T) {
	for _, client := range []string{"go-redis", "rueidis"} {
		t.Run(client, func(t *testing.T) { replicasForwardTurns(t, client) })
	}
}

// replicasForwardTurns runs TestReplicasOnRedisForwardTurnsToTheirSocket
// with the store on client.
func replicasForwardTurns(t *testing.T, client string) {
	rdb := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, rdb, ns)
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{}))
	t.Cleanup(up.Close)
	var addrs []string
	for _, id := range []string{"gw-1", "gw-2"} {
		port := freePort(t)
		addr, _ := start(t, "-listen", port, "-upstream", "ws"+strings.TrimPrefix(up.URL, "http")+"/v1",
			"-redis", "redis://"+rdb.Options().Addr, "-redis-client", client, "-namespace", ns, "-replica", id,
			"-forward-secret", strings.Repeat("k", 32))
		addrs = append(addrs, addr)
	}
	history := `{"role":"user","content":"hi"}`
	for turn := range 4 {
		resp, err := http.Post("http://"+addrs[turn%2]+"/v1/responses", "application/json",
			strings.NewReader(`{"model":"m","store":false,"metadata":{"session_id":"s1"},"input":[`+history+`]}`))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		output := gjson.GetBytes(b, "output").Raw
		history += "," + output[1:len(output)-1] + `,{"role":"user","content":"more"}`
	}
	var continued, forwarded float64
	for _, a := range addrs {
		continued += metric(t, a, "contproxy_turns_continued_total")
		forwarded += metric(t, a, "contproxy_forwarded_total")
	}
	assert.Equal(t, 3.0, continued, "every later turn continues")
	assert.Equal(t, 2.0, forwarded, "the conversation's socket stays on gw-1: gw-2's turns go there")
}

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// metric reads one counter from a replica's /metrics.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no %s in the metrics of %s", name, addr)
	return 0
}
