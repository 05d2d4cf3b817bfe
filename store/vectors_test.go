package store

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/vectorfile"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/lua"
	"github.com/contstore/contstore/session"
)

// testdata/vectors.json at the repository root holds the protocol's test
// vectors for other implementations (PROTOCOL.md). TestVectors rebuilds it
// from this code and fails on any difference; -update-vectors rewrites it.
var updateVectors = flag.Bool("update-vectors", false, "rewrite ../testdata/vectors.json from the code")

var vecPath = filepath.Join("..", "testdata", "vectors.json")

// vecFile is the layout of testdata/vectors.json.
type vecFile struct {
	About        []string          `json:"about"`
	Constants    vecConstants      `json:"constants"`
	Owners       []vecOwner        `json:"owners"`
	OwnerKeys    []vecOwnerKey     `json:"owner_keys"`
	Keys         []vecKeys         `json:"keys"`
	SessionKeys  []vecSessionKeys  `json:"session_keys"`
	Scores       []vecScore        `json:"scores"`
	TurnTokens   []vecTurnToken    `json:"turn_tokens"`
	Sequences    []vecSequence     `json:"sequences"`
	StoredBytes  []vecStoredBytes  `json:"stored_bytes"`
	Scripts      []vecScript       `json:"scripts"`
	Scenario     vecScenario       `json:"store_scenario"`
	SessionSteps []vecScenarioStep `json:"session_scenario"`
}

var vecAbout = []string{
	"Test vectors of the contstore protocol; PROTOCOL.md describes every rule they exercise.",
	"Regenerate with: go test ./store -run TestVectors -update-vectors. go test ./store ./identity fails when this file and the code disagree.",
	"A 64-bit digest is given as {hex: 16 lowercase hex digits, dec: the same 64 bits as a signed decimal int64, the form stored in Redis}.",
	"A text that is not valid UTF-8 is given in a *_hex field (its bytes in hex) instead of the plain field.",
	"Scenario replies: a JSON string is a bulk string, a number an integer reply, null a nil reply, an array an array reply.",
}

type vecConstants struct {
	MaxIDBytes             int    `json:"max_id_bytes"`
	ScoreEpochMillis       int64  `json:"score_epoch_ms"`
	ScoreTimeUnit          int64  `json:"score_time_unit"`
	ScorePublished         int64  `json:"score_published"`
	MaxStateBytes          int64  `json:"max_state_bytes"`
	TurnEpochSeconds       int64  `json:"turn_epoch_s"`
	TicksPerMilli          int64  `json:"ticks_per_ms"`
	TurnLimit              int64  `json:"turn_limit"`
	FreshStateOverhead     int64  `json:"fresh_state_overhead"`
	PublishedStateOverhead int64  `json:"published_state_overhead"`
	EvictionBudget         int    `json:"eviction_budget"`
	SchemaVersion          int    `json:"schema_version"`
	DefaultNamespace       string `json:"default_namespace"`
	DefaultPartitions      int    `json:"default_partitions"`
	MaxPartitions          int    `json:"max_partitions"`
	DefaultTTLMillis       int64  `json:"default_ttl_ms"`
	DefaultMaxOwners       int    `json:"default_max_owners"`
	DefaultMaxOwnerBytes   int64  `json:"default_max_owner_bytes"`
	DefaultMaxTotalBytes   int64  `json:"default_max_total_bytes"`
	MaxResponseIDBytes     int    `json:"max_response_id_bytes"`
	MaxReplicaBytes        int    `json:"max_replica_bytes"`
	MaxNamespaceBytes      int    `json:"max_namespace_bytes"`
}

// ---- owners and keys ----

type vecOwner struct {
	Name       string  `json:"name"`
	Session    *string `json:"session,omitempty"`
	SessionHex string  `json:"session_hex,omitempty"`
	// Agent is absent for a main owner.
	Agent         *string            `json:"agent,omitempty"`
	AgentHex      string             `json:"agent_hex,omitempty"`
	Valid         bool               `json:"valid"`
	Key           string             `json:"key,omitempty"`
	KeyHash       *vectorfile.Digest `json:"key_hash,omitempty"`
	Partition16   *int               `json:"partition_16,omitempty"`
	Partition1024 *int               `json:"partition_1024,omitempty"`
}

type vecOwnerCase struct {
	name, session string
	agent         *string
}

func vecStr(s string) *string { return &s }

func vecOwnerCases() []vecOwnerCase {
	return []vecOwnerCase{
		{"main", "session-a", nil},
		{"agent", "session-a", vecStr("agent-one")},
		{"main with ':'", "a:b", nil},
		{"agent with ':' in both ids", "a:b", vecStr("c:d")},
		{"agent whose ids would collide without escaping (1)", "a", vecStr("b:c")},
		{"agent whose ids would collide without escaping (2)", "a:b", vecStr("c")},
		{"main with '%'", "100%", nil},
		{"main that looks escaped", "%3A", nil},
		{"main that looks escaped twice", "%25", nil},
		{"main with braces", "{tag}", nil},
		{"agent with braces", "{s}", vecStr("}a{")},
		{"main that looks like a key", "m:x", nil},
		{"agent ':' and ':'", ":", vecStr(":")},
		{"main with spaces", " a b ", nil},
		{"main with non-ASCII", "é—ü日本語😀", nil},
		{"main with U+2028 (not a control character)", "a\u2028b", nil},
		{"main of 256 bytes", strings.Repeat("x", 256), nil},
		{"agent of 256 '%' each (longest key)", strings.Repeat("%", 256), vecStr(strings.Repeat("%", 256))},
		{"empty session", "", nil},
		{"empty agent", "s", vecStr("")},
		{"session of 257 bytes", strings.Repeat("x", 257), nil},
		{"agent of 257 bytes", "s", vecStr(strings.Repeat("x", 257))},
		{"NUL", "a\x00b", nil},
		{"tab", "a\tb", nil},
		{"line feed in agent", "s", vecStr("a\nb")},
		{"DEL", "a\x7fb", nil},
		{"C1 control U+0085", "a\u0085b", nil},
		{"invalid UTF-8", "a\xffb", nil},
		{"invalid UTF-8 in agent", "s", vecStr("\xc0\xaf")},
	}
}

func vecOwnerOf(c vecOwnerCase) (identity.Owner, error) {
	if c.agent == nil {
		return identity.Main(c.session)
	}
	return identity.Agent(c.session, *c.agent)
}

