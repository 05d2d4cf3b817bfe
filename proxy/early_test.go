package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// On a store that keeps guesses, a turn that continues this replica's
// last record of its owner reaches the upstream while the store reserves
// it, and the turn keeps the upstream's answer whatever the reservation
// says, so that it runs once upstream. On a store that keeps none, the
// upstream gets a turn only once it is reserved.
func TestATurnGoesUpstreamOnItsGuessWhileTheStoreReserves(t *testing.T) {
	for _, guesses := range []bool{false, true} {
		// How long a reserve is held unless the upstream gets the turn:
		// with guesses it should at once, without them it cannot.
		hold, guessOwners := 100*time.Millisecond, 0
		if guesses {
			hold, guessOwners = 5*time.Second, 16
		}
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("guesses=%v/stream=%v", guesses, stream), func(t *testing.T) {
				r, held, mr := newHeldRig(t, lua.Reserve, store.Options{Namespace: "early", GuessOwners: guessOwners}, false)
				sent := make(chan string, 8) // the previous_response_id of each upstream request
				fault := func(req fakeupstream.Request) fakeupstream.Fault {
					sent <- gjson.GetBytes(req.Body, "previous_response_id").String()
					return fakeupstream.Fault{}
				}
				r.fault.Store(&fault)
				input := []any{map[string]any{"role": "user", "content": "hi"}}
				turn := func() string {
					t.Helper()
					a := post(t, r.url, http.Header{"X-Session-Id": {"s-early"}},
						map[string]any{"model": "gpt-test", "stream": stream, "input": input})
					require.Equal(t, http.StatusOK, a.status, "%s", a.body)
					require.Equal(t, `"completed"`, string(a.response["status"]))
					input = a.next(input, fmt.Sprint("more ", len(input)+len(a.output)))
					var id string
					require.NoError(t, json.Unmarshal(a.response["id"], &id))
					return id
				}
				upstreamGot := func() []string {
					var got []string
					for {
						select {
						case prev := <-sent:
							got = append(got, prev)
						default:
							return got
						}
					}
				}

				held.let(t, 0)
				first := turn()
				// Another replica, on the namespace the first turn made.
				other, err := store.NewRedis(redis.NewClient(&redis.Options{Addr: mr.Addr()}),
					store.Options{Namespace: "early", Replica: "r2", OpTimeout: 10 * time.Second})
				require.NoError(t, err)
				assert.Equal(t, []string{""}, upstreamGot(), "the opening turn goes whole")

				// Did the upstream get the next turn while its reserve was
				// held? The reserve goes once it did, or after hold.
				early := make(chan string, 1)
				reserveOnceSent := func() {
					go func() {
						select {
						case prev := <-sent:
							early <- prev
						case <-time.After(hold):
							early <- "none"
						}
						held.let(t, 0)
					}()
				}
				reserveOnceSent()
				second := turn()
				if !guesses {
					assert.Equal(t, "none", <-early, "the upstream got the turn before the store reserved it")
				} else {
					assert.Equal(t, first, <-early, "the upstream got the turn, continued, while the store reserved it")
				}
				assert.Equal(t, first, previousOf(t, r, second), "the client got the answer to the continued turn")
				stats := r.proxy.Stats()
				assert.Equal(t, int64(1), stats.Continued, "the second turn continues")
				if !guesses {
					assert.Equal(t, []string{first}, upstreamGot(), "sent once, continued")
					assert.Zero(t, stats.Guessed)
					return
				}
				assert.Empty(t, upstreamGot(), "sent once")
				assert.Equal(t, int64(1), stats.Guessed)

				// Redis lost the state (flushed, restarted empty,
				// evicted), or fails: the reserve decides nothing, and the
				// turn keeps the answer to its guess rather than run twice
				// upstream (store.Reservation.Adopt). Without state, it
				// records it under the turn it reserved, and the next turn
				// goes on its guess again; when Redis fails, it records
				// nothing, and the next turn goes after its reserve.
				r.proxy.records.waitAll() // the second turn's record is in
				mr.FlushAll()
				reserveOnceSent()
				third := turn()
				assert.Equal(t, second, <-early, "the third turn went on its guess")
				assert.Empty(t, upstreamGot(), "sent once")
				assert.Equal(t, second, previousOf(t, r, third), "the client got the answer to the guess")
				reserveOnceSent()
				fourth := turn()
				assert.Equal(t, third, <-early, "the fourth turn went on its guess: the third's record")
				assert.Empty(t, upstreamGot(), "sent once")
				assert.Equal(t, third, previousOf(t, r, fourth))
				r.proxy.records.waitAll()
				mr.SetError("ERR the store fails")
				reserveOnceSent()
				fifth := turn()
				assert.Equal(t, fourth, <-early, "the fifth turn went on its guess")
				assert.Empty(t, upstreamGot(), "sent once")
				assert.Equal(t, fourth, previousOf(t, r, fifth), "the client got the answer to the guess")
				mr.SetError("")
				held.let(t, 0)
				sixth := turn()
				assert.Equal(t, []string{fourth}, upstreamGot(), "the sixth turn continues the last record, after its reserve")
				stats = r.proxy.Stats()
				assert.Equal(t, int64(5), stats.Continued)
				assert.Equal(t, int64(4), stats.Guessed)
				assert.Zero(t, stats.GuessesOverruled)

				// The state changed behind this replica (another replica
				// served the owner): the reservation no longer continues
				// from the guess's response, and the turn keeps the answer
				// to its guess rather than run twice upstream, recorded
				// under the turn it reserved: the next turn continues it.
				r.proxy.records.waitAll() // the sixth turn's record is in
				otherReplicaServes(t, other, http.Header{"X-Session-Id": {"s-early"}},
					map[string]any{"model": "gpt-test", "stream": stream, "input": input})
				reserveOnceSent()
				seventh := turn()
				assert.Equal(t, sixth, <-early, "the seventh turn went on its guess")
				assert.Empty(t, upstreamGot(), "sent once")
				assert.Equal(t, sixth, previousOf(t, r, seventh), "the client got the answer to the guess")
				stats = r.proxy.Stats()
				assert.Equal(t, int64(6), stats.Continued)
				assert.Equal(t, int64(5), stats.Guessed)
				assert.Equal(t, int64(1), stats.GuessesOverruled)
				r.proxy.records.waitAll()
				held.let(t, 0)
				eighth := turn()
				assert.Equal(t, []string{seventh}, upstreamGot(), "the eighth turn continues the seventh's answer")
				assert.Equal(t, seventh, previousOf(t, r, eighth))
			})
		}
	}
}

