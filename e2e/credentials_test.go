//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// The two credentials of TestTwoCredentialsOneSession: A, the AI SDK's, and
// B, the junk requests'. The fake upstream does not record credentials, so
// B's requests also carry a User-Agent of their own, which it records.
const (
	credentialA = "key-a"
	credentialB = "key-b"
	userAgentB  = "contstore-e2e-credential-b"
	// promptB is the prompt of B's requests, not A's.
	promptB = "You are another assistant, holding another conversation under the same session id."
)

// junkKind is what credential B sends before each of A's requests in a
// run of TestTwoCredentialsOneSession.
type junkKind int

const (
	// noJunk: A alone.
	noJunk junkKind = iota
	// otherPrompt: B holds a conversation of its own under A's session id
	// with another prompt and no tools, one user message more each time.
	otherPrompt
	// replay: B sends A's previous request again, byte for byte, so that
	// only the credential tells B's turns from A's.
	replay
)

// TestTwoCredentialsOneSession holds, through two replicas sharing Redis
// in front of an HTTP upstream that keeps responses, an AI SDK
// conversation under a session-id header with credential A: alone, then
// (each time under another session id) with a request of credential B
// under the same session id before each of A's requests: a junk request
// of another prompt, or a replay of A's previous request. No upstream call
// of one credential may carry a previous_response_id of a response made
// for the other, and A's requests must go upstream the same way with and
// without B's: the same turns continued, with the same input items.
func TestTwoCredentialsOneSession(t *testing.T) {
	tools := nodeClients(t)
	addr := redisAddr(t)
	const name = "H-http-store-2-replicas-two-credentials"
	st := startStack(t, name, stackConfig{transport: "http", replicas: 2, redis: addr, toolCalls: toolCalls})
	env := clientEnvironment{nodeTools: tools, st: st, store: true}

	alone := credentialRun(t, env, name, "a-alone", "shared-session-1", noJunk)
	mixed := []runResult{
		credentialRun(t, env, name, "a-with-b-other-prompt", "shared-session-2", otherPrompt),
		credentialRun(t, env, name, "a-with-b-replays", "shared-session-3", replay),
	}
	rows := append([]runResult{alone}, mixed...)
	table := resultsTable(rows)
	t.Logf("credential A's AI SDK conversation alone, then with credential B's requests under its session id:\n%s", table)
	report.add("## Two credentials, one session id\n\nThe AI SDK (credential A, session-id header, store as shipped) " +
		"through two replicas: alone; with a junk request of credential B under the same session id and another " +
		"prompt before each of its requests; with B replaying A's previous request before each. The rows count A's " +
		"requests only.\n\n" + table)

	for _, r := range rows {
		if r.err != nil {
			t.Errorf("%s: the client failed: %v", r.client, r.err)
		}
		for _, f := range r.failures {
			t.Errorf("%s: the client was sent an error: %s", r.client, f)
		}
		for _, m := range r.mismatches {
			t.Errorf("%s: %s", r.client, m)
		}
		if r.refused > 0 {
			t.Errorf("%s: the upstream refused %d requests", r.client, r.refused)
		}
	}
	if alone.rate() < 0.95 {
		t.Errorf("alone, A continued %d of %d later turns (%.0f%%), want at least 95%%: B's requests have no continued turns to leave unchanged",
			alone.continued, alone.later(), 100*alone.rate())
	}
	for _, m := range mixed {
		if a, b := sentUpstream(alone), sentUpstream(m); !slices.Equal(a, b) {
			t.Errorf("%s: B's requests changed how A's went upstream (per request: continued or full, input items):\nalone:  %v\nwith B: %v",
				m.client, a, b)
		}
	}

	// No call continues a response made for the other credential.
	calls, err := readTrace(st.up.trace)
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]string{} // response id → the credential it was made for
	crossed, callsB, continuedB := 0, 0, 0
	for i, c := range calls {
		cred := credentialOf(c)
		if cred == "B" {
			callsB++
		}
		if c.previous != "" {
			switch by, ok := made[c.previous]; {
			case !ok:
				t.Errorf("upstream call %d (credential %s) continues %s, which the upstream did not make before", i+1, cred, c.previous)
			case by != cred:
				crossed++
				t.Errorf("upstream call %d of credential %s continues %s, made for credential %s", i+1, cred, c.previous, by)
			case cred == "B":
				continuedB++
			}
		}
		made[c.responseID] = cred
	}
	t.Logf("%d upstream calls, %d of credential B (%d continued), %d continuing a response of the other credential",
		len(calls), callsB, continuedB, crossed)
}

// credentialOf tells which credential an upstream call of
// TestTwoCredentialsOneSession was made with, by its User-Agent.
func credentialOf(c upstreamCall) string {
	if c.userAgent == userAgentB {
		return "B"
	}
	return "A"
}

