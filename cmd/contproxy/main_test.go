package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store/prommetrics"
)

// noEnv is an empty environment.
var noEnv []string

func TestFlagsComeFromTheEnvironmentUnlessGiven(t *testing.T) {
	env := []string{"CONTPROXY_UPSTREAM=wss://up.example/v1", "CONTPROXY_SOCKETS=4", "CONTPROXY_REPLICA=from-env"}
	c, err := parse([]string{"-replica", "from-flag"}, env, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "wss://up.example/v1", c.upstream)
	assert.Equal(t, "websocket", c.transport, "from the URL's scheme")
	assert.Equal(t, 4, c.sockets)
	assert.Equal(t, "from-flag", c.replica)
	assert.Empty(t, c.unknownEnv)

	_, err = parse(nil, append(env, "CONTPROXY_SOCKETS=many"), io.Discard)
	assert.NoError(t, err, "the first of a variable's values wins, as in os.LookupEnv")
	_, err = parse(nil, []string{"CONTPROXY_UPSTREAM=wss://up.example/v1", "CONTPROXY_SOCKETS=many"}, io.Discard)
	assert.ErrorContains(t, err, "CONTPROXY_SOCKETS")
}

// contproxy runs contproxy's main with args and env, as main does, and
// returns the exit status and what it wrote to stderr.
func contproxy(env []string, args ...string) (code int, stderr string) {
	var b strings.Builder
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a command line that is accepted serves nothing
	code = exitCode(run(ctx, args, env, &b, nil), &b)
	return code, b.String()
}

func TestBadFlagsPrintTheErrorAndAPointerToHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		err  string
	}{
		{args: []string{"-fake-upstream", "-nope"}, err: "flag provided but not defined: -nope"},
		{args: []string{"-fake-upstream", "-sockets", "many"}, err: `invalid value "many" for flag -sockets: parse error`},
		{args: []string{}, err: "-upstream is required (or -fake-upstream for a first try)"},
		{args: []string{"-fake-upstream", "-log-level", "loud"}, err: `-log-level "loud": want debug, info, warn or error`},
		{env: []string{"CONTPROXY_FAKE_UPSTREAM=maybe"}, err: `CONTPROXY_FAKE_UPSTREAM="maybe": parse error`},
	} {
		code, stderr := contproxy(tc.env, tc.args...)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Equal(t, "contproxy: "+tc.err+"\nrun contproxy -h for the flags\n", stderr, "%q %q", tc.args, tc.env)
	}
}

func TestHelpPrintsTheUsage(t *testing.T) {
	code, stderr := contproxy(noEnv, "-h")
	assert.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(stderr, "Usage: contproxy [flags]\n"), stderr)
	for _, f := range []string{"-upstream URL", "-transport string", "-redis URL", "-log-level string",
		"-ops-listen address", "-write-timeout duration", "-max-conns int"} {
		assert.Contains(t, stderr, "\n  "+f+"\n", "every flag is listed")
	}
	assert.NotContains(t, stderr, "run contproxy -h")
}

// Help says what contproxy does, not what it did once.
func TestHelpTellsNoHistory(t *testing.T) {
	_, stderr := contproxy(noEnv, "-h")
	for _, phrase := range []string{"is gone", "formerly", "the old", "no longer", "used to", "renamed",
		"deprecated", "anymore", "stays on", "now "} {
		assert.NotContains(t, strings.ToLower(stderr), phrase)
	}
}

func TestRedisWantsAURL(t *testing.T) {
	for _, tc := range []struct{ redis, err string }{
		{"127.0.0.1:6379", "-redis wants a URL such as redis://127.0.0.1:6379"},
		{"localhost:6379", "-redis wants a URL such as redis://127.0.0.1:6379"},
		{"user:secret@10.0.0.1:6379", "-redis wants a URL such as redis://127.0.0.1:6379"},
		{"http://127.0.0.1:6379", "-redis wants a URL such as redis://127.0.0.1:6379: redis: invalid URL scheme: http"},
		{"redis://user:secret@127.0.0.1:port/0", `-redis wants a URL such as redis://127.0.0.1:6379: invalid port ":port" after host`},
		{"redis://127.0.0.1:6379", ""},
		{"rediss://user:secret@127.0.0.1:6380/2?dial_timeout=3", ""},
		{"unix:///run/redis.sock", ""},
	} {
		for _, env := range [][]string{nil, {"CONTPROXY_REDIS=" + tc.redis}} {
			args := []string{"-fake-upstream"}
			if env == nil {
				args = append(args, "-redis", tc.redis)
			}
			_, err := parse(args, env, io.Discard)
			if tc.err == "" {
				assert.NoError(t, err, tc.redis)
				continue
			}
			assert.EqualError(t, err, tc.err, tc.redis)
			assert.NotContains(t, err.Error(), "secret", "a -redis that is refused is not repeated")
		}
	}
}