// Owners whose turns go from replica to replica, one turn or two on each,
// still continue every turn through the store, and cost a few overruled
// guesses a replica in all, not one an owner, even on replicas that had
// found that owners stay: a replica guesses an owner only once it has
// stayed, longer each time the replica found it moved, and only while
// owners stay on the replica.
func TestOwnersThatMoveAreNotGuessed(t *testing.T) {
	for _, each := range []int{1, 2} { // turns on a replica before an owner moves
		t.Run(fmt.Sprintf("turns-on-each=%d", each), func(t *testing.T) {
			_, rc := redistest.Miniredis(t)
			up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{}))
			t.Cleanup(up.Close)
			var replicas []*Proxy
			var urls []string
			for _, name := range []string{"r1", "r2"} {
				st, err := store.NewRedis(rc, store.Options{Namespace: "moves", Replica: name, OpTimeout: 10 * time.Second,
					GuessOwners: 16})
				require.NoError(t, err)
				storetest.OwnersStay(t, st)
				p := newProxy(t, overHTTP, st, up.URL+"/v1")
				srv := httptest.NewServer(p)
				t.Cleanup(srv.Close)
				replicas, urls = append(replicas, p), append(urls, srv.URL+"/v1/responses")
			}
			const owners, turns = 8, 12
			inputs := make([][]any, owners)
			for i := range inputs {
				inputs[i] = []any{map[string]any{"role": "user", "content": "hi"}}
			}
			for turn := range turns {
				at := turn / each % 2
				for i, input := range inputs {
					a := post(t, urls[at], http.Header{"X-Session-Id": {fmt.Sprint("s-moves-", i)}},
						map[string]any{"model": "gpt-test", "input": input})
					require.Equal(t, http.StatusOK, a.status, "%s", a.body)
					replicas[at].records.waitAll() // the next turn, wherever it goes, finds the record
					inputs[i] = a.next(input, fmt.Sprint("more ", turn))
				}
			}
			var continued int64
			for _, p := range replicas {
				s := p.Stats()
				continued += s.Continued
				assert.LessOrEqual(t, s.GuessesOverruled, int64(3), "overruled guesses on one replica")
			}
			assert.Equal(t, int64(owners*(turns-1)), continued, "every later turn continues through the store")
		})
	}
}

