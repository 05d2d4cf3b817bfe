//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// killBefore is the request of a TestReplicaKilled run before which the
// replica holding the conversation's upstream socket is killed: the first
// five have been answered.
const killBefore = 6

// directoryTTL is how long a replica's announcement outlives its last
// renewal (the directory's default); a replica renews it every third of
// that.
const directoryTTL = 6 * time.Second

// killScenario is the deployment of TestReplicaKilled: as scenario D, four
// replicas with forwarding.
var killScenario = scenario{
	name: "E-ws-4-replicas-forwarding-kill", transport: "ws", store: false, replicas: 4, forward: true, noRetries: true,
}

// killed is what the kill of a TestReplicaKilled run did.
type killed struct {
	victim string    // the -replica id of the killed replica
	at     time.Time // when it was gone
	err    error
}

// TestReplicaKilled holds a conversation through four replicas with
// forwarding and, between two of its requests (none in flight), kills the
// replica holding its upstream socket with SIGKILL. The round-robin proxy
// sends a request that cannot reach the dead replica to the next one. The
// client must finish with its answers and see no error; the turn that
// continued on the dead replica's socket must go with the full context
// (forwarding to the dead replica fails, or the directory no longer
// names it), every other later turn must be continued, and the upstream
// must refuse no continuation. It logs and reports a table of the runs.
func TestReplicaKilled(t *testing.T) {
	addr := redisAddr(t)
	var rows [][]string
	for _, kc := range []struct {
		cl   client
		node bool // the client runs on node
	}{
		{cl: client{name: "go-sdk-stream", run: runGoSDK}},
		{cl: client{name: "jssdk-create-stream", run: jsSDK("create-stream")}, node: true},
	} {
		t.Run(kc.cl.name, func(t *testing.T) {
			var tools nodeTools
			if kc.node {
				tools = nodeClients(t)
			}
			st := startStack(t, killScenario.name, stackConfig{
				transport: killScenario.transport,
				replicas:  killScenario.replicas,
				redis:     addr,
				toolCalls: toolCalls,
				forward:   killScenario.forward,
			})
			done := make(chan killed, 1)
			env := clientEnvironment{nodeTools: tools, st: st, store: killScenario.store, before: func(n int) {
				if n == killBefore {
					done <- st.killHolder(t.Context(), kc.cl.name)
				}
			}}
			r := runOne(t, killScenario, kc.cl, env)
			var k killed
			select {
			case k = <-done:
			default:
				k.err = fmt.Errorf("the client sent fewer than %d requests: no replica was killed", killBefore)
			}
			if k.err != nil {
				t.Errorf("killing a replica: %v", k.err)
			}
			check(t, killScenario, kc.cl, r)
			affected, retried := checkKill(t, r, k)
			ok := "yes"
			if t.Failed() {
				ok = "NO"
			}
			rows = append(rows, []string{
				kc.cl.name, ok, strconv.Itoa(r.requests), strconv.Itoa(r.later()),
				fmt.Sprintf("%d (%.0f%%)", r.continued, 100*r.rate()),
				fmt.Sprintf("before request %d", killBefore),
				formatRequests(affected),
				fmt.Sprintf("%d / %d (%s)", r.itemsUp, r.itemsFull, percent(r.itemsUp, r.itemsFull)),
				fmt.Sprintf("%d (%d)", r.forwarded, r.forwardFailures),
				strconv.Itoa(retried),
				strconv.Itoa(r.retries),
				strconv.Itoa(len(r.failures)),
			})
		})
	}
	table := markdownTable([]string{"client", "ok", "requests", "later turns", "continued", "replica killed",
		"full context (socket on the killed replica)", "items upstream / full", "forwarded (failed)", "requests the load balancer retried",
		"full-context retries", "client errors"}, rows)
	about := fmt.Sprintf("WebSocket upstream, store=false, 4 replicas round-robin with forwarding; the replica holding "+
		"the conversation's socket killed with SIGKILL between two requests; %d tool calls per user message", toolCalls)
	t.Logf("replica killed mid-run (%s):\n%s", about, table)
	report.add(fmt.Sprintf("## Replica killed mid-run\n\n%s.\n\n%s", about, table))
}

// killHolder waits until no request is in flight through the round-robin
// proxy, then kills the replica holding the upstream socket of client's
// latest answered request (the one before the request about to go).
func (st *stack) killHolder(ctx context.Context, client string) killed {
	if err := st.rr.waitIdle(countersTimeout); err != nil {
		return killed{err: err}
	}
	calls := st.rr.callsOf(client)
	if len(calls) < 2 {
		return killed{err: fmt.Errorf("%d requests recorded, want at least 2", len(calls))}
	}
	holder := calls[len(calls)-2].holder
	r := st.replica(holder)
	if r == nil {
		return killed{err: fmt.Errorf("request %d was answered with %s %q, no replica of the stack",
			len(calls)-1, routingHeader, holder)}
	}
	if err := st.kill(ctx, r); err != nil {
		return killed{err: err}
	}
	return killed{victim: holder, at: time.Now()}
}

// checkKill checks, request by request, that what TestReplicaKilled
// expects of run r happened. It returns the requests (1-based) that
// continued from the killed replica's socket and the number of requests
// the round-robin proxy had to send to another backend.
func checkKill(t *testing.T, r runResult, k killed) (affected []int, retried int) {
	t.Helper()
	for _, c := range r.calls {
		retried += c.retried
	}
	if k.err != nil || len(r.up) != len(r.calls) {
		return nil, retried // reported already
	}
	for i := 1; i < len(r.calls); i++ {
		n, onVictim := i+1, r.calls[i-1].holder == k.victim
		switch {
		case n >= killBefore && r.calls[i].holder == k.victim:
			t.Errorf("request %d was answered with its socket on %s, killed before request %d", n, k.victim, killBefore)
		case n >= killBefore && onVictim:
			affected = append(affected, n)
			if r.up[i].previous != "" {
				t.Errorf("request %d continued from %s's socket, killed before it", n, k.victim)
			}
		case r.up[i].previous == "":
			t.Errorf("request %d went with the full context though its socket, on %s, was alive",
				n, r.calls[i-1].holder)
		}
	}
	if len(affected) == 0 {
		t.Errorf("no request continued from %s's socket after the kill", k.victim)
	}
	// The killed replica's announcement outlives it by at least two thirds
	// of the directory's TTL: a turn soon after the kill is forwarded to it
	// and fails.
	if len(affected) > 0 {
		first := r.calls[affected[0]-1]
		if since := first.sent.Sub(k.at); since < directoryTTL/3 && r.forwardFailures < 1 {
			t.Errorf("request %d went %v after %s was killed, while the directory still named it, but no forwarding failed",
				affected[0], since.Round(time.Millisecond), k.victim)
		}
	}
	if retried == 0 {
		t.Errorf("the round-robin proxy never met the killed replica %s", k.victim)
	}
	return affected, retried
}

// formatRequests formats request numbers, "requests 6, 7", or "none".
func formatRequests(ns []int) string {
	if len(ns) == 0 {
		return "none"
	}
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	if len(ns) == 1 {
		return "request " + s[0]
	}
	return "requests " + strings.Join(s, ", ")
}