func TestUnknownEnvironmentVariablesAreNamed(t *testing.T) {
	c, err := parse(nil, []string{"CONTPROXY_FAKE_UPSTREAM=true", "CONTPROXY_REDIS_URL=redis://127.0.0.1:6379",
		"CONTPROXY_LOGLEVEL=debug", "CONTPROXY_UPSTREAM_URL=https://up.example/v1", "CONTPROXY_BANANA=1",
		"REDIS_URL=redis://127.0.0.1:6379", "CONTPROXY_REDIS_URL=second"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []unknownVar{
		{"CONTPROXY_BANANA", ""},
		{"CONTPROXY_LOGLEVEL", "CONTPROXY_LOG_LEVEL"},
		{"CONTPROXY_REDIS_URL", "CONTPROXY_REDIS"},
		{"CONTPROXY_UPSTREAM_URL", "CONTPROXY_UPSTREAM"},
	}, c.unknownEnv, "each once, with the variable it probably meant")
}

func TestUnknownEnvironmentVariablesAreWarnedAboutAtStart(t *testing.T) {
	var log syncBuffer
	_, _, stop := startWith(t, []string{"CONTPROXY_REDIS_URL=redis://127.0.0.1:6379", "CONTPROXY_BANANA=1"}, &log,
		"-fake-upstream")
	require.NoError(t, stop())
	out := log.String()
	assert.Equal(t, 1, strings.Count(out, "var=CONTPROXY_REDIS_URL did_you_mean=CONTPROXY_REDIS\n"), out)
	assert.Equal(t, 1, strings.Count(out, "var=CONTPROXY_BANANA\n"), out)
	assert.Contains(t, out, `level=WARN msg="ignoring an environment variable no flag reads" var=CONTPROXY_REDIS_URL`)
}

// A store:false turn over HTTP is served in full and not recorded, since
// the upstream keeps nothing to continue; its log line says so.
func TestADroppedTurnSaysWhyItWasNotRecorded(t *testing.T) {
	for tr, want := range map[string]string{
		"http":      `outcome=not_recorded why="the upstream keeps no responses (store:false)"`,
		"websocket": "outcome=published",
	} {
		t.Run(tr, func(t *testing.T) {
			var log syncBuffer
			addr, _, stop := startWith(t, noEnv, &log, "-fake-upstream", "-transport", tr, "-log-level", "debug")
			resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
				strings.NewReader(`{"model":"m","store":false,"metadata":{"session_id":"s1"},"input":"hi"}`))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NoError(t, stop()) // the turn's line is written once its handler returns
			out := log.String()
			assert.Contains(t, out, want)
			if tr != "http" {
				assert.NotContains(t, out, "why=")
			}
		})
	}
}

// syncBuffer is a bytes.Buffer for a writer and a reader on different
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-fake-upstream", "-upstream", "http://x/v1"},
		{"-fake-upstream", "-redis", "redis://x", "-redis-cluster", "a:1"},
		{"-fake-upstream", "-transport", "carrier-pigeon"},
		{"-upstream", "https://up.example/v1", "-transport", "websocket"},
		{"-upstream", "wss://up.example/v1", "-transport", "http"},
		{"-fake-upstream", "-sockets", "-1"},
		{"-fake-upstream", "-max-body", "-1"},
		{"-fake-upstream", "-max-conns", "0"},
		{"-fake-upstream", "-guess-owners", "-1"},
		{"-fake-upstream", "-body-timeout", "0s"},
		{"-fake-upstream", "-idle-timeout", "-1s"},
		{"-fake-upstream", "-redis", "redis://x", "-redis-client", "redigo"},
		{"-fake-upstream", "-redis-client", "rueidis"},
		{"-fake-upstream", "stray"},
	} {
		_, err := parse(args, noEnv, io.Discard)
		assert.Error(t, err, "%q", args)
	}
}

