package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/store"
)

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1760000000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func testLearner(t *testing.T, cfg Learning) (*learner, *clock) {
	t.Helper()
	c := newClock()
	cfg.Now = c.Now
	require.NoError(t, cfg.check())
	return newLearner(cfg), c
}

// allowed returns allow's answer as "continue", "probe" or "full".
func allowed(l *learner, model string) string {
	switch ok, probe := l.allow(lm(model)); {
	case probe:
		return "probe"
	case ok:
		return "continue"
	}
	return "full"
}

// lm is model learned for the account that sends no account headers.
func lm(model string) learned { return learnedOf(http.Header{}, "", model) }

func TestLearnerPausesAfterRefusalsInARowAndProbes(t *testing.T) {
	l, c := testLearner(t, Learning{})
	// Two refusals, then an accepted continuation: the count starts over.
	for range 2 {
		what, _ := l.refused(lm("m"), false)
		assert.Equal(t, unchanged, what)
	}
	assert.Equal(t, unchanged, l.accepted(lm("m")))
	for range 2 {
		l.refused(lm("m"), false)
	}
	assert.Equal(t, "continue", allowed(l, "m"))
	what, pause := l.refused(lm("m"), false)
	assert.Equal(t, paused, what)
	assert.Equal(t, time.Minute, pause)
	assert.Equal(t, "full", allowed(l, "m"))
	assert.Equal(t, "continue", allowed(l, "other"), "models are learned apart")
	other := learnedOf(http.Header{"Authorization": {"Bearer sk-b"}}, "", "m")
	assert.NotEqual(t, lm("m"), other)
	assert.Equal(t, other, learnedOf(http.Header{"Authorization": {"Bearer sk-b"}, "X-Session-Id": {"s"}}, "", "m"))
	ok, _ := l.allow(other)
	assert.True(t, ok, "accounts are learned apart: one whose responses are gone pauses no other")
	byQuery := learnedOf(http.Header{}, "key=sk-b", "m")
	assert.NotEqual(t, lm("m"), byQuery, "a key in the query names an account")
	ok, _ = l.allow(byQuery)
	assert.True(t, ok)
	assert.Equal(t, []string{"m"}, l.pausedModels())

	// A turn sent continued before the pause and refused now does not
	// lengthen it.
	what, _ = l.refused(lm("m"), false)
	assert.Equal(t, unchanged, what)

	// Each refused probe doubles the pause, up to an hour.
	want := time.Minute
	for range 8 {
		c.advance(want - time.Second)
		require.Equal(t, "full", allowed(l, "m"), "paused for %v", want)
		c.advance(time.Second)
		require.Equal(t, "probe", allowed(l, "m"))
		require.Equal(t, "full", allowed(l, "m"), "one probe at a time")
		what, pause := l.refused(lm("m"), true)
		want = min(2*want, time.Hour)
		require.Equal(t, extended, what)
		require.Equal(t, want, pause)
	}
	assert.Equal(t, time.Hour, want)

	// A probe that gets no verdict lets the next turn probe.
	c.advance(time.Hour)
	assert.Equal(t, "probe", allowed(l, "m"))
	l.undecided(lm("m"))
	assert.Equal(t, "probe", allowed(l, "m"))
	// An accepted probe ends the pause and the learner forgets the model.
	assert.Equal(t, resumed, l.accepted(lm("m")))
	assert.Equal(t, "continue", allowed(l, "m"))
	assert.Empty(t, l.pausedModels())
	what, _ = l.refused(lm("m"), false)
	assert.Equal(t, unchanged, what, "three refusals in a row again")
}