// sentUpstream describes how each request of r went upstream: continued or
// not, and with how many input items.
func sentUpstream(r runResult) []string {
	var out []string
	for _, u := range r.up {
		how := "full"
		if u.previous != "" {
			how = "continued"
		}
		out = append(out, fmt.Sprintf("%s/%d", how, u.items))
	}
	return out
}

// credentialRun runs aisdk.mjs generate with credential A under session,
// labelled label, a request of credential B of kind junk going to a
// replica, in turn, before each of A's requests. It returns the measure of
// A's requests and what the upstream made of them.
func credentialRun(t *testing.T, e clientEnvironment, scenarioName, label, session string, junk junkKind) runResult {
	t.Helper()
	up := e.st.up
	before := up.mark(t)
	b := &junkConversation{session: session}
	var hook func(n int)
	switch junk {
	case otherPrompt:
		hook = func(n int) {
			b.send(t.Context(), e.st.replicas[n%len(e.st.replicas)].base, n)
		}
	case replay:
		hook = func(n int) {
			if n < 2 {
				return
			}
			previous := e.st.rr.callsOf(label)[n-2]
			b.replay(t.Context(), e.st.replicas[n%len(e.st.replicas)].base, previous.body)
		}
	}
	e.st.rr.begin(label, hook)
	_, runErr := aiSDKRun{mode: "generate", session: session, apiKey: credentialA, label: label}.run(e)
	e.st.rr.begin("", nil)
	calls, posts := up.since(t, before)
	var mine []upstreamCall
	for _, c := range calls {
		if credentialOf(c) == "A" {
			mine = append(mine, c)
		}
	}
	r := measure(scenarioName, label, e.st.rr.callsOf(label), mine)
	r.err = runErr
	r.retries, r.forwarded, r.forwardFailures = -1, -1, -1
	r.refused = max(posts-len(calls), 0)
	for _, f := range b.errors() {
		t.Errorf("%s: a request of credential B: %s", label, f)
	}
	want := map[junkKind]int{noJunk: 0, otherPrompt: r.requests, replay: max(r.requests-1, 0)}[junk]
	if b.sent() != want {
		t.Errorf("%s: credential B sent %d requests, want %d for A's %d", label, b.sent(), want, r.requests)
	}
	return r
}

// junkRequestTimeout bounds one junk request.
const junkRequestTimeout = 60 * time.Second

// junkConversation is credential B's requests under A's session id: its
// own conversation, with another prompt and no tools (each request sends
// the whole history plus a new user message, store true), or replays of
// A's requests.
type junkConversation struct {
	session string

	mu      sync.Mutex
	history []json.RawMessage
	n       int
	failed  []string
}

// send sends the next junk request to the contproxy at base, before A's
// nth request, and keeps the answer in the history.
func (b *junkConversation) send(ctx context.Context, base string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	msg, _ := json.Marshal(map[string]string{"role": "user", "content": fmt.Sprintf("Junk %d, before A's request %d.", b.n, n)})
	b.history = append(b.history, msg)
	body, err := json.Marshal(map[string]any{
		"model":        "gpt-5.1",
		"instructions": promptB,
		"input":        b.history,
		"store":        true,
	})
	if err != nil {
		b.failed = append(b.failed, err.Error())
		return
	}
	output, err := postResponse(ctx, base, b.session, body)
	if err == nil {
		text, _ := json.Marshal(output)
		if !bytes.Contains(text, []byte("Done with message")) {
			err = fmt.Errorf("no answer of the fake model in %s", clip(string(text), 2000))
		}
	}
	if err != nil {
		b.failed = append(b.failed, fmt.Sprintf("junk %d: %v", b.n, err))
		return
	}
	b.history = append(b.history, output...)
}

// replay sends body, a request of A, again with credential B to the
// contproxy at base.
func (b *junkConversation) replay(ctx context.Context, base string, body []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if _, err := postResponse(ctx, base, b.session, body); err != nil {
		b.failed = append(b.failed, fmt.Sprintf("replay %d: %v", b.n, err))
	}
}

// sent returns how many junk requests were sent.
func (b *junkConversation) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// errors returns the failures of the junk requests.
func (b *junkConversation) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.failed)
}

// postResponse sends a create-response request of credential B under
// session (the session-id header, as the AI SDK's) to the contproxy at base
// and returns the response's output items.
func postResponse(ctx context.Context, base, session string, body []byte) ([]json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, junkRequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/responses", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+credentialB)
	req.Header.Set("User-Agent", userAgentB)
	req.Header.Set("Session-Id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(raw))
	}
	var res struct {
		Status string            `json:"status"`
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, err
	}
	if res.Status != "completed" || len(res.Output) == 0 {
		return nil, fmt.Errorf("response %s with %d output items: %s", res.Status, len(res.Output), clip(string(raw), 2000))
	}
	return res.Output, nil
}
