//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/contstore/contstore/internal/redistest"
)

// pollInterval is how often a start is checked.
const pollInterval = 20 * time.Millisecond

// upstream is a running fake upstream.
type upstream struct {
	proc  *process
	addr  string // host:port
	trace string // the trace file
}

// startUpstream starts a fake upstream named name on 127.0.0.1 whose model
// makes toolCalls function calls after each user message, tracing to
// dir/name.jsonl, with the extra flags, and waits until it prints its
// address.
func startUpstream(t *testing.T, dir, name string, toolCalls int, extra ...string) *upstream {
	t.Helper()
	bin := fakeupstreamBin.build(t)
	up := &upstream{trace: dir + "/" + name + ".jsonl"}
	args := []string{"-listen", "127.0.0.1:0", "-trace", up.trace, "-tool-calls", strconv.Itoa(toolCalls)}
	up.proc = startServer(t, name, dir, bin, append(args, extra...)...)
	deadline := time.Now().Add(startTimeout)
	for {
		if line, err := firstLine(up.proc.stdout); err == nil {
			up.addr = line
			return up
		} else if !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if up.proc.exited() {
			t.Fatalf("%s exited before printing its address: %v\n%s", name, up.proc.err, up.proc.logs())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no address within %v", name, startTimeout)
		}
		time.Sleep(pollInterval)
	}
}

// url returns the upstream's base URL for scheme (http or ws).
func (up *upstream) url(scheme string) string { return scheme + "://" + up.addr + "/v1" }

// requestLine matches the line the fake upstream logs for each HTTP
// request it receives, answered or not: "fakeupstream: POST
// /v1/responses"; a WebSocket connection starts with "fakeupstream: GET
// /v1/responses".
var requestLine = regexp.MustCompile(`^fakeupstream: ([A-Z]+) (/\S*)`)

// posts counts the HTTP create-response requests the upstream received.
func (up *upstream) posts() (int, error) {
	return up.logged(func(method, path string) bool {
		return method == http.MethodPost && strings.Contains(path, "/responses")
	})
}

// upstreamMark is where the upstream's logs stood: the calls it had
// answered and the create-response POSTs it had logged.
type upstreamMark struct{ calls, posts int }

// mark returns where the upstream's logs stand now.
func (up *upstream) mark(t *testing.T) upstreamMark {
	t.Helper()
	calls, posts := up.read(t)
	return upstreamMark{len(calls), posts}
}

// since returns the calls the upstream answered since m, and the
// create-response POSTs it logged since m.
func (up *upstream) since(t *testing.T, m upstreamMark) ([]upstreamCall, int) {
	t.Helper()
	calls, posts := up.read(t)
	return calls[m.calls:], posts - m.posts
}

// read returns the calls the upstream answered and the number of
// create-response POSTs it logged.
func (up *upstream) read(t *testing.T) ([]upstreamCall, int) {
	t.Helper()
	calls, err := readTrace(up.trace)
	if err != nil {
		t.Fatal(err)
	}
	posts, err := up.posts()
	if err != nil {
		t.Fatal(err)
	}
	return calls, posts
}

// requests counts the HTTP requests of any kind the upstream received,
// WebSocket connections included.
func (up *upstream) requests() (int, error) {
	return up.logged(func(string, string) bool { return true })
}

// logged counts the requests the upstream logged that match wants.
func (up *upstream) logged(wants func(method, path string) bool) (int, error) {
	raw, err := os.ReadFile(up.proc.stderr)
	if err != nil {
		return 0, err
	}
	n := 0
	for line := range strings.Lines(string(raw)) {
		if m := requestLine.FindStringSubmatch(line); m != nil && wants(m[1], m[2]) {
			n++
		}
	}
	return n, nil
}

// firstLine returns the first complete line of the file at path, io.EOF
// while there is none.
func firstLine(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, ok := bytes.Cut(raw, []byte("\n"))
	if !ok {
		return "", io.EOF
	}
	return strings.TrimSpace(string(line)), nil
}

// replicaConfig configures one contproxy.
type replicaConfig struct {
	// name is the process's name in logs and its -replica id.
	name string
	// upstream is the -upstream URL.
	upstream string
	// redis is the Redis address, "" for in-process state.
	redis string
	// namespace is the key namespace in Redis.
	namespace string
	// logLevel is the -log-level.
	logLevel string
	// forwardSecret, when set, turns forwarding on: it goes to the replica
	// as CONTPROXY_FORWARD_SECRET, and the replica announces its -listen
	// address in Redis.
	forwardSecret string
	// noGuesses runs the replica with -guess-owners 0.
	noGuesses bool
}

// replica is a running contproxy.
type replica struct {
	// name is its -replica id.
	name string
	// base is its base URL, http://127.0.0.1:PORT.
	base string
	// ops is the base URL of its operations port (-ops-listen), where
	// /metrics is.
	ops  string
	proc *process

	mu sync.Mutex
	// final holds its counters as they were just before the test killed
	// it; nil while it runs.
	final *counters
}

// portAttempts is how many ports a contproxy start tries: a free port
// picked here can be taken before contproxy listens on it.
const portAttempts = 3

