package session_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/vectorfile"
	"github.com/contstore/contstore/internal/vectorscenario"
	"github.com/contstore/contstore/session"
)

// testdata/session-vectors.json at the repository root holds the test
// vectors of the session layout (PROTOCOL.md section 10) for other
// implementations. TestVectors rebuilds it from this code and fails on any
// difference; -update-vectors rewrites it.
var updateVectors = flag.Bool("update-vectors", false, "rewrite ../testdata/session-vectors.json from the code")

var vecPath = filepath.Join("..", "testdata", "session-vectors.json")

// vecFile is the layout of testdata/session-vectors.json.
type vecFile struct {
	About []string `json:"about"`
	// OpDeadlineMillis is how long after the server's clock of its step a
	// save of the scenario has its deadline.
	OpDeadlineMillis int64                 `json:"op_deadline_ms"`
	SessionKeys      []vecSessionKeys      `json:"session_keys"`
	SessionSteps     []vectorscenario.Step `json:"session_scenario"`
}

var vecAbout = []string{
	"Test vectors of contstore's sessions; PROTOCOL.md section 10 describes every rule they exercise, and 6.6 the ops of the calls that change state (a save's op, ARGV[6], is given as {hex}). The constants they share with the rest of the protocol (the op's length) are in vectors.json.",
	"Regenerate with: go test ./session -run TestVectors -update-vectors. go test ./session fails when this file and the code disagree.",
	"Scenario replies: a JSON string is a bulk string, a number an integer reply, null a nil reply, an array an array reply, {error: text} an error reply.",
}

type vecSessionKeys struct {
	Namespace string `json:"namespace"`
	SessionID string `json:"session_id"`
	Head      string `json:"head"`
	Log       string `json:"log"`
	// AnswerPrefix followed by an operation id is the key of a save's
	// answer.
	AnswerPrefix string `json:"answer_prefix"`
}

// vecSessionKeyNames finds the session keys by saving a journal session in
// miniredis and listing the keys it wrote.
func vecSessionKeyNames(t *testing.T) []vecSessionKeys {
	cases := []struct{ ns, id string }{{"sess", "3f2a"}, {"sess", "a:b c"}, {"prod:sess", "é"}}
	var vs []vecSessionKeys
	for _, c := range cases {
		mr, client := redistest.Miniredis(t)
		st, err := session.NewRedis(client, session.Options{Namespace: c.ns, Mode: session.Journal})
		require.NoError(t, err)
		s := &session.Session{ID: c.id, Model: "m", Messages: []json.RawMessage{json.RawMessage(`{}`)}}
		require.NoError(t, st.Save(context.Background(), s))
		keys := mr.Keys()
		require.Len(t, keys, 3)
		v := vecSessionKeys{Namespace: c.ns, SessionID: c.id}
		for _, k := range keys {
			switch mr.Type(k) {
			case "hash":
				v.Head = k
			case "list":
				v.Log = k
			case "string":
				require.Regexp(t, `:[0-9a-f]{18}$`, k)
				v.AnswerPrefix = k[:len(k)-18]
			}
		}
		require.NotEmpty(t, v.Head)
		require.NotEmpty(t, v.Log)
		require.NotEmpty(t, v.AnswerPrefix)
		vs = append(vs, v)
	}
	return vs
}

// vecOpaque: a session scenario's opaque bytes are the ops of its saves
// (ARGV[6]), which also name their answer keys (KEYS[3]).
var vecOpaque = vectorscenario.Opaque{Ops: map[string]vectorscenario.OpAt{"session_save": {Key: 2, Arg: 5}}}

