//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// toolCalls is the number of function calls the fake model makes after
// each user message in TestClients.
const toolCalls = 3

// continuation is what a scenario expects of a client's later turns.
type continuation struct {
	// atLeast is the fraction of later turns that must be continued.
	atLeast float64
	// never says that no turn may be continued.
	never bool
}

// scenario is one deployment the clients run against.
type scenario struct {
	name string
	// transport is the contproxy's upstream transport, "http" or "ws".
	transport string
	// store is the store value the clients send, but Codex, which always
	// sends store=false.
	store bool
	// replicas is the number of contproxy replicas behind the round-robin
	// proxy.
	replicas int
	// others is what is expected of every client but Codex; codex of Codex.
	others, codex continuation
	// noRetries says that the upstream must refuse no continuation.
	noRetries bool
	// forward turns forwarding on between the replicas.
	forward bool
	// keepsOwners says that the replicas see every turn of an owner
	// (one replica): at least a third of the continued turns must go
	// upstream on a guess (a replica guesses once owners have stayed a
	// few turns), and at most one guess be overruled.
	keepsOwners bool
}

// scenarios is the matrix of TestClients.
var scenarios = []scenario{
	{
		// The baseline: the clients straight to the fake upstream (through
		// the round-robin proxy), as they run without contproxy.
		name: "baseline-no-contproxy", transport: "http", store: false, replicas: 0,
		others: continuation{never: true}, codex: continuation{never: true},
	},
	{
		// Codex sends store=false, which HTTP cannot continue: the upstream
		// keeps nothing for it.
		name: "A-http-store-2-replicas", transport: "http", store: true, replicas: 2,
		others: continuation{atLeast: 0.95}, codex: continuation{never: true}, noRetries: true,
	},
	{
		name: "B-ws-1-replica", transport: "ws", store: false, replicas: 1,
		others: continuation{atLeast: 0.95}, codex: continuation{atLeast: 0.95}, noRetries: true,
	},
	{
		// A response lives on the socket of the replica that made it, and
		// round-robin sends every other turn to the other replica, which
		// without forwarding sends it with the full context.
		name: "C-ws-2-replicas", transport: "ws", store: false, replicas: 2,
	},
	{
		// With forwarding, a turn landing on a replica that does not hold
		// its socket goes to the one that does: three turns in four here.
		name: "D-ws-4-replicas-forwarding", transport: "ws", store: false, replicas: 4, forward: true,
		others: continuation{atLeast: 0.9}, codex: continuation{atLeast: 0.9}, noRetries: true,
	},
	{
		// One replica sees every turn: once owners have stayed a few
		// turns, the clients' continued turns go upstream on its guesses
		// while Redis reserves them.
		name: "E-http-store-1-replica", transport: "http", store: true, replicas: 1, keepsOwners: true,
		others: continuation{atLeast: 0.95}, codex: continuation{never: true}, noRetries: true,
	},
}

// clientEnvironment is what a client run gets.
type clientEnvironment struct {
	nodeTools
	st    *stack
	store bool
	// before, when set, is called with n before the client's nth
	// create-response request goes to a replica.
	before func(n int)
}

// client is one real client, run once per scenario.
type client struct {
	name string
	// isCodex marks the Codex CLI.
	isCodex bool
	// store, when set, is the store of the client's upstream requests
	// ("true", "false" or "absent") whatever the scenario's.
	store string
	run   func(ctx context.Context, e clientEnvironment) error
}

// clients are the clients of TestClients.
var clients = []client{
	{name: "codex", isCodex: true, run: runCodex},
	{name: "jssdk-create-stream", run: jsSDK("create-stream")},
	{name: "jssdk-create", run: jsSDK("create")},
	{name: "jssdk-stream-helper", run: jsSDK("stream-helper")},
	{name: "agents", run: runAgents},
	{name: "go-sdk-stream", run: runGoSDK},
}