func vecOwners(t *testing.T) []vecOwner {
	var vs []vecOwner
	for _, c := range vecOwnerCases() {
		v := vecOwner{Name: c.name}
		v.Session, v.SessionHex = vectorfile.Text(c.session)
		if c.agent != nil {
			v.Agent, v.AgentHex = vectorfile.Text(*c.agent)
		}
		o, err := vecOwnerOf(c)
		if err != nil {
			require.ErrorIs(t, err, identity.ErrInvalid)
			vs = append(vs, v)
			continue
		}
		p16, p1024 := o.Partition(16), o.Partition(1024)
		h := vectorfile.NewDigest(xxhash.Sum64String(o.Key()))
		v.Valid, v.Key, v.KeyHash, v.Partition16, v.Partition1024 = true, o.Key(), &h, &p16, &p1024
		vs = append(vs, v)
	}
	return vs
}

type vecOwnerKey struct {
	Key     string  `json:"key"`
	Valid   bool    `json:"valid"`
	Session *string `json:"session,omitempty"`
	Agent   *string `json:"agent,omitempty"`
}

var vecOwnerKeyCases = []string{
	"m:a", "a:s:b", "m:100%25", "m:%253A", "a:a%3Ab:c%3Ad", "m:{x}", "a:%3A:%3A", "m:a%253",
	"", "m:", "a:", "a:s", "a:s:", "a::b", "x:a", "M:a", "m", "m:a:b", "a:s:b:c",
	"m:a%3a", "m:%41", "m:%", "m:%2", "m:a\x00",
}

func vecOwnerKeys(t *testing.T) []vecOwnerKey {
	var vs []vecOwnerKey
	for _, k := range vecOwnerKeyCases {
		v := vecOwnerKey{Key: k}
		o, err := identity.ParseKey(k)
		if err == nil {
			require.Equal(t, k, o.Key())
			v.Valid, v.Session = true, vecStr(o.Session())
			if o.IsAgent() {
				v.Agent = vecStr(o.AgentID())
			}
		} else {
			require.ErrorIs(t, err, identity.ErrInvalid)
		}
		vs = append(vs, v)
	}
	return vs
}

type vecKeys struct {
	Namespace  string  `json:"namespace"`
	Partitions int     `json:"partitions"`
	Session    string  `json:"session"`
	Agent      *string `json:"agent,omitempty"`
	OwnerKey   string  `json:"owner_key"`
	Partition  int     `json:"partition"`
	Tag        string  `json:"tag"`
	State      string  `json:"state"`
	LRU        string  `json:"lru"`
	Part       string  `json:"part"`
	Meta       string  `json:"meta"`
}

// vecOwnerIn returns the first owner "<prefix><n>" whose partition among
// parts satisfies ok.
func vecOwnerIn(t testing.TB, prefix string, parts int, ok func(int) bool) identity.Owner {
	for n := 0; n < 100000; n++ {
		o, err := identity.Main(prefix + strconv.Itoa(n))
		require.NoError(t, err)
		if ok(o.Partition(parts)) {
			return o
		}
	}
	t.Fatalf("no owner found")
	return identity.Owner{}
}

func vecKeyNames(t *testing.T) []vecKeys {
	agent, err := identity.Agent("s:1", "sub{1}")
	require.NoError(t, err)
	mainA, err := identity.Main("session-a")
	require.NoError(t, err)
	cases := []struct {
		ns    string
		parts int
		owner identity.Owner
	}{
		{"cont", 16, mainA},
		{"cont", 16, agent},
		{"cont", 1024, vecOwnerIn(t, "user-", 1024, func(p int) bool { return p < 10 })},
		{"cont", 1024, vecOwnerIn(t, "user-", 1024, func(p int) bool { return p >= 1000 })},
		{"gw:prod", 1024, vecOwnerIn(t, "user-", 1024, func(p int) bool { return p >= 100 && p < 1000 })},
		{"é", 1, mainA},
	}
	var vs []vecKeys
	for _, c := range cases {
		k := keyspace{ns: c.ns}
		p := c.owner.Partition(c.parts)
		v := vecKeys{Namespace: c.ns, Partitions: c.parts, Session: c.owner.Session(), OwnerKey: c.owner.Key(),
			Partition: p, Tag: k.tag(p), State: k.owner(p, c.owner), LRU: k.lru(p), Part: k.part(p), Meta: k.meta()}
		if c.owner.IsAgent() {
			v.Agent = vecStr(c.owner.AgentID())
		}
		vs = append(vs, v)
	}
	return vs
}

type vecSessionKeys struct {
	Namespace string `json:"namespace"`
	SessionID string `json:"session_id"`
	Head      string `json:"head"`
	Log       string `json:"log"`
}

// vecSessionKeyNames finds the session keys by saving a journal session in
// miniredis and listing the keys it wrote.
func vecSessionKeyNames(t *testing.T) []vecSessionKeys {
	cases := []struct{ ns, id string }{{"sess", "3f2a"}, {"sess", "a:b c"}, {"prod:sess", "é"}}
	var vs []vecSessionKeys
	for _, c := range cases {
		mr, client := redistest.Miniredis(t)
		st, err := session.NewRedisStore(client, session.StoreOptions{Namespace: c.ns, Mode: session.Journal})
		require.NoError(t, err)
		s := &session.Session{ID: c.id, Model: "m", Messages: []json.RawMessage{json.RawMessage(`{}`)}}
		require.NoError(t, st.Save(context.Background(), s))
		keys := mr.Keys()
		require.Len(t, keys, 2)
		v := vecSessionKeys{Namespace: c.ns, SessionID: c.id}
		for _, k := range keys {
			switch mr.Type(k) {
			case "hash":
				v.Head = k
			case "list":
				v.Log = k
			}
		}
		require.NotEmpty(t, v.Head)
		require.NotEmpty(t, v.Log)
		vs = append(vs, v)
	}
	return vs
}

// ---- LRU scores, turns, stored bytes ----

type vecScore struct {
	TouchedMillis int64  `json:"touched_ms"`
	Touched       string `json:"touched"`
	Published     bool   `json:"published"`
	Size          int64  `json:"size"`
	Score         int64  `json:"score"`
}

