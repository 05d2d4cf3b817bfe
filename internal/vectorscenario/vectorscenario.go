// Package vectorscenario records the Redis scenarios of the protocol's
// test-vector files (testdata/*vectors.json): a miniredis whose clock the
// test moves, a go-redis hook that writes down every command a step sends
// and its reply, and a dump of every key after the step. The store's and
// the session's vector tests both build their scenarios with it.
package vectorscenario

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/serverclock"
)

// Call is one Redis command of a step and its reply.
type Call struct {
	Command string   `json:"command"`
	Script  string   `json:"script,omitempty"`
	Keys    []string `json:"keys,omitempty"`
	// Args are strings, but an argument Opaque.Arg names is a Bytes.
	Args  []any `json:"args"`
	Reply any   `json:"reply"`
}

// Bytes gives opaque bytes in hex.
type Bytes struct {
	Hex string `json:"hex"`
}

// Hex returns s as Bytes.
func Hex(s string) Bytes { return Bytes{Hex: hex.EncodeToString([]byte(s))} }

// ZMember is a member of a sorted set and its score.
type ZMember struct {
	Member string `json:"member"`
	Score  int64  `json:"score"`
}

// KeyState is a key and its contents.
type KeyState struct {
	Key  string `json:"key"`
	Type string `json:"type"`
	// PTTL is the key's remaining time to live in ms, -1 for none.
	PTTL int64 `json:"pttl_ms"`
	// Hash values are strings, but a field Opaque.HashField names is a
	// Bytes.
	Hash map[string]any `json:"hash,omitempty"`
	ZSet []ZMember      `json:"zset,omitempty"`
	List []string       `json:"list,omitempty"`
	// String is a string, but one Opaque.String names is a Bytes.
	String any `json:"string,omitempty"`
}

// Step is one step of a scenario.
type Step struct {
	Name string `json:"name"`
	// ServerTime is the Redis server's clock during the step.
	ServerTime string         `json:"server_time"`
	Op         string         `json:"op"`
	Input      map[string]any `json:"input,omitempty"`
	Calls      []Call         `json:"calls"`
	Result     map[string]any `json:"result,omitempty"`
	// State is every key after the step.
	State []KeyState `json:"state"`
}

// Opaque says which values of a scenario are opaque bytes, given as Bytes
// rather than as strings, and which calls draw a random operation id.
// Every field may be nil.
type Opaque struct {
	// Arg reports whether argument i (0-based, after the keys) of a call
	// of script is opaque.
	Arg func(script string, i int) bool
	// Reply reports whether a string in a reply of script is opaque: the
	// element at index i of an array reply, or the whole reply (i = -1).
	Reply func(script string, i int, s string) bool
	// HashField reports whether field of the hash at key is opaque.
	HashField func(key, field string) bool
	// String reports whether the string value of a key is opaque.
	String func(key, value string) bool
	// Ops gives, by script, where a call carries its op (lua.NewCallID): the
	// index of its answer key, whose name ends in the op in hex, and of
	// the argument that holds it (0-based, after the keys). The recorder
	// replaces each op with the scenario's next (Op), the same for every
	// call that sent the same op, so that the scenario is reproducible,
	// and gives the argument as Bytes.
	Ops map[string]OpAt
}

// OpAt is where a script's call carries its op.
type OpAt struct{ Key, Arg int }

// OpDeadline is how long after the server's clock of its step a scenario's
// call has its deadline.
const OpDeadline = 200 * time.Millisecond

// Op is the n-th op of a scenario, sent when the server's clock read now:
// 5 bytes drawn from n, then the low 32 bits of its deadline (OpDeadline
// later), as lua.NewCallID makes them.
func Op(n uint64, now time.Time) string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:], n*0x9e3779b97f4a7c15)
	binary.BigEndian.PutUint32(b[5:], uint32(now.Add(OpDeadline).UnixMilli()-serverclock.EpochMillis))
	return string(b[:lua.CallIDSize])
}

// Deadline is the deadline of op, in milliseconds since 2025-01-01, as
// PROTOCOL.md 6.6 reads it, written out apart from the scripts: the
// instant with op's last 4 bytes as its low 32 bits, no later than an hour
// after now and less than 2^32 ms before that.
func Deadline(op string, now int64) int64 {
	low := int64(op[5])<<24 | int64(op[6])<<16 | int64(op[7])<<8 | int64(op[8])
	diff := ((low-now)%(1<<32) + 1<<32) % (1 << 32)
	if diff > time.Hour.Milliseconds() {
		diff -= 1 << 32
	}
	return now + diff
}

// OpPattern matches an op's hex in an answer key's name.
var OpPattern = regexp.MustCompile(`^[0-9a-f]{18}$`)

