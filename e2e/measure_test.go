//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/contstore/contstore/internal/fakeupstream"
)

// upstreamCall is one call the fake upstream answered, from its trace.
type upstreamCall struct {
	// owner is the conversation owner the upstream attributed the call to.
	owner fakeupstream.Owner
	// transport is "http" or "websocket".
	transport string
	// previous is the request's previous_response_id.
	previous string
	// store is the request's store member, nil when absent.
	store *bool
	// items and bytes are the input items and the body the upstream got.
	items, bytes int
	// seen is, when the answer is a message, the number of items of the
	// conversation the upstream resolved (its transcript of previous plus
	// the input), as the fake model says it; -1 otherwise.
	seen int
	// responseID is the id of the response the upstream answered with.
	responseID string
	// userAgent is the request's User-Agent header.
	userAgent string
	// prompt is the request's prompt: its instructions, else the text of
	// the system and developer messages its input opens with.
	prompt string
}

// seenPattern finds the item count in the fake model's message, "Done with
// message 2 after 3 tool calls (17 items seen). You said: …".
var seenPattern = regexp.MustCompile(`\((\d+) items seen\)`)

// readTrace reads the calls of a fake upstream's trace file.
func readTrace(path string) ([]upstreamCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []upstreamCall
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var line fakeupstream.TraceLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, len(calls)+1, err)
		}
		var req struct {
			PreviousResponseID string `json:"previous_response_id"`
			Store              *bool  `json:"store"`
		}
		if err := json.Unmarshal(line.Request, &req); err != nil {
			return nil, fmt.Errorf("%s:%d: request: %v", path, len(calls)+1, err)
		}
		calls = append(calls, upstreamCall{
			owner:      line.Owner,
			transport:  line.Transport,
			previous:   req.PreviousResponseID,
			store:      req.Store,
			items:      inputItems(line.Request),
			bytes:      len(line.Request),
			seen:       itemsSeen(line.Output),
			responseID: line.ResponseID,
			userAgent:  line.Headers["user-agent"],
			prompt:     promptOf(line.Request),
		})
	}
	return calls, sc.Err()
}

// promptOf returns the prompt of a create-response body: its instructions,
// else the text of the system and developer messages its input opens with
// (the Vercel AI SDK and opencode send the prompt as a developer message).
func promptOf(body []byte) string {
	var req struct {
		Instructions string            `json:"instructions"`
		Input        []json.RawMessage `json:"input"`
	}
	if json.Unmarshal(body, &req) != nil || req.Instructions != "" {
		return req.Instructions
	}
	var b strings.Builder
	for _, raw := range req.Input {
		var item struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &item) != nil || (item.Role != "system" && item.Role != "developer") {
			break
		}
		b.WriteString(item.Role)
		b.WriteString(": ")
		b.Write(item.Content)
		b.WriteString("\n")
	}
	return b.String()
}

// conversation names the conversation of an upstream call.
type conversation struct {
	owner  fakeupstream.Owner
	prompt string
}

// conversationsOf returns the conversation of each call: a call with a
// previous_response_id belongs to the conversation of the call that made
// that response, one without to that of its owner and prompt (a call
// under a session with another prompt, like opencode's title generation,
// holds a conversation of its own).
func conversationsOf(calls []upstreamCall) []conversation {
	of := map[string]conversation{} // response id → conversation
	convs := make([]conversation, len(calls))
	for i, c := range calls {
		k, ok := of[c.previous]
		if c.previous == "" || !ok {
			k = conversation{c.owner, c.prompt}
		}
		convs[i] = k
		of[c.responseID] = k
	}
	return convs
}

// pair returns, for each client request, the index of the upstream call
// that answered it: the calls of each prompt in order, so that requests of
// two conversations in flight at once (opencode's title generation beside
// its first turn) pair with their own answers whatever the order the
// upstream answered them in; -1 for a request left without one.
func pair(calls []clientCall, up []upstreamCall) []int {
	convs := conversationsOf(up)
	used := make([]bool, len(up))
	pairs := make([]int, len(calls))
	for i, c := range calls {
		pairs[i] = -1
		for j := range up {
			if !used[j] && convs[j].prompt == c.prompt {
				used[j], pairs[i] = true, j
				break
			}
		}
	}
	return pairs
}