// A flag whose default is package proxy's takes 0 for it, as the proxy
// does for a zero field.
func TestZeroFlagsTakeTheProxyDefaults(t *testing.T) {
	c, err := parse([]string{"-fake-upstream", "-sockets", "0", "-max-body", "0"}, noEnv, io.Discard)
	require.NoError(t, err)
	assert.Zero(t, c.sockets)
	assert.Zero(t, c.maxBody)
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

// The go-redis client honours the store's deadlines, sends a script once
// more at most, and dials once: a Redis that refuses connections fails a
// turn open at once, not after four more dials 100 ms apart.
func TestTheRedisClientFailsFast(t *testing.T) {
	for _, args := range [][]string{{"-redis", "redis://127.0.0.1:1/0"}, {"-redis-cluster", "127.0.0.1:1,127.0.0.1:2"}} {
		c, err := parse(append([]string{"-fake-upstream"}, args...), noEnv, io.Discard)
		require.NoError(t, err)
		_, rdb, closeStore, err := openStore(c, prommetrics.New(prommetrics.Options{}))
		require.NoError(t, err, "%q", args)
		switch o := rdb.(type) {
		case *redis.Client:
			assert.Equal(t, []any{true, 1, 1}, []any{o.Options().ContextTimeoutEnabled, o.Options().MaxRetries, o.Options().DialerRetries})
		case *redis.ClusterClient:
			assert.Equal(t, []any{true, 1, 1}, []any{o.Options().ContextTimeoutEnabled, o.Options().MaxRetries, o.Options().DialerRetries})
		default:
			t.Fatalf("%q: a %T", args, rdb)
		}
		closeStore()
	}
}

// A store on Redis in front of an HTTP upstream keeps -guess-owners
// owners' guesses; a store in process, or in front of a WebSocket
// upstream, keeps none.
func TestGuessOwnersReachesTheStore(t *testing.T) {
	const redisURL = "redis://127.0.0.1:1/0"
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"-fake-upstream", "-redis", redisURL}, 10_000},
		{[]string{"-fake-upstream", "-redis", redisURL, "-guess-owners", "50"}, 50},
		{[]string{"-fake-upstream", "-redis", redisURL, "-guess-owners", "0"}, 0},
		{[]string{"-upstream", "wss://up.example/v1", "-redis", redisURL}, 0},
		{[]string{"-fake-upstream"}, 0},
	} {
		c, err := parse(tc.args, noEnv, io.Discard)
		require.NoError(t, err)
		st, _, closeStore, err := openStore(c, prommetrics.New(prommetrics.Options{}))
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.want, st.Options().GuessOwners, "%q", tc.args)
		closeStore()
	}
}

// The store's limits are the flags', in process and on Redis; left out,
// the store's defaults.
func TestStoreLimitsReachTheStore(t *testing.T) {
	for _, backend := range [][]string{nil, {"-redis", "redis://127.0.0.1:1/0"}} {
		c, err := parse(append([]string{"-fake-upstream", "-max-owners", "50000", "-max-stored-bytes", "40MB",
			"-max-conversation-bytes", "8MiB", "-state-ttl", "2h"}, backend...), noEnv, io.Discard)
		require.NoError(t, err)
		st, _, closeStore, err := openStore(c, prommetrics.New(prommetrics.Options{}))
		require.NoError(t, err, "%q", backend)
		o := st.Options()
		assert.Equal(t, []any{50_000, int64(40_000_000), int64(8 << 20), 2 * time.Hour},
			[]any{o.MaxOwners, o.MaxTotalBytes, o.MaxOwnerBytes, o.TTL}, "%q", backend)
		closeStore()
	}
	c, err := parse([]string{"-fake-upstream"}, noEnv, io.Discard)
	require.NoError(t, err)
	st, _, closeStore, err := openStore(c, prommetrics.New(prommetrics.Options{}))
	require.NoError(t, err)
	defer closeStore()
	o := st.Options()
	assert.Equal(t, []any{10_000, int64(20_000_000), int64(2_000_000), 30 * time.Minute}, []any{o.MaxOwners, o.MaxTotalBytes, o.MaxOwnerBytes, o.TTL})
}

// start runs contproxy with args until the test ends or stop is called;
// it serves clients at addr and metrics at ops.
func start(t *testing.T, args ...string) (addr, ops string, stop func() error) {
	t.Helper()
	return startWith(t, noEnv, io.Discard, args...)
}