// recorder is a go-redis hook that records the commands a step sends.
type recorder struct {
	t       testing.TB
	opaque  Opaque
	on      bool
	calls   []Call
	scripts map[string]string // SHA1 → name
	opIDs   map[string]string // op drawn → op sent
	drawn   uint64
	now     *time.Time // the server's clock
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.fixOp(cmd)
		err := next(ctx, cmd)
		if r.on && !unknownCommand(err) {
			r.record(cmd)
		}
		return err
	}
}

// unknownCommand reports whether err is the server's refusal of a
// command it does not have: the FCALL that finds a server without
// functions, which then runs the scripts by EVALSHA, is not part of a
// step.
func unknownCommand(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR unknown command")
}

// script returns the name of the script cmd runs, or "".
func (r *recorder) script(cmd redis.Cmder) string {
	args := cmd.Args()
	switch strings.ToUpper(fmt.Sprint(args[0])) {
	case "EVALSHA":
		return r.scripts[fmt.Sprint(args[1])]
	case "EVAL":
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		return r.scripts[hex.EncodeToString(sum[:])]
	}
	return ""
}

func (r *recorder) fixOp(cmd redis.Cmder) {
	at, ok := r.opaque.Ops[r.script(cmd)]
	if !ok {
		return
	}
	args := cmd.Args()
	keys := args[2].(int)
	drawn := args[3+keys+at.Arg].(string)
	op, ok := r.opIDs[drawn]
	if !ok {
		r.drawn++
		op = Op(r.drawn, *r.now)
		r.opIDs[drawn], r.opIDs[op] = op, op
	}
	key := args[3+at.Key].(string) // "<…>:q:<op in hex>"
	args[3+at.Key] = key[:len(key)-2*lua.CallIDSize] + lua.CallIDKey(op)
	args[3+keys+at.Arg] = op
}

func (r *recorder) record(cmd redis.Cmder) {
	args := cmd.Args()
	name := strings.ToUpper(fmt.Sprint(args[0]))
	c := Call{Command: name}
	var rest []any
	switch name {
	case "EVALSHA", "EVAL":
		c.Script = r.script(cmd)
		require.NotEmpty(r.t, c.Script, "unknown script")
		n := args[2].(int)
		for _, k := range args[3 : 3+n] {
			c.Keys = append(c.Keys, Arg(r.t, k))
		}
		rest = args[3+n:]
	default:
		rest = args[1:]
	}
	c.Args = []any{}
	for i, a := range rest {
		s := Arg(r.t, a)
		if at, ok := r.opaque.Ops[c.Script]; (ok && at.Arg == i) || (r.opaque.Arg != nil && c.Script != "" && r.opaque.Arg(c.Script, i)) {
			c.Args = append(c.Args, Hex(s))
			continue
		}
		c.Args = append(c.Args, s)
	}
	var val any
	var err error
	switch cmd := cmd.(type) {
	case *redis.Cmd:
		val, err = cmd.Val(), cmd.Err()
	case *redis.StringCmd:
		val, err = cmd.Val(), cmd.Err()
	default:
		r.t.Fatalf("unexpected command type %T", cmd)
	}
	switch {
	case errors.Is(err, redis.Nil):
		c.Reply = nil
	case err != nil:
		c.Reply = map[string]any{"error": err.Error()}
	default:
		c.Reply = Reply(r.t, val)
	}
	if r.opaque.Reply != nil {
		switch reply := c.Reply.(type) {
		case []any:
			for i, x := range reply {
				if s, ok := x.(string); ok && r.opaque.Reply(c.Script, i, s) {
					reply[i] = Hex(s)
				}
			}
		case string:
			if r.opaque.Reply(c.Script, -1, reply) {
				c.Reply = Hex(reply)
			}
		}
	}
	r.calls = append(r.calls, c)
}

// Arg spells an argument as go-redis sends it.
func Arg(t testing.TB, a any) string {
	switch a := a.(type) {
	case string:
		return a
	case []byte:
		return string(a)
	case int:
		return strconv.Itoa(a)
	case int64:
		return strconv.FormatInt(a, 10)
	case uint64:
		return strconv.FormatUint(a, 10)
	default:
		t.Fatalf("argument of type %T", a)
		return ""
	}
}

// Reply gives a go-redis reply as the file holds it.
func Reply(t testing.TB, v any) any {
	switch v := v.(type) {
	case nil, string, int64:
		return v
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = Reply(t, x)
		}
		return out
	default:
		t.Fatalf("reply of type %T", v)
		return nil
	}
}

