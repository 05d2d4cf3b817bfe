//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/agentchat"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// gatewaySizes are the conversations BenchmarkGateway plays: each target
// plays convs conversations per mode, each opening with a request of items
// input items and then turns measured turns, every one two items longer
// than the one before (the previous answer and a new user message).
var gatewaySizes = []struct{ items, convs, turns int }{
	{10, 200, 5},
	{100, 200, 5},
	{1_000, 60, 5},
	{5_000, 20, 5},
}

// BenchmarkGateway sends the same full-context Responses requests, one at
// a time, to four targets in front of one fake upstream
// (internal/fakeupstream over HTTP, in a process of its own):
//
//   - direct: the fake upstream itself;
//   - rproxy: a plain httputil.ReverseProxy, the floor of any gateway
//     (reads the body once, writes it once);
//   - contproxy: this package's Proxy on the in-process store;
//   - contproxy-redis: the Proxy on the standalone Redis of
//     scripts/redis-env.sh, as contproxy opens it: its store keeps
//     guesses, and a turn that continues its owner's last record goes
//     upstream while Redis reserves it, its record in flight while its end
//     reaches the client. Without Redis (CONTSTORE_REDIS_ADDR unset) the
//     target is left out and logged, unless CI=true, which fails the
//     benchmark, as with internal/redistest's helpers;
//   - contproxy-redis-no-guesses: the same without guesses (contproxy
//     -guess-owners 0), each turn waiting for its reserve and its record.
//
// Sub-benchmarks items=N/json and items=N/stream: each conversation's
// first request holds N input items (user and assistant messages, function
// calls and their outputs of a few hundred bytes) and is not measured
// (contproxy cannot continue it); each later request appends the answer
// and a new user message, as a client does. Streamed turns read the SSE to
// its end. items=N/stream-unstored: the same streamed turns with "store":
// false, as Codex sends them, which the upstream keeps nothing of, so that
// over HTTP no gateway can continue them: what a gateway costs a client it
// cannot save anything for. A round is one conversation per target, in an
// order that rotates from round to round, so that every target sees the
// same machine.
//
// The client runs in the benchmark's process; the fake upstream and each
// gateway run in a child process of their own (the test binary again,
// serving it: see serveGatewayChild), so that a target's CPU is its
// process's alone (getrusage, read through the child's meter), and the
// fake's decoding of full-context bodies and its garbage share neither a
// gateway's CPU nor its collector, as a real upstream does not. A turn
// that contproxy continues costs the upstream less than a full-context one
// (it parses two input items instead of the whole history); the
// upstream's handler is measured apart, in its child, and left out of the
// gateways' figures. Metrics, per turn (T is a target):
//
//   - T-gateway-cpu-µs/turn: the user+system CPU of T's process over T's
//     measured turns, less what reading its meter costs: what the gateway
//     costs, its garbage collector and scheduler included.
//   - T-faults/turn: the minor page faults of T's process over T's
//     measured turns: where the host makes a fault costly (tens of
//     microseconds on some virtual machines), the memory a gateway takes
//     from the system shows in its CPU.
//   - T-upstream-cpu-µs/turn: the CPU of the fake upstream's handler
//     goroutine, on a locked thread (RUSAGE_THREAD).
//   - T-upstream-kB/turn: request bytes that reached the fake upstream.
//   - direct-p50-µs, direct-p99-µs, T-added-p50-µs, T-added-p99-µs: the
//     request's latency, from sending it to the answer read to its end,
//     and what T adds to it.
//   - T-gateway-p50-µs, T-gateway-p99-µs: the same for the latency less
//     the upstream handler's time after it read the request
//     (meteredUpstream).
//   - contproxy/rproxy-gateway-cpu, contproxy/rproxy-gateway-p50 (and
//     contproxy-redis/…, contproxy-redis-no-guesses/…): the ratios of what
//     the two gateways cost.
//   - contproxy-continued, contproxy-redis-continued, …: the share of
//     measured turns continued (every target must continue every one;
//     none, unstored).
//
// p99 is over convs×turns requests per target (100 at 5,000 items). Linux
// only (RUSAGE_THREAD). Run with -benchtime 1x; see BENCHMARKS.md.
func BenchmarkGateway(b *testing.B) {
	if role := os.Getenv(gatewayChildEnv); role != "" {
		serveGatewayChild(b, role)
		return
	}
	rc := gatewayRedis(b)
	for _, size := range gatewaySizes {
		for _, mode := range gatewayModes {
			b.Run(fmt.Sprintf("items=%d/%s", size.items, mode.name), func(b *testing.B) {
				for b.Loop() {
					runGatewayBench(b, rc, size.items, size.convs, size.turns, mode.stream, mode.unstored)
				}
			})
		}
	}
}