// A turn whose reservation overrules its guess (another replica served
// the owner since) keeps the answer to its guess, and its record is in
// before its end reaches the client, as for any turn whose owner did not
// stay: the owner's next turn, wherever it goes, continues it.
func TestAnOverruledGuessIsRecordedBeforeItsEnd(t *testing.T) {
	const hold = 100 * time.Millisecond
	r, held, mr := newHeldRig(t, lua.Record, store.Options{Namespace: "overruled", GuessOwners: 16}, false)
	other, err := store.NewRedis(redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		store.Options{Namespace: "overruled", Replica: "r2", OpTimeout: 10 * time.Second})
	require.NoError(t, err)
	header := http.Header{"X-Session-Id": {"s-overruled"}}
	input := []any{map[string]any{"role": "user", "content": "hi"}}
	turn := func() (string, time.Duration) {
		t.Helper()
		sent := time.Now()
		a := post(t, r.url, header, map[string]any{"model": "gpt-test", "input": input})
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
		require.False(t, held.stuck.Load())
		input = a.next(input, fmt.Sprint("more ", len(input)+len(a.output)))
		var id string
		require.NoError(t, json.Unmarshal(a.response["id"], &id))
		return id, time.Since(sent)
	}
	held.let(t, 0) // the opening turn's record, in before its end
	turn()
	second, _ := turn() // on its guess, which the reservation agrees with: the end comes first
	held.let(t, 0)
	r.proxy.records.waitAll()
	require.Equal(t, int64(1), r.proxy.Stats().Guessed)

	otherReplicaServes(t, other, header, map[string]any{"model": "gpt-test", "input": input})
	held.let(t, hold)
	third, took := turn()
	assert.GreaterOrEqual(t, took, hold, "the client got the end before its record")
	stats := r.proxy.Stats()
	assert.Equal(t, int64(2), stats.Guessed)
	assert.Equal(t, int64(1), stats.GuessesOverruled)
	assert.Equal(t, second, previousOf(t, r, third), "the client got the answer to the guess")
	b, err := json.Marshal(map[string]any{"model": "gpt-test", "input": input})
	require.NoError(t, err)
	req, err := other.ParseRequest(b)
	require.NoError(t, err)
	who, err := DefaultIdentity.Owner(header, "", req)
	require.NoError(t, err)
	assert.Equal(t, third, other.Reserve(t.Context(), who, req).PreviousResponseID,
		"the next turn, on another replica at once, continues the third")
}

// A turn sent on its guess that the upstream refuses (the response is
// gone) is sent again with the full context, unseen by the client, and,
// its owner staying on this replica, recorded while its end reaches the
// client; the owner's next turn continues that answer, on its guess.
func TestAGuessTheUpstreamRefusesIsSentAgainWhole(t *testing.T) {
	r, held, _ := newHeldRig(t, lua.Record, store.Options{Namespace: "refused", GuessOwners: 16}, false)
	input := []any{map[string]any{"role": "user", "content": "hi"}}
	turn := func() string {
		t.Helper()
		a := post(t, r.url, http.Header{"X-Session-Id": {"s-refused"}}, map[string]any{"model": "gpt-test", "input": input})
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
		require.False(t, held.stuck.Load(), "the client got the end only after its record")
		input = a.next(input, fmt.Sprint("more ", len(input)+len(a.output)))
		var id string
		require.NoError(t, json.Unmarshal(a.response["id"], &id))
		return id
	}
	held.let(t, 0) // the opening turn's record, in before its end
	first := turn()
	req, err := http.NewRequest(http.MethodDelete, r.upstream.URL+"/v1/responses/"+first, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	second := turn() // its record is held: the end came first
	stats := r.proxy.Stats()
	assert.Equal(t, int64(1), stats.Guessed)
	assert.Equal(t, int64(1), stats.FullContextRetries, "refused, then sent whole")
	assert.Zero(t, stats.GuessesOverruled, "the reservation agreed with the guess")
	assert.Zero(t, stats.Continued)

	held.let(t, 0) // the second turn's record, which the third waits for
	third := turn()
	held.let(t, 0) // the third's
	r.proxy.records.waitAll()
	assert.Equal(t, second, previousOf(t, r, third), "the third turn continues the second's answer")
	stats = r.proxy.Stats()
	assert.Equal(t, int64(2), stats.Guessed)
	assert.Equal(t, int64(1), stats.Continued)
	assert.Zero(t, stats.GuessesOverruled)
}

// previousOf returns the previous_response_id of the upstream request
// that response id, which a client of r got, answered.
// otherReplicaServes serves a turn of the owner that header and body
// name on st, another replica's store: it reserves the turn and records a
// response the body's requester never saw.
func otherReplicaServes(t *testing.T, st *store.Store, header http.Header, body map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := st.ParseRequest(b)
	require.NoError(t, err)
	who, err := DefaultIdentity.Owner(header, "", req)
	require.NoError(t, err)
	res := st.Reserve(t.Context(), who, req)
	require.NoError(t, res.Err)
	got, err := st.Record(t.Context(), res, store.Result{ResponseID: "resp_other", Socket: store.Socket{Any: true},
		Output: []json.RawMessage{json.RawMessage(`{"type":"message","id":"msg_other","role":"assistant","status":"completed","content":[{"type":"output_text","text":"other"}]}`)}})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, got)
}

