package proxy

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
)

// clientHeader names the test client a request comes from; the proxy
// forwards it upstream like any end-to-end header.
const clientHeader = "X-Test-Client"

// upstreamCall is one call the fake upstream answered.
type upstreamCall struct {
	client, prev string // the test client; the previous_response_id sent, "" for none
}

// callLog records every call the rig's upstream answers.
type callLog struct {
	mu    sync.Mutex
	calls []upstreamCall
}

func recordCalls(r *rig) *callLog {
	l := &callLog{}
	r.setFault(func(req fakeupstream.Request) fakeupstream.Fault {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, upstreamCall{req.Header.Get(clientHeader), gjson.GetBytes(req.Body, "previous_response_id").String()})
		return fakeupstream.Fault{}
	})
	return l
}

// of returns the calls of client.
func (l *callLog) of(client string) []upstreamCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []upstreamCall
	for _, c := range l.calls {
		if c.client == client {
			out = append(out, c)
		}
	}
	return out
}

// continued counts the calls of client sent as a continuation.
func (l *callLog) continued(client string) int {
	n := 0
	for _, c := range l.of(client) {
		if c.prev != "" {
			n++
		}
	}
	return n
}

// testClient returns a conversation of client under credential auth
// ("" for none) naming session ("" for none).
func testClient(t *testing.T, url, client, auth, session string) *conversation {
	c := newConversation(t, url, session, false, true)
	c.header = http.Header{clientHeader: {client}}
	if session != "" {
		c.header.Set("X-Session-Id", session)
	}
	if auth != "" {
		c.header.Set("Authorization", auth)
	}
	return c
}

// responseIDs returns the ids of the responses c got.
func (c *conversation) responseIDs() map[string]bool {
	ids := map[string]bool{}
	for _, a := range c.answers {
		var id string
		require.NoError(c.t, json.Unmarshal(a.response["id"], &id))
		ids[id] = true
	}
	return ids
}

// send posts one request of c's client with c's prompt and input, outside
// its conversation, and requires it answered.
func (c *conversation) send(override map[string]any, input ...any) answer {
	c.t.Helper()
	a := c.request(override, input...)
	require.Equal(c.t, http.StatusOK, a.status, "%s", a.body)
	return a
}

// request posts one request of c's client with c's prompt and input,
// outside its conversation, and returns its answer, whatever its status.
func (c *conversation) request(override map[string]any, input ...any) answer {
	c.t.Helper()
	body := map[string]any{"input": input}
	for k, v := range c.params {
		body[k] = v
	}
	for k, v := range override {
		body[k] = v
	}
	return post(c.t, c.url, c.header, body)
}

// assertAllLaterTurnsContinued checks that every call of c after its first
// went upstream as a continuation of one of c's own responses.
func assertAllLaterTurnsContinued(t *testing.T, l *callLog, client string, c *conversation) {
	t.Helper()
	calls := l.of(client)
	require.Len(t, calls, len(c.answers))
	assert.Empty(t, calls[0].prev)
	ids := c.responseIDs()
	for i, call := range calls[1:] {
		assert.True(t, ids[call.prev], "call %d of %s: previous_response_id %q is not one of its responses", i+1, client, call.prev)
	}
}

// assertApart checks that client "a" (conversation a) and client "b" kept
// their conversations apart: every later turn of a's continued one of
// its own responses, no call of b's continued one of a's, and b's own
// turns continued.
func assertApart(t *testing.T, log *callLog, a *conversation) {
	t.Helper()
	assertAllLaterTurnsContinued(t, log, "a", a)
	ids := a.responseIDs()
	for _, call := range log.of("b") {
		assert.False(t, ids[call.prev], "a call of B continued from A's response %s", call.prev)
	}
	assert.Positive(t, log.continued("b"), "B's own turns continue")
}