// startWith is start with an environment and a writer for the log.
func startWith(t *testing.T, env []string, stderr io.Writer, args ...string) (addr, ops string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-listen", "127.0.0.1:0", "-ops-listen", "127.0.0.1:0", "-log-level", "warn"}, args...),
			env, stderr, func(a, o string) { ready <- [2]string{a, o} })
	}()
	select {
	case a := <-ready:
		addr, ops = a[0], a[1]
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
	return addr, ops, stop
}

func TestServesTheFakeUpstreamOverBothTransports(t *testing.T) {
	for _, tr := range []string{"http", "websocket"} {
		t.Run(tr, func(t *testing.T) {
			addr, ops, _ := start(t, "-fake-upstream", "-transport", tr)
			resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"store":false,"input":"hi"}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Contains(t, string(b), "event: response.completed")

			for _, c := range []struct{ addr, path, want string }{
				{addr, "/healthz", "ok"},
				{ops, "/metrics", "contproxy_turns_total 1"},
				{ops, "/metrics", `contproxy_turn_steps_total{result="full",step="route"} 1`},
				{ops, "/metrics", `contproxy_turn_steps_total{result="answered",step="attempt"} 1`},
			} {
				resp, err := http.Get("http://" + c.addr + c.path)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Contains(t, string(b), c.want, c.path)
			}
			// Every other request under /v1 passes through, over either
			// transport to the upstream's HTTP base.
			resp, err = http.Get("http://" + addr + "/v1/models")
			require.NoError(t, err)
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "list", gjson.GetBytes(b, "object").String(), "%s", b)
			resp, err = http.Post("http://"+addr+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			require.NoError(t, err)
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"), "%s", b)

			resp, err = http.Get("http://" + addr + "/v2/other")
			require.NoError(t, err)
			b, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusNotFound, resp.StatusCode)
			assert.Equal(t, "invalid_request_error", gjson.GetBytes(b, "error.type").String(), "%s", b)
		})
	}
}

// Headers over maxHeaderBytes are answered 431, unread: a client
// WebSocket connection would keep them for as long as it lives.
func TestHugeHeadersAreRefused(t *testing.T) {
	addr, _, _ := start(t, "-fake-upstream")
	for _, tc := range []struct {
		size   int
		status int
	}{{maxHeaderBytes / 2, http.StatusOK}, {2 * maxHeaderBytes, http.StatusRequestHeaderFieldsTooLarge}} {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/responses",
			strings.NewReader(`{"model":"m","input":"hi"}`))
		require.NoError(t, err)
		req.Header.Set("X-Padding", strings.Repeat("x", tc.size))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, "%d bytes of headers", tc.size)
	}
}

func TestShutdownLetsAStreamInFlightFinish(t *testing.T) {
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{EventDelay: 20 * time.Millisecond}))
	t.Cleanup(up.Close)
	addr, _, stop := start(t, "-upstream", up.URL+"/v1")
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
	var addrs, opsAddrs []string
	for _, id := range []string{"gw-1", "gw-2"} {
		port := freePort(t)
		addr, ops, _ := start(t, "-listen", port, "-upstream", "ws"+strings.TrimPrefix(up.URL, "http")+"/v1",
			"-redis", "redis://"+rdb.Options().Addr, "-redis-client", client, "-namespace", ns, "-replica", id,
			"-forward-secret", strings.Repeat("k", 32))
		addrs = append(addrs, addr)
		opsAddrs = append(opsAddrs, ops)
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
	for _, a := range opsAddrs {
		continued += metric(t, a, "contproxy_turns_continued_total")
		forwarded += metric(t, a, "contproxy_forwarded_total")
	}
	assert.Equal(t, 3.0, continued, "every later turn continues")
	assert.Equal(t, 2.0, forwarded, "the conversation's socket stays on gw-1: gw-2's turns go there")
}

// A replica that forwards, whose port is taken, stops at once with the
// error, as one that does not: its announcement is withdrawn.
func TestAForwardingReplicaWhosePortIsTakenStops(t *testing.T) {
	rdb := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, rdb, ns)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"-fake-upstream", "-transport", "websocket", "-listen", taken.Addr().String(),
			"-ops-listen", "", "-redis", "redis://" + rdb.Options().Addr, "-namespace", ns,
			"-forward-secret", strings.Repeat("k", 32)}, nil, io.Discard, nil)
	}()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "address already in use")
	case <-time.After(20 * time.Second):
		t.Fatal("contproxy kept running without its port")
	}
}

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// metric reads one counter from the /metrics of the replica whose
// operations port is at ops.
func metric(t *testing.T, ops, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + ops + "/metrics")
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
	t.Fatalf("no %s in the metrics of %s", name, ops)
	return 0
}