func vecScores(t *testing.T) []vecScore {
	cases := []struct {
		ms        int64
		published bool
		size      int64
	}{
		{scoreEpochMillis, false, 0},
		{scoreEpochMillis + 1, true, 372},
		{time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC).UnixMilli(), false, 288},
		{time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC).UnixMilli(), true, 384},
		{time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), true, 4095},
		{scoreEpochMillis + 1<<40 - 1, true, 4095},
	}
	var vs []vecScore
	for _, c := range cases {
		at := time.UnixMilli(c.ms).UTC()
		s := packScore(at, c.published, c.size)
		require.Equal(t, c.published, s.published())
		require.Equal(t, c.size, s.size())
		require.Equal(t, at, s.touched().UTC())
		vs = append(vs, vecScore{TouchedMillis: c.ms, Touched: at.Format(time.RFC3339Nano), Published: c.published, Size: c.size, Score: int64(s)})
	}
	return vs
}

type vecTurnToken struct {
	Seq        uint64 `json:"seq"`
	Partitions int    `json:"partitions"`
	Partition  int    `json:"partition"`
	// Turn is seq * partitions + partition, or absent when that reaches
	// 2^53 and reserve fails with "ERR turn overflow".
	Turn     *uint64 `json:"turn,omitempty"`
	Overflow bool    `json:"overflow,omitempty"`
}

type vecSequence struct {
	Name string `json:"name"`
	// PartitionSeq is the partition's stored seq before the call (0: none).
	PartitionSeq uint64 `json:"partition_seq"`
	// ServerTime is the Redis TIME reply: seconds and microseconds.
	TimeSeconds int64  `json:"time_s"`
	TimeMicros  int64  `json:"time_us"`
	Time        string `json:"time"`
	// OwnerTurn is the owner's current turn (0: no state).
	OwnerTurn  uint64 `json:"owner_turn"`
	Partitions int    `json:"partitions"`
	Partition  int    `json:"partition"`
	Ticks      uint64 `json:"ticks"`
	Seq        uint64 `json:"seq"`
	Turn       uint64 `json:"turn"`
}

// vecReserveRedis runs reserve.lua for owner on a fresh server whose
// partition seq, owner turn (0: none) and clock are set first, and returns
// the turn token of the reply.
func vecReserveRedis(t *testing.T, parts int, owner identity.Owner, prevSeq, ownerTurn uint64, now time.Time) (string, error) {
	mr, client := redistest.Miniredis(t)
	mr.SetTime(now)
	opts, err := Options{Namespace: "v", Partitions: parts, Replica: "r"}.withDefaults()
	require.NoError(t, err)
	b := &redisBackend{client: client, opts: opts, keys: keyspace{ns: "v"}}
	b.schema.running = true
	_, state, _, part := b.ownerKeys(owner)
	ctx := context.Background()
	if prevSeq > 0 {
		require.NoError(t, client.HSet(ctx, part, "seq", prevSeq).Err())
	}
	if ownerTurn > 0 {
		require.NoError(t, client.HSet(ctx, state, "t", ownerTurn).Err())
	}
	got, err := b.reserve(ctx, owner, freshStateBytes(owner), 1)
	if err != nil {
		return "", err
	}
	return got.Turn.String(), nil
}

func vecTurnTokens(t *testing.T) []vecTurnToken {
	ticks := clockTicks(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	cases := []struct {
		seq         uint64
		parts, part int
	}{
		{1, 16, 0},
		{1, 16, 15},
		{ticks, 16, 7},
		{ticks, 1024, 1023},
		{ticks, 1, 0},
		{1<<43 - 1, 1024, 1023},
		{1 << 43, 1024, 0},
		{1<<49 - 1, 16, 15},
		{1 << 49, 16, 0},
	}
	epoch := time.Unix(turnEpochSeconds, 0)
	var vs []vecTurnToken
	for _, c := range cases {
		v := vecTurnToken{Seq: c.seq, Partitions: c.parts, Partition: c.part}
		turn := c.seq*uint64(c.parts) + uint64(c.part)
		owner := vecOwnerIn(t, "owner-", c.parts, func(p int) bool { return p == c.part })
		got, err := vecReserveRedis(t, c.parts, owner, c.seq-1, 0, epoch)
		if turn >= 1<<53 {
			require.ErrorContains(t, err, "turn overflow")
			v.Overflow = true
		} else {
			require.NoError(t, err)
			require.Equal(t, strconv.FormatUint(turn, 10), got)
			v.Turn = &turn
			// The in-process backend gives the same token.
			m, err := NewMemory(Options{Partitions: c.parts, MaxOwners: c.parts, Now: func() time.Time { return epoch }})
			require.NoError(t, err)
			mem := m.backend.(*memory)
			mem.parts[c.part].seq = c.seq - 1
			r, err := mem.reserve(context.Background(), owner, freshStateBytes(owner), 0)
			require.NoError(t, err)
			require.Equal(t, Turn(turn), r.Turn)
		}
		vs = append(vs, v)
	}
	return vs
}

func vecSequences(t *testing.T) []vecSequence {
	at := time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC)
	ticks := clockTicks(at)
	cases := []struct {
		name           string
		prev, ownerSeq uint64 // ownerSeq: the seq of the owner's turn, 0 for none
		now            time.Time
		parts, part    int
	}{
		{"new partition: the clock", 0, 0, at, 16, 3},
		{"clock ahead of the stored seq", ticks - 1000, 0, at, 16, 3},
		{"stored seq ahead of the clock", ticks + 5000, 0, at, 16, 3},
		{"owner's turn ahead of both (seq lost, clock behind)", 0, ticks + 9000, at, 16, 3},
		{"owner's turn behind the stored seq", ticks + 5000, ticks + 10, at, 16, 3},
		{"sub-millisecond ticks: 124 us is 0 ticks", 0, 0, time.Date(2025, 6, 1, 0, 0, 0, 124000, time.UTC), 16, 0},
		{"sub-millisecond ticks: 125 us is 1 tick", 0, 0, time.Date(2025, 6, 1, 0, 0, 0, 125000, time.UTC), 16, 0},
		{"sub-millisecond ticks: 999999 us", 0, 0, time.Date(2025, 6, 1, 0, 0, 0, 999999000, time.UTC), 1024, 1000},
		{"epoch", 0, 0, time.Unix(turnEpochSeconds, 0), 1024, 5},
	}
	var vs []vecSequence
	for _, c := range cases {
		owner := vecOwnerIn(t, "owner-", c.parts, func(p int) bool { return p == c.part })
		var ownerTurn uint64
		if c.ownerSeq > 0 {
			ownerTurn = c.ownerSeq*uint64(c.parts) + uint64(c.part)
		}
		seq := nextSeq(c.prev, c.now, Turn(ownerTurn), c.parts)
		turn := seq*uint64(c.parts) + uint64(c.part)
		got, err := vecReserveRedis(t, c.parts, owner, c.prev, ownerTurn, c.now)
		require.NoError(t, err)
		require.Equal(t, strconv.FormatUint(turn, 10), got, c.name)
		vs = append(vs, vecSequence{Name: c.name, PartitionSeq: c.prev, TimeSeconds: c.now.Unix(),
			TimeMicros: int64(c.now.Nanosecond() / 1000), Time: c.now.UTC().Format(time.RFC3339Nano), OwnerTurn: ownerTurn,
			Partitions: c.parts, Partition: c.part, Ticks: clockTicks(c.now), Seq: seq, Turn: turn})
	}
	return vs
}

