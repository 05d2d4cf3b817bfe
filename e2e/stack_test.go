//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
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
// dir/name.jsonl, and waits until it prints its address.
func startUpstream(t *testing.T, dir, name string, toolCalls int) *upstream {
	t.Helper()
	bin := fakeupstreamBin.build(t)
	up := &upstream{trace: dir + "/" + name + ".jsonl"}
	up.proc = startServer(t, name, dir, bin,
		"-listen", "127.0.0.1:0", "-trace", up.trace, "-tool-calls", strconv.Itoa(toolCalls))
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

// postPrefix starts the line the fake upstream logs for each HTTP request
// it receives, "fakeupstream: POST /v1/responses", answered or not.
const postPrefix = "fakeupstream: POST "

// posts counts the HTTP create-response requests the upstream received.
func (up *upstream) posts() (int, error) {
	raw, err := os.ReadFile(up.proc.stderr)
	if err != nil {
		return 0, err
	}
	n := 0
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, postPrefix) && strings.Contains(line, "/responses") {
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
}

// portAttempts is how many ports a contproxy start tries: a free port
// picked here can be taken before contproxy listens on it.
const portAttempts = 3

// startContproxy starts a contproxy on a free port of 127.0.0.1, waits
// until GET /healthz answers 200 "ok" and returns its base URL,
// http://127.0.0.1:PORT.
func startContproxy(t *testing.T, dir string, cfg replicaConfig) string {
	t.Helper()
	bin := contproxyBin.build(t)
	for attempt := 1; ; attempt++ {
		addr := freePort(t)
		args := []string{"-listen", addr, "-upstream", cfg.upstream, "-replica", cfg.name, "-log-level", cfg.logLevel}
		if cfg.redis != "" {
			args = append(args, "-redis", "redis://"+cfg.redis+"/0", "-namespace", cfg.namespace)
		}
		p, err := startProcess(cfg.name, dir, dir, os.Environ(), bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + addr
		err = waitHealthy(p, base)
		if err == nil {
			supervise(t, p, bin, args)
			return base
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
	replicas []string // the base URLs of the contproxy replicas
	rr       *roundRobin
}

// stackConfig describes a stack.
type stackConfig struct {
	// transport is the contproxy's upstream transport, "http" or "ws".
	transport string
	// replicas is the number of contproxy replicas; 0 puts the round-robin
	// proxy straight in front of the fake upstream.
	replicas int
	// redis is the Redis address the replicas share.
	redis string
	// namespace is their key namespace.
	namespace string
	// toolCalls is the number of function calls the fake model makes after
	// each user message.
	toolCalls int
}

// startStack starts a stack in a fresh directory; everything stops when
// the test ends.
func startStack(t *testing.T, name string, cfg stackConfig) *stack {
	t.Helper()
	st := &stack{dir: t.TempDir()}
	st.up = startUpstream(t, st.dir, "fakeupstream", cfg.toolCalls)
	if cfg.replicas == 0 {
		st.rr = newRoundRobin(t, "http://"+st.up.addr)
		return st
	}
	for i := range cfg.replicas {
		st.replicas = append(st.replicas, startContproxy(t, st.dir, replicaConfig{
			name:      fmt.Sprintf("%s-%d", name, i+1),
			upstream:  st.up.url(cfg.transport),
			redis:     cfg.redis,
			namespace: cfg.namespace,
			logLevel:  "debug",
		}))
	}
	st.rr = newRoundRobin(t, st.replicas...)
	return st
}