func previousOf(t *testing.T, r *rig, id string) string {
	t.Helper()
	resp, err := http.Get(r.upstream.URL + "/v1/responses/" + id)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	return gjson.GetBytes(b, "previous_response_id").String()
}

// blockingWriter is a client that takes the answer's headers, then does
// not read its body until let.
type blockingWriter struct {
	h       http.Header
	status  int
	writing chan struct{}
	let     chan struct{}
	once    atomic.Bool
	buf     bytes.Buffer
}

func (w *blockingWriter) Header() http.Header { return w.h }
func (w *blockingWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *blockingWriter) Write(b []byte) (int, error) {
	if w.once.CompareAndSwap(false, true) {
		close(w.writing)
		<-w.let
	}
	return w.buf.Write(b)
}

// A JSON answer is held as it is read, waiting for room as a body does
// (-max-bytes-in-flight), on a turn sent on its guess too: read on a
// goroutine of its own, it is held in a hold the turn takes over, and the
// budget never holds more than its size.
func TestAGuessedTurnsAnswerIsHeldInTheBudget(t *testing.T) {
	for _, guessOwners := range []int{0, 16} {
		t.Run(fmt.Sprint("guessOwners=", guessOwners), func(t *testing.T) {
			var calls atomic.Int32
			big := strings.Repeat("x", 3<<20)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				n := calls.Add(1)
				text := "hello"
				if gjson.GetBytes(b, "previous_response_id").String() != "" || gjson.GetBytes(b, "input.#").Int() > 1 {
					text = big
				}
				resp, _ := json.Marshal(map[string]any{"id": fmt.Sprint("resp_", n), "object": "response", "status": "completed",
					"output": []any{map[string]any{"type": "message", "id": fmt.Sprint("msg_", n), "role": "assistant", "status": "completed",
						"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}}})
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(resp)
			}))
			t.Cleanup(up.Close)
			_, rc := redistest.Miniredis(t)
			st, err := store.NewRedis(rc, store.Options{Namespace: "budget", Replica: "r1", GuessOwners: guessOwners, OpTimeout: 5 * time.Second})
			require.NoError(t, err)
			if guessOwners > 0 {
				storetest.OwnersStay(t, st)
			}
			p := limitedProxy(t, st, up.URL+"/v1", Config{MaxBytesInFlight: 4 << 20, MaxBodyBytes: 1 << 20})

			turn := func(input []any, w http.ResponseWriter) {
				b, _ := json.Marshal(map[string]any{"model": "m", "input": input})
				req := httptest.NewRequest(http.MethodPost, "/v1/responses", bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Session-Id", "s-budget")
				p.ServeHTTP(w, req)
			}
			input := []any{map[string]any{"role": "user", "content": "hi"}}
			first := httptest.NewRecorder()
			turn(input, first)
			require.Equal(t, http.StatusOK, first.Code, first.Body.String())
			for _, it := range gjson.GetBytes(first.Body.Bytes(), "output").Array() {
				input = append(input, json.RawMessage(it.Raw))
			}
			input = append(input, map[string]any{"role": "user", "content": "more"})
			p.records.waitAll()

			w := &blockingWriter{h: http.Header{}, writing: make(chan struct{}), let: make(chan struct{})}
			letGo := sync.OnceFunc(func() { close(w.let) })
			t.Cleanup(letGo) // however the test ends: the proxy's Close waits for the turn
			done := make(chan struct{})
			go func() { defer close(done); turn(input, w) }()
			select {
			case <-w.writing:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			p.budget.mu.Lock()
			cur, size := p.budget.cur, p.budget.size
			p.budget.mu.Unlock()
			letGo()
			<-done
			assert.LessOrEqual(t, cur, size, "held while the client got the answer")
			if guessOwners > 0 {
				assert.Equal(t, int64(1), p.Stats().Guessed, "sent on its guess")
			}
			p.records.waitAll()
			p.budget.mu.Lock()
			defer p.budget.mu.Unlock()
			assert.Zero(t, p.budget.cur, "all given back once the turn is over")
		})
	}
}
