//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/contstore/contstore/internal/redistest"
)

// The conversations of TestAddedLatency: per target and mode, warm-up
// conversations, then measured ones of latencyUserTurns user messages,
// each answered after latencyToolCalls function calls.
const (
	latencyWarmup        = 2
	latencyConversations = 40
	latencyUserTurns     = 5
	latencyToolCalls     = 1
)

// latencyTarget is where TestAddedLatency sends its conversations.
type latencyTarget struct {
	name, about string
	baseURL     string // …/v1
}

// TestAddedLatency measures the latency contproxy adds to a turn: the same
// Go SDK conversations (store=true, non-streaming and streaming) go
// straight to the fake upstream, through a contproxy with in-process state,
// through one on Redis and through one on Redis with -guess-owners 0,
// interleaved so that the machine's load weighs on all of them alike. It
// logs the per-request p50 and p99 of each and what the proxies add; it
// asserts nothing about time. On Redis, at least 98% of the continued
// turns must have gone upstream on the replica's guess (it guesses once
// owners have stayed a few turns), and at most 1% of the guesses be
// overruled.
func TestAddedLatency(t *testing.T) {
	addr := redisAddr(t)
	ns := redistest.Namespace(t)
	cleanNamespace(t, addr, ns)
	dir := t.TempDir()
	up := startUpstream(t, dir, "fakeupstream", latencyToolCalls)
	guessing := startContproxy(t, dir, replicaConfig{
		name: "latency-redis", upstream: up.url("http"), redis: addr, namespace: ns, logLevel: "warn",
	})
	targets := []latencyTarget{
		{name: "direct", about: "the fake upstream itself", baseURL: up.url("http")},
		{name: "memory", about: "contproxy, in-process state", baseURL: startContproxy(t, dir, replicaConfig{
			name: "latency-memory", upstream: up.url("http"), logLevel: "warn",
		}).base + "/v1"},
		{name: "redis", about: "contproxy on Redis", baseURL: guessing.base + "/v1"},
		{name: "redis-no-guesses", about: "contproxy on Redis, -guess-owners 0", baseURL: startContproxy(t, dir, replicaConfig{
			name: "latency-redis-no-guesses", upstream: up.url("http"), redis: addr, namespace: ns, logLevel: "warn", noGuesses: true,
		}).base + "/v1"},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	var rows [][]string
	for _, stream := range []bool{false, true} {
		mode := "json"
		if stream {
			mode = "stream"
		}
		latencies := make([][]time.Duration, len(targets))
		for conv := range latencyWarmup + latencyConversations {
			for i, tg := range targets {
				session := fmt.Sprintf("latency-%s-%s-%d", tg.name, mode, conv)
				if conv < latencyWarmup {
					session = fmt.Sprintf("warmup-%s-%s-%d", tg.name, mode, conv)
				}
				c := &goConversation{client: newGoClient(tg.baseURL), session: session, store: true, stream: stream}
				for k := range latencyUserTurns {
					if _, err := c.userTurn(ctx, fmt.Sprintf("Latency check %d.", k+1)); err != nil {
						t.Fatalf("%s: %v", tg.about, err)
					}
				}
				if conv >= latencyWarmup {
					latencies[i] = append(latencies[i], c.latencies...)
				}
			}
		}
		calls, err := readTrace(up.trace)
		if err != nil {
			t.Fatal(err)
		}
		base50, base99 := percentile(latencies[0], 0.50), percentile(latencies[0], 0.99)
		for i, tg := range targets {
			p50, p99 := percentile(latencies[i], 0.50), percentile(latencies[i], 0.99)
			added := "-"
			if i > 0 {
				added = fmt.Sprintf("%s / %s", ms(p50-base50), ms(p99-base99))
			}
			rows = append(rows, []string{mode, tg.name + " (" + tg.about + ")", strconv.Itoa(len(latencies[i])),
				ms(p50), ms(p99), added, continuedOf(calls, fmt.Sprintf("latency-%s-%s-", tg.name, mode))})
		}
	}
	var c counters
	if err := c.scrape(ctx, guessing.ops); err != nil {
		t.Fatal(err)
	}
	// The replica's first few continued turns go before it guesses, and a
	// store call that times out on a loaded machine costs the next turn's
	// guess: 2% is left for those.
	if c.continued == 0 || 100*c.guessed < 98*c.continued || 100*c.guessesOverruled > c.guessed {
		t.Errorf("on Redis: %d turns continued, %d sent on a guess, %d guesses overruled; want at least 98%% guessed, at most 1%% overruled",
			c.continued, c.guessed, c.guessesOverruled)
	}
	table := markdownTable([]string{"mode", "target", "requests", "p50", "p99", "added p50 / p99", "later turns continued"}, rows)
	about := fmt.Sprintf("Go SDK, store=true, HTTP upstream; per target and mode %d conversations of %d user messages, "+
		"each answered after %d function call(s), after %d warm-up conversations; one request at a time, the targets in turn",
		latencyConversations, latencyUserTurns, latencyToolCalls, latencyWarmup)
	t.Logf("latency per request, %s:\n%s", about, table)
	report.add(fmt.Sprintf("## Added latency\n\nLatency per request (%s).\n\n%s", about, table))
}

// percentile returns the p-quantile of ds (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// continuedOf formats how many later turns of the sessions starting with
// prefix were continued upstream.
func continuedOf(calls []upstreamCall, prefix string) string {
	owners := map[string]bool{}
	turns, continued := 0, 0
	for _, c := range calls {
		if !strings.HasPrefix(c.owner.Session, prefix) {
			continue
		}
		owners[c.owner.Session] = true
		turns++
		if c.previous != "" {
			continued++
		}
	}
	later := turns - len(owners)
	return fmt.Sprintf("%d of %d (%s)", continued, later, percent(continued, later))
}