// Dump returns every key of the server c talks to, sorted, with its
// contents; opaque names the values given as Bytes.
func Dump(t testing.TB, c *redis.Client, opaque Opaque) []KeyState {
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	sort.Strings(keys)
	out := []KeyState{}
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		require.NoError(t, err)
		pttl, err := c.Do(ctx, "PTTL", k).Int64()
		require.NoError(t, err)
		ks := KeyState{Key: k, Type: typ, PTTL: pttl}
		switch typ {
		case "hash":
			var h map[string]string
			h, err = c.HGetAll(ctx, k).Result()
			ks.Hash = map[string]any{}
			for f, v := range h {
				ks.Hash[f] = v
				if opaque.HashField != nil && opaque.HashField(k, f) {
					ks.Hash[f] = Hex(v)
				}
			}
		case "zset":
			var zs []redis.Z
			zs, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
			for _, z := range zs {
				ks.ZSet = append(ks.ZSet, ZMember{Member: z.Member.(string), Score: int64(z.Score)})
			}
		case "list":
			ks.List, err = c.LRange(ctx, k, 0, -1).Result()
		case "string":
			var s string
			s, err = c.Get(ctx, k).Result()
			ks.String = s
			if opaque.String != nil && opaque.String(k, s) {
				ks.String = Hex(s)
			}
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		require.NoError(t, err)
		out = append(out, ks)
	}
	return out
}

// Server is a miniredis with a clock that moves only when the test says,
// a recording client and every script of package lua loaded.
type Server struct {
	t      testing.TB
	mr     *miniredis.Miniredis
	opaque Opaque
	rec    *recorder
	now    time.Time
	// C is the recording client.
	C *redis.Client
}

// NewServer starts a server whose clock reads start.
func NewServer(t testing.TB, start time.Time, opaque Opaque) *Server {
	mr, c := redistest.Miniredis(t)
	mr.SetTime(start)
	srv := &Server{t: t, mr: mr, opaque: opaque, now: start, C: c}
	rec := &recorder{t: t, opaque: opaque, scripts: map[string]string{}, opIDs: map[string]string{}, now: &srv.now}
	srv.rec = rec
	c.AddHook(rec)
	for _, s := range lua.All() {
		sha, err := c.ScriptLoad(context.Background(), s.Source).Result()
		require.NoError(t, err)
		require.Equal(t, s.Hash(), sha)
		rec.scripts[sha] = s.Name
	}
	return srv
}

// Now returns the server's clock.
func (s *Server) Now() time.Time { return s.now }

// Advance moves the server clock, expiring keys as Redis would.
func (s *Server) Advance(d time.Duration) {
	s.now = s.now.Add(d)
	s.mr.SetTime(s.now)
	s.mr.FastForward(d)
}

// Step runs fn while recording its commands and returns the step.
func (s *Server) Step(name, op string, input map[string]any, fn func() map[string]any) Step {
	s.rec.on, s.rec.calls = true, nil
	result := fn()
	s.rec.on = false
	st := Step{Name: name, ServerTime: s.now.UTC().Format(time.RFC3339Nano), Op: op, Input: input,
		Calls: s.rec.calls, Result: result, State: Dump(s.t, s.C, s.opaque)}
	if st.Calls == nil {
		st.Calls = []Call{}
	}
	return st
}

// SameState checks that nothing changed from step before to step after:
// the same keys with the same contents, and each TTL down by the time
// between them (nothing refreshed it), but for the keys whose TTL ran out.
func SameState(t testing.TB, before, after Step) {
	t.Helper()
	t0, err := time.Parse(time.RFC3339Nano, before.ServerTime)
	require.NoError(t, err)
	t1, err := time.Parse(time.RFC3339Nano, after.ServerTime)
	require.NoError(t, err)
	want := []KeyState{}
	for _, k := range before.State {
		if k.PTTL >= 0 {
			if k.PTTL -= t1.Sub(t0).Milliseconds(); k.PTTL <= 0 {
				continue
			}
		}
		want = append(want, k)
	}
	assert.Equal(t, want, after.State, "%s: nothing changes", after.Name)
}

// UnHex returns the bytes of a {"hex": …} value read back from a file, or
// of a Bytes.
func UnHex(t testing.TB, v any) []byte {
	if b, ok := v.(Bytes); ok {
		v = map[string]any{"hex": b.Hex}
	}
	m, ok := v.(map[string]any)
	require.True(t, ok, "%v is no {hex}", v)
	b, err := hex.DecodeString(m["hex"].(string))
	require.NoError(t, err)
	return b
}

// Strings reads a call's arguments read back from a file, which are
// strings but for opaque bytes ({hex}), given back as their bytes.
func Strings(t testing.TB, args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if s, ok := a.(string); ok {
			out[i] = s
		} else {
			out[i] = string(UnHex(t, a))
		}
	}
	return out
}