// itemsSeen returns the number of items the fake model's message in output
// says it saw, -1 when output has no such message.
func itemsSeen(output []json.RawMessage) int {
	for _, raw := range output {
		var item struct {
			Type    string `json:"type"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		if json.Unmarshal(raw, &item) != nil || item.Type != "message" {
			continue
		}
		for _, part := range item.Content {
			if m := seenPattern.FindStringSubmatch(part.Text); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		}
	}
	return -1
}

// runResult is what one client run did, seen by the client, by the
// round-robin proxy and by the fake upstream.
type runResult struct {
	scenario, client string
	// err is the client's own failure, nil when it succeeded.
	err error
	// requests is the number of create-response requests the client sent.
	requests int
	// failures are the errors the client was sent.
	failures []string
	// turns is the number of calls the upstream answered; conversations
	// the number of conversations they belong to (see conversationsOf);
	// continued how many had a previous_response_id.
	turns, conversations, continued int
	// itemsUp and bytesUp are the input items and the body bytes sent
	// upstream; itemsFull and bytesFull what the clients sent, the full
	// context.
	itemsUp, bytesUp, itemsFull, bytesFull int
	// stores are the distinct store values of the upstream requests
	// ("true", "false", "absent").
	stores []string
	// transports are the distinct upstream transports.
	transports []string
	// refused is the number of requests the upstream received but did not
	// answer (a continuation it refused, say), -1 when unknown (the
	// WebSocket upstream does not log its messages).
	refused int
	// retries is the number of continuations the upstream refused and
	// contproxy resent with the full context, by its own count; -1 without
	// contproxy.
	retries int
	// forwarded is the number of turns handed to the replica holding their
	// socket, forwardFailures of those it could not take, by contproxy's
	// count; -1 without forwarding.
	forwarded, forwardFailures int
	// guessed is the number of turns sent upstream on a replica's guess
	// while Redis reserved them, guessesOverruled of those whose
	// reservation disagreed, by contproxy's count; -1 without contproxy or with the
	// WebSocket upstream.
	guessed, guessesOverruled int
	// calls are the client's requests, up the upstream's answers to them,
	// in order.
	calls []clientCall
	up    []upstreamCall
	// mismatches are disagreements between what the client sent and what
	// the upstream saw.
	mismatches []string
}

// later is the number of turns after each conversation's first.
func (r *runResult) later() int { return r.turns - r.conversations }

// rate is the fraction of later turns that were continued.
func (r *runResult) rate() float64 {
	if r.later() <= 0 {
		return 0
	}
	return float64(r.continued) / float64(r.later())
}

// tallyUpstream counts, from r.up, the continued calls, the items and
// bytes sent upstream, the conversations, and the store values and
// transports seen.
func (r *runResult) tallyUpstream() {
	stores, transports := map[string]bool{}, map[string]bool{}
	for _, u := range r.up {
		if u.previous != "" {
			r.continued++
		}
		r.itemsUp += u.items
		r.bytesUp += u.bytes
		store := "absent"
		if u.store != nil {
			store = strconv.FormatBool(*u.store)
		}
		stores[store] = true
		transports[u.transport] = true
	}
	distinct := map[conversation]bool{}
	for _, c := range conversationsOf(r.up) {
		distinct[c] = true
	}
	r.conversations = len(distinct)
	r.stores, r.transports = slices.Sorted(maps.Keys(stores)), slices.Sorted(maps.Keys(transports))
}

// measure compares a client's requests with the upstream calls they made.
// A request answered without previous_response_id must reach the upstream
// with all of its items, and the conversation the upstream resolved for a
// request must have as many items as the client sent.
func measure(scenario, client string, calls []clientCall, up []upstreamCall) runResult {
	r := runResult{scenario: scenario, client: client, requests: len(calls), turns: len(up), calls: calls, up: up}
	for i, c := range calls {
		r.itemsFull += c.items
		r.bytesFull += c.bytes
		if c.failure != "" {
			r.failures = append(r.failures, fmt.Sprintf("request %d: %s", i+1, c.failure))
		}
	}
	r.tallyUpstream()
	if len(up) != len(calls) {
		r.mismatches = append(r.mismatches,
			fmt.Sprintf("the upstream answered %d calls for %d client requests", len(up), len(calls)))
		return r
	}
	for i, j := range pair(calls, up) {
		c := calls[i]
		if j < 0 {
			r.mismatches = append(r.mismatches, fmt.Sprintf("request %d: no upstream call of its prompt answered it", i+1))
			continue
		}
		u := up[j]
		if u.previous == "" && u.items != c.items {
			r.mismatches = append(r.mismatches, fmt.Sprintf(
				"request %d: sent upstream without previous_response_id but with %d of the client's %d items",
				i+1, u.items, c.items))
		}
		if u.seen >= 0 && u.seen != c.items {
			r.mismatches = append(r.mismatches, fmt.Sprintf(
				"request %d: the client sent %d items, the upstream answered a conversation of %d (previous_response_id %q, %d items sent)",
				i+1, c.items, u.seen, u.previous, u.items))
		}
	}
	return r
}

// resultsTable formats runs as a markdown table.
func resultsTable(rows []runResult) string {
	header := []string{"scenario", "client", "ok", "requests", "later turns", "continued",
		"items upstream / full", "bytes upstream / full", "client errors", "refused upstream", "full-context retries",
		"forwarded (failed)", "store", "transport"}
	var cells [][]string
	for _, r := range rows {
		ok := "yes"
		if r.err != nil || len(r.failures) > 0 || len(r.mismatches) > 0 || r.refused > 0 {
			ok = "NO"
		}
		refused, retries, forwarded := "-", "-", "-"
		if r.refused >= 0 {
			refused = strconv.Itoa(r.refused)
		}
		if r.retries >= 0 {
			retries = strconv.Itoa(r.retries)
		}
		if r.forwarded >= 0 {
			forwarded = fmt.Sprintf("%d (%d)", r.forwarded, r.forwardFailures)
		}
		cells = append(cells, []string{
			r.scenario, r.client, ok,
			strconv.Itoa(r.requests),
			strconv.Itoa(r.later()),
			fmt.Sprintf("%d (%.0f%%)", r.continued, 100*r.rate()),
			fmt.Sprintf("%d / %d (%s)", r.itemsUp, r.itemsFull, percent(r.itemsUp, r.itemsFull)),
			fmt.Sprintf("%s / %s (%s)", kib(r.bytesUp), kib(r.bytesFull), percent(r.bytesUp, r.bytesFull)),
			strconv.Itoa(len(r.failures)),
			refused,
			retries,
			forwarded,
			strings.Join(r.stores, ","),
			strings.Join(r.transports, ","),
		})
	}
	return markdownTable(header, cells)
}

// percent formats part/whole as a percentage.
func percent(part, whole int) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

// kib formats a byte count in KiB.
func kib(n int) string { return fmt.Sprintf("%.1f KiB", float64(n)/1024) }

// markdownTable formats a table with aligned columns.
func markdownTable(header []string, rows [][]string) string {
	widths := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, cell := range row {
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		b.WriteString("|")
		for i, cell := range row {
			fmt.Fprintf(&b, " %s%s |", cell, strings.Repeat(" ", widths[i]-len([]rune(cell))))
		}
		b.WriteString("\n")
	}
	line(header)
	rule := make([]string, len(header))
	for i, w := range widths {
		rule[i] = strings.Repeat("-", w)
	}
	line(rule)
	for _, row := range rows {
		line(row)
	}
	return b.String()
}

// report collects the sections of the markdown report, written at the end
// to the file E2E_REPORT names.
var report reportFile

// reportFile is the markdown report.
type reportFile struct {
	mu       sync.Mutex
	sections []string
}

// add appends a section.
func (r *reportFile) add(section string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sections = append(r.sections, section)
}

// write writes the report to path; an empty path or report writes nothing.
func (r *reportFile) write(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if path == "" || len(r.sections) == 0 {
		return nil
	}
	return os.WriteFile(path, []byte(strings.Join(r.sections, "\n")), 0o644)
}