// TestClients runs every client in every scenario and checks that each
// succeeds, that the upstream answered exactly the conversations the
// clients sent, and that enough later turns were continued. It logs the
// table of what was sent upstream against the full context.
func TestClients(t *testing.T) {
	tools := nodeClients(t)
	addr := redisAddr(t)
	var rows []runResult
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			st := startStack(t, sc.name, stackConfig{
				transport: sc.transport,
				replicas:  sc.replicas,
				redis:     addr,
				toolCalls: toolCalls,
				forward:   sc.forward,
			})
			env := clientEnvironment{nodeTools: tools, st: st, store: sc.store}
			for _, cl := range clients {
				t.Run(cl.name, func(t *testing.T) {
					r := runOne(t, sc, cl, env)
					rows = append(rows, r)
					check(t, sc, cl, r)
				})
			}
		})
	}
	table := resultsTable(rows)
	t.Logf("turns continued and input sent upstream vs the full context the clients sent (%d tool calls per user message):\n%s",
		toolCalls, table)
	report.add(fmt.Sprintf("## Clients\n\nTurns continued and input sent upstream vs the full context the clients sent "+
		"(fake model: %d tool calls per user message). Forwarded (failed): the turns a replica handed to the one "+
		"holding their socket, and of those the ones it served itself with the full context.\n\n%s", toolCalls, table))
}

// runOne runs client cl in scenario sc and measures the run.
func runOne(t *testing.T, sc scenario, cl client, env clientEnvironment) runResult {
	t.Helper()
	up := env.st.up
	before := up.mark(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*clientTimeout)
	defer cancel()
	countersBefore, err := env.st.counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env.st.rr.begin(cl.name, env.before)
	runErr := cl.run(ctx, env)
	calls, posts := up.since(t, before)
	r := measure(sc.name, cl.name, env.st.rr.callsOf(cl.name), calls)
	r.err = runErr
	r.refused, r.retries, r.forwarded, r.forwardFailures, r.guessed, r.guessesOverruled = -1, -1, -1, -1, -1, -1
	if len(env.st.replicas) > 0 {
		d, err := env.st.settle(ctx, countersBefore, &r)
		if err != nil {
			t.Fatal(err)
		}
		d.compare(&r)
		r.retries = d.retries
		if env.st.forwardSecret != "" {
			r.forwarded, r.forwardFailures = d.forwarded, d.forwardFailures
		}
		if sc.transport == "http" {
			r.guessed, r.guessesOverruled = d.guessed, d.guessesOverruled
		}
	}
	if sc.transport == "http" {
		r.refused = max(posts-r.turns, 0)
		if posts < r.turns {
			r.mismatches = append(r.mismatches, fmt.Sprintf("the upstream logged %d requests but answered %d", posts, r.turns))
		}
	}
	return r
}

// check reports what is wrong with a run.
func check(t *testing.T, sc scenario, cl client, r runResult) {
	t.Helper()
	if r.err != nil {
		t.Errorf("the client failed: %v", r.err)
	}
	for _, f := range r.failures {
		t.Errorf("the client was sent an error: %s", f)
	}
	for _, m := range r.mismatches {
		t.Errorf("%s", m)
	}
	if r.refused > 0 {
		t.Errorf("the upstream refused %d requests (the client saw none of them)", r.refused)
	}
	if sc.noRetries && r.retries > 0 {
		t.Errorf("contproxy resent %d refused continuations with the full context", r.retries)
	}
	if r.guessed >= 0 {
		t.Logf("%d of %d continued turns went upstream on a guess, %d guesses overruled", r.guessed, r.continued, r.guessesOverruled)
	}
	if sc.keepsOwners && (3*r.guessed < r.continued || r.guessesOverruled > 1) {
		t.Errorf("%d of %d continued turns went upstream on a guess and %d guesses were overruled; want at least a third, at most one overruled",
			r.guessed, r.continued, r.guessesOverruled)
	}
	if r.requests == 0 {
		t.Errorf("the client sent no request")
	}
	wantStore := strconv.FormatBool(sc.store && !cl.isCodex)
	if cl.store != "" {
		wantStore = cl.store
	}
	if len(r.stores) != 1 || r.stores[0] != wantStore {
		t.Errorf("the upstream requests have store %v, want %s", r.stores, wantStore)
	}
	wantTransport := map[string]string{"http": "http", "ws": "websocket"}[sc.transport]
	if len(r.transports) != 1 || r.transports[0] != wantTransport {
		t.Errorf("the upstream calls went over %v, want %s", r.transports, wantTransport)
	}
	want := sc.others
	if cl.isCodex {
		want = sc.codex
	}
	switch {
	case want.never && r.continued != 0:
		t.Errorf("%d turns were continued, want none", r.continued)
	case r.rate() < want.atLeast:
		t.Errorf("%d of %d later turns were continued (%.0f%%), want at least %.0f%%",
			r.continued, r.later(), 100*r.rate(), 100*want.atLeast)
	}
}