// startContproxy starts a contproxy on a free port of 127.0.0.1 and waits
// until GET /healthz answers 200 "ok".
func startContproxy(t *testing.T, dir string, cfg replicaConfig) *replica {
	t.Helper()
	bin := contproxyBin.build(t)
	env := os.Environ()
	if cfg.forwardSecret != "" {
		env = append(env, "CONTPROXY_FORWARD_SECRET="+cfg.forwardSecret)
	}
	for attempt := 1; ; attempt++ {
		addr, ops := freePort(t), freePort(t)
		args := []string{"-listen", addr, "-ops-listen", ops, "-upstream", cfg.upstream, "-replica", cfg.name, "-log-level", cfg.logLevel}
		if cfg.redis != "" {
			// A second for each store operation, not 200 ms: on a loaded
			// machine a call may take longer and fail open, which the
			// scenarios' shares of continued turns do not allow for.
			args = append(args, "-redis", "redis://"+cfg.redis+"/0", "-namespace", cfg.namespace, "-op-timeout", "1s")
		}
		if cfg.noGuesses {
			args = append(args, "-guess-owners", "0")
		}
		p, err := startProcess(cfg.name, dir, dir, env, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + addr
		err = waitHealthy(p, base)
		if err == nil {
			supervise(t, p, bin, args)
			return &replica{name: cfg.name, base: base, ops: "http://" + ops, proc: p}
		}
		exited := p.exited()
		_ = p.stop()
		if exited && attempt < portAttempts && strings.Contains(p.logs(), "address already in use") {
			continue
		}
		t.Fatalf("%s (contproxy %s): %v; the end of its log:\n%s", cfg.name, strings.Join(args, " "), err, p.logs())
	}
}

// freePort returns an address on 127.0.0.1 that nothing listened on a
// moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHealthy polls base/healthz until it answers 200 "ok", p exits or
// startTimeout passes.
func waitHealthy(p *process, base string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("exited before serving /healthz: %v", p.err)
		}
		last = healthz(client, base)
		if last == nil {
			return nil
		}
		time.Sleep(pollInterval)
	}
	return fmt.Errorf("/healthz did not answer 200 ok within %v: %v", startTimeout, last)
}

// healthz checks that GET base/healthz answers 200 "ok".
func healthz(client *http.Client, base string) error {
	ctx, cancel := context.WithTimeout(context.Background(), client.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("GET /healthz: %s %q", resp.Status, body)
	}
	return nil
}

// stack is one scenario's servers: a fake upstream, the contproxy replicas
// in front of it and the round-robin proxy in front of them.
type stack struct {
	dir      string
	up       *upstream
	replicas []*replica
	rr       *roundRobin
	// forwardSecret is the replicas' forwarding secret, "" without
	// forwarding.
	forwardSecret string
}

// stackConfig describes a stack.
type stackConfig struct {
	// transport is the contproxy's upstream transport, "http" or "ws".
	transport string
	// replicas is the number of contproxy replicas; 0 puts the round-robin
	// proxy straight in front of the fake upstream.
	replicas int
	// redis is the Redis address the replicas share, each stack in a
	// fresh namespace of its own.
	redis string
	// toolCalls is the number of function calls the fake model makes after
	// each user message.
	toolCalls int
	// forward turns forwarding on, with one secret for all the replicas
	// (it needs redis and the ws transport).
	forward bool
	// upstreamFlags are extra flags of the fake upstream, such as
	// -keeps-no-responses.
	upstreamFlags []string
}

// startStack starts a stack in a fresh directory; everything stops when
// the test ends.
func startStack(t *testing.T, name string, cfg stackConfig) *stack {
	t.Helper()
	st := &stack{dir: t.TempDir()}
	st.up = startUpstream(t, st.dir, "fakeupstream", cfg.toolCalls, cfg.upstreamFlags...)
	if cfg.replicas == 0 {
		st.rr = newRoundRobin(t, "http://"+st.up.addr)
		return st
	}
	if cfg.forward {
		st.forwardSecret = randomSecret(t)
	}
	ns := redistest.Namespace(t)
	cleanNamespace(t, cfg.redis, ns)
	var bases []string
	for i := range cfg.replicas {
		r := startContproxy(t, st.dir, replicaConfig{
			name:          fmt.Sprintf("%s-%d", name, i+1),
			upstream:      st.up.url(cfg.transport),
			redis:         cfg.redis,
			namespace:     ns,
			logLevel:      "debug",
			forwardSecret: st.forwardSecret,
		})
		st.replicas = append(st.replicas, r)
		bases = append(bases, r.base)
	}
	st.rr = newRoundRobin(t, bases...)
	return st
}

// randomSecret returns a fresh forwarding secret: 32 random bytes, in hex.
func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// replica returns the stack's replica whose -replica id is name, nil when
// there is none.
func (st *stack) replica(name string) *replica {
	for _, r := range st.replicas {
		if r.name == name {
			return r
		}
	}
	return nil
}

// kill reads the counters of replica r, then kills it with SIGKILL: it
// gets no chance to finish anything or to withdraw its announcement. Its
// counters keep the values read.
func (st *stack) kill(ctx context.Context, r *replica) error {
	var c counters
	if err := c.scrape(ctx, r.ops); err != nil {
		return fmt.Errorf("%s before killing it: %w", r.name, err)
	}
	r.mu.Lock()
	r.final = &c
	r.mu.Unlock()
	return r.proc.kill()
}

// finalCounters returns the counters read before r was killed, nil while
// it runs.
func (r *replica) finalCounters() *counters {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.final
}