func TestLearnerSettings(t *testing.T) {
	l, _ := testLearner(t, Learning{Refusals: -1})
	for range 10 {
		l.refused(lm("m"), false)
	}
	assert.Equal(t, "continue", allowed(l, "m"), "negative Refusals never pauses")

	l, c := testLearner(t, Learning{Refusals: 1, Cooldown: time.Second, MaxCooldown: 3 * time.Second})
	what, pause := l.refused(lm("m"), false)
	assert.Equal(t, paused, what)
	assert.Equal(t, time.Second, pause)
	for _, want := range []time.Duration{2 * time.Second, 3 * time.Second, 3 * time.Second} {
		c.advance(time.Hour)
		require.Equal(t, "probe", allowed(l, "m"))
		_, pause = l.refused(lm("m"), true)
		assert.Equal(t, want, pause)
	}

	cfg := Learning{Cooldown: 2 * time.Hour}
	require.NoError(t, cfg.check())
	assert.Equal(t, 3, cfg.Refusals)
	assert.Equal(t, 2*time.Hour, cfg.MaxCooldown, "never below Cooldown")
	assert.NotNil(t, cfg.Now)
	for _, bad := range []Learning{{Cooldown: -1}, {MaxCooldown: -1}, {Cooldown: time.Hour, MaxCooldown: time.Minute}} {
		assert.ErrorIs(t, bad.check(), ErrInvalidConfig, "%+v", bad)
	}
}

func TestLearnerKeepsABoundedNumberOfModels(t *testing.T) {
	l, _ := testLearner(t, Learning{Refusals: 1})
	for i := range maxLearnedModels + 10 {
		l.refused(lm(fmt.Sprint("m", i)), false)
	}
	assert.Len(t, l.pausedModels(), maxLearnedModels)
	assert.Equal(t, "continue", allowed(l, fmt.Sprint("m", maxLearnedModels)), "past the bound, a model is not learned")

	// Models refused once, never paused, make room for new ones.
	l, _ = testLearner(t, Learning{Refusals: 2})
	for i := range maxLearnedModels {
		l.refused(lm(fmt.Sprint("m", i)), false)
	}
	for range 2 {
		l.refused(lm("new"), false)
	}
	assert.Equal(t, []string{"new"}, l.pausedModels())
	assert.Len(t, l.models, maxLearnedModels)
}

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many lines hold s.
func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// learnRig is a proxy with a clock and a log in front of an upstream.
type learnRig struct {
	proxy *Proxy
	url   string
	clock *clock
	log   *logBuffer
	store *store.Store
}

// newLearnRig starts a proxy over tr in front of upstream, configured by
// cfg (Store, Upstream, Logger and the learner's clock are filled in).
func newLearnRig(t *testing.T, tr transport, upstream http.Handler, cfg Config) *learnRig {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	r := &learnRig{clock: newClock(), log: &logBuffer{}, store: st}
	base := up.URL + "/v1"
	switch tr {
	case overHTTP:
		cfg.Upstream, err = NewHTTPUpstream(base, nil)
	case overWebSocket:
		cfg.Upstream, err = NewWebSocketUpstream("ws"+strings.TrimPrefix(base, "http"),
			WebSocketOptions{Replica: "r1", Sockets: 2})
	}
	require.NoError(t, err)
	cfg.Store = st
	cfg.Logger = slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Learning.Now = r.clock.Now
	r.proxy, err = New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.proxy.Close() })
	srv := httptest.NewServer(r.proxy)
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/v1/responses"
	return r
}

// playUntilPaused plays c's first two user turns, of three turns each
// (two tool calls), in front of an upstream that refuses every
// continuation: the 2nd and 3rd turns are refused and sent again, the
// 4th too, which pauses continuing; the 5th and 6th go in full.
func playUntilPaused(t *testing.T, r *learnRig, c *conversation) Stats {
	t.Helper()
	c.say("turn 0")
	c.say("turn 1")
	st := r.proxy.Stats()
	require.Equal(t, int64(6), st.Turns)
	require.Equal(t, int64(3), st.FullContextRetries)
	require.Equal(t, int64(2), st.ContinuationsPaused)
	require.Equal(t, []string{"gpt-test"}, r.proxy.PausedModels())
	return st
}

const pauseLine = `level=WARN msg="upstream refuses continuations; sending full context for 1m0s" model=gpt-test`