// saysDone checks that out holds the fake model's final answer to each of
// n user messages, each line starting with prefix.
func saysDone(out, prefix string, n int) error {
	for k := 1; k <= n; k++ {
		want := fmt.Sprintf("%sDone with message %d after %d tool calls", prefix, k, toolCalls)
		if !strings.Contains(out, want) {
			return fmt.Errorf("no %q in its output:\n%s", want, clip(out, 4000))
		}
	}
	return nil
}

// codexDone is the fake model's final answer as Codex prints it. Codex
// sends its environment context as a user message of its own, so the
// message numbers are not those of the prompts.
var codexDone = regexp.MustCompile(fmt.Sprintf(`Done with message \d+ after %d tool calls`, toolCalls))

// jsSDK returns the run of jssdk.mjs with pattern.
func jsSDK(pattern string) func(ctx context.Context, e clientEnvironment) error {
	return func(_ context.Context, e clientEnvironment) error {
		out, err := runClient("jssdk-"+pattern, e.st.dir, e.dir, nodeEnv(e), e.node, "jssdk.mjs", pattern)
		if err != nil {
			return err
		}
		return saysDone(out, "["+pattern+"] ", len(userTurns))
	}
}

// runAgents runs agents.mjs.
func runAgents(_ context.Context, e clientEnvironment) error {
	out, err := runClient("agents", e.st.dir, e.dir, nodeEnv(e), e.node, "agents.mjs")
	if err != nil {
		return err
	}
	return saysDone(out, "[agents] ", len(userTurns))
}

// nodeEnv is the environment of a node driver.
func nodeEnv(e clientEnvironment) []string {
	return clientEnv("FAKE_BASE_URL="+e.st.rr.baseURL(), "FAKE_API_KEY=fake-key",
		"FAKE_STORE="+strconv.FormatBool(e.store))
}

// runGoSDK holds one streaming Go SDK conversation.
func runGoSDK(ctx context.Context, e clientEnvironment) error {
	return goSDKConversation("go-sdk-stream", true)(ctx, e)
}

// codexPrompts are the user messages of the Codex session: codex exec,
// then codex exec resume --last for each further one.
var codexPrompts = []string{
	"Show me where we are and what is here.",
	"Run the same checks again, please.",
	"One more time, then tell me you are done.",
}

// runCodex runs one Codex session: codex exec, then resumed user turns, in
// a fresh CODEX_HOME whose provider is the round-robin proxy.
func runCodex(_ context.Context, e clientEnvironment) error {
	config := codexConfig(`model_provider = "fake"
`, fmt.Sprintf(`
[model_providers.fake]
name = "Fake upstream"
base_url = %q
wire_api = "responses"
env_key = "FAKE_API_KEY"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
`, e.st.rr.baseURL()))
	_, err := runCodexSession(filepath.Join(e.st.dir, "codex"), map[string]string{"config.toml": config},
		clientEnv("FAKE_API_KEY=fake-key"), e.nodeTools, nil)
	return err
}
