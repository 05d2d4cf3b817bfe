package lua_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/store"
)

// scriptCall is one script call as the client sent it.
type scriptCall struct {
	sha        string
	keys, args int
}

// scriptCalls records every EVAL and EVALSHA (and their read-only forms)
// a client sends, alone or in a pipeline.
type scriptCalls struct {
	mu    sync.Mutex
	calls []scriptCall
	bad   []string // commands it could not read
}

func (h *scriptCalls) noteGoRedis(cmd redis.Cmder) {
	args := make([]string, len(cmd.Args()))
	for i, a := range cmd.Args() {
		args[i] = fmt.Sprint(a)
	}
	h.note(args)
}

// note records args when it is a script call.
func (h *scriptCalls) note(args []string) {
	if len(args) == 0 {
		return
	}
	name := strings.ToLower(args[0])
	if name != "eval" && name != "evalsha" && name != "eval_ro" && name != "evalsha_ro" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(args) < 3 {
		h.bad = append(h.bad, fmt.Sprint(args))
		return
	}
	numkeys, err := strconv.Atoi(args[2])
	if err != nil || numkeys < 0 || 3+numkeys > len(args) {
		h.bad = append(h.bad, fmt.Sprintf("%s with numkeys %v and %d arguments in all", name, args[2], len(args)))
		return
	}
	sha := args[1]
	if !strings.HasPrefix(name, "evalsha") {
		sum := sha1.Sum([]byte(sha)) // EVAL sends the script itself
		sha = hex.EncodeToString(sum[:])
	}
	h.calls = append(h.calls, scriptCall{sha: sha, keys: numkeys, args: len(args) - 3 - numkeys})
}

// observedRueidis is a rueidis client whose commands a scriptCalls sees.
type observedRueidis struct {
	rueidis.Client
	calls *scriptCalls
}

func (o observedRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	o.calls.note(cmd.Commands())
	return o.Client.Do(ctx, cmd)
}

func (o observedRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	for _, cmd := range cmds {
		o.calls.note(cmd.Commands())
	}
	return o.Client.DoMulti(ctx, cmds...)
}

// Every script is called by some operation of the stores, and every call
// passes the key and argument counts its script's header declares: through
// go-redis and through rueidis, the continuation store's and the session
// store's.
func TestScriptCallsMatchTheirHeaders(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	mr.SetTime(time.Now())
	viaGoRedis := &scriptCalls{}
	c.AddHook(redistest.CommandHook(viaGoRedis.noteGoRedis))
	ctx := context.Background()

	s, err := store.NewRedis(c, store.Options{Namespace: "calls", Partitions: 2})
	require.NoError(t, err)
	runStoreOperations(t, ctx, s)
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		st, err := session.NewRedis(c, session.Options{Namespace: "calls-" + mode.String(), Mode: mode})
		require.NoError(t, err)
		runSessionOperations(t, ctx, st)
	}
	checkScriptCalls(t, viaGoRedis, lua.All())

	viaRueidis := &scriptCalls{}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	s, err = store.NewRueidis(observedRueidis{rc, viaRueidis}, store.Options{Namespace: "calls-rueidis", Partitions: 2})
	require.NoError(t, err)
	runStoreOperations(t, ctx, s)
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		st, err := session.NewRueidis(observedRueidis{rc, viaRueidis}, session.Options{Namespace: "calls-rueidis-" + mode.String(), Mode: mode})
		require.NoError(t, err)
		runSessionOperations(t, ctx, st)
	}
	checkScriptCalls(t, viaRueidis, lua.All())
}