// gatewayModes are the sub-benchmarks' requests: JSON, streamed, and
// streamed with "store": false (see BenchmarkGateway).
var gatewayModes = []struct {
	name             string
	stream, unstored bool
}{{"json", false, false}, {"stream", true, false}, {"stream-unstored", true, true}}

// gatewayChildEnv, set, makes BenchmarkGateway serve one target in a
// process of its own instead of measuring (serveGatewayChild): the fake
// upstream ("fake"), or a gateway in front of the fake at
// gatewayUpstreamEnv ("rproxy", "contproxy", and "contproxy-redis" and
// "contproxy-redis-no-guesses" on the standalone Redis under the namespace
// gatewayNamespaceEnv). That is how the benchmark starts its child
// processes (startGatewayChild).
const (
	gatewayChildEnv     = "CONTSTORE_GATEWAY_CHILD"
	gatewayUpstreamEnv  = "CONTSTORE_GATEWAY_UPSTREAM"
	gatewayNamespaceEnv = "CONTSTORE_GATEWAY_NAMESPACE"
)

// gatewayChildReady starts the line on which a child names the address it
// serves on.
const gatewayChildReady = "serving on "

// serveGatewayChild serves role on a port of its own, and its meter on GET
// /meter, until its standard input ends. The fake's meter is "<cpu ns>
// <wall ns> <request bytes>" of its handlers so far; a gateway's is
// "<cpu ns> <minor faults> <turns continued>", its process's CPU and
// faults (getrusage).
func serveGatewayChild(b *testing.B, role string) {
	var h http.Handler
	var meter func() string
	switch role {
	case "fake":
		fake := &meteredUpstream{h: fakeupstream.New(fakeupstream.Options{})}
		h = fake
		meter = func() string { return fmt.Sprintf("%d %d %d", fake.cpu.Load(), fake.wall.Load(), fake.bytes.Load()) }
	case "rproxy":
		h = reverseProxy(b, os.Getenv(gatewayUpstreamEnv))
		meter = func() string { return fmt.Sprintf("%d %d 0", cpuTime(syscall.RUSAGE_SELF), minorFaults()) }
	case "contproxy", "contproxy-redis", "contproxy-redis-no-guesses":
		p := gatewayProxy(b, role)
		h = p
		meter = func() string {
			return fmt.Sprintf("%d %d %d", cpuTime(syscall.RUSAGE_SELF), minorFaults(), p.Stats().Continued)
		}
	default:
		b.Fatalf("%s=%q: no such target", gatewayChildEnv, role)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", h)
	mux.HandleFunc("GET /meter", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, meter()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Printf("%s%s\n", gatewayChildReady, ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// reverseProxy returns a plain httputil.ReverseProxy to upstream: the
// floor of any gateway (reads the body once, writes it once).
func reverseProxy(b *testing.B, upstream string) http.Handler {
	u, err := url.Parse(upstream)
	if err != nil {
		b.Fatal(err)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// Exactly the body's bytes: after them the Transport reads
			// the body once more, for its end, and once the proxy has
			// flushed an event stream's first bytes to the client, the
			// server may have closed the body by then, and the stream
			// is dropped ("use of closed network connection").
			if pr.In.ContentLength > 0 {
				pr.Out.Body = io.NopCloser(io.LimitReader(pr.In.Body, pr.In.ContentLength))
			}
		},
		Transport: http.DefaultTransport.(*http.Transport).Clone(),
	}
}

// gatewayGuessOwners is the owners whose guesses a store on Redis keeps,
// as contproxy opens it (-guess-owners).
const gatewayGuessOwners = 10_000

// gatewayProxy returns this package's Proxy in front of the fake upstream
// at gatewayUpstreamEnv: on the in-process store (contproxy) or on the
// standalone Redis, with guesses (contproxy-redis) or without
// (contproxy-redis-no-guesses).
func gatewayProxy(b *testing.B, role string) *Proxy {
	st, err := store.NewMemory(store.Options{Replica: "bench"})
	if role != "contproxy" {
		// The client as contproxy opens it: calls on the caller's goroutine,
		// bounded by the store's deadline, one resend, 128 connections.
		rc := redis.NewClient(&redis.Options{Addr: os.Getenv(redistest.EnvAddr), ContextTimeoutEnabled: true, MaxRetries: 1, PoolSize: 128})
		opts := store.Options{Namespace: os.Getenv(gatewayNamespaceEnv), Replica: "bench"}
		if role == "contproxy-redis" {
			opts.GuessOwners = gatewayGuessOwners
		}
		st, err = store.NewRedis(rc, opts)
	}
	if err != nil {
		b.Fatal(err)
	}
	hu, err := NewHTTPUpstream(os.Getenv(gatewayUpstreamEnv)+"/v1", nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Store: st, Upstream: hu})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// gatewayChild is a child process serving one target, as its parent sees
// it.
type gatewayChild struct {
	url    string
	client *http.Client
	// meterCost is the CPU a call of the meter costs the child, taken
	// out of what it measures.
	meterCost time.Duration
}

// startGatewayChild starts a child process serving role (with env added
// to its environment), ended when b is.
func startGatewayChild(b *testing.B, role string, env ...string) *gatewayChild {
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkGateway$", "-test.benchtime=1x")
	cmd.Env = append(append(os.Environ(), gatewayChildEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if addr, ok := strings.CutPrefix(lines.Text(), gatewayChildReady); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			c := &gatewayChild{url: "http://" + addr, client: &http.Client{}}
			if role != "fake" {
				const calls = 20
				first, _, _ := c.meter(b)
				for range calls - 1 {
					c.meter(b)
				}
				last, _, _ := c.meter(b)
				c.meterCost = (last - first) / calls
			}
			return c
		}
	}
	b.Fatalf("the %s process ended before it served: %v", role, lines.Err())
	return nil
}

// meter returns the child's meter: for the fake, the CPU and wall time (in
// ns, x) its handlers took so far and the request bytes they read; for a
// gateway, its process's CPU, minor faults (x) and the turns it
// continued.
func (c *gatewayChild) meter(b *testing.B) (cpu time.Duration, x, n int64) {
	resp, err := c.client.Get(c.url + "/meter")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := fmt.Fscan(resp.Body, &cpu, &x, &n); err != nil {
		b.Fatal(err)
	}
	return cpu, x, n
}

// gatewayRedis returns a client of the standalone Redis, or nil when there
// is none and CI is not true. The target left out is listed in
// redistest.EnvSkipLog's file, as the helpers list the tests they skip.
func gatewayRedis(b *testing.B) *redis.Client {
	ci, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("CI")))
	if strings.TrimSpace(os.Getenv(redistest.EnvAddr)) != "" || ci {
		return redistest.Standalone(b) // fails the benchmark with CI=true
	}
	b.Logf("%s is not set: the contproxy-redis target is left out; run under scripts/redis-env.sh to include it", redistest.EnvAddr)
	if path := os.Getenv(redistest.EnvSkipLog); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err == nil {
			_, err = fmt.Fprintf(f, "github.com/contstore/contstore/proxy\t%s (contproxy-redis)\t%s\n", b.Name(), redistest.EnvAddr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			b.Logf("listing the skipped target in %s: %v", path, err)
		}
	}
	return nil
}

// gatewayTarget is one way to the fake upstream, and what it measured.
type gatewayTarget struct {
	name  string
	url   string
	child *gatewayChild // nil for direct

	turns            int
	cpu, upstreamCPU time.Duration
	upstreamBytes    int64
	latencies        []time.Duration
	// outside are the latencies less the upstream handler's time after
	// it read the request.
	outside   []time.Duration
	continued int64
	faults    int64
}

// meteredUpstream is the fake upstream's handler, with the CPU, the time
// and the request bytes of its calls counted. Its time starts once it has
// read the whole request: the body's arrival is the client's and the
// gateway's to pay, as it is a real upstream's; what the handler does
// with the body, which the fake does more slowly than a real upstream and
// which a continued turn makes smaller, is left out.
type meteredUpstream struct {
	h                http.Handler
	cpu, wall, bytes atomic.Int64
}

// rusageThread is Linux's RUSAGE_THREAD.
const rusageThread = 1

func (m *meteredUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Locked to its thread, the handler's goroutine is the only one whose
	// CPU that thread's usage counts.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := cpuTime(rusageThread)
	body := &countingBody{ReadCloser: r.Body, n: &m.bytes, left: r.ContentLength, read: time.Now()}
	r.Body = body
	m.h.ServeHTTP(w, r)
	m.cpu.Add(int64(cpuTime(rusageThread) - before))
	m.wall.Add(int64(time.Since(body.read)))
}

// countingBody counts a request body's bytes, and notes when its last
// byte was read.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
	// left is how many bytes are still to come (-1: not known); read is
	// when the last came, once done (when the handler began until then).
	left int64
	read time.Time
	done bool
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	if c.left > 0 {
		c.left -= int64(n)
	}
	if !c.done && (c.left == 0 || err == io.EOF) {
		c.read, c.done = time.Now(), true
	}
	return n, err
}

