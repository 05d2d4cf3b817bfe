//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// counters are contproxy's own counters (GET /metrics), summed over the
// replicas of a stack.
type counters struct {
	turns, continued, retries, upstreamErrors, itemsReceived, itemsSent int
	// forwarded counts the turns a replica handed to the replica holding
	// their socket, answered there; forwardFailures those it could not hand
	// over and served itself with the full context; forwardedIn the turns a
	// replica carried for another.
	forwarded, forwardFailures, forwardedIn int
	// guessed counts the turns a replica sent upstream on its last record
	// of their owner while Redis reserved them; guessesOverruled those whose
	// reservation disagreed (the turn kept the guess's answer).
	guessed, guessesOverruled int
}

// fields maps the Prometheus names of the counters to their fields.
func (c *counters) fields() map[string]*int {
	return map[string]*int{
		"contproxy_turns_total":                &c.turns,
		"contproxy_turns_continued_total":      &c.continued,
		"contproxy_full_context_retries_total": &c.retries,
		"contproxy_upstream_errors_total":      &c.upstreamErrors,
		"contproxy_input_items_received_total": &c.itemsReceived,
		"contproxy_input_items_sent_total":     &c.itemsSent,
		"contproxy_forwarded_total":            &c.forwarded,
		"contproxy_forward_failures_total":     &c.forwardFailures,
		"contproxy_forwarded_in_total":         &c.forwardedIn,
		"contproxy_turns_guessed_total":        &c.guessed,
		"contproxy_guesses_overruled_total":    &c.guessesOverruled,
	}
}

// sub returns c - o.
func (c counters) sub(o counters) counters {
	of := o.fields()
	for name, f := range c.fields() {
		*f -= *of[name]
	}
	return c
}

// add adds o to c.
func (c *counters) add(o counters) {
	of := o.fields()
	for name, f := range c.fields() {
		*f += *of[name]
	}
}

// scrape adds the counters of the contproxy at base to c.
func (c *counters) scrape(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	fields := c.fields()
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		field := fields[name]
		if !ok || field == nil {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("GET %s/metrics: %s: %v", base, name, err)
		}
		*field += int(v)
		found++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if found != len(fields) {
		return fmt.Errorf("GET %s/metrics: %d of the %d contproxy counters", base, found, len(fields))
	}
	return nil
}

// countersTimeout bounds the wait for contproxy's counters to account for a
// client run: a turn is counted once it is over, which may be after the
// client has what it needs.
const countersTimeout = 10 * time.Second

// counters returns the counters of the stack's replicas, summed; a killed
// replica's are those read just before it was killed.
func (st *stack) counters(ctx context.Context) (counters, error) {
	var c counters
	for _, r := range st.replicas {
		if final := r.finalCounters(); final != nil {
			c.add(*final)
		} else if err := c.scrape(ctx, r.ops); err != nil {
			return c, err
		}
	}
	return c, nil
}

// settle polls the stack's counters until they account for run r (as many
// turns as requests, as many continued turns and items as the client and
// the upstream saw) or countersTimeout passes, and returns their change
// since before.
func (st *stack) settle(ctx context.Context, before counters, r *runResult) (counters, error) {
	deadline := time.Now().Add(countersTimeout)
	for {
		now, err := st.counters(ctx)
		if err != nil {
			return counters{}, err
		}
		d := now.sub(before)
		if d.turns >= r.requests && d.continued >= r.continued && d.itemsReceived >= r.itemsFull &&
			d.itemsSent >= r.itemsUp || time.Now().After(deadline) {
			return d, nil
		}
		time.Sleep(pollInterval)
	}
}

// compare adds to r's mismatches where contproxy's counters d disagree
// with what the client and the upstream saw.
func (d counters) compare(r *runResult) {
	add := func(format string, args ...any) { r.mismatches = append(r.mismatches, fmt.Sprintf(format, args...)) }
	if d.continued != r.continued {
		add("contproxy counts %d continued turns, the upstream answered %d", d.continued, r.continued)
	}
	if d.itemsReceived != r.itemsFull {
		add("contproxy counts %d input items received, the client sent %d", d.itemsReceived, r.itemsFull)
	}
	// contproxy counts the items of every attempt that reached the
	// upstream: a refused continuation counts its delta as well as the
	// full context sent after it; a forward the origin did not take counts
	// nothing.
	if d.itemsSent < r.itemsUp || d.retries == 0 && d.itemsSent != r.itemsUp {
		add("contproxy counts %d input items sent upstream, the upstream got %d", d.itemsSent, r.itemsUp)
	}
	if d.upstreamErrors != 0 {
		add("contproxy counts %d upstream errors", d.upstreamErrors)
	}
	if d.forwarded > d.forwardedIn {
		add("contproxy counts %d turns forwarded but %d carried for another replica", d.forwarded, d.forwardedIn)
	}
	if d.forwarded > d.continued {
		add("contproxy counts %d turns forwarded but %d continued", d.forwarded, d.continued)
	}
}