func vecSessionScenario(t *testing.T) []vectorscenario.Step {
	ctx := context.Background()
	srv := vectorscenario.NewServer(t, time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC), vecOpaque)
	snap, err := session.NewRedis(srv.C, session.Options{Namespace: "sess"})
	require.NoError(t, err)
	journal, err := session.NewRedis(srv.C, session.Options{Namespace: "sess", Mode: session.Journal, TTL: time.Hour})
	require.NoError(t, err)
	created := time.Date(2025, 6, 1, 11, 59, 0, 0, time.UTC)
	msg := func(s string) json.RawMessage { return json.RawMessage(s) }
	newSession := func(id string) *session.Session {
		return &session.Session{ID: id, Name: "demo", Model: "gpt-4.1", ThinkingLevel: "medium", SystemPrompt: "Be brief.",
			Messages: []json.RawMessage{msg(`{ "role": "user", "content": "Hi <b>&</b> é" }`), msg(`{"role":"assistant","content":[{"type":"text","text":"Hello!"}]}`)},
			Tokens:   session.Tokens{Input: 1200, Output: 35, CacheRead: 1024, CacheCreation: 0},
			Cost:     0.0125, KeepWarmCost: 0.001, KeepWarmTokens: session.Tokens{Input: 100},
			CreatedAt: created, UpdatedAt: created.Add(30 * time.Second)}
	}
	sessionResult := func(s *session.Session, err error) map[string]any {
		require.NoError(t, err)
		var doc bytes.Buffer
		enc := json.NewEncoder(&doc)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(s))
		return map[string]any{"version": s.Version, "session": strings.TrimSuffix(doc.String(), "\n")}
	}
	var steps []vectorscenario.Step
	save := func(name string, st *session.Store, s *session.Session, mode string) {
		in := map[string]any{"mode": mode, "session": s.ID, "version": s.Version}
		steps = append(steps, srv.Step(name, "session_save", in, func() map[string]any {
			switch err := st.Save(ctx, s); {
			case errors.Is(err, session.ErrConflict):
				return map[string]any{"error": "conflict"}
			default:
				require.NoError(t, err)
				return map[string]any{"version": s.Version}
			}
		}))
	}
	// saveAgain sends the script call of the last save step again, as a
	// client library re-sends a call whose reply was lost; within its
	// deadline it answers as it did.
	saveAgain := func(name string) {
		i := len(steps) - 1
		for steps[i].Input["resend"] != nil {
			i--
		}
		prev := steps[i]
		require.Len(t, prev.Calls, 1)
		call := prev.Calls[0]
		args := vectorscenario.Strings(t, call.Args)
		steps = append(steps, srv.Step(name, "session_save", map[string]any{"resend": prev.Name}, func() map[string]any {
			reply, err := lua.SessionSave.Run(ctx, srv.C, call.Keys, anys(args)...).Slice()
			require.NoError(t, err)
			require.Len(t, reply, 2)
			if reply[0] == "expired" {
				return map[string]any{"status": reply[0], "server_clock": reply[1]}
			}
			require.Equal(t, call.Reply, reply)
			return map[string]any{"status": reply[0], "version": reply[1]}
		}))
		vectorscenario.SameState(t, steps[len(steps)-2], steps[len(steps)-1])
	}
	load := func(name string, st *session.Store, id string) {
		steps = append(steps, srv.Step(name, "session_load", map[string]any{"session": id}, func() map[string]any {
			return sessionResult(st.Load(ctx, id))
		}))
	}

	a := newSession("snap-1")
	stale := a.Clone()
	save("snapshot: first save (version 0)", snap, a, "snapshot")
	srv.Advance(time.Second)
	a.Messages = append(a.Messages, msg(`{"role":"user","content":"More"}`))
	save("snapshot: next save", snap, a, "snapshot")
	saveAgain("snapshot: the same save sent again with the same op: ok and the version it wrote, from its answer key; nothing changes")
	save("snapshot: a copy loaded at an older version conflicts", snap, stale, "snapshot")
	load("snapshot: load", snap, "snap-1")

	j := newSession("journal-1")
	save("journal: first save writes every message (rewrite)", journal, j, "journal")
	srv.Advance(time.Second)
	j.Messages = append(j.Messages, msg(`{"role":"user","content":"Weather?"}`))
	j.Tokens.Input += 50
	save("journal: an append-only extension pushes the new message", journal, j, "journal")
	saveAgain("journal: the same append sent again with the same op: ok from its answer key; nothing is pushed twice")
	srv.Advance(time.Second)
	saveAgain("journal: the same append sent once more, after its deadline: refused with the server's clock; nothing changes")
	j.Messages[0] = msg(`{"role":"user","content":"Hi (edited)"}`)
	save("journal: an edited history is rewritten", journal, j, "journal")
	srv.Advance(time.Second)
	require.NoError(t, srv.C.Del(ctx, "sess:{sess:journal-1}:log").Err())
	j.Messages = append(j.Messages, msg(`{"role":"assistant","content":"Sunny."}`))
	save("journal: the log was lost, so the append is refused and rewritten with the same op", journal, j, "journal")
	load("journal: load", journal, "journal-1")

	expiring, err := session.NewRedis(srv.C, session.Options{Namespace: "sess", TTL: time.Hour})
	require.NoError(t, err)
	e := newSession("expiring-1")
	save("TTL: a save sets the TTL of head and log", expiring, e, "snapshot")
	srv.Advance(time.Hour)
	steps = append(steps, srv.Step("TTL: an hour later Redis has expired the keys, so a load finds no head", "session_load", map[string]any{"session": "expiring-1"}, func() map[string]any {
		_, err := expiring.Load(ctx, "expiring-1")
		require.ErrorIs(t, err, session.ErrNotFound)
		return map[string]any{"error": "not_found"}
	}))
	e.Messages = append(e.Messages, msg(`{"role":"user","content":"Late"}`))
	save("TTL: the expired session's writer conflicts at version 0", expiring, e, "snapshot")
	save("TTL: a new session under the id starts again at version 1", expiring, newSession("expiring-1"), "snapshot")
	return steps
}