// cpuTime is the user+system CPU time of who (RUSAGE_SELF, rusageThread).
func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// minorFaults is the minor page faults of the process so far.
func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Minflt
}

// runGatewayBench sets the targets up in front of a fresh fake upstream,
// plays the conversations and reports the metrics.
func runGatewayBench(b *testing.B, rc *redis.Client, items, convs, turns int, stream, unstored bool) {
	up := startGatewayChild(b, "fake")
	targets := []*gatewayTarget{{name: "direct", url: up.url + "/v1/responses"}}
	roles := []string{"rproxy", "contproxy"}
	if rc != nil {
		roles = append(roles, "contproxy-redis", "contproxy-redis-no-guesses")
	}
	for _, role := range roles {
		env := []string{gatewayUpstreamEnv + "=" + up.url}
		if strings.HasPrefix(role, "contproxy-redis") {
			ns := redistest.Namespace(b)
			redistest.CleanupNamespace(b, rc, ns)
			env = append(env, gatewayNamespaceEnv+"="+ns)
		}
		c := startGatewayChild(b, role, env...)
		targets = append(targets, &gatewayTarget{name: role, url: c.url + "/v1/responses", child: c})
	}

	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	history := agentchat.History(items - 1) // the first request adds a user message
	for round := range convs {
		for k := range targets {
			tg := targets[(round+k)%len(targets)]
			c := &gatewayConversation{
				b: b, client: client, url: tg.url, stream: stream, unstored: unstored,
				session: fmt.Sprintf("bench-%s-%d", tg.name, round),
				items:   slices.Clone(history),
			}
			c.turn() // not measured: the conversation's opening request
			var cpu0 time.Duration
			var faults0, continued0 int64
			if tg.child != nil {
				cpu0, faults0, continued0 = tg.child.meter(b)
			}
			up0, _, bytes0 := up.meter(b)
			for range turns {
				_, w0, _ := up.meter(b)
				lat := c.turn()
				_, w1, _ := up.meter(b)
				tg.latencies = append(tg.latencies, lat)
				tg.outside = append(tg.outside, lat-time.Duration(w1-w0))
			}
			up1, _, bytes1 := up.meter(b)
			if tg.child != nil {
				cpu1, faults1, continued1 := tg.child.meter(b)
				tg.cpu += cpu1 - cpu0 - tg.child.meterCost
				tg.faults += faults1 - faults0
				tg.continued += continued1 - continued0
			}
			tg.upstreamCPU += up1 - up0
			tg.upstreamBytes += bytes1 - bytes0
			tg.turns += turns
		}
	}
	reportGateway(b, targets, !unstored)
}