// In front of an upstream that keeps no responses, the proxy stops
// continuing after three refusals, says so once, and probes once per
// cooldown: about one upstream request per client turn.
func TestAnUpstreamThatKeepsNoResponsesIsLearned(t *testing.T) {
	for _, tc := range []struct {
		tr            transport
		stream, store bool
	}{
		{overHTTP, false, true},
		{overWebSocket, true, false},
	} {
		t.Run(fmt.Sprintf("%s/stream=%v/store=%v", tc.tr, tc.stream, tc.store), func(t *testing.T) {
			fake := fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}, KeepsNoResponses: true})
			r := newLearnRig(t, tc.tr, fake, Config{})
			c := newConversation(t, r.url, "s1", tc.stream, tc.store)
			st := playUntilPaused(t, r, c)
			require.Equal(t, int64(9), fake.Calls())
			turns0, calls0 := st.Turns, fake.Calls()

			for i := range 11 {
				c.say(fmt.Sprint("more ", i))
			}
			st = r.proxy.Stats()
			assert.Equal(t, st.Turns-turns0, fake.Calls()-calls0, "one upstream request per turn while paused")
			assert.Equal(t, int64(3), st.FullContextRetries)
			assert.Zero(t, st.Continued)

			// After the cooldown, one probe, refused: the pause doubles.
			r.clock.advance(time.Minute)
			retries, calls, turns := st.FullContextRetries, fake.Calls(), st.Turns
			c.say("after a minute")
			st = r.proxy.Stats()
			assert.Equal(t, retries+1, st.FullContextRetries, "exactly one probe, refused")
			assert.Equal(t, st.Turns-turns+1, fake.Calls()-calls)
			r.clock.advance(time.Minute)
			c.say("a minute later")
			assert.Equal(t, retries+1, r.proxy.Stats().FullContextRetries, "the pause is two minutes now")
			r.clock.advance(time.Minute)
			c.say("two minutes later")
			st = r.proxy.Stats()
			assert.Equal(t, retries+2, st.FullContextRetries, "the second probe")

			turns, calls = st.Turns-turns0, fake.Calls()-calls0
			require.GreaterOrEqual(t, turns, int64(40))
			assert.LessOrEqual(t, float64(calls)/float64(turns), 1.05, "%d upstream requests for %d turns", calls, turns)
			assert.Equal(t, st.Turns-4-2, st.ContinuationsPaused, "every turn after the 4th but the probes")
			assert.Equal(t, 1, r.log.count(pauseLine), "the pause is said once")
			assert.Equal(t, 1, r.log.count("upstream refuses continuations"))
			assert.Zero(t, r.log.count("accepts continuations again"))
			assert.Equal(t, 2, r.log.count("upstream still refuses continuations; pause extended"))
			assert.Equal(t, st.ContinuationsPaused, int64(r.log.count("reason=continuation_paused")))
		})
	}
}

// refusing answers every continuation with the not-found error while on,
// and hands everything else to next.
type refusing struct {
	on   atomic.Bool
	next http.Handler
}