// A Redis target that cannot serve the store whatever happens stops
// contproxy at start, naming the flag; one that is down for now does not
// (turns fail open until it comes).
func TestRedisTargetsThatCannotServeStopTheStart(t *testing.T) {
	standalone := redistest.Standalone(t).Options().Addr
	node := redistest.Cluster(t).Options().Addrs[0]
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-redis-cluster", "redis://" + standalone}, "-redis-cluster"},
		{[]string{"-redis-cluster", standalone}, "cluster support disabled"},
		{[]string{"-redis", "redis://" + node + "/0"}, "node of a Redis Cluster"},
		{[]string{"-redis", "redis://" + standalone + "/99"}, "DB index is out of range"},
	} {
		err := run(t.Context(), append([]string{"-fake-upstream", "-listen", "127.0.0.1:0", "-ops-listen", ""}, tc.args...),
			noEnv, io.Discard, func(string, string) { t.Errorf("%q: started", tc.args) })
		assert.ErrorContains(t, err, tc.want, "%q", tc.args)
	}
	var log syncBuffer
	startWith(t, noEnv, &log, "-fake-upstream", "-redis", "redis://127.0.0.1:1/0", "-log-level", "warn")
	assert.Contains(t, log.String(), "Redis cannot be reached yet")
}

// The log shows the -upstream URL without what may carry a credential: its
// password and its query's values.
func TestTheLogShowsNoUpstreamCredential(t *testing.T) {
	assert.Equal(t, "https://x.example/openai/v1?api-key=redacted&api-version=redacted",
		shownURL("https://x.example/openai/v1?api-version=preview&api-key=SECRET"))
	assert.Equal(t, "http://user:xxxxx@h:8080/v1", shownURL("http://user:SECRET@h:8080/v1"))
	assert.Equal(t, "wss://api.example/v1", shownURL("wss://api.example/v1"))
}

// A byte flag takes a plain number or one with a unit, as the docs write
// the defaults; anything else is refused naming the forms it takes.
func TestByteFlagsTakeUnits(t *testing.T) {
	for in, want := range map[string]int64{"67108864": 64 << 20, "64MiB": 64 << 20, "64 MiB": 64 << 20, "512mb": 512e6, "2GiB": 2 << 30, "10kB": 10e3, "0": 0, "7B": 7} {
		c, err := parse([]string{"-fake-upstream", "-max-body", in}, noEnv, io.Discard)
		require.NoError(t, err, in)
		assert.Equal(t, want, c.maxBody, in)
	}
	for _, in := range []string{"64MB/s", "MiB", "1.5GiB", "9999999999GiB", "abc", ""} {
		_, err := parse([]string{"-fake-upstream", "-max-passthrough-body", in}, noEnv, io.Discard)
		assert.ErrorContains(t, err, "want a number of bytes", "%q", in)
	}
	c, err := parse([]string{"-fake-upstream"}, []string{"CONTPROXY_MAX_KEPT_BYTES=1GiB"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<30), c.maxKeptBytes)
}

// A replica without -profile takes the one its namespace records and says
// so; one naming another stops, saying what to do.
func TestAReplicaTakesTheNamespacesProfile(t *testing.T) {
	rdb := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, rdb, ns)
	args := []string{"-fake-upstream", "-redis", "redis://" + rdb.Options().Addr, "-namespace", ns}
	_, _, stop := start(t, append(args, "-profile", "v3")...)
	require.NoError(t, stop())
	var log syncBuffer
	_, _, stop = startWith(t, noEnv, &log, append(args, "-log-level", "info")...)
	require.NoError(t, stop())
	assert.Contains(t, log.String(), "profile=v3")
	err := run(t.Context(), append([]string{"-listen", "127.0.0.1:0", "-ops-listen", "", "-profile", "v4"}, args...),
		noEnv, io.Discard, func(string, string) { t.Error("started") })
	assert.ErrorContains(t, err, "leave -profile out to take the namespace's")
}
