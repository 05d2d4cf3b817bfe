//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// nextRun is a client of TestNextClients in one scenario, and what is
// expected of its later turns.
type nextRun struct {
	cl   client
	want continuation
}

// nextScenario is a deployment of TestNextClients and the clients it runs.
type nextScenario struct {
	sc   scenario
	runs []nextRun
}

// nextScenarios are the deployments of TestNextClients, each behind
// contproxy replicas sharing Redis.
var nextScenarios = []nextScenario{
	{
		// The AI SDK with store as shipped: the upstream keeps its
		// responses, and the SDK sends earlier reasoning items and
		// assistant messages back as item_reference. opencode sends
		// store:false, which HTTP cannot continue.
		sc: scenario{name: "F-http-store-2-replicas", transport: "http", replicas: 2, noRetries: true},
		runs: []nextRun{
			{cl: client{name: "aisdk-generate", store: "absent", run: aiSDK(aiSDKRun{mode: "generate"})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "aisdk-stream", store: "absent", run: aiSDK(aiSDKRun{mode: "stream"})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "aisdk-generate-session", store: "absent",
				run: aiSDK(aiSDKRun{mode: "generate", session: "aisdk-generate-session"})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "opencode", store: "false", run: runOpencode}, want: continuation{never: true}},
		},
	},
	{
		// store:false over the WebSocket upstream, with forwarding: a turn
		// landing on the replica that does not hold its socket goes to
		// the one that does. The AI SDK sends assistant messages back in
		// the short form, opencode without annotations and logprobs, and
		// opencode generates the session's title under the same session id
		// with another prompt.
		sc: scenario{name: "G-ws-nostore-2-replicas-forwarding", transport: "ws", replicas: 2, forward: true, noRetries: true},
		runs: []nextRun{
			{cl: client{name: "aisdk-generate-nostore", store: "false", run: aiSDK(aiSDKRun{mode: "generate", noStore: true})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "aisdk-stream-nostore", store: "false", run: aiSDK(aiSDKRun{mode: "stream", noStore: true})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "opencode", store: "false", run: runOpencode}, want: continuation{atLeast: 0.95}},
		},
	},
	{
		// One replica, which keeps every owner, as behind a load balancer
		// that keeps an owner on its replica: once owners have stayed a
		// few turns, each later turn goes upstream on the replica's last
		// record of its owner while Redis reserves it (at most one guess
		// overruled, after a store timeout). The AI SDK sends earlier items
		// back as item_reference, which the guesses were not derived from.
		sc: scenario{name: "H-http-store-1-replica", transport: "http", replicas: 1, keepsOwners: true, noRetries: true},
		runs: []nextRun{
			{cl: client{name: "aisdk-generate", store: "absent", run: aiSDK(aiSDKRun{mode: "generate"})},
				want: continuation{atLeast: 0.95}},
			{cl: client{name: "aisdk-stream", store: "absent", run: aiSDK(aiSDKRun{mode: "stream"})},
				want: continuation{atLeast: 0.95}},
		},
	},
}

// TestNextClients runs the Vercel AI SDK and opencode (testdata/clients,
// aisdk.mjs and opencode.mjs) through contproxy on Redis: two replicas
// with an HTTP upstream that keeps their responses, two with a WebSocket
// upstream, store:false and forwarding, and one alone, whose continued
// turns must mostly go upstream on its guesses. Each client must
// succeed and get no error, the upstream must have answered each request
// once, resolving a conversation of exactly the items the client sent, and
// contproxy's counters must agree; from the fake upstream's trace, at
// least 95% of the later turns (every request after a conversation's
// first) must have gone upstream with previous_response_id where the
// upstream can continue them, none where it cannot. It logs and reports
// the table of what was sent upstream against the full context.
func TestNextClients(t *testing.T) {
	tools := nodeClients(t)
	needOpencode(t, tools)
	addr := redisAddr(t)
	var rows []runResult
	for _, ns := range nextScenarios {
		t.Run(ns.sc.name, func(t *testing.T) {
			st := startStack(t, ns.sc.name, stackConfig{
				transport: ns.sc.transport,
				replicas:  ns.sc.replicas,
				redis:     addr,
				toolCalls: toolCalls,
				forward:   ns.sc.forward,
			})
			env := clientEnvironment{nodeTools: tools, st: st, store: ns.sc.store}
			for _, run := range ns.runs {
				t.Run(run.cl.name, func(t *testing.T) {
					sc := ns.sc
					sc.others = run.want
					r := runOne(t, sc, run.cl, env)
					rows = append(rows, r)
					check(t, sc, run.cl, r)
				})
			}
		})
	}
	table := resultsTable(rows)
	t.Logf("the Vercel AI SDK and opencode: turns continued and input sent upstream vs the full context the clients sent (%d tool calls per user message):\n%s",
		toolCalls, table)
	report.add(fmt.Sprintf("## The Vercel AI SDK and opencode\n\nTurns continued and input sent upstream vs the full context "+
		"the clients sent (fake model: %d tool calls per user message), through contproxy replicas sharing Redis.\n\n%s", toolCalls, table))
}

// aiSDKRun is one run of aisdk.mjs.
type aiSDKRun struct {
	// mode is "generate" (generateText) or "stream" (streamText).
	mode string
	// noStore sends providerOptions.openai.store = false; without it the
	// requests carry no store member.
	noStore bool
	// session, when set, is sent as the session-id header.
	session string
	// apiKey is the API key sent (default fake-key).
	apiKey string
	// label names the run's log files (default aisdk-MODE-shipped or
	// aisdk-MODE-nostore).
	label string
}

// aiSDK returns the run of aisdk.mjs as a.
func aiSDK(a aiSDKRun) func(ctx context.Context, e clientEnvironment) error {
	return func(_ context.Context, e clientEnvironment) error {
		_, err := a.run(e)
		return err
	}
}

// run runs aisdk.mjs and checks that it printed the fake model's answer to
// each user message; it returns its output.
func (a aiSDKRun) run(e clientEnvironment) (string, error) {
	store := "shipped"
	if a.noStore {
		store = "nostore"
	}
	label := a.label
	if label == "" {
		label = "aisdk-" + a.mode + "-" + store
	}
	env := nodeEnv(e)
	if a.session != "" {
		env = append(env, "FAKE_SESSION_ID="+a.session)
	}
	if a.apiKey != "" {
		env = append(env, "FAKE_API_KEY="+a.apiKey)
	}
	out, err := runClient(label, e.st.dir, e.dir, env, e.node, "aisdk.mjs", a.mode, store)
	if err != nil {
		return out, err
	}
	return out, saysDone(out, "[aisdk-"+a.mode+"] ", len(userTurns))
}

// opencodePrompts is the number of user messages of opencode.mjs's
// session: opencode run, then opencode run --continue for each further
// one.
const opencodePrompts = 3

// opencodeTimeout bounds opencode.mjs, whose opencode runs are each
// bounded by clientTimeout.
const opencodeTimeout = opencodePrompts*clientTimeout + 30*time.Second

// runOpencode runs opencode.mjs in a fresh directory of the stack's.
func runOpencode(_ context.Context, e clientEnvironment) error {
	root := filepath.Join(e.st.dir, "opencode")
	env := append(nodeEnv(e), "FAKE_OPENCODE_TIMEOUT="+strconv.Itoa(int(clientTimeout/time.Second)))
	out, err := runClientFor(opencodeTimeout, "opencode", e.st.dir, e.dir, env, e.node, "opencode.mjs", root)
	if err != nil {
		return err
	}
	return saysDone(out, "[opencode] ", opencodePrompts)
}