func (h *refusing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if prev := gjson.GetBytes(body, "previous_response_id").String(); prev != "" && h.on.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"Previous response with id '%s' not found.","type":"invalid_request_error",`+
			`"param":"previous_response_id","code":"previous_response_not_found"}}`, prev)
		return
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	h.next.ServeHTTP(w, r)
}

// An upstream that continues again is found by the next probe, and said so
// once.
func TestAProbeAcceptedResumesContinuing(t *testing.T) {
	up := &refusing{next: fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}})}
	up.on.Store(true)
	r := newLearnRig(t, overHTTP, up, Config{})
	c := newConversation(t, r.url, "s1", true, true)
	c.say("hello")
	c.say("again")
	require.Equal(t, int64(2), r.proxy.Stats().ContinuationsPaused)
	up.on.Store(false)
	c.say("still paused")
	st := r.proxy.Stats()
	assert.Zero(t, st.Continued, "no probe before the cooldown")
	r.clock.advance(time.Minute)
	c.say("probe")
	c.say("continuing")
	after := r.proxy.Stats()
	assert.Equal(t, int64(6), after.Continued, "the probe and every turn after it continue")
	assert.Equal(t, st.ContinuationsPaused, after.ContinuationsPaused)
	assert.Empty(t, r.proxy.PausedModels())
	assert.Equal(t, 1, r.log.count(pauseLine))
	assert.Equal(t, 1, r.log.count(`level=INFO msg="upstream accepts continuations again; continuing" model=gpt-test`))
}

// With NoContinuation nothing continues, even in front of an upstream
// that could, and the store is not used. The input is not read: an item
// with a duplicate key, which the fingerprint scanner refuses and JSON
// decoders accept, goes upstream as received, and no item is counted.
func TestNoContinuationNeverContinues(t *testing.T) {
	for _, tr := range []transport{overHTTP, overWebSocket} {
		t.Run(string(tr), func(t *testing.T) {
			fake := fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}})
			r := newLearnRig(t, tr, fake, Config{NoContinuation: true})
			c := newConversation(t, r.url, "s1", true, tr == overHTTP)
			for i := range 14 {
				c.say(fmt.Sprint("turn ", i))
			}
			st := r.proxy.Stats()
			assert.Equal(t, int64(42), st.Turns)
			assert.Equal(t, st.Turns, fake.Calls(), "each turn once, never refused")
			assert.Zero(t, st.Continued)
			assert.Zero(t, st.FullContextRetries)
			assert.Zero(t, st.ContinuationsPaused)
			assert.Zero(t, st.ItemsReceived, "the input is not read")
			assert.Zero(t, st.ItemsSent)
			assert.Equal(t, st.BytesReceived, st.BytesSent)
			status, _, _, err := postBytes(t.Context(), r.url, "s1",
				[]byte(`{"model":"gpt-test","input":[{"role":"user","content":"again","content":"again"}]}`))
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, status)
			ss, err := r.store.Stats(t.Context())
			require.NoError(t, err)
			assert.Zero(t, ss.Total.Owners, "nothing reserved")
		})
	}
}

// A model's name is the client's: the learner keeps, logs and exports it
// within maxModelName bytes, two long names kept apart.
func TestLongModelNamesAreBounded(t *testing.T) {
	long := strings.Repeat("m", 1<<20)
	a, b := learnedOf(http.Header{}, "", long+"a"), learnedOf(http.Header{}, "", long+"b")
	assert.LessOrEqual(t, len(a.model), maxModelName)
	assert.NotEqual(t, a, b, "two long names stay apart")
	assert.Equal(t, a, learnedOf(http.Header{}, "", long+"a"))
	assert.True(t, strings.HasPrefix(a.model, "mmm"))
	assert.Equal(t, "gpt-5", learnedOf(http.Header{}, "", "gpt-5").model, "a usual name is kept as it is")
	cut := modelName(strings.Repeat("é", 100)) // cut within a character
	assert.True(t, utf8.ValidString(cut), "%q", cut)
	assert.Equal(t, "m\uFFFD", modelName("m\xff"))

	cfg := Learning{Refusals: 1}
	require.NoError(t, cfg.check())
	l := newLearner(cfg)
	l.refused(a, false)
	assert.Equal(t, []string{a.model}, l.pausedModels())
}

// A turn sent on its guess went while continuing was open for its model;
// it keeps that answer, so its gate pauses nothing, and notes the
// upstream's verdict under its model, whatever its reservation decided.
func TestAGuessedTurnsGateIsItsModels(t *testing.T) {
	st, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	p := newProxy(t, overHTTP, st, "http://127.0.0.1:1/v1")
	h := http.Header{"Authorization": {"Bearer sk-gate"}}
	model := learnedOf(h, "", "gpt-test")
	for range 3 {
		p.learn.refused(model, false)
	}
	require.False(t, p.learn.open(model), "paused")
	req, err := st.ParseRequest([]byte(`{"model":"gpt-test","input":"hi"}`))
	require.NoError(t, err)
	who, err := identity.Main("s-gate")
	require.NoError(t, err)
	res := st.Reserve(t.Context(), who, req)
	require.False(t, res.Continues(), "the reservation does not continue")
	g := p.gate(&turn{target: target{header: h}, res: res, early: &early{}})
	assert.Equal(t, model, g.model)
	assert.False(t, g.paused)
}

// keepsNoneWording is an upstream that keeps no responses and refuses a
// previous_response_id with status and body, or, with status 0, passes
// over it and answers from the request's input alone.
func keepsNoneWording(status int, body string) http.Handler {
	fake := fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		prev := gjson.GetBytes(b, "previous_response_id").String()
		if prev == "" || r.Method != http.MethodPost {
			r.Body = io.NopCloser(bytes.NewReader(b))
			fake.ServeHTTP(w, r)
			return
		}
		if status == 0 {
			b, _ = sjson.DeleteBytes(b, "previous_response_id")
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			fake.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, strings.ReplaceAll(body, "PREV", prev))
	})
}

// However an upstream words its refusal of a previous response it does
// not hold, or when it passes over the previous_response_id, the turn is
// sent again with the full context, unseen by the client, and the proxy
// learns to stop continuing, as with previous_response_not_found.
func TestAnUpstreamThatRefusesInItsOwnWordsIsLearned(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"404 naming the response", http.StatusNotFound,
			`{"error":{"message":"Response with id 'PREV' not found.","type":"invalid_request_error","param":null,"code":null}}`},
		{"400 with a code of its own", http.StatusBadRequest,
			`{"error":{"message":"Not found.","type":"invalid_request_error","param":null,"code":"response_not_found"}}`},
		{"404 naming nothing", http.StatusNotFound, `{"error":{"message":"Not Found","code":null}}`},
		{"422 validation error", http.StatusUnprocessableEntity,
			`{"detail":[{"type":"value_error","loc":["body","previous_response_id"],"msg":"unknown response"}]}`},
		{"passes over it", 0, ""},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				r := newLearnRig(t, overHTTP, keepsNoneWording(tc.status, tc.body), Config{})
				playUntilPaused(t, r, newConversation(t, r.url, "s1", stream, true))
				assert.Equal(t, 1, r.log.count(pauseLine), "the pause is said once")
			})
		}
	}
}

// An error about another parameter, on a continued turn, is the client's
// answer, sent once; an error the full context gets too, on the turn
// sent again, was not the continuation's: it pauses nothing.
func TestAContinuedTurnsOwnErrorsAreNotRefusals(t *testing.T) {
	var calls atomic.Int64
	var failing atomic.Value
	failing.Store("")
	fake := fakeupstream.New(fakeupstream.Options{})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if body := failing.Load().(string); body != "" {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, body)
			return
		}
		fake.ServeHTTP(w, r)
	})
	r := newLearnRig(t, overHTTP, up, Config{})
	c := newConversation(t, r.url, "s1", false, true)
	c.say("hello")
	turn := func(text string) answer {
		return c.request(nil, append(c.history, map[string]any{"role": "user", "content": text})...)
	}

	failing.Store(`{"error":{"message":"Invalid temperature.","type":"invalid_request_error","param":"temperature","code":null}}`)
	before := calls.Load()
	a := turn("one")
	assert.Equal(t, http.StatusBadRequest, a.status)
	assert.Equal(t, "temperature", gjson.GetBytes(a.body, "error.param").String())
	assert.Equal(t, before+1, calls.Load(), "sent once")
	assert.Zero(t, r.proxy.Stats().FullContextRetries)

	for i := range 4 {
		failing.Store("")
		c.say(fmt.Sprint("fine ", i))
		failing.Store(`{"error":{"message":"Bad request.","type":"invalid_request_error","param":null,"code":null}}`)
		before = calls.Load()
		a = turn(fmt.Sprint("two ", i))
		assert.Equal(t, http.StatusBadRequest, a.status)
		assert.Equal(t, before+2, calls.Load(), "continued, then sent with the full context")
	}
	assert.Equal(t, int64(4), r.proxy.Stats().FullContextRetries)
	assert.Empty(t, r.proxy.PausedModels(), "the full context was refused too: nothing learned")
}