type vecStoredBytes struct {
	Session    string  `json:"session"`
	Agent      *string `json:"agent,omitempty"`
	KeyBytes   int     `json:"key_bytes"`
	ResponseID string  `json:"response_id"`
	Replica    string  `json:"replica"`
	Fresh      int64   `json:"fresh"`
	Published  int64   `json:"published"`
}

func vecStoredBytesCases(t *testing.T) []vecStoredBytes {
	cases := []struct {
		session       string
		agent         *string
		resp, replica string
	}{
		{"session-a", nil, "resp_68a1f0c2", "gw-a"},
		{"a:b", vecStr("c%d"), "resp_0123456789abcdef0123456789abcdef", "replica-3fa94c1e2b7d"},
		{"é", nil, "r", "é"},
		{strings.Repeat("%", 256), vecStr(strings.Repeat("%", 256)), strings.Repeat("r", maxResponseIDBytes), strings.Repeat("g", maxReplicaBytes)},
	}
	var vs []vecStoredBytes
	for _, c := range cases {
		o, err := vecOwnerOf(vecOwnerCase{session: c.session, agent: c.agent})
		require.NoError(t, err)
		cont := continuation{ResponseID: c.resp, Origin: Socket{Replica: c.replica, ID: 1}}
		v := vecStoredBytes{Session: c.session, Agent: c.agent, KeyBytes: len(o.Key()), ResponseID: c.resp, Replica: c.replica,
			Fresh: freshStateBytes(o), Published: publishedStateBytes(o, cont)}
		require.Less(t, v.Published, int64(scorePublished))
		vs = append(vs, v)
	}
	return vs
}

// ---- scripts ----

type vecScript struct {
	Name      string   `json:"name"`
	File      string   `json:"file"`
	Libraries []string `json:"libraries"`
	Keys      int      `json:"keys"`
	Args      int      `json:"args"`
	Variadic  bool     `json:"variadic,omitempty"`
	SourceLen int      `json:"source_bytes"`
	SHA1      string   `json:"sha1"`
}

func vecScripts(t *testing.T) []vecScript {
	lru, err := os.ReadFile(filepath.Join("..", "lua", "lru.lua"))
	require.NoError(t, err)
	var vs []vecScript
	for _, s := range lua.All() {
		v := vecScript{Name: s.Name, File: "lua/" + s.Name + ".lua", Libraries: []string{}, Keys: s.Keys, Args: s.Args,
			Variadic: s.Variadic, SourceLen: len(s.Source), SHA1: s.Hash()}
		if s.Source != s.File {
			require.Equal(t, string(lru)+"\n"+s.File, s.Source, "%s: composed source", s.Name)
			v.Libraries = append(v.Libraries, "lua/lru.lua")
		}
		sum := sha1.Sum([]byte(s.Source))
		require.Equal(t, hex.EncodeToString(sum[:]), s.Hash())
		vs = append(vs, v)
	}
	return vs
}

// ---- Redis scenarios ----

type vecCall struct {
	Command string   `json:"command"`
	Script  string   `json:"script,omitempty"`
	Keys    []string `json:"keys,omitempty"`
	Args    []string `json:"args"`
	Reply   any      `json:"reply"`
}

type vecZMember struct {
	Member string `json:"member"`
	Score  int64  `json:"score"`
}

type vecKeyState struct {
	Key  string `json:"key"`
	Type string `json:"type"`
	// PTTL is the key's remaining time to live in ms, -1 for none.
	PTTL int64             `json:"pttl_ms"`
	Hash map[string]string `json:"hash,omitempty"`
	ZSet []vecZMember      `json:"zset,omitempty"`
	List []string          `json:"list,omitempty"`
}

type vecScenarioStep struct {
	Name string `json:"name"`
	// ServerTime is the Redis server's clock during the step.
	ServerTime string         `json:"server_time"`
	Op         string         `json:"op"`
	Input      map[string]any `json:"input,omitempty"`
	Calls      []vecCall      `json:"calls"`
	Result     map[string]any `json:"result,omitempty"`
	// State is every key after the step.
	State []vecKeyState `json:"state"`
}

type vecScenario struct {
	Options map[string]any    `json:"options"`
	Steps   []vecScenarioStep `json:"steps"`
}

// vecRecorder is a go-redis hook that records the commands a step sends.
type vecRecorder struct {
	t       *testing.T
	on      bool
	calls   []vecCall
	scripts map[string]string // SHA1 → name
}

func (r *vecRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *vecRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (r *vecRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if r.on {
			r.record(cmd)
		}
		return err
	}
}

func (r *vecRecorder) record(cmd redis.Cmder) {
	args := cmd.Args()
	name := strings.ToUpper(fmt.Sprint(args[0]))
	c := vecCall{Command: name}
	var rest []any
	switch name {
	case "EVALSHA", "EVAL":
		c.Script = r.scripts[fmt.Sprint(args[1])]
		require.NotEmpty(r.t, c.Script, "unknown script")
		n := args[2].(int)
		for _, k := range args[3 : 3+n] {
			c.Keys = append(c.Keys, vecArg(r.t, k))
		}
		rest = args[3+n:]
	default:
		rest = args[1:]
	}
	c.Args = []string{}
	for _, a := range rest {
		c.Args = append(c.Args, vecArg(r.t, a))
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
		c.Reply = vecReply(r.t, val)
	}
	r.calls = append(r.calls, c)
}