// checkScriptCalls fails unless every call calls is one of lua.All() with
// the counts its header declares, and every script of want was called.
func checkScriptCalls(t *testing.T, calls *scriptCalls, want []*lua.Script) {
	t.Helper()
	byHash := map[string]*lua.Script{}
	for _, s := range lua.All() {
		byHash[s.Hash()] = s
	}
	called := map[string]int{}
	var wrong []string
	calls.mu.Lock()
	defer calls.mu.Unlock()
	require.Empty(t, calls.bad, "script calls the hook could not read")
	for _, call := range calls.calls {
		s, ok := byHash[call.sha]
		if !ok {
			wrong = append(wrong, fmt.Sprintf("script %s, which is none of lua.All(), called with %d keys and %d args", call.sha, call.keys, call.args))
			continue
		}
		called[s.Name]++
		if call.keys != s.Keys || call.args < s.Args || (!s.Variadic && call.args > s.Args) {
			wrong = append(wrong, fmt.Sprintf("%s called with %d keys and %d args; its header declares %s", s.Name, call.keys, call.args, declared(s)))
		}
	}
	if n := len(wrong); n > 0 {
		slices.Sort(wrong)
		wrong = slices.Compact(wrong)
		t.Fatalf("%d of %d script calls do not match their script's header; %d distinct, the first ones:\n%s",
			n, len(calls.calls), len(wrong), strings.Join(wrong[:min(5, len(wrong))], "\n"))
	}
	var never []string
	for _, s := range want {
		if called[s.Name] == 0 {
			never = append(never, s.Name)
		}
	}
	require.Empty(t, never, "scripts no operation called")
}

// declared renders the counts of s's header.
func declared(s *lua.Script) string {
	more := ""
	if s.Variadic {
		more = " or more"
	}
	return fmt.Sprintf("%d keys and %d args%s", s.Keys, s.Args, more)
}

// runStoreOperations runs every operation of the continuation store s,
// each of them successfully.
func runStoreOperations(t *testing.T, ctx context.Context, s *store.Store) {
	t.Helper()
	owner, err := identity.Main("calls")
	require.NoError(t, err)
	parse := func(items ...string) *fingerprint.Request {
		t.Helper()
		body := `{"model":"m","input":[` + strings.Join(items, ",") + `]}`
		r, err := s.ParseRequest([]byte(body))
		require.NoError(t, err)
		return r
	}
	user, assistant := `{"role":"user","content":"hi"}`, `{"role":"assistant","content":"hello"}`
	socket := store.Socket{Replica: "replica-a", ID: 1}
	reserve := func(r *fingerprint.Request) *store.Reservation {
		t.Helper()
		res := s.Reserve(ctx, owner, r)
		require.NoError(t, res.Err)
		require.NotZero(t, res.Turn)
		return res
	}
	record := func(res *store.Reservation, out store.Result, want store.Outcome) {
		t.Helper()
		got, err := s.Record(ctx, res, out)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}

	first := reserve(parse(user))
	record(first, store.Result{ResponseID: "resp_1", Socket: socket, Output: []json.RawMessage{json.RawMessage(assistant)}}, store.OutcomePublished)
	next := reserve(parse(user, assistant, user))
	require.True(t, next.Continues(), "reason %q", next.Reason)
	current, err := s.IsCurrent(ctx, next)
	require.NoError(t, err)
	require.True(t, current)
	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	require.True(t, st.Exists)
	record(next, store.Result{Socket: socket}, store.OutcomeDropped) // no response id: dropped

	aborted := reserve(parse(user))
	removed, err := s.Abort(ctx, aborted)
	require.NoError(t, err)
	require.True(t, removed)

	reserve(parse(user))
	require.NoError(t, s.Clear(ctx, owner))

	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	_, err = s.Stats(ctx)
	require.NoError(t, err)
	a, err := s.Audit(ctx)
	require.NoError(t, err)
	require.Empty(t, a.Problems)
}

// runSessionOperations saves a session on st (twice, the second time
// appending a message) and loads it.
func runSessionOperations(t *testing.T, ctx context.Context, st *session.Store) {
	t.Helper()
	s := session.New("m", "", "")
	s.Messages = []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}
	require.NoError(t, st.Save(ctx, s))
	s.Messages = append(s.Messages, json.RawMessage(`{"role":"assistant","content":"hello"}`))
	require.NoError(t, st.Save(ctx, s))
	got, err := st.Load(ctx, s.ID)
	require.NoError(t, err)
	require.Len(t, got.Messages, 2)
}