func TestCredentialsSharingASessionIDDoNotShareAConversation(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	log := recordCalls(r)
	a := testClient(t, r.url, "a", "Bearer sk-a", "s1")
	b := testClient(t, r.url, "b", "Bearer sk-b", "s1")
	a.say("hello")
	b.say("hello")
	a.say("again")
	// B sends A's whole conversation and one more message: under one owner
	// it would continue from A's last response.
	b.send(nil, append(a.history, map[string]any{"role": "user", "content": "mine now"})...)
	// B's junk under the same session id: other items, another prompt.
	b.send(nil, map[string]any{"role": "user", "content": "unrelated"})
	b.send(map[string]any{"instructions": "classify the message"}, map[string]any{"role": "user", "content": "x"})
	a.say("third")
	b.say("again")

	assertApart(t, log, a)
}

// A credential carried elsewhere than in the known credential headers
// scopes the owner too: in the query, a cookie, a gateway's own header.
func TestCredentialsElsewhereDoNotShareAConversation(t *testing.T) {
	for _, carrier := range []string{"query", "Cookie", "Helicone-Auth"} {
		t.Run(carrier, func(t *testing.T) {
			r := newRig(t, overHTTP, nil)
			log := recordCalls(r)
			client := func(name, key string) *conversation {
				if carrier == "query" {
					return testClient(t, r.url+"?key="+key, name, "", "")
				}
				c := testClient(t, r.url, name, "", "")
				c.header.Set(carrier, key)
				return c
			}
			a, b := client("a", "sk-a"), client("b", "sk-b")
			a.say("hello")
			a.say("again")
			// B sends A's whole conversation and one more message: under
			// one owner it would continue from A's last response.
			b.send(nil, append(a.history, map[string]any{"role": "user", "content": "mine now"})...)
			b.say("hello")
			b.say("again")
			a.say("third")

			assertApart(t, log, a)
		})
	}
}

func TestAClientWithoutSessionIDContinues(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	log := recordCalls(r)
	c := testClient(t, r.url, "c", "Bearer sk-c", "")
	c.say("hello")
	c.say("again")
	c.say("third")
	assertAllLaterTurnsContinued(t, log, "c", c)

	// Another conversation of the same client, opening otherwise, is
	// another owner: it leaves c's continuation in place.
	other := testClient(t, r.url, "other", "Bearer sk-c", "")
	other.say("something else")
	c.say("fourth")
	assertAllLaterTurnsContinued(t, log, "c", c)
	assertAllLaterTurnsContinued(t, log, "other", other)
	st := r.proxy.Stats()
	assert.Equal(t, st.Turns-2, st.Continued, "every turn after each conversation's first continued")
}

func TestASideCallLeavesTheMainThreadInPlace(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	log := recordCalls(r)
	a := testClient(t, r.url, "a", "Bearer sk-a", "s1")
	a.say("hello")
	// A title request under the same session: other instructions, the
	// first message.
	side := testClient(t, r.url, "side", "Bearer sk-a", "s1")
	side.params["instructions"] = "Generate a title for this conversation."
	delete(side.params, "tools")
	side.answers = append(side.answers, side.send(nil, map[string]any{"role": "user", "content": "hello"}))
	a.say("again")
	assertAllLaterTurnsContinued(t, log, "a", a)
	assert.Zero(t, log.continued("side"))
}

func TestSubAgentsKeepOwnersOfTheirOwn(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	log := recordCalls(r)
	main := testClient(t, r.url, "main", "Bearer sk-a", "s1")
	helper := testClient(t, r.url, "helper", "Bearer sk-a", "s1")
	helper.header.Set("X-Agent-Id", "helper")
	main.say("hello")
	helper.say("hello")
	main.say("again")
	helper.say("again")
	// The same agent id under another credential is another owner.
	intruder := testClient(t, r.url, "intruder", "Bearer sk-b", "s1")
	intruder.header.Set("X-Agent-Id", "helper")
	intruder.answers = append(intruder.answers,
		intruder.send(nil, append(helper.history, map[string]any{"role": "user", "content": "mine now"})...))
	helper.say("third")
	assertAllLaterTurnsContinued(t, log, "main", main)
	assertAllLaterTurnsContinued(t, log, "helper", helper)
	assert.Zero(t, log.continued("intruder"))
}