// vecArg spells an argument as go-redis sends it.
func vecArg(t *testing.T, a any) string {
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

func vecReply(t *testing.T, v any) any {
	switch v := v.(type) {
	case nil, string, int64:
		return v
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = vecReply(t, x)
		}
		return out
	default:
		t.Fatalf("reply of type %T", v)
		return nil
	}
}

func vecDump(t *testing.T, c *redis.Client) []vecKeyState {
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	sort.Strings(keys)
	out := []vecKeyState{}
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		require.NoError(t, err)
		pttl, err := c.Do(ctx, "PTTL", k).Int64()
		require.NoError(t, err)
		ks := vecKeyState{Key: k, Type: typ, PTTL: pttl}
		switch typ {
		case "hash":
			ks.Hash, err = c.HGetAll(ctx, k).Result()
		case "zset":
			var zs []redis.Z
			zs, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
			for _, z := range zs {
				ks.ZSet = append(ks.ZSet, vecZMember{Member: z.Member.(string), Score: int64(z.Score)})
			}
		case "list":
			ks.List, err = c.LRange(ctx, k, 0, -1).Result()
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		require.NoError(t, err)
		out = append(out, ks)
	}
	return out
}

// vecServer is a miniredis with a stopped clock, a recording client and
// every script loaded.
type vecServer struct {
	t   *testing.T
	mr  *miniredis.Miniredis
	c   *redis.Client
	rec *vecRecorder
	now time.Time
}

func newVecServer(t *testing.T, start time.Time) *vecServer {
	mr, c := redistest.Miniredis(t)
	mr.SetTime(start)
	rec := &vecRecorder{t: t, scripts: map[string]string{}}
	c.AddHook(rec)
	for _, s := range lua.All() {
		sha, err := c.ScriptLoad(context.Background(), s.Source).Result()
		require.NoError(t, err)
		require.Equal(t, s.Hash(), sha)
		rec.scripts[sha] = s.Name
	}
	return &vecServer{t: t, mr: mr, c: c, rec: rec, now: start}
}

// advance moves the server clock, expiring keys as Redis would.
func (s *vecServer) advance(d time.Duration) {
	s.now = s.now.Add(d)
	s.mr.SetTime(s.now)
	s.mr.FastForward(d)
}

// step runs fn while recording its commands and returns the step.
func (s *vecServer) step(name, op string, input map[string]any, fn func() map[string]any) vecScenarioStep {
	s.rec.on, s.rec.calls = true, nil
	result := fn()
	s.rec.on = false
	st := vecScenarioStep{Name: name, ServerTime: s.now.UTC().Format(time.RFC3339Nano), Op: op, Input: input,
		Calls: s.rec.calls, Result: result, State: vecDump(s.t, s.c)}
	if st.Calls == nil {
		st.Calls = []vecCall{}
	}
	return st
}

// vecKey is the fingerprint key of the scenario's namespace: the bytes 0,
// 1, …, 31.
var vecKey = func() (k fingerprint.Key) {
	for i := range k {
		k[i] = byte(i)
	}
	return k
}()

var vecParser, _ = fingerprint.New(fingerprint.V2(), vecKey)

// vecNonceBackend is the Redis backend with the reserve nonce fixed by the
// scenario, so that its calls are reproducible.
type vecNonceBackend struct {
	*redisBackend
	nonce uint64
}

func (b *vecNonceBackend) reserve(ctx context.Context, owner identity.Owner, size int64, _ uint64) (reserved, error) {
	return b.redisBackend.reserve(ctx, owner, size, b.nonce)
}

func vecReservation(r *Reservation) map[string]any {
	out := map[string]any{"turn": r.Turn.String(), "reason": string(r.Reason), "continues": r.Continues(), "delta_count": r.DeltaCount}
	if r.Continues() {
		out["previous_response_id"] = r.PreviousResponseID
		out["origin_replica"] = r.Origin.Replica
		out["origin_socket"] = strconv.FormatUint(r.Origin.ID, 10)
		delta := []string{}
		for _, d := range r.Delta {
			delta = append(delta, string(d))
		}
		out["delta"] = delta
	}
	return out
}

