//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// keepsNoneModel is the model of every request of TestUpstreamKeepsNoResponses.
const keepsNoneModel = "gpt-5.1"

// Conversations of TestUpstreamKeepsNoResponses: the Go SDK conversations
// before the measure, enough for each replica to see three refused
// continuations in a row, and those of the measure, beside the JS SDK's.
const (
	keepsNoneWarmUp        = 2
	keepsNoneConversations = 8
)

// maxRequestsPerTurn bounds the upstream requests per client request of
// TestUpstreamKeepsNoResponses, once continuing has paused: a paused
// replica sends a probe continuation now and then.
const maxRequestsPerTurn = 1.05

// TestUpstreamKeepsNoResponses runs clients with store=true through two
// replicas in front of an upstream that keeps no responses (the fake
// upstream's -keeps-no-responses): it refuses every previous_response_id,
// and each refused continuation costs a second upstream request with the
// full context. After the first refusals (Go SDK conversations, after
// which each replica must report continuing paused for the model), the
// clients (the JS SDK and Go SDK conversations) must succeed without an
// error, and the upstream must get at most maxRequestsPerTurn requests per
// client request, by its own log.
func TestUpstreamKeepsNoResponses(t *testing.T) {
	tools := nodeClients(t)
	addr := redisAddr(t)
	sc := scenario{name: "I-http-keeps-no-responses-2-replicas", transport: "http", store: true, replicas: 2}
	st := startStack(t, sc.name, stackConfig{transport: sc.transport, replicas: sc.replicas, redis: addr,
		toolCalls: toolCalls, upstreamFlags: []string{"-keeps-no-responses"}})
	env := clientEnvironment{nodeTools: tools, st: st, store: sc.store}

	// The first refusals.
	warm := keepsNoneRuns(t, sc, env, "warm-up", keepsNoneWarmUp, nil)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, r := range st.replicas {
		models, err := pausedModels(ctx, r.ops)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(models, keepsNoneModel) {
			t.Errorf("after %d refused continuations, %s does not report continuing paused for %s (contproxy_continuation_paused: %v)",
				warm.refused, r.name, keepsNoneModel, models)
		}
	}

	// The measure.
	measured := keepsNoneRuns(t, sc, env, "measured", keepsNoneConversations, []client{
		{name: "jssdk-create", run: jsSDK("create")},
		{name: "jssdk-create-stream", run: jsSDK("create-stream")},
	})
	perTurn := float64(measured.upstream) / float64(max(measured.requests, 1))
	table := markdownTable([]string{"phase", "client requests", "upstream requests", "refused continuations", "upstream requests per client request"},
		[][]string{warm.row("the first refusals"), measured.row("measured")})
	t.Logf("an upstream that keeps no responses, two replicas:\n%s", table)
	report.add("## An upstream that keeps no responses\n\nClients with store=true through two replicas; the upstream refuses " +
		"every previous_response_id. The first refusals: Go SDK conversations; measured: the JS SDK and Go SDK conversations.\n\n" + table)
	if measured.requests == 0 {
		t.Fatal("no client request was measured")
	}
	if perTurn > maxRequestsPerTurn {
		t.Errorf("after the first refusals the upstream got %d requests for %d client requests (%.3f per request), want at most %.2f",
			measured.upstream, measured.requests, perTurn, maxRequestsPerTurn)
	}
}

// keepsNoneResult sums a phase of TestUpstreamKeepsNoResponses.
type keepsNoneResult struct {
	// requests are the clients' create-response requests, upstream those
	// the upstream received, refused those it refused.
	requests, upstream, refused int
}

// row is the phase's row of the report's table.
func (k keepsNoneResult) row(phase string) []string {
	per := "-"
	if k.requests > 0 {
		per = fmt.Sprintf("%.3f", float64(k.upstream)/float64(k.requests))
	}
	return []string{phase, strconv.Itoa(k.requests), strconv.Itoa(k.upstream), strconv.Itoa(k.refused), per}
}

// keepsNoneRuns runs the node clients node, then n Go SDK conversations (every
// other one streaming), each labelled phase/…, checks that each succeeded
// and that the upstream answered what they sent, and counts the phase's
// requests.
func keepsNoneRuns(t *testing.T, sc scenario, env clientEnvironment, phase string, n int, node []client) keepsNoneResult {
	t.Helper()
	up := env.st.up
	postsBefore, err := up.posts()
	if err != nil {
		t.Fatal(err)
	}
	runs := slices.Clone(node)
	for i := range n {
		runs = append(runs, client{name: fmt.Sprintf("go-sdk-%d", i+1), run: goSDKConversation(fmt.Sprintf("%s-go-sdk-%d", phase, i+1), i%2 == 1)})
	}
	var res keepsNoneResult
	for _, cl := range runs {
		label := phase + "/" + cl.name
		before, err := readTrace(up.trace)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*clientTimeout)
		env.st.rr.begin(label, nil)
		runErr := cl.run(ctx, env)
		cancel()
		after, err := readTrace(up.trace)
		if err != nil {
			t.Fatal(err)
		}
		r := measure(sc.name, label, env.st.rr.callsOf(label), after[len(before):])
		if runErr != nil {
			t.Errorf("%s: the client failed: %v", label, runErr)
		}
		for _, f := range r.failures {
			t.Errorf("%s: the client was sent an error: %s", label, f)
		}
		for _, m := range r.mismatches {
			t.Errorf("%s: %s", label, m)
		}
		if r.continued != 0 {
			t.Errorf("%s: the upstream answered %d continued turns, but keeps no responses", label, r.continued)
		}
		res.requests += r.requests
	}
	env.st.rr.begin("", nil)
	postsAfter, err := up.posts()
	if err != nil {
		t.Fatal(err)
	}
	res.upstream = postsAfter - postsBefore
	res.refused = max(res.upstream-res.requests, 0)
	return res
}

// goSDKConversation returns a run holding one Go SDK conversation under
// session, store as the environment says.
func goSDKConversation(session string, stream bool) func(ctx context.Context, e clientEnvironment) error {
	return func(ctx context.Context, e clientEnvironment) error {
		c := &goConversation{client: newGoClient(e.st.rr.baseURL()), session: session, store: e.store, stream: stream}
		var said []string
		for _, text := range userTurns {
			s, err := c.userTurn(ctx, text)
			if err != nil {
				return err
			}
			said = append(said, s)
		}
		return saysDone(strings.Join(said, "\n"), "", len(userTurns))
	}
}

// pausedModels returns the models the contproxy at base reports
// continuing paused for: those of its contproxy_continuation_paused
// series at 1.
func pausedModels(ctx context.Context, base string) ([]string, error) {
	body, err := scrape(ctx, base)
	if err != nil {
		return nil, err
	}
	const prefix = `contproxy_continuation_paused{model="`
	var models []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		model, value, ok := strings.Cut(rest, `"} `)
		if ok && strings.TrimSpace(value) == "1" {
			models = append(models, model)
		}
	}
	return models, sc.Err()
}