// ---- the file ----

func vecBuild(t *testing.T) vecFile {
	return vecFile{
		About:            vecAbout,
		OpDeadlineMillis: vectorscenario.OpDeadline.Milliseconds(),
		SessionKeys:      vecSessionKeyNames(t),
		SessionSteps:     vecSessionScenario(t),
	}
}

// TestVectors rebuilds testdata/session-vectors.json from the code and
// fails when the stored file differs in any byte. Run with -update-vectors
// after an intended change of the protocol.
func TestVectors(t *testing.T) {
	vectorfile.Check(t, vecPath, vecBuild(t), *updateVectors, "go test ./session -run TestVectors -update-vectors")
}

// vecLoad reads the stored vectors.
func vecLoad(t *testing.T) vecFile {
	var f vecFile
	vectorfile.Load(t, vecPath, &f)
	return f
}

// anys returns args as go-redis takes them.
func anys(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// ---- the documented rules, written out independently ----

// TestVectorsFollowTheDocumentedRules checks the stored vectors with the
// rules of PROTOCOL.md, written out here independently of the code that
// generates them.
func TestVectorsFollowTheDocumentedRules(t *testing.T) {
	f := vecLoad(t)
	for _, v := range f.SessionKeys {
		tag := "{" + v.Namespace + ":" + v.SessionID + "}"
		assert.Equal(t, v.Namespace+":"+tag+":head", v.Head)
		assert.Equal(t, v.Namespace+":"+tag+":log", v.Log)
		assert.Equal(t, v.Namespace+":"+tag+":q:", v.AnswerPrefix)
	}
	ruleSessionScenario(t, f.OpDeadlineMillis, f.SessionSteps)
}

func ruleSessionScenario(t *testing.T, deadlineAfter int64, steps []vectorscenario.Step) {
	answered := map[string]any{} // answer key → the reply that published
	resent, expired, gone := 0, 0, 0
	for _, st := range steps {
		at, err := time.Parse(time.RFC3339Nano, st.ServerTime)
		require.NoError(t, err)
		now := at.UnixMilli() - 1735689600000 // the scripts' clock (6.6)
		answers, pttls := map[string]any{}, map[string]int64{}
		heads := map[string]map[string]any{}
		for _, k := range st.State {
			answers[k.Key], pttls[k.Key], heads[k.Key] = k.String, k.PTTL, k.Hash
			if strings.HasSuffix(k.Key, ":head") {
				// A head holds the version and a snapshot, or a journal
				// header and count; nothing else (10.1).
				fields := slices.Sorted(maps.Keys(k.Hash))
				assert.Contains(t, [][]string{{"d", "v"}, {"h", "n", "v"}}, fields, "%s: fields of %s", st.Name, k.Key)
			}
		}
		for _, call := range st.Calls {
			if call.Script == "session_load" {
				// A load finds a head exactly when Redis holds its key.
				require.Empty(t, call.Args, st.Name)
				_, held := heads[call.Keys[0]]
				assert.Equal(t, held, len(call.Reply.([]any)) > 0, "%s: load of %s", st.Name, call.Keys[0])
				if !held {
					gone++
				}
			}
			if call.Script != "session_save" {
				continue
			}
			require.Len(t, call.Keys, 3, st.Name)
			tag := strings.TrimSuffix(call.Keys[0], "head")
			assert.Equal(t, tag+"log", call.Keys[1], st.Name)
			op, ok := strings.CutPrefix(call.Keys[2], tag+"q:")
			assert.True(t, ok && vectorscenario.OpPattern.MatchString(op), "%s: answer key %q", st.Name, call.Keys[2])
			args := vectorscenario.Strings(t, call.Args)
			require.GreaterOrEqual(t, len(args), 6, st.Name)
			// The op (6.6): its answer key ends in it in hex; its last 4
			// bytes are the low 32 bits of its deadline.
			require.Len(t, args[5], 9, st.Name)
			assert.Equal(t, hex.EncodeToString([]byte(args[5])), op, "%s: answer key", st.Name)
			deadline := vectorscenario.Deadline(args[5], now)
			r := call.Reply.([]any)
			if r[0] == "expired" {
				// Refused past its deadline, with the server's clock, an
				// integer.
				expired++
				assert.LessOrEqual(t, deadline, now, st.Name)
				assert.Equal(t, float64(now), r[1], st.Name)
				continue
			}
			assert.Greater(t, deadline, now, st.Name)
			if first, ok := answered[call.Keys[2]]; ok {
				resent++
				assert.Equal(t, first, r, st.Name)
			} else if r[0] == "ok" {
				answered[call.Keys[2]] = r
				assert.Equal(t, now+deadlineAfter, deadline, "%s: deadline", st.Name)
				assert.Equal(t, r[1], answers[call.Keys[2]], "%s: answer", st.Name)
				assert.Contains(t, []int64{deadline - now - 1, deadline - now}, pttls[call.Keys[2]], "%s: the answer lives until the deadline", st.Name)
				// Head and log carry the TTL of ARGV[3], or none for "0".
				ttl, err := strconv.ParseInt(args[2], 10, 64)
				require.NoError(t, err, st.Name)
				if ttl == 0 {
					ttl = -1
				}
				assert.Equal(t, ttl, pttls[call.Keys[0]], "%s: the head's TTL", st.Name)
			} else if !slices.ContainsFunc(st.Calls, func(o vectorscenario.Call) bool {
				return slices.Equal(o.Keys, call.Keys) && o.Reply.([]any)[0] == "ok"
			}) {
				// Nothing written, and no later call of the step wrote it.
				assert.NotContains(t, answers, call.Keys[2], st.Name)
			}
		}
	}
	assert.NotZero(t, resent, "a session save sent again")
	assert.NotZero(t, expired, "a session save sent again after its deadline")
	assert.NotZero(t, gone, "a load of a session whose keys expired")
}