func vecStoreScenario(t *testing.T) vecScenario {
	ctx := context.Background()
	srv := newVecServer(t, time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC))
	newStoreOn := func(o Options) (*Store, *vecNonceBackend) {
		opts, err := o.withDefaults()
		require.NoError(t, err)
		rb := &redisBackend{client: srv.c, opts: opts, keys: keyspace{ns: opts.Namespace}}
		rb.fp.Store(vecParser)
		rb.schema.running = true // no background schema checks in the record
		nb := &vecNonceBackend{redisBackend: rb}
		return &Store{opts: opts, backend: nb, inline: true, breakers: newBreakers(opts)}, nb
	}
	base := Options{Namespace: "cont", Replica: "gw-a", BreakerFailures: -1}
	s, nb := newStoreOn(base)
	var steps []vecScenarioStep
	add := func(st vecScenarioStep) { steps = append(steps, st) }
	nonces := uint64(0)
	nextNonce := func() uint64 {
		nonces++
		nb.nonce = nonces * 0x9e3779b97f4a7c15
		return nb.nonce
	}

	mustOwner := func(o identity.Owner, err error) identity.Owner {
		require.NoError(t, err)
		return o
	}
	s1 := mustOwner(identity.Main("s1"))
	sub := mustOwner(identity.Agent("s1", "sub:1"))

	u1 := `{"role":"user","content":"Hi"}`
	o1 := `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello!"}]}`
	u2 := `{"role":"user","content":"Weather in Zürich?"}`
	o2 := `{"type":"function_call","call_id":"c1","name":"weather","arguments":"{\"city\": \"Zürich\"}"}`
	body := func(instructions string, items ...string) string {
		return `{"model":"gpt-4.1","instructions":"` + instructions + `","store":false,"input":[` + strings.Join(items, ",") + `]}`
	}
	parse := func(b string) *fingerprint.Request {
		r, err := s.ParseRequest([]byte(b))
		require.NoError(t, err)
		return r
	}
	reserve := func(name string, o identity.Owner, b string, nonce uint64) *Reservation {
		if nonce == 0 {
			nonce = nextNonce()
		}
		nb.nonce = nonce
		var res *Reservation
		add(srv.step(name, "reserve", map[string]any{"owner": o.Key(), "request": b, "nonce": strconv.FormatUint(nonce, 16)}, func() map[string]any {
			res = s.Reserve(ctx, o, parse(b))
			require.NoError(t, res.Err)
			return vecReservation(res)
		}))
		return res
	}
	record := func(name string, res *Reservation, b string, out Result) {
		in := map[string]any{"owner": res.Owner.Key(), "turn": res.Turn.String(), "request": b,
			"response_id": out.ResponseID, "socket_replica": out.Socket.Replica, "socket_id": strconv.FormatUint(out.Socket.ID, 10)}
		outs := []string{}
		for _, o := range out.Output {
			outs = append(outs, string(o))
		}
		in["output"] = outs
		add(srv.step(name, "record", in, func() map[string]any {
			got, err := s.Record(ctx, res, out)
			require.NoError(t, err)
			return map[string]any{"outcome": string(got)}
		}))
	}
	output := func(items ...string) []json.RawMessage {
		var out []json.RawMessage
		for _, i := range items {
			out = append(out, json.RawMessage(i))
		}
		return out
	}
	tick := func() { srv.advance(1500 * time.Millisecond) }

	add(srv.step("open the namespace: record or compare the schema", "open", map[string]any{"namespace": "cont", "partitions": 16}, func() map[string]any {
		require.NoError(t, nb.checkSchema(ctx))
		return map[string]any{"schema_ok": true}
	}))
	tick()
	r1 := body("Be brief.", u1)
	a := reserve("first request of s1: no state", s1, r1, 0)
	tick()
	record("record the first response", a, r1, Result{ResponseID: "resp_1", Socket: Socket{ID: 7}, Output: output(o1)})
	tick()
	r2 := body("Be brief.", u1, o1, u2)
	nonceB := nextNonce()
	b := reserve("next request appends to the transcript: continue", s1, r2, nonceB)
	add(srv.step("the same reserve call sent again (client retry): the first answer", "reserve", map[string]any{"owner": s1.Key(), "request": r2, "nonce": strconv.FormatUint(nonceB, 16)}, func() map[string]any {
		nb.nonce = nonceB
		res := s.Reserve(ctx, s1, parse(r2))
		require.Equal(t, b.Turn, res.Turn)
		return vecReservation(res)
	}))
	add(srv.step("is the turn current", "is_current", map[string]any{"owner": s1.Key(), "turn": b.Turn.String()}, func() map[string]any {
		ok, err := s.IsCurrent(ctx, b)
		require.NoError(t, err)
		return map[string]any{"current": ok}
	}))
	add(srv.step("inspect an owner whose turn is in flight", "inspect", map[string]any{"owner": s1.Key()}, func() map[string]any {
		st, err := s.Inspect(ctx, s1)
		require.NoError(t, err)
		return vecStateResult(st)
	}))
	tick()
	record("a stale turn records: nothing changes", a, r1, Result{ResponseID: "resp_late", Socket: Socket{ID: 7}, Output: output(o1)})
	record("the current turn records", b, r2, Result{ResponseID: "resp_2", Socket: Socket{Replica: "gw-b", ID: 12}, Output: output(o2)})
	add(srv.step("inspect a published owner", "inspect", map[string]any{"owner": s1.Key()}, func() map[string]any {
		st, err := s.Inspect(ctx, s1)
		require.NoError(t, err)
		return vecStateResult(st)
	}))
	tick()
	r3 := body("Be verbose.", u1, o1, u2, o2)
	c := reserve("changed instructions: prompt_changed", s1, r3, 0)
	tick()
	record("record the full-context response", c, r3, Result{ResponseID: "resp_3", Socket: Socket{ID: 7}, Output: output(o1)})
	tick()
	r4 := body("Be verbose.", u1, o1)
	d := reserve("a request shorter than the transcript: not_append_only", s1, r4, 0)
	add(srv.step("abort the current turn", "abort", map[string]any{"owner": s1.Key(), "turn": d.Turn.String()}, func() map[string]any {
		ok, err := s.Abort(ctx, d)
		require.NoError(t, err)
		return map[string]any{"removed": ok}
	}))
	tick()
	e := reserve("after abort: missing_state", s1, r1, 0)
	record("a response without id is dropped (abort)", e, r1, Result{Socket: Socket{ID: 7}, Output: output(o1)})
	tick()
	f := reserve("an agent of s1: its own state", sub, r1, 0)
	record("the agent records", f, r1, Result{ResponseID: "resp_a1", Socket: Socket{ID: 9}, Output: output(o1)})
	tick()
	reserve("the agent sends its transcript unchanged: empty_delta", sub, body("Be brief.", u1, o1), 0)
	add(srv.step("clear the agent", "clear", map[string]any{"owner": sub.Key()}, func() map[string]any {
		require.NoError(t, s.Clear(ctx, sub))
		return map[string]any{}
	}))
	add(srv.step("inspect a cleared owner", "inspect", map[string]any{"owner": sub.Key()}, func() map[string]any {
		st, err := s.Inspect(ctx, sub)
		require.NoError(t, err)
		return vecStateResult(st)
	}))

	// Idle expiry: s2 and s3 publish, then nothing touches them for longer
	// than the TTL.
	p1 := s1.Partition(16)
	s2 := vecOwnerIn(t, "idle-", 16, func(p int) bool { return p != p1 })
	p2 := s2.Partition(16)
	s3 := vecOwnerIn(t, "idle-", 16, func(p int) bool { return p != p1 && p != p2 })
	tick()
	g := reserve("another owner", s2, r1, 0)
	record("it records", g, r1, Result{ResponseID: "resp_g", Socket: Socket{ID: 3}, Output: output(o1)})
	h := reserve("a third owner", s3, r1, 0)
	record("it records too", h, r1, Result{ResponseID: "resp_h", Socket: Socket{ID: 3}, Output: output(o1)})
	srv.advance(DefaultTTL + time.Second)
	add(srv.step("prune after the TTL: the idle state's bytes are given back", "prune", map[string]any{"partition": p2}, func() map[string]any {
		ev, err := nb.prune(ctx, p2)
		require.NoError(t, err)
		return map[string]any{"ttl": ev.TTL, "owners": ev.Owners, "bytes": ev.Bytes}
	}))
	tick()
	reserve("reserve finds its own expired LRU entry: missing_state, counted as a TTL eviction", s3, r2, 0)
	reserve("s1 starts again", s1, r1, 0)

	// Owner limit: a store whose share is one owner per partition.
	small, smallNB := newStoreOn(Options{Namespace: "cont", Replica: "gw-a", BreakerFailures: -1, MaxOwners: 16})
	tick()
	x := vecOwnerIn(t, "crowd-", 16, func(p int) bool { return p == p1 })
	nonce := nextNonce()
	smallNB.nonce = nonce
	add(srv.step("a store with MaxOwners 16 (one per partition) reserves a second owner in s1's partition: s1 is evicted", "reserve",
		map[string]any{"owner": x.Key(), "request": r1, "nonce": strconv.FormatUint(nonce, 16), "max_owners": 16}, func() map[string]any {
			res := small.Reserve(ctx, x, parse(r1))
			require.NoError(t, res.Err)
			return vecReservation(res)
		}))

	return vecScenario{
		Options: map[string]any{"namespace": "cont", "partitions": s.opts.Partitions, "ttl_ms": s.opts.TTL.Milliseconds(),
			"max_owners": s.opts.MaxOwners, "max_total_bytes": s.opts.MaxTotalBytes, "max_owner_bytes": s.opts.MaxOwnerBytes,
			"partition_owner_limit": s.opts.partitionOwners(), "partition_byte_limit": s.opts.partitionBytes(),
			"eviction_budget": evictionBudget, "replica": s.opts.Replica},
		Steps: steps,
	}
}