// reportGateway reports the targets' metrics (see BenchmarkGateway):
// every contproxy target must have continued every measured turn when
// continuable tells they could be, and none otherwise.
func reportGateway(b *testing.B, targets []*gatewayTarget, continuable bool) {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	perTurn := func(d time.Duration, tg *gatewayTarget) float64 { return us(d) / float64(tg.turns) }
	pct := func(l []time.Duration, q float64) float64 {
		l = slices.Sorted(slices.Values(l))
		return us(l[min(len(l)-1, int(q*float64(len(l))))])
	}
	direct := targets[0]
	dUp := perTurn(direct.upstreamCPU, direct)
	d50, d99 := pct(direct.latencies, 0.50), pct(direct.latencies, 0.99)
	o50, o99 := pct(direct.outside, 0.50), pct(direct.outside, 0.99)
	b.ReportMetric(dUp, "direct-upstream-cpu-µs/turn")
	b.ReportMetric(float64(direct.upstreamBytes)/1e3/float64(direct.turns), "direct-upstream-kB/turn")
	b.ReportMetric(d50, "direct-p50-µs")
	b.ReportMetric(d99, "direct-p99-µs")
	type gateway struct{ cpu, p50 float64 }
	byName := map[string]gateway{}
	for _, tg := range targets[1:] {
		g := gateway{cpu: perTurn(tg.cpu, tg), p50: pct(tg.outside, 0.50) - o50}
		byName[tg.name] = g
		b.ReportMetric(perTurn(tg.upstreamCPU, tg), tg.name+"-upstream-cpu-µs/turn")
		b.ReportMetric(g.cpu, tg.name+"-gateway-cpu-µs/turn")
		b.ReportMetric(float64(tg.faults)/float64(tg.turns), tg.name+"-faults/turn")
		b.ReportMetric(float64(tg.upstreamBytes)/1e3/float64(tg.turns), tg.name+"-upstream-kB/turn")
		b.ReportMetric(pct(tg.latencies, 0.50)-d50, tg.name+"-added-p50-µs")
		b.ReportMetric(pct(tg.latencies, 0.99)-d99, tg.name+"-added-p99-µs")
		b.ReportMetric(g.p50, tg.name+"-gateway-p50-µs")
		b.ReportMetric(pct(tg.outside, 0.99)-o99, tg.name+"-gateway-p99-µs")
		if strings.HasPrefix(tg.name, "contproxy") {
			share := float64(tg.continued) / float64(tg.turns)
			b.ReportMetric(share, tg.name+"-continued")
			want := 0.0
			if continuable {
				want = 1
			}
			if share != want {
				b.Errorf("%s continued %d of %d measured turns", tg.name, tg.continued, tg.turns)
			}
		}
	}
	rp := byName["rproxy"]
	for _, name := range []string{"contproxy", "contproxy-redis", "contproxy-redis-no-guesses"} {
		if g, ok := byName[name]; ok {
			b.ReportMetric(g.cpu/rp.cpu, name+"/rproxy-gateway-cpu")
			b.ReportMetric(g.p50/rp.p50, name+"/rproxy-gateway-p50")
		}
	}
}

