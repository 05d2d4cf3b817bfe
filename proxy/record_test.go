package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// With Affinity, a record that runs on a goroutine of its own is in flight
// under its owner from the moment record returns, before the handler
// writes the end: the owner's next turn, sent the moment the end arrives,
// reserves after it (Proxy.reserve).
func TestARecordIsInFlightOnceStarted(t *testing.T) {
	r, held, _ := newHeldRig(t, lua.Record, store.Options{Namespace: "inflight"}, true)
	st := r.proxy.cfg.Store
	up, ok := r.proxy.cfg.Upstream.(*httpUpstream)
	require.True(t, ok)
	owner, err := identity.Main("s-inflight")
	require.NoError(t, err)
	req, err := st.ParseRequest([]byte(`{"model":"m","input":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	ctx := context.Background()
	res := st.Reserve(ctx, owner, req)
	require.NotZero(t, res.Turn)

	a := &sent{c: &httpConn{up: up, tg: &target{stores: true}}, res: res}
	rec := r.proxy.record(ctx, r.proxy.cfg.Logger, &hold{}, a, outcome{status: 200, continuable: true, id: "resp_1"})
	done := r.proxy.records.pending(owner)
	require.NotNil(t, done, "the record is in flight once record returned")
	select {
	case <-done:
		t.Fatal("the record ended while its call was held")
	default:
	}
	held.let(t, 0)
	rec.end(true, nil)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the record did not end once its call was let go")
	}
	r.proxy.records.waitAll()
	assert.Nil(t, r.proxy.records.pending(owner))
}

// storeOps counts the store operations that reached the store, by kind.
type storeOps struct {
	mu  sync.Mutex
	ops map[store.Op]int
}

func (s *storeOps) Observe(ev store.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ops == nil {
		s.ops = map[store.Op]int{}
	}
	s.ops[ev.Op]++
}

func (*storeOps) BreakerChanged(store.BreakerStatus) {}

func (s *storeOps) count(op store.Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

// A turn the upstream keeps no response of ("store": false) over HTTP can
// be continued by nothing, and its response can continue nothing: the
// store is not asked. Over the WebSocket upstream, which keeps a socket's
// latest response, or with forwarding on, where another replica's socket
// may hold the previous one, it is.
func TestATurnNothingCanContinueAsksTheStoreNothing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tr         transport
		stores     bool
		forwarding bool
		asks       bool
	}{
		{"http/store=false", overHTTP, false, false, false},
		{"http/store=true", overHTTP, true, false, true},
		{"http/store=false/forwarding", overHTTP, false, true, true},
		{"websocket/store=false", overWebSocket, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops := &storeOps{}
			st, err := store.NewMemory(store.Options{Replica: "r1", Observer: ops})
			require.NoError(t, err)
			r := newRig(t, tc.tr, st)
			if tc.forwarding {
				dir, err := directory.NewMemory(directory.Options{})
				require.NoError(t, err)
				r.proxy.cfg.Forwarding = &Forwarding{Directory: dir, Secret: testSecret}
			}
			owners := &eventOwners{}
			r.proxy.cfg.Observer = owners
			c := newConversation(t, r.url, "s1", true, tc.stores)
			c.say("hello")
			c.say("again")
			s := r.proxy.Stats()
			require.Positive(t, s.Turns)
			seen := owners.seen()
			if assert.Len(t, seen, 1, "every step of every turn names its owner") {
				assert.False(t, seen[0].IsZero())
			}
			if !tc.asks {
				assert.Zero(t, ops.count(store.OpReserve)+ops.count(store.OpRecord)+ops.count(store.OpAbort))
				assert.Zero(t, s.Continued)
				return
			}
			assert.Equal(t, int(s.Turns), ops.count(store.OpReserve))
			if tc.stores {
				assert.Equal(t, s.Turns-1, s.Continued, "every turn after the first continues")
			}
		})
	}
}

// eventOwners is a proxy Observer that collects the owners its events
// name, each once.
type eventOwners struct {
	mu     sync.Mutex
	owners []identity.Owner
}

func (o *eventOwners) Observe(ev Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !slices.Contains(o.owners, ev.Owner) {
		o.owners = append(o.owners, ev.Owner)
	}
}

func (o *eventOwners) seen() []identity.Owner {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.owners)
}

// A turn whose record the store could not make ends "record_failed", not
// "recorded", and its log line says so: the owner's next turn sends its
// full context.
func TestAFailedRecordIsNoRecord(t *testing.T) {
	mr, rc := redistest.Miniredis(t)
	st, err := store.NewRedis(rc, store.Options{Replica: "r1", Namespace: "failed", OpTimeout: 10 * time.Second})
	require.NoError(t, err)
	r := newRig(t, overHTTP, st)
	var steps stepLog
	r.proxy.cfg.Observer = &steps
	logs := &logBuffer{}
	r.proxy.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.setFault(func(fakeupstream.Request) fakeupstream.Fault {
		mr.SetError("ERR the store fails from here on") // reserved; the record fails
		return fakeupstream.Fault{}
	})
	a := post(t, r.url, http.Header{"X-Session-Id": {"s1"}}, map[string]any{"model": "m", "input": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Contains(t, steps.take(), "end:record_failed")
	assert.Equal(t, 1, logs.count("outcome=failed"))
}

// Each turn's line says how the turn ended, as the end step counts it.
func TestATurnsLineSaysHowItEnded(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	logs := &logBuffer{}
	r.proxy.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := newConversation(t, r.url, "s1", false, true)
	c.say("hello")
	c.say("again")
	turns := int(r.proxy.Stats().Turns)
	assert.Eventually(t, func() bool { return logs.count("msg=turn ") == turns && logs.count(" end=recorded ") == turns },
		5*time.Second, time.Millisecond, "%d turns: %s", turns, logs)
}

func TestTurnsTheUpstreamKeepsNoneOfAreCountedAndExplained(t *testing.T) {
	r := newRig(t, overHTTP, nil)
	logs := &logBuffer{}
	r.proxy.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	c := newConversation(t, r.url, "s1", false, false)
	c.say("hello")
	c.say("again")
	s := r.proxy.Stats()
	assert.Zero(t, s.Continued)
	assert.Equal(t, s.Turns, s.NotKeptUpstream, "every turn has store false")
	assert.Equal(t, 1, logs.count("the HTTP upstream keeps none of their responses"), "said once, at the default level: %s", logs)

	kept := newConversation(t, r.url, "s2", false, true)
	kept.say("hello")
	assert.Equal(t, s.NotKeptUpstream, r.proxy.Stats().NotKeptUpstream, "a turn the upstream keeps is not counted")
}
