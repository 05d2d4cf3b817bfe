//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// codexWSClient labels the Codex runs of TestCodexWebSocket.
const codexWSClient = "codex-openai-ws"

// fallbackLine matches what Codex says when its WebSocket connection fails
// or it leaves the WebSocket mode: its warning "falling back to HTTP", the
// notice "Falling back from WebSockets to HTTPS transport", its retry
// lines "Reconnecting...", and its log lines about the connection
// (codex_api::endpoint::responses_websocket).
var fallbackLine = regexp.MustCompile(`(?i)falling back (to https?\b|from websockets)|reconnecting|responses_websocket`)

// TestCodexWebSocket runs the Codex CLI with its built-in OpenAI provider
// pointed at contproxy (openai_base_url), which talks the Responses API's
// WebSocket mode: codex exec, then resumed user turns, each a process and
// a connection of its own, through the round-robin proxy in front of two
// replicas sharing Redis, which forward a turn to the replica holding its
// upstream socket, over a WebSocket upstream (Codex sends store:false).
// Every user turn must be answered; Codex must neither fall back to HTTP
// nor reconnect, so no create-response request reaches the replicas over
// HTTP and each process opens one connection; at least 95% of the later
// turns of the session must reach the upstream continued, the first turn
// of each resumed process included (Codex then sends its whole history,
// its items tagged with its own turn metadata, which the profile leaves
// out), and contproxy's counters must agree with the upstream.
func TestCodexWebSocket(t *testing.T) {
	tools := nodeClients(t)
	st, ctx, before := startCodexStack(t, "codex-ws", codexWSClient, stackConfig{
		transport: "ws",
		replicas:  2,
		redis:     redisAddr(t),
		toolCalls: toolCalls,
		forward:   true,
	})
	// runs[i] is the number of upstream calls when run i had ended.
	var runs []int
	outputs, err := runCodexOpenAI(st, tools, func() error {
		up, err := readTrace(st.up.trace)
		runs = append(runs, len(up))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range outputs {
		for _, line := range strings.Split(out, "\n") {
			if fallbackLine.MatchString(line) {
				t.Errorf("%s: the WebSocket connection failed or Codex left the WebSocket mode: %s", name, line)
			}
		}
	}
	if posts := st.rr.callsOf(codexWSClient); len(posts) > 0 {
		t.Errorf("Codex sent %d create-response requests over HTTP, the first with %d input items", len(posts), posts[0].items)
	}
	opened := 0
	for _, r := range st.replicas {
		raw, err := os.ReadFile(r.proc.stderr)
		if err != nil {
			t.Fatal(err)
		}
		opened += strings.Count(string(raw), `msg="client socket opened"`)
	}
	if opened != len(codexPrompts) {
		t.Errorf("the replicas accepted %d client sockets for %d Codex runs, want one each", opened, len(codexPrompts))
	}

	up, err := readTrace(st.up.trace)
	if err != nil {
		t.Fatal(err)
	}
	r := runResult{scenario: "codex-openai-websocket-2-replicas-forwarding", client: codexWSClient, turns: len(up), up: up}
	r.tallyUpstream()
	if !slices.Equal(r.stores, []string{"false"}) || !slices.Equal(r.transports, []string{"websocket"}) {
		t.Errorf("the upstream calls have store %v over %v, want false over websocket", r.stores, r.transports)
	}
	if r.conversations != 1 {
		t.Errorf("the upstream answered %d conversations, want Codex's one", r.conversations)
	}
	// Later turns of a connection: every call of a run but its first.
	later, continued, from := 0, 0, 0
	var firsts []string
	for i, to := range runs {
		if to-from != toolCalls+1 {
			t.Errorf("run %d: the upstream answered %d calls, want %d (%d tool calls and the answer)", i+1, to-from, toolCalls+1, toolCalls)
		}
		for j := from; j < to; j++ {
			switch {
			case j == from && up[j].previous != "":
				firsts = append(firsts, fmt.Sprintf("run %d: continued", i+1))
			case j == from && i > 0:
				firsts = append(firsts, fmt.Sprintf("run %d: full context", i+1))
			case j > from:
				later++
				if up[j].previous != "" {
					continued++
				}
			}
		}
		from = to
	}
	if later == 0 || float64(continued) < 0.95*float64(later) {
		t.Errorf("%d of %d later turns of a connection were continued, want at least 95%%", continued, later)
	}
	if r.later() == 0 || r.rate() < 0.95 {
		t.Errorf("%d of %d later turns of the session were continued, want at least 95%%; first turns of the resumed runs: %s",
			r.continued, r.later(), strings.Join(firsts, ", "))
	}

	// contproxy counts a turn once it is over, which may be after Codex has
	// what it needs.
	var d counters
	for deadline := time.Now().Add(countersTimeout); ; time.Sleep(pollInterval) {
		now, err := st.counters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d = now.sub(before); d.turns >= r.turns && d.continued >= r.continued || time.Now().After(deadline) {
			break
		}
	}
	if d.turns != r.turns || d.continued != r.continued || d.upstreamErrors != 0 || d.itemsSent != r.itemsUp {
		t.Errorf("contproxy counts %d turns, %d continued, %d input items sent, %d upstream errors; the upstream answered %d calls, %d continued, with %d input items",
			d.turns, d.continued, d.itemsSent, d.upstreamErrors, r.turns, r.continued, r.itemsUp)
	}
	summary := fmt.Sprintf("%d Codex runs (codex exec, then resume), one connection each, through 2 replicas: %d upstream calls; "+
		"%d of %d later turns of a connection continued; first turns of the resumed runs: %s; overall %d of %d later turns "+
		"continued (%.0f%%); %d forwarded (%d failed); %d input items sent upstream of the %d of the full context",
		len(runs), r.turns, continued, later, strings.Join(firsts, ", "), r.continued, r.later(), 100*r.rate(),
		d.forwarded, d.forwardFailures, d.itemsSent, d.itemsReceived)
	t.Log(summary)
	report.add("## Codex over the WebSocket mode\n\nThe Codex CLI's built-in OpenAI provider (openai_base_url) over the " +
		"WebSocket mode, a WebSocket upstream, forwarding: " + summary + ".\n")
}

// startCodexStack starts the stack of a Codex session's test (named name),
// the round-robin proxy's calls labelled client from now on, and returns
// it, a context that bounds the session's runs (ended with the test), and
// contproxy's counters before them.
func startCodexStack(t *testing.T, name, client string, cfg stackConfig) (*stack, context.Context, counters) {
	t.Helper()
	st := startStack(t, name, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(len(codexPrompts)+1)*clientTimeout)
	t.Cleanup(cancel)
	before, err := st.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.rr.begin(client, nil)
	return st, ctx, before
}

// runCodexOpenAI runs one Codex session with the built-in OpenAI provider
// pointed at the round-robin proxy, its WebSocket mode on (as shipped):
// codex exec, then codex exec resume --last for each further prompt,
// calling after when each run has ended. It returns each run's standard
// output and error.
func runCodexOpenAI(st *stack, tools nodeTools, after func() error) (map[string]string, error) {
	config := codexConfig(fmt.Sprintf("openai_base_url = %q\n", st.rr.baseURL()), "")
	env := clientEnv("OPENAI_API_KEY=fake-key", "CODEX_API_KEY=fake-key", "RUST_LOG=warn")
	return runCodexSession(filepath.Join(st.dir, "codex-openai"), map[string]string{"config.toml": config}, env, tools, after)
}

// codexConfig returns a Codex config.toml: the model, then top's keys (its
// provider), the settings every run here shares (no approvals, no
// sandbox, no update check, no analytics), then tables (a provider's).
func codexConfig(top, tables string) string {
	return `model = "gpt-5.5"
` + top + `model_reasoning_summary = "detailed"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false
` + tables
}

// runCodexSession runs one Codex session in root, its runs named after
// root: codex exec, then codex exec resume --last for each further prompt,
// in env with CODEX_HOME root/home holding homeFiles (config.toml,
// auth.json), HOME root and the working directory root/work, calling
// after (unless nil) when each run has ended. It returns each run's
// standard output and error.
func runCodexSession(root string, homeFiles map[string]string, env []string, tools nodeTools, after func() error) (map[string]string, error) {
	home, work := filepath.Join(root, "home"), filepath.Join(root, "work")
	for _, dir := range []string{home, work} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	for name, content := range homeFiles {
		if err := os.WriteFile(filepath.Join(home, name), []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	env = append(slices.Clip(env), "CODEX_HOME="+home, "HOME="+root)
	flags := []string{"exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--color", "never"}
	outputs := map[string]string{}
	for i, prompt := range codexPrompts {
		args := slices.Concat(flags, []string{prompt})
		if i > 0 {
			args = slices.Concat(flags, []string{"resume", "--last", prompt})
		}
		name := fmt.Sprintf("%s-%d", filepath.Base(root), i+1)
		out, err := runClient(name, root, work, env, tools.codex, args...)
		if err != nil {
			return outputs, err
		}
		stderr, err := os.ReadFile(filepath.Join(root, name+".stderr"))
		if err != nil {
			return outputs, err
		}
		outputs[name] = out + "\n" + string(stderr)
		if !codexDone.MatchString(out) {
			return outputs, fmt.Errorf("codex, user turn %d: no %q in its output:\n%s", i+1, codexDone, clip(out, 4000))
		}
		if after != nil {
			if err := after(); err != nil {
				return outputs, err
			}
		}
	}
	return outputs, nil
}