// gatewayConversation is a client's conversation: it sends the whole
// history every turn.
type gatewayConversation struct {
	b       *testing.B
	client  *http.Client
	url     string
	session string
	stream  bool
	// unstored sends "store": false.
	unstored bool
	items    [][]byte
	body     []byte
	user     int
	// fatalf ends the conversation on a failure: b.Fatalf when nil; a
	// conversation on a goroutine of its own sets it.
	fatalf func(format string, args ...any)
}

// fail reports a failure and ends the conversation.
func (c *gatewayConversation) fail(format string, args ...any) {
	if c.fatalf != nil {
		c.fatalf(format, args...)
		return
	}
	c.b.Fatalf(format, args...)
}

// turn appends a user message, sends the history, appends the answer's
// output items and returns the request's latency: from sending it to the
// answer read to its end.
func (c *gatewayConversation) turn() time.Duration {
	c.user++
	c.items = append(c.items, fmt.Appendf(nil, `{"role":"user","content":%q}`,
		fmt.Sprintf("Now look at step %d of %s: %s", c.user, c.session, agentchat.Text[:120])))
	c.body = fmt.Appendf(c.body[:0], `{"model":"gpt-5.1","store":%t,"stream":%t,"prompt_cache_key":%q,`+
		`"instructions":"You are a coding agent. Be terse.","tools":%s,"input":[`, !c.unstored, c.stream, c.session, agentchat.Tools)
	for i, it := range c.items {
		if i > 0 {
			c.body = append(c.body, ',')
		}
		c.body = append(c.body, it...)
	}
	c.body = append(c.body, "]}"...)
	req, err := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(c.body))
	if err != nil {
		c.fail("%s (%s, turn %d): %v", c.url, c.session, c.user, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-bench")
	start := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		c.fail("%s (%s, turn %d): %v", c.url, c.session, c.user, err)
	}
	answer, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	_ = resp.Body.Close()
	if err != nil {
		c.fail("%s (%s, turn %d): %v", c.url, c.session, c.user, err)
	}
	if resp.StatusCode != http.StatusOK {
		c.fail("%s: status %d: %.300s", c.url, resp.StatusCode, answer)
	}
	output := gjson.GetBytes(answer, "output")
	if c.stream {
		const completed = "event: response.completed\ndata: "
		i := bytes.LastIndex(answer, []byte(completed))
		if i < 0 {
			c.fail("%s: no response.completed in the stream: %.300s", c.url, answer)
		}
		data := answer[i+len(completed):]
		data = data[:max(0, bytes.IndexByte(data, '\n'))]
		output = gjson.GetBytes(data, "response.output")
	}
	n := 0
	output.ForEach(func(_, it gjson.Result) bool {
		c.items = append(c.items, []byte(it.Raw))
		n++
		return true
	})
	if n == 0 {
		c.fail("%s: an answer without output items: %.300s", c.url, answer)
	}
	return took
}