func vecStateResult(st State) map[string]any {
	out := map[string]any{"exists": st.Exists}
	if !st.Exists {
		return out
	}
	out["turn"] = st.Turn.String()
	out["updated_at"] = st.UpdatedAt.UTC().Format(time.RFC3339Nano)
	out["has_continuation"] = st.HasContinuation
	if st.HasContinuation {
		out["response_id"] = st.ResponseID
		out["origin_replica"] = st.Origin.Replica
		out["origin_socket"] = strconv.FormatUint(st.Origin.ID, 10)
		out["items"] = st.Items
		out["transcript_bytes"] = st.TranscriptBytes
	}
	return out
}

func vecSessionScenario(t *testing.T) []vecScenarioStep {
	ctx := context.Background()
	srv := newVecServer(t, time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	snap, err := session.NewRedisStore(srv.c, session.StoreOptions{Namespace: "sess"})
	require.NoError(t, err)
	journal, err := session.NewRedisStore(srv.c, session.StoreOptions{Namespace: "sess", Mode: session.Journal, TTL: time.Hour})
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
	var steps []vecScenarioStep
	save := func(name string, st session.Store, s *session.Session, mode string) {
		in := map[string]any{"mode": mode, "session": s.ID, "version": s.Version}
		steps = append(steps, srv.step(name, "session_save", in, func() map[string]any {
			switch err := st.Save(ctx, s); {
			case errors.Is(err, session.ErrConflict):
				return map[string]any{"error": "conflict"}
			default:
				require.NoError(t, err)
				return map[string]any{"version": s.Version}
			}
		}))
	}
	load := func(name string, st session.Store, id string) {
		steps = append(steps, srv.step(name, "session_load", map[string]any{"session": id}, func() map[string]any {
			return sessionResult(st.Load(ctx, id))
		}))
	}

	a := newSession("snap-1")
	stale := a.Clone()
	save("snapshot: first save (version 0)", snap, a, "snapshot")
	srv.advance(time.Second)
	a.Messages = append(a.Messages, msg(`{"role":"user","content":"More"}`))
	save("snapshot: next save", snap, a, "snapshot")
	save("snapshot: a copy loaded at an older version conflicts", snap, stale, "snapshot")
	load("snapshot: load", snap, "snap-1")

	j := newSession("journal-1")
	save("journal: first save writes every message (rewrite)", journal, j, "journal")
	srv.advance(time.Second)
	j.Messages = append(j.Messages, msg(`{"role":"user","content":"Weather?"}`))
	j.Tokens.Input += 50
	save("journal: an append-only extension pushes the new message", journal, j, "journal")
	srv.advance(time.Second)
	j.Messages[0] = msg(`{"role":"user","content":"Hi (edited)"}`)
	save("journal: an edited history is rewritten", journal, j, "journal")
	srv.advance(time.Second)
	require.NoError(t, srv.c.Del(ctx, "sess:{sess:journal-1}:log").Err())
	j.Messages = append(j.Messages, msg(`{"role":"assistant","content":"Sunny."}`))
	save("journal: the log was lost, so the append is refused and rewritten", journal, j, "journal")
	load("journal: load", journal, "journal-1")
	return steps
}

// ---- the file ----

func vecBuild(t *testing.T) vecFile {
	return vecFile{
		About: vecAbout,
		Constants: vecConstants{
			MaxIDBytes:       identity.MaxIDBytes,
			ScoreEpochMillis: scoreEpochMillis, ScoreTimeUnit: scoreTimeUnit, ScorePublished: scorePublished, MaxStateBytes: maxStateBytes,
			TurnEpochSeconds: turnEpochSeconds, TicksPerMilli: ticksPerMilli, TurnLimit: 1 << 53,
			FreshStateOverhead: freshStateOverhead, PublishedStateOverhead: publishedStateOverhead,
			EvictionBudget: evictionBudget, SchemaVersion: schemaVersion,
			DefaultNamespace: DefaultNamespace, DefaultPartitions: DefaultPartitions, MaxPartitions: MaxPartitions,
			DefaultTTLMillis: DefaultTTL.Milliseconds(), DefaultMaxOwners: DefaultMaxOwners,
			DefaultMaxOwnerBytes: DefaultMaxOwnerBytes, DefaultMaxTotalBytes: DefaultMaxTotalBytes,
			MaxResponseIDBytes: maxResponseIDBytes, MaxReplicaBytes: maxReplicaBytes, MaxNamespaceBytes: maxNamespaceBytes,
		},
		Owners:       vecOwners(t),
		OwnerKeys:    vecOwnerKeys(t),
		Keys:         vecKeyNames(t),
		SessionKeys:  vecSessionKeyNames(t),
		Scores:       vecScores(t),
		TurnTokens:   vecTurnTokens(t),
		Sequences:    vecSequences(t),
		StoredBytes:  vecStoredBytesCases(t),
		Scripts:      vecScripts(t),
		Scenario:     vecStoreScenario(t),
		SessionSteps: vecSessionScenario(t),
	}
}

// TestVectors rebuilds testdata/vectors.json from the code and fails when
// the stored file differs in any byte. Run with -update-vectors after an
// intended change of the protocol.
func TestVectors(t *testing.T) {
	vectorfile.Check(t, vecPath, vecBuild(t), *updateVectors, "go test ./store -run TestVectors -update-vectors")
}

// vecLoad reads the stored vectors.
func vecLoad(t *testing.T) vecFile {
	var f vecFile
	vectorfile.Load(t, vecPath, &f)
	return f
}

// TestVectorsFollowTheDocumentedRules checks the stored vectors with the
// formulas of PROTOCOL.md, written out here independently of the code that
// generates them.
func TestVectorsFollowTheDocumentedRules(t *testing.T) {
	f := vecLoad(t)
	c := f.Constants
	for _, v := range f.Owners {
		if !v.Valid {
			continue
		}
		session := vectorfile.UnText(t, v.Session, v.SessionHex)
		esc := strings.NewReplacer("%", "%25", ":", "%3A")
		key := "m:" + esc.Replace(session)
		if v.Agent != nil || v.AgentHex != "" {
			key = "a:" + esc.Replace(session) + ":" + esc.Replace(vectorfile.UnText(t, v.Agent, v.AgentHex))
		}
		assert.Equal(t, key, v.Key, v.Name)
		sum := xxhash.Sum64String(key)
		vectorfile.CheckDigest(t, *v.KeyHash, sum, v.Name)
		assert.Equal(t, int(sum%16), *v.Partition16, v.Name)
		assert.Equal(t, int(sum%1024), *v.Partition1024, v.Name)
	}

	for _, v := range f.Keys {
		assert.Equal(t, int(xxhash.Sum64String(v.OwnerKey)%uint64(v.Partitions)), v.Partition)
		tag := fmt.Sprintf("{%s:%02d}", v.Namespace, v.Partition)
		assert.Equal(t, tag, v.Tag)
		assert.Equal(t, v.Namespace+":"+tag+":o:"+v.OwnerKey, v.State)
		assert.Equal(t, v.Namespace+":"+tag+":lru", v.LRU)
		assert.Equal(t, v.Namespace+":"+tag+":part", v.Part)
		assert.Equal(t, v.Namespace+":{"+v.Namespace+"}:meta", v.Meta)
	}
	for _, v := range f.SessionKeys {
		tag := "{" + v.Namespace + ":" + v.SessionID + "}"
		assert.Equal(t, v.Namespace+":"+tag+":head", v.Head)
		assert.Equal(t, v.Namespace+":"+tag+":log", v.Log)
	}

	for _, v := range f.Scores {
		want := (v.TouchedMillis-c.ScoreEpochMillis)*c.ScoreTimeUnit + v.Size
		if v.Published {
			want += c.ScorePublished
		}
		assert.Equal(t, want, v.Score)
		assert.Less(t, v.Score, c.TurnLimit, "scores stay below 2^53")
	}
	for _, v := range f.TurnTokens {
		turn := v.Seq*uint64(v.Partitions) + uint64(v.Partition)
		if v.Overflow {
			assert.GreaterOrEqual(t, turn, uint64(c.TurnLimit))
			assert.Nil(t, v.Turn)
		} else {
			assert.Less(t, turn, uint64(c.TurnLimit))
			assert.Equal(t, turn, *v.Turn)
		}
	}
	for _, v := range f.Sequences {
		ticks := uint64((v.TimeSeconds-c.TurnEpochSeconds)*1000*c.TicksPerMilli + v.TimeMicros*c.TicksPerMilli/1000)
		assert.Equal(t, ticks, v.Ticks, v.Name)
		seq := max(v.PartitionSeq+1, ticks)
		if v.OwnerTurn != 0 {
			seq = max(seq, v.OwnerTurn/uint64(v.Partitions)+1)
		}
		assert.Equal(t, seq, v.Seq, v.Name)
		assert.Equal(t, seq*uint64(v.Partitions)+uint64(v.Partition), v.Turn, v.Name)
		at, err := time.Parse(time.RFC3339Nano, v.Time)
		require.NoError(t, err)
		assert.Equal(t, v.TimeSeconds, at.Unix())
		assert.Equal(t, v.TimeMicros, int64(at.Nanosecond()/1000))
	}
	for _, v := range f.StoredBytes {
		assert.Equal(t, c.FreshStateOverhead+int64(v.KeyBytes), v.Fresh)
		assert.Equal(t, v.Fresh+c.PublishedStateOverhead+int64(len(v.ResponseID)+len(v.Replica)), v.Published)
	}
	for _, v := range f.Scripts {
		src, err := os.ReadFile(filepath.Join("..", v.File))
		require.NoError(t, err)
		for _, lib := range slices.Backward(v.Libraries) {
			l, err := os.ReadFile(filepath.Join("..", lib))
			require.NoError(t, err)
			src = append(append(l, '\n'), src...)
		}
		sum := sha1.Sum(src)
		assert.Equal(t, hex.EncodeToString(sum[:]), v.SHA1, v.Name)
		assert.Equal(t, len(src), v.SourceLen, v.Name)
	}

	// In the scenario, every LRU score matches the state it names, and the
	// partition hash sums the LRU.
	for _, st := range f.Scenario.Steps {
		zsets := map[string][]vecZMember{}
		hashes := map[string]map[string]string{}
		for _, k := range st.State {
			zsets[k.Key], hashes[k.Key] = k.ZSet, k.Hash
		}
		for key, members := range zsets {
			if !strings.HasSuffix(key, ":lru") {
				continue
			}
			var size, published int64
			for _, m := range members {
				low := m.Score % c.ScoreTimeUnit
				size += low % c.ScorePublished
				if low >= c.ScorePublished {
					published++
				}
			}
			part := hashes[strings.TrimSuffix(key, "lru")+"part"]
			assert.Equal(t, strconv.FormatInt(size, 10), part["bytes"], "%s: %s bytes", st.Name, key)
			assert.Equal(t, strconv.FormatInt(published, 10), part["published"], "%s: %s published", st.Name, key)
		}
	}
}
