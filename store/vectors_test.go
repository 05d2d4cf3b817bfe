package store

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redisconn"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/serverclock"
	"github.com/contstore/contstore/internal/vectorfile"
	"github.com/contstore/contstore/internal/vectorscenario"
)

// testdata/vectors.json at the repository root holds the protocol's test
// vectors for other implementations (PROTOCOL.md). TestVectors rebuilds it
// from this code and fails on any difference; -update-vectors rewrites it.
var updateVectors = flag.Bool("update-vectors", false, "rewrite ../testdata/vectors.json from the code")

var vecPath = filepath.Join("..", "testdata", "vectors.json")

// vecFile is the layout of testdata/vectors.json.
type vecFile struct {
	About         []string          `json:"about"`
	Constants     vecConstants      `json:"constants"`
	Owners        []vecOwner        `json:"owners"`
	OwnerKeys     []vecOwnerKey     `json:"owner_keys"`
	Keys          []vecKeys         `json:"keys"`
	Scores        []vecScore        `json:"scores"`
	Continuations []vecContinuation `json:"continuations"`
	TurnTokens    []vecTurnToken    `json:"turn_tokens"`
	Sequences     []vecSequence     `json:"sequences"`
	StoredBytes   []vecStoredBytes  `json:"stored_bytes"`
	Scripts       []vecScript       `json:"scripts"`
	Library       vecLibrary        `json:"function_library"`
	Scenario      vecScenario       `json:"store_scenario"`
}

var vecAbout = []string{
	"Test vectors of the contstore protocol; PROTOCOL.md describes every rule they exercise.",
	"Regenerate with: go test ./store -run TestVectors -update-vectors. go test ./store ./identity fails when this file and the code disagree.",
	"A 64-bit digest is given as {hex: 16 lowercase hex digits, dec: the same 64 bits as a signed decimal int64}.",
	"A turn token is given as a decimal string: tokens may exceed 2^53.",
	"A text that is not valid UTF-8 is given in a *_hex field (its bytes in hex) instead of the plain field.",
	"A continuation (opaque bytes) is given as {hex: its bytes in hex} wherever it appears: record's ARGV[4], inspect's reply [3], field c of an owner state hash; so is the whole reply, and the whole answer, of a reserve that consumed one.",
	"Scenario replies: a JSON string is a bulk string, a number an integer reply, null a nil reply, an array an array reply, {error: text} an error reply.",
}

type vecConstants struct {
	MaxIDBytes       int   `json:"max_id_bytes"`
	ScoreEpochMillis int64 `json:"score_epoch_ms"`
	ScoreTimeUnit    int64 `json:"score_time_unit"`
	ScorePublished   int64 `json:"score_published"`
	MaxStateBytes    int64 `json:"max_state_bytes"`
	TurnEpochSeconds int64 `json:"turn_epoch_s"`
	// SeqLimit is 2^53: sequence numbers, scores, sizes and counters stay
	// below it (Lua numbers are doubles); turn tokens do not.
	SeqLimit           int64 `json:"seq_limit"`
	StateOverhead      int64 `json:"state_overhead"`
	StateNameCost      int64 `json:"state_name_cost_percent"`
	ContinuationFormat int   `json:"continuation_format"`
	// OpBytes is the length of an op (PROTOCOL.md 6.6).
	OpBytes                int    `json:"op_bytes"`
	EvictionBudget         int    `json:"eviction_budget"`
	SchemaVersion          int    `json:"schema_version"`
	DefaultNamespace       string `json:"default_namespace"`
	DefaultPartitions      int    `json:"default_partitions"`
	MaxPartitions          int    `json:"max_partitions"`
	DefaultTTLMillis       int64  `json:"default_ttl_ms"`
	DefaultMaxOwners       int    `json:"default_max_owners"`
	DefaultMaxOwnerBytes   int64  `json:"default_max_owner_bytes"`
	DefaultMaxTotalBytes   int64  `json:"default_max_total_bytes"`
	DefaultOpTimeoutMillis int64  `json:"default_op_timeout_ms"`
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

// vecTurn is a turn token as the file holds it: decimal, in a string (it
// may exceed 2^53).
func vecTurn(t Turn) string { return strconv.FormatUint(uint64(t), 10) }

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
	// OwnerPrefix is the partition's prefix of state keys (prune's ARGV[3]);
	// LRUMember is the owner's member in the LRU: State without it.
	OwnerPrefix string `json:"owner_prefix"`
	LRUMember   string `json:"lru_member"`
	// AnswerPrefix followed by an op in hex is the answer key of
	// one operation that changes the owner.
	AnswerPrefix string `json:"answer_prefix"`
	LRU          string `json:"lru"`
	Part         string `json:"part"`
	Meta         string `json:"meta"`
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
		k := newKeyspace(c.ns, c.parts)
		p := c.owner.Partition(c.parts)
		v := vecKeys{Namespace: c.ns, Partitions: c.parts, Session: c.owner.Session(), OwnerKey: c.owner.Key(),
			Partition: p, Tag: k.tag(p), State: k.owner(p, c.owner), OwnerPrefix: k.ownerPrefix(p), LRUMember: c.owner.Key(),
			AnswerPrefix: strings.TrimSuffix(k.answer(p, c.owner, "op"), lua.CallIDKey("op")), LRU: k.lru(p), Part: k.part(p), Meta: k.meta()}
		require.Equal(t, v.State, v.OwnerPrefix+v.LRUMember)
		if c.owner.IsAgent() {
			v.Agent = vecStr(c.owner.AgentID())
		}
		vs = append(vs, v)
	}
	return vs
}

// ---- LRU scores, continuations, turns, stored bytes ----

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

// vecContinuation is a continuation and its encoding (field c of an owner
// state), or, when not Valid, bytes that do not decode.
type vecContinuation struct {
	Name  string `json:"name"`
	Hex   string `json:"hex"`
	Valid bool   `json:"valid"`
	// DecodeOnly marks an encoding of a format that is read but no longer
	// written.
	DecodeOnly bool `json:"decode_only,omitempty"`
	// The decoded continuation, when Valid. AnySocket: any socket of any
	// replica (socket id 0); OriginReplica and OriginDigest are then empty
	// and OriginSocket "0". OriginReplica is the replica's name as the
	// encoder was given it; the encoding holds its digest, OriginDigest
	// (16 hex digits, names.ReplicaDigest), which is what a decoder gives.
	ResponseID      *string            `json:"response_id,omitempty"`
	AnySocket       bool               `json:"any_socket,omitempty"`
	OriginReplica   *string            `json:"origin_replica,omitempty"`
	OriginDigest    string             `json:"origin_replica_digest,omitempty"`
	OriginSocket    string             `json:"origin_socket,omitempty"`
	Items           *int               `json:"items,omitempty"`
	TranscriptBytes *int64             `json:"transcript_bytes,omitempty"`
	Digest          *vectorfile.Digest `json:"digest,omitempty"`
	Signature       *vectorfile.Digest `json:"signature,omitempty"`
	// References, with any socket only: transcript item and mask.
	References []vecReference `json:"references,omitempty"`
}

// vecReference is one reference of a continuation's transcript.
type vecReference struct {
	Item int               `json:"item"`
	Mask vectorfile.Digest `json:"mask"`
}

func vecContinuations(t *testing.T) []vecContinuation {
	cases := []struct {
		name string
		c    continuation
	}{
		{"a socket of a replica", continuation{ResponseID: "resp_68a1f0c2", Origin: Socket{Replica: "gw-a", ID: 7},
			Signature: 0xd4d1fe4b38ed9369, Transcript: fingerprint.Transcript{Items: 2, Digest: 0x7c6d5e4f3a2b1c0d, Bytes: 118}}},
		{"an id as OpenAI gives them, resp_ and 48 lowercase hex digits: held as the 24 bytes they spell (format 4)",
			continuation{ResponseID: "resp_67cb71b351908190a308f3859487620d06981a8637e6bc44", Origin: Socket{Replica: "gw-a", ID: 1},
				Signature: 2, Transcript: fingerprint.Transcript{Items: 4, Digest: 3, Bytes: 900}}},
		{"uppercase hex digits: held as they are (format 3)", continuation{ResponseID: "resp_68A1F0C2", Origin: Socket{Replica: "gw-a", ID: 1},
			Signature: 2, Transcript: fingerprint.Transcript{Items: 4, Digest: 3, Bytes: 900}}},
		{"an odd number of hex digits: held as they are (format 3)", continuation{ResponseID: "resp_68a1f", Origin: Socket{Replica: "gw-a", ID: 1},
			Signature: 2, Transcript: fingerprint.Transcript{Items: 4, Digest: 3, Bytes: 900}}},
		{"any socket (the upstream stores responses)", continuation{ResponseID: "resp_store", Origin: Socket{Any: true},
			Signature: 1, Transcript: fingerprint.Transcript{Items: 1, Digest: 2, Bytes: 3}}},
		{"any socket with references to its output items 2 and 3", continuation{ResponseID: "resp_67cb71b351908190a308f3859487620d06981a8637e6bc44", Origin: Socket{Any: true},
			Signature: 1, Transcript: fingerprint.Transcript{Items: 4, Digest: 2, Bytes: 300,
				References: []fingerprint.Reference{{Item: 2, Mask: 0x0123456789abcdef}, {Item: 3, Mask: 0xfedcba9876543210}}}}},
		{"multi-byte varints: 300 items, 2,000,000 bytes, socket id 2^64-1", continuation{ResponseID: "r", Origin: Socket{Replica: "replica-3fa94c1e2b7d", ID: 1<<64 - 1},
			Signature: 0x8000000000000000, Transcript: fingerprint.Transcript{Items: 300, Digest: 0xffffffffffffffff, Bytes: 2_000_000}}},
		{"non-ASCII ids, 128-byte response id", continuation{ResponseID: "é" + strings.Repeat("x", 126), Origin: Socket{Replica: "é—日本", ID: 128},
			Transcript: fingerprint.Transcript{}}},
		{"longest response id and replica", continuation{ResponseID: strings.Repeat("r", maxResponseIDBytes), Origin: Socket{Replica: strings.Repeat("g", maxReplicaBytes), ID: 1},
			Signature: 0x0123456789abcdef, Transcript: fingerprint.Transcript{Items: 1, Digest: 0xfedcba9876543210, Bytes: 2}}},
	}
	var vs []vecContinuation
	add := func(name string, c continuation, b []byte, decodeOnly bool) {
		back, err := decodeContinuation(b)
		require.NoError(t, err, name)
		want := c
		if !c.Origin.Any {
			want.Origin.Replica = replicaRef(c.Origin.Replica)
		}
		require.Equal(t, want, back, name)
		d, g := vectorfile.NewDigest(c.Transcript.Digest), vectorfile.NewDigest(c.Signature)
		v := vecContinuation{Name: name, Hex: hex.EncodeToString(b), Valid: true, DecodeOnly: decodeOnly, ResponseID: vecStr(c.ResponseID),
			AnySocket: c.Origin.Any, OriginReplica: vecStr(c.Origin.Replica), OriginSocket: strconv.FormatUint(c.Origin.ID, 10),
			Items: &c.Transcript.Items, TranscriptBytes: &c.Transcript.Bytes, Digest: &d, Signature: &g}
		for _, r := range c.Transcript.References {
			v.References = append(v.References, vecReference{Item: r.Item, Mask: vectorfile.NewDigest(r.Mask)})
		}
		if !c.Origin.Any {
			v.OriginDigest = strings.TrimPrefix(want.Origin.Replica, "#")
		}
		vs = append(vs, v)
	}
	for _, c := range cases {
		add(c.name, c.c, encodeContinuation(c.c), false)
	}
	for _, c := range cases[:3] {
		add("written before replicas were held by their digest: "+c.name, c.c, encodeNamedContinuation(c.c), true)
	}
	many := continuation{ResponseID: "resp_67cb71b351908190a308f3859487620d06981a8637e6bc44", Origin: Socket{Any: true},
		Signature: 1, Transcript: fingerprint.Transcript{Items: 6, Digest: 2, Bytes: 300}}
	for i := 1; i < 6; i++ {
		many.Transcript.References = append(many.Transcript.References, fingerprint.Reference{Item: i, Mask: uint64(i)})
	}
	kept := many
	kept.Transcript.References = many.Transcript.References[:2]
	add("references beyond 64 bytes are left out", kept, encodeContinuation(many), false)
	digests := strings.Repeat("00", 16)
	over := hex.EncodeToString(binary.AppendUvarint(nil, 1<<62+1))
	for _, c := range []struct{ name, hex string }{
		{"empty", ""},
		{"unknown format byte", "05" + "0000" + digests + "01" + "01" + "72"},
		{"format byte 0", "00" + "0000" + digests + "01" + "01" + "72"},
		{"replica digest of 7 bytes", "03" + "0000" + digests + "01" + "01" + "72" + strings.Repeat("ab", 7)},
		{"replica digest of 9 bytes", "03" + "0000" + digests + "01" + "01" + "72" + strings.Repeat("ab", 9)},
		{"truncated varint", "0180"},
		{"item count above 2^62", "01" + over + "00" + digests + "01" + "01" + "72"},
		{"truncated digests", "01" + "0000" + strings.Repeat("00", 15)},
		{"no socket id", "01" + "0000" + digests},
		{"empty response id", "01" + "0000" + digests + "01" + "00"},
		{"response id longer than the rest", "01" + "0000" + digests + "01" + "03" + "7272"},
		{"a reference to item count minus 0", "03" + "0200" + digests + "00" + "01" + "72" + "00" + strings.Repeat("ab", 8)},
		{"a reference beyond the transcript", "03" + "0200" + digests + "00" + "01" + "72" + "03" + strings.Repeat("ab", 8)},
		{"a truncated reference mask", "03" + "0200" + digests + "00" + "01" + "72" + "01" + strings.Repeat("ab", 7)},
		{"references out of order", "03" + "0200" + digests + "00" + "01" + "72" + "01" + strings.Repeat("ab", 8) + "02" + strings.Repeat("ab", 8)},
	} {
		b, err := hex.DecodeString(c.hex)
		require.NoError(t, err)
		_, err = decodeContinuation(b)
		require.ErrorIs(t, err, errBadReply, c.name)
		vs = append(vs, vecContinuation{Name: c.name, Hex: c.hex})
	}
	return vs
}

// encodeNamedContinuation encodes c as states written before replicas were
// held by their digest: format 1 or 2, the replica's name to the end.
func encodeNamedContinuation(c continuation) []byte {
	b := encodeContinuation(continuation{ResponseID: c.ResponseID, Origin: Socket{Any: true}, Signature: c.Signature, Transcript: c.Transcript})
	b[0] -= continuationFormat - continuationNamedFormat
	if c.Origin.Any {
		return b
	}
	// the socket id sits after the format byte, the two sizes and the digests
	_, n1 := binary.Uvarint(b[1:])
	_, n2 := binary.Uvarint(b[1+n1:])
	at := 1 + n1 + n2 + 16
	out := append(append([]byte(nil), b[:at]...), binary.AppendUvarint(nil, c.Origin.ID)...)
	out = append(out, b[at+1:]...)
	return append(out, c.Origin.Replica...)
}

type vecTurnToken struct {
	Seq        uint64 `json:"seq"`
	Partitions int    `json:"partitions"`
	Partition  int    `json:"partition"`
	// Turn is seq * partitions + partition, a 64-bit unsigned integer.
	Turn string `json:"turn"`
}

type vecSequence struct {
	Name string `json:"name"`
	// PartitionSeq is the partition's stored seq before the call (0: none).
	PartitionSeq uint64 `json:"partition_seq"`
	// ServerTime is the Redis TIME reply: seconds and microseconds.
	TimeSeconds int64  `json:"time_s"`
	TimeMicros  int64  `json:"time_us"`
	Time        string `json:"time"`
	// OwnerT is field t of the owner's state before the call (0: no
	// state): its turn's seq, negative once that turn published.
	OwnerT     int64  `json:"owner_t"`
	Partitions int    `json:"partitions"`
	Partition  int    `json:"partition"`
	Micros     uint64 `json:"micros"`
	Seq        uint64 `json:"seq"`
	Turn       string `json:"turn"`
}

// vecReserveRedis runs reserve.lua for owner on a fresh server whose
// partition seq, owner state field t (0: no state) and clock are set first,
// and returns the turn token of the reply.
func vecReserveRedis(t *testing.T, parts int, owner identity.Owner, prevSeq uint64, ownerT int64, now time.Time) Turn {
	mr, client := redistest.Miniredis(t)
	mr.SetTime(now)
	opts, err := Options{Namespace: "v", Partitions: parts, Replica: "r"}.withDefaults()
	require.NoError(t, err)
	b := newRedisBackend(redisconn.GoRedis(client), opts)
	b.schema.running = true
	b.servers.Seed(now.UnixMilli() - serverclock.EpochMillis)
	p, keys := b.ownerKeys(owner)
	ctx := context.Background()
	if prevSeq > 0 {
		require.NoError(t, client.Set(ctx, b.keys.seq(p), prevSeq, 0).Err())
	}
	if ownerT != 0 {
		require.NoError(t, client.HSet(ctx, keys[0], "t", ownerT).Err())
	}
	got, err := b.reserve(ctx, owner)
	require.NoError(t, err)
	return got.Turn
}

func vecTurnTokens(t *testing.T) []vecTurnToken {
	us := clockMicros(time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC))
	cases := []struct {
		seq         uint64
		parts, part int
	}{
		{1, 16, 0},
		{1, 16, 15},
		{us, 16, 7},
		{us, 1024, 1023},
		{us, 1, 0},
		{1<<53 - 1, 16, 15},
		{1<<53 - 1, 1024, 1023},
	}
	epoch := time.Unix(turnEpochSeconds, 0)
	var vs []vecTurnToken
	for _, c := range cases {
		turn := Turn(c.seq*uint64(c.parts) + uint64(c.part))
		owner := vecOwnerIn(t, "owner-", c.parts, func(p int) bool { return p == c.part })
		// At the turn epoch the clock term is 0: the partition's seq decides.
		require.Equal(t, turn, vecReserveRedis(t, c.parts, owner, c.seq-1, 0, epoch))
		// The in-process backend gives the same token.
		m, err := NewMemory(Options{Partitions: c.parts, MaxOwners: c.parts, now: func() time.Time { return epoch }})
		require.NoError(t, err)
		mem := m.backend.(*memory)
		mem.parts[c.part].seq = c.seq - 1
		r, err := mem.reserve(context.Background(), owner)
		require.NoError(t, err)
		require.Equal(t, turn, r.Turn)
		seq, ok := seqOf(turn, c.parts, c.part)
		require.True(t, ok)
		require.Equal(t, c.seq, seq)
		vs = append(vs, vecTurnToken{Seq: c.seq, Partitions: c.parts, Partition: c.part, Turn: vecTurn(turn)})
	}
	return vs
}

func vecSequences(t *testing.T) []vecSequence {
	at := time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC)
	us := int64(clockMicros(at))
	cases := []struct {
		name        string
		prev        uint64
		ownerT      int64 // the owner's t, 0 for no state
		now         time.Time
		parts, part int
	}{
		{"new partition: the clock", 0, 0, at, 16, 3},
		{"clock ahead of the stored seq", uint64(us - 1000), 0, at, 16, 3},
		{"stored seq ahead of the clock", uint64(us + 5000), 0, at, 16, 3},
		{"owner's turn ahead of both (seq lost, clock behind)", 0, us + 9000, at, 16, 3},
		{"owner's published turn (t negative) ahead of both", 0, -(us + 9000), at, 16, 3},
		{"owner's turn behind the stored seq", uint64(us + 5000), us + 10, at, 16, 3},
		{"microseconds: 1 us", 0, 0, time.Date(2025, 6, 1, 0, 0, 0, 1000, time.UTC), 16, 0},
		{"microseconds: 999999 us", 0, 0, time.Date(2025, 6, 1, 0, 0, 0, 999999000, time.UTC), 1024, 1000},
		{"epoch", 0, 0, time.Unix(turnEpochSeconds, 0), 1024, 5},
	}
	var vs []vecSequence
	for _, c := range cases {
		owner := vecOwnerIn(t, "owner-", c.parts, func(p int) bool { return p == c.part })
		seq := nextSeq(c.prev, c.now, uint64(max(c.ownerT, -c.ownerT)))
		turn := turnOf(seq, c.parts, c.part)
		require.Equal(t, turn, vecReserveRedis(t, c.parts, owner, c.prev, c.ownerT, c.now), c.name)
		vs = append(vs, vecSequence{Name: c.name, PartitionSeq: c.prev, TimeSeconds: c.now.Unix(),
			TimeMicros: int64(c.now.Nanosecond() / 1000), Time: c.now.UTC().Format(time.RFC3339Nano), OwnerT: c.ownerT,
			Partitions: c.parts, Partition: c.part, Micros: clockMicros(c.now), Seq: seq, Turn: vecTurn(turn)})
	}
	return vs
}

// vecStoredBytes is the stored-bytes estimate of an owner's state, without
// and with a continuation of ContinuationBytes (the encoding's length), and
// the size its LRU score holds.
type vecStoredBytes struct {
	Namespace     string  `json:"namespace"`
	Partitions    int     `json:"partitions"`
	Session       string  `json:"session"`
	Agent         *string `json:"agent,omitempty"`
	Partition     int     `json:"partition"`
	StateKeyBytes int     `json:"state_key_bytes"`
	MemberBytes   int     `json:"member_bytes"`
	// The continuation: its encoding's length depends on these.
	ResponseID        string `json:"response_id"`
	OriginReplica     string `json:"origin_replica"`
	OriginSocket      string `json:"origin_socket"`
	Items             int    `json:"items"`
	TranscriptBytes   int64  `json:"transcript_bytes"`
	ContinuationBytes int    `json:"continuation_bytes"`
	// WithoutContinuation is the estimate the store sends to reserve and
	// record; WithContinuation adds the continuation's bytes, as the scripts
	// do; ScoreSize is the size packed in the LRU score.
	WithoutContinuation int64 `json:"without_continuation"`
	WithContinuation    int64 `json:"with_continuation"`
	ScoreSize           int64 `json:"score_size"`
}

func vecStoredBytesCases(t *testing.T) []vecStoredBytes {
	cases := []struct {
		ns            string
		parts         int
		session       string
		agent         *string
		resp, replica string
		socket        uint64
		items         int
		bytes         int64
	}{
		{"cont", 16, "session-a", nil, "resp_68a1f0c2", "gw-a", 7, 2, 118},
		{"cont", 1024, "a:b", vecStr("c%d"), "resp_0123456789abcdef0123456789abcdef", "replica-3fa94c1e2b7d", 1<<64 - 1, 300, 2_000_000},
		{"é", 1, "é", nil, "r", "é", 1, 1, 1},
		{strings.Repeat("n", maxNamespaceBytes), 1024, "user-1", nil, "resp_1", "gw-a", 12, 4, 400},
		{"cont", 16, strings.Repeat("%", 256), vecStr(strings.Repeat("%", 256)), strings.Repeat("r", maxResponseIDBytes), strings.Repeat("g", maxReplicaBytes), 1, 1, 1},
	}
	var vs []vecStoredBytes
	for _, c := range cases {
		o, err := vecOwnerOf(vecOwnerCase{session: c.session, agent: c.agent})
		require.NoError(t, err)
		keys := newKeyspace(c.ns, c.parts)
		p := o.Partition(c.parts)
		cont := continuation{ResponseID: c.resp, Origin: Socket{Replica: c.replica, ID: c.socket},
			Transcript: fingerprint.Transcript{Items: c.items, Bytes: c.bytes}}
		n := len(encodeContinuation(cont))
		without := keys.stateBytes(p, o)
		with := without + int64(n)
		vs = append(vs, vecStoredBytes{Namespace: c.ns, Partitions: c.parts, Session: c.session, Agent: c.agent, Partition: p,
			StateKeyBytes: len(keys.owner(p, o)), MemberBytes: len(o.Key()),
			ResponseID: c.resp, OriginReplica: c.replica, OriginSocket: strconv.FormatUint(c.socket, 10), Items: c.items, TranscriptBytes: c.bytes,
			ContinuationBytes: n, WithoutContinuation: without, WithContinuation: with,
			ScoreSize: packScore(time.UnixMilli(scoreEpochMillis), true, with).size()})
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

// vecLibraries returns the files of internal/lua/ that are no script (oplog.lua,
// lru.lua): the libraries scripts are composed with, by name.
func vecLibraries(t *testing.T) map[string]string {
	files, err := filepath.Glob(filepath.Join("..", "internal", "lua", "*.lua"))
	require.NoError(t, err)
	libs := map[string]string{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".lua")
		if slices.ContainsFunc(lua.All(), func(s *lua.Script) bool { return s.Name == name }) {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		libs[name] = string(b)
	}
	require.NotEmpty(t, libs)
	return libs
}

func vecScripts(t *testing.T) []vecScript {
	libs := vecLibraries(t)
	names := slices.Sorted(maps.Keys(libs))
	var vs []vecScript
	for _, s := range lua.All() {
		v := vecScript{Name: s.Name, File: "internal/lua/" + s.Name + ".lua", Libraries: []string{}, Keys: s.Keys, Args: s.Args,
			Variadic: s.Variadic, SourceLen: len(s.Source), SHA1: s.Hash()}
		// The source is each library followed by "\n", then the file.
		rest := s.Source
		for rest != s.File {
			i := slices.IndexFunc(names, func(n string) bool { return strings.HasPrefix(rest, libs[n]+"\n") })
			require.GreaterOrEqual(t, i, 0, "%s: the composed source is no libraries followed by the file", s.Name)
			v.Libraries = append(v.Libraries, "internal/lua/"+names[i]+".lua")
			rest = rest[len(libs[names[i]])+1:]
		}
		sum := sha1.Sum([]byte(s.Source))
		require.Equal(t, hex.EncodeToString(sum[:]), s.Hash())
		vs = append(vs, v)
	}
	return vs
}

// vecLibrary is the scripts' function library (PROTOCOL.md 8.1).
type vecLibrary struct {
	Name      string   `json:"name"`
	Functions []string `json:"functions"`
	SourceLen int      `json:"source_bytes"`
	SHA1      string   `json:"sha1"`
}

func vecFunctionLibrary() vecLibrary {
	sum := sha1.Sum([]byte(lua.Library.Source))
	v := vecLibrary{Name: lua.Library.Name, SourceLen: len(lua.Library.Source), SHA1: hex.EncodeToString(sum[:])}
	for _, s := range lua.All() {
		v.Functions = append(v.Functions, s.Function())
	}
	return v
}

// ruleFunctionLibrary composes the function library from the files the
// scripts list, as PROTOCOL.md 8.1 says, and checks it against v.
func ruleFunctionLibrary(t *testing.T, scripts []vecScript, v vecLibrary) {
	var shared []string
	for _, s := range scripts {
		for _, lib := range s.Libraries {
			if !slices.Contains(shared, lib) {
				shared = append(shared, lib)
			}
		}
	}
	compose := func(name string) string {
		text := "local KEYS, ARGV\n"
		for _, lib := range shared {
			b, err := os.ReadFile(filepath.Join("..", lib))
			require.NoError(t, err)
			text += string(b) + "\n"
		}
		flagsLine := regexp.MustCompile(`(?m)^-- flags: (.*)$`)
		for _, s := range scripts {
			b, err := os.ReadFile(filepath.Join("..", s.File))
			require.NoError(t, err)
			var flags []string
			if m := flagsLine.FindSubmatch(b); m != nil {
				for _, f := range strings.Split(string(m[1]), ",") {
					flags = append(flags, "'"+strings.TrimSpace(f)+"'")
				}
			}
			text += "redis.register_function{function_name = '" + name + "_" + s.Name + "', flags = {" + strings.Join(flags, ", ") +
				"}, callback = function(keys, args)\nKEYS, ARGV = keys, args\n" + string(b) + "end}\n"
		}
		return text
	}
	sum := sha1.Sum([]byte(compose("contstore_0000000000000000")))
	name := "contstore_" + hex.EncodeToString(sum[:8])
	src := "#!lua name=" + name + "\n" + compose(name)
	sum = sha1.Sum([]byte(src))
	assert.Equal(t, name, v.Name)
	assert.Equal(t, len(src), v.SourceLen)
	assert.Equal(t, hex.EncodeToString(sum[:]), v.SHA1)
	for i, s := range scripts {
		assert.Equal(t, name+"_"+s.Name, v.Functions[i])
	}
}

// ---- Redis scenarios ----

// vecOpaque names the opaque bytes of the store scenario: record's ARGV[4]
// (the continuation), the reply of a reserve that consumed a continuation
// and inspect's [3], fields c and o of an owner state, the answer of a
// reserve that consumed a continuation, and the ops of the calls that
// change state.
var vecOpaque = vectorscenario.Opaque{
	Arg: func(script string, i int) bool { return script == "record" && i == 3 },
	Reply: func(script string, i int, s string) bool {
		return (script == "reserve" && i == -1 && vecConsumedReply.MatchString(s)) || (script == "inspect" && i == 2)
	},
	HashField: func(key, field string) bool { return (field == "c" || field == "o") && strings.Contains(key, "}:o:") },
	String:    func(_, s string) bool { return vecConsumedAnswer.MatchString(s) },
	Ops: map[string]vectorscenario.OpAt{"reserve": {Key: 1, Arg: 1}, "record": {Key: 1, Arg: 1},
		"abort": {Key: 3, Arg: 0}, "clear": {Key: 3, Arg: 0}},
}

// vecConsumedAnswer matches the answer of a reserve that consumed a
// continuation (internal/lua/reserve.lua): "<seq>:<existed>1" and the continuation.
var vecConsumedAnswer = regexp.MustCompile(`^[0-9]+:[01]1`)

// vecConsumedReply matches the reply of a reserve that consumed a
// continuation: "<seq>:<existed>:<evicted>:" and the continuation.
var vecConsumedReply = regexp.MustCompile(`^[0-9]+:[01]:[0-9]+:`)

type vecScenario struct {
	Options map[string]any        `json:"options"`
	Steps   []vectorscenario.Step `json:"steps"`
}

// vecKey is the fingerprint key of the scenario's namespace: the bytes 0,
// 1, …, 31.
var vecKey = func() (k fingerprint.Key) {
	for i := range k {
		k[i] = byte(i)
	}
	return k
}()

var vecParser, _ = fingerprint.New(fingerprint.V4(), vecKey)

// vecOpIDs draws the ops of a scenario's stores from a counter they
// share and the server's clock, so that its calls are reproducible.
type vecOpIDs struct {
	n   *uint64
	now func() time.Time
	// again, when set, is the op of the next call: a call sent again.
	again string
	// last is the op of the last call.
	last string
}

func (o *vecOpIDs) next(int64) string {
	op := o.again
	if op == "" {
		*o.n++
		op = vectorscenario.Op(*o.n, o.now())
	}
	o.again, o.last = "", op
	return op
}

func vecReservation(r *Reservation) map[string]any {
	out := map[string]any{"turn": vecTurn(r.Turn), "reason": string(r.Reason), "continues": r.Continues(), "delta_count": r.UpstreamItems}
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
	srv := vectorscenario.NewServer(t, time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC), vecOpaque)
	var drawn uint64
	newStoreOn := func(o Options) (*Store, *redisBackend, *vecOpIDs) {
		opts, err := o.withDefaults()
		require.NoError(t, err)
		ids := &vecOpIDs{n: &drawn, now: srv.Now}
		rb := newRedisBackend(redisconn.GoRedis(srv.C), opts)
		rb.newCallID = ids.next
		rb.fp.Store(vecParser)
		rb.schema.running = true // no background schema checks in the record
		return &Store{opts: opts, backend: rb, guard: newGuard(opts, true)}, rb, ids
	}
	base := Options{Namespace: "cont", Replica: "gw-a", BreakerFailures: -1}
	s, rb, ids := newStoreOn(base)
	var steps []vectorscenario.Step
	// step records a step of a store whose operation ids ids draws; the
	// input names the id the step's call sent.
	step := func(ids *vecOpIDs, name, op string, in map[string]any, fn func() map[string]any) {
		ids.last = ""
		steps = append(steps, srv.Step(name, op, in, func() map[string]any {
			out := fn()
			if ids.last != "" {
				in["op"] = lua.CallIDKey(ids.last)
			}
			return out
		}))
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
	// reserveAgain reserves on s; again, when set, is the op of an
	// earlier call that this one sends again.
	reserveAgain := func(name string, o identity.Owner, b, again string) *Reservation {
		var res *Reservation
		step(ids, name, "reserve", map[string]any{"owner": o.Key(), "request": b}, func() map[string]any {
			ids.again = again
			res = s.Reserve(ctx, o, parse(b))
			require.NoError(t, res.Err)
			return vecReservation(res)
		})
		return res
	}
	reserve := func(name string, o identity.Owner, b string) *Reservation { return reserveAgain(name, o, b, "") }
	recordAgain := func(name string, res *Reservation, b string, out Result, again string) {
		in := map[string]any{"owner": res.Owner.Key(), "turn": vecTurn(res.Turn), "request": b,
			"response_id": out.ResponseID, "socket_replica": out.Socket.Replica, "socket_id": strconv.FormatUint(out.Socket.ID, 10)}
		outs := []string{}
		for _, o := range out.Output {
			outs = append(outs, string(o))
		}
		in["output"] = outs
		step(ids, name, "record", in, func() map[string]any {
			ids.again = again
			got, err := s.Record(ctx, res, out)
			require.NoError(t, err)
			return map[string]any{"outcome": string(got)}
		})
	}
	record := func(name string, res *Reservation, b string, out Result) { recordAgain(name, res, b, out, "") }
	inspect := func(name string, o identity.Owner) {
		step(ids, name, "inspect", map[string]any{"owner": o.Key()}, func() map[string]any {
			st, err := s.Inspect(ctx, o)
			require.NoError(t, err)
			return vecStateResult(st)
		})
	}
	output := func(items ...string) []json.RawMessage {
		var out []json.RawMessage
		for _, i := range items {
			out = append(out, json.RawMessage(i))
		}
		return out
	}
	later := func() { srv.Advance(1500 * time.Millisecond) } // past every op's deadline
	soon := func() { srv.Advance(50 * time.Millisecond) }    // within the last op's
	last := func() vectorscenario.Step { return steps[len(steps)-1] }
	// raw sends a call of script with the keys and arguments of an earlier
	// step's first call, as a client library re-sends it.
	raw := func(name, op string, script *lua.Script, from vectorscenario.Step) {
		call := from.Calls[0]
		step(ids, name, op, map[string]any{"sent_again": from.Name}, func() map[string]any {
			reply, err := rb.conn.Eval(ctx, script, call.Keys, vectorscenario.Strings(t, call.Args))
			require.NoError(t, err)
			return map[string]any{"reply": vectorscenario.Reply(t, reply)}
		})
	}

	step(ids, "open the namespace: record or compare the schema", "open", map[string]any{"namespace": "cont", "partitions": 16}, func() map[string]any {
		require.NoError(t, rb.checkSchema(ctx))
		return map[string]any{"schema_ok": true}
	})
	later()
	r1 := body("Be brief.", u1)
	a := reserve("first request of s1: no state", s1, r1)
	firstA := last()
	later()
	record("record the first response", a, r1, Result{ResponseID: "resp_1", Socket: Socket{ID: 7}, Output: output(o1)})
	later()
	r2 := body("Be brief.", u1, o1, u2)
	b := reserve("next request appends to the transcript: continue", s1, r2)
	opB, first := ids.last, last()
	soon()
	again := reserveAgain("the same reserve sent again within its deadline with the same op (its reply was lost): the first run's answer, from the state's o; nothing changes",
		s1, r2, opB)
	require.Equal(t, vecReservation(b), vecReservation(again))
	require.Equal(t, first.Calls[0].Keys, last().Calls[0].Keys)
	require.Equal(t, first.Calls[0].Args, last().Calls[0].Args)
	step(ids, "is the turn current", "is_current", map[string]any{"owner": s1.Key(), "turn": vecTurn(b.Turn)}, func() map[string]any {
		ok, err := s.IsCurrent(ctx, b)
		require.NoError(t, err)
		require.True(t, ok)
		return map[string]any{"current": ok}
	})
	inspect("inspect an owner whose turn is in flight", s1)
	soon()
	record("a stale turn records: nothing changes", a, r1, Result{ResponseID: "resp_late", Socket: Socket{ID: 7}, Output: output(o1)})
	out2 := Result{ResponseID: "resp_2", Socket: Socket{Replica: "gw-b", ID: 12}, Output: output(o2)}
	record("the current turn records", b, r2, out2)
	opRB := ids.last
	soon()
	before := last()
	recordAgain("the same record sent again within its deadline with the same op: published, from the state's o; nothing changes (not even the LRU touch)", b, r2, out2, opRB)
	vectorscenario.SameState(t, before, last())
	late := reserveAgain("the first reserve sent once more, within its deadline but after its turn published (so its client has its reply: no one waits for this copy): nothing changes; its turn, without the continuation it consumed, which the state no longer holds",
		s1, r2, opB)
	require.Equal(t, b.Turn, late.Turn)
	vectorscenario.SameState(t, before, last())
	later()
	raw("the reserve of s1's first turn sent again long after its deadline (its answer left the state and was not kept): refused, with the server's clock; nothing changes", "reserve", lua.Reserve, firstA)
	vectorscenario.SameState(t, before, last())
	inspect("inspect a published owner", s1)

	// Two replicas reserve one owner within a deadline: the later keeps the
	// earlier one's answer in its answer key until its deadline.
	other, _, otherIDs := newStoreOn(base)
	srv.Advance(30 * time.Minute / 16)
	r3 := body("Be verbose.", u1, o1, u2, o2)
	c := reserve("changed instructions, a sixteenth of the TTL after the last refresh: prompt_changed; the LRU entry and the TTL are refreshed", s1, r3)
	opC, firstC := ids.last, last()
	soon()
	var c2 *Reservation
	step(otherIDs, "another replica reserves the same owner within the first's deadline: superseded_turn; the first's answer moves to its answer key", "reserve",
		map[string]any{"owner": s1.Key(), "request": r3}, func() map[string]any {
			c2 = other.Reserve(ctx, s1, parse(r3))
			require.NoError(t, c2.Err)
			return vecReservation(c2)
		})
	soon()
	againC := reserveAgain("the first of them sent again within its deadline: its first run's answer, from its answer key; nothing changes", s1, r3, opC)
	require.Equal(t, vecReservation(c), vecReservation(againC))
	require.Equal(t, firstC.Calls[0].Args, last().Calls[0].Args)
	out3 := Result{ResponseID: "resp_3", Socket: Socket{ID: 7}, Output: output(o1)}
	var opRC2 string
	step(otherIDs, "the other replica's turn records", "record", map[string]any{"owner": s1.Key(), "turn": vecTurn(c2.Turn)}, func() map[string]any {
		got, err := other.Record(ctx, c2, out3)
		require.NoError(t, err)
		opRC2 = otherIDs.last
		return map[string]any{"outcome": string(got)}
	})
	soon()
	r3b := body("Be verbose.", u1, o1, u2, o2, o1, u1)
	c3 := reserve("a turn continues from it", s1, r3b)
	record("and records within the other replica's record's deadline: that record's answer moves to its answer key", c3, r3b,
		Result{ResponseID: "resp_3b", Socket: Socket{ID: 7}, Output: output(o1)})
	soon()
	step(otherIDs, "the other replica's record sent again within its deadline: published, from its answer key; nothing changes", "record",
		map[string]any{"owner": s1.Key(), "turn": vecTurn(c2.Turn)}, func() map[string]any {
			otherIDs.again = opRC2
			got, err := other.Record(ctx, c2, out3)
			require.NoError(t, err)
			require.Equal(t, OutcomePublished, got)
			return map[string]any{"outcome": string(got)}
		})
	later()
	r4 := body("Be verbose.", u1, o1)
	d := reserve("a request shorter than the transcript: not_append_only", s1, r4)
	step(ids, "abort the current turn", "abort", map[string]any{"owner": s1.Key(), "turn": vecTurn(d.Turn)}, func() map[string]any {
		ok, err := s.Abort(ctx, d)
		require.NoError(t, err)
		return map[string]any{"removed": ok}
	})
	later()
	e := reserve("after abort: missing_state", s1, r1)
	record("a response without id is dropped (abort)", e, r1, Result{Socket: Socket{ID: 7}, Output: output(o1)})
	later()
	f := reserve("an agent of s1: its own state", sub, r1)
	record("the agent records", f, r1, Result{ResponseID: "resp_a1", Socket: Socket{ID: 9}, Output: output(o1)})
	later()
	reserve("the agent sends its transcript unchanged: empty_delta", sub, body("Be brief.", u1, o1))
	step(ids, "clear the agent", "clear", map[string]any{"owner": sub.Key()}, func() map[string]any {
		require.NoError(t, s.Clear(ctx, sub))
		return map[string]any{}
	})
	inspect("inspect a cleared owner", sub)

	// Idle expiry: s2 and s3 publish, then nothing touches them for longer
	// than the TTL.
	p1 := s1.Partition(16)
	s2 := vecOwnerIn(t, "idle-", 16, func(p int) bool { return p != p1 })
	p2 := s2.Partition(16)
	s3 := vecOwnerIn(t, "idle-", 16, func(p int) bool { return p != p1 && p != p2 })
	later()
	g := reserve("another owner", s2, r1)
	record("it records", g, r1, Result{ResponseID: "resp_g", Socket: Socket{ID: 3}, Output: output(o1)})
	h := reserve("a third owner", s3, r1)
	record("it records too", h, r1, Result{ResponseID: "resp_h", Socket: Socket{ID: 3}, Output: output(o1)})
	srv.Advance(defaultTTL + time.Second)
	step(ids, "prune after the TTL: the idle state's bytes are given back", "prune", map[string]any{"partition": p2}, func() map[string]any {
		ev, err := rb.prune(ctx, p2)
		require.NoError(t, err)
		return map[string]any{"ttl": ev.TTL, "owners": ev.Owners, "bytes": ev.Bytes}
	})
	later()
	reserve("reserve finds its own expired LRU entry: missing_state, counted as a TTL eviction", s3, r2)
	reserve("s1 starts again", s1, r1)

	// Owner limit: a store whose share is one owner per partition.
	small, _, smallIDs := newStoreOn(Options{Namespace: "cont", Replica: "gw-a", BreakerFailures: -1, MaxOwners: 16})
	later()
	x := vecOwnerIn(t, "crowd-", 16, func(p int) bool { return p == p1 })
	step(smallIDs, "a store with MaxOwners 16 (one per partition) reserves a second owner in s1's partition: s1 is evicted", "reserve",
		map[string]any{"owner": x.Key(), "request": r1, "max_owners": 16}, func() map[string]any {
			res := small.Reserve(ctx, x, parse(r1))
			require.NoError(t, res.Err)
			return vecReservation(res)
		})

	return vecScenario{
		Options: map[string]any{"namespace": "cont", "partitions": s.opts.Partitions, "ttl_ms": s.opts.TTL.Milliseconds(),
			"max_owners": s.opts.MaxOwners, "max_total_bytes": s.opts.MaxTotalBytes, "max_owner_bytes": s.opts.MaxOwnerBytes,
			"partition_owner_limit": s.opts.partitionOwners(), "partition_byte_limit": s.opts.partitionBytes(),
			"eviction_budget": evictionBudget, "replica": s.opts.Replica,
			"op_timeout_ms": s.opts.OpTimeout.Milliseconds(), "op_deadline_ms": vectorscenario.OpDeadline.Milliseconds()},
		Steps: steps,
	}
}

func vecStateResult(st State) map[string]any {
	out := map[string]any{"exists": st.Exists}
	if !st.Exists {
		return out
	}
	out["turn"] = vecTurn(st.Turn)
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

// ---- the file ----

func vecBuild(t *testing.T) vecFile {
	return vecFile{
		About: vecAbout,
		Constants: vecConstants{
			MaxIDBytes:       identity.MaxIDBytes,
			ScoreEpochMillis: scoreEpochMillis, ScoreTimeUnit: scoreTimeUnit, ScorePublished: scorePublished, MaxStateBytes: maxStateBytes,
			TurnEpochSeconds: turnEpochSeconds, SeqLimit: 1 << 53,
			StateOverhead: stateOverhead, StateNameCost: stateNameCost, ContinuationFormat: continuationFormat,
			OpBytes:        lua.CallIDSize,
			EvictionBudget: evictionBudget, SchemaVersion: schemaVersion,
			DefaultNamespace: defaultNamespace, DefaultPartitions: defaultPartitions, MaxPartitions: MaxPartitions,
			DefaultTTLMillis: defaultTTL.Milliseconds(), DefaultMaxOwners: defaultMaxOwners,
			DefaultMaxOwnerBytes: defaultMaxOwnerBytes, DefaultMaxTotalBytes: defaultMaxTotalBytes, DefaultOpTimeoutMillis: defaultOpTimeout.Milliseconds(),
			MaxResponseIDBytes: maxResponseIDBytes, MaxReplicaBytes: maxReplicaBytes, MaxNamespaceBytes: maxNamespaceBytes,
		},
		Owners:        vecOwners(t),
		OwnerKeys:     vecOwnerKeys(t),
		Keys:          vecKeyNames(t),
		Scores:        vecScores(t),
		Continuations: vecContinuations(t),
		TurnTokens:    vecTurnTokens(t),
		Sequences:     vecSequences(t),
		StoredBytes:   vecStoredBytesCases(t),
		Scripts:       vecScripts(t),
		Library:       vecFunctionLibrary(),
		Scenario:      vecStoreScenario(t),
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

// ---- the documented rules, written out independently ----

// ruleUvarint appends v as an unsigned LEB128 varint.
func ruleUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// ruleContinuation is a continuation as PROTOCOL.md 6.2 encodes it; its
// replica is the digest of the replica's name, xxhash64.
type ruleContinuation struct {
	responseID        string
	replica, socket   uint64
	items, bytes      uint64
	digest, signature uint64
	refs              [][2]uint64 // item and mask of each reference, any socket only
}

func (c ruleContinuation) encode() []byte {
	format, id := byte(3), []byte(c.responseID)
	if m := rulePackedID.FindStringSubmatch(c.responseID); m != nil {
		format, id = 4, nil
		for i := 0; i < len(m[1]); i += 2 {
			v, _ := strconv.ParseUint(m[1][i:i+2], 16, 8)
			id = append(id, byte(v))
		}
	}
	b := ruleUvarint(ruleUvarint([]byte{format}, c.items), c.bytes)
	for _, d := range []uint64{c.digest, c.signature} {
		for shift := 56; shift >= 0; shift -= 8 {
			b = append(b, byte(d>>shift))
		}
	}
	b = ruleUvarint(b, c.socket)
	b = ruleUvarint(b, uint64(len(id)))
	b = append(b, id...)
	if c.socket != 0 {
		for shift := 56; shift >= 0; shift -= 8 {
			b = append(b, byte(c.replica>>shift))
		}
	}
	for _, r := range c.refs {
		b = ruleUvarint(b, c.items-r[0])
		for shift := 56; shift >= 0; shift -= 8 {
			b = append(b, byte(r[1]>>shift))
		}
	}
	return b
}

// rulePackedID matches the response ids formats 2 and 4 hold as bytes.
var rulePackedID = regexp.MustCompile(`^resp_((?:[0-9a-f]{2})+)$`)

// ruleDecode decodes an encoded continuation, or reports false.
func ruleDecode(b []byte) (ruleContinuation, bool) {
	var c ruleContinuation
	uvarint := func() (uint64, bool) {
		var v uint64
		for i := 0; i < 10 && i < len(b); i++ {
			v |= uint64(b[i]&0x7f) << (7 * i)
			if b[i] < 0x80 {
				b = b[i+1:]
				return v, true
			}
		}
		return 0, false
	}
	if len(b) == 0 || b[0] < 1 || b[0] > 4 {
		return c, false
	}
	packed, named := b[0]%2 == 0, b[0] <= 2
	b = b[1:]
	var ok1, ok2, ok3, ok4 bool
	if c.items, ok1 = uvarint(); !ok1 || c.items > 1<<62 {
		return c, false
	}
	if c.bytes, ok2 = uvarint(); !ok2 || c.bytes > 1<<62 || len(b) < 16 {
		return c, false
	}
	for i := range 8 {
		c.digest = c.digest<<8 | uint64(b[i])
		c.signature = c.signature<<8 | uint64(b[8+i])
	}
	b = b[16:]
	if c.socket, ok3 = uvarint(); !ok3 {
		return c, false
	}
	n, ok4 := uvarint()
	if !ok4 || n == 0 || n > uint64(len(b)) {
		return c, false
	}
	c.responseID = string(b[:n])
	if packed {
		c.responseID = "resp_" + hex.EncodeToString(b[:n])
	}
	switch rest := b[n:]; {
	case c.socket == 0 && named:
	case c.socket == 0:
		for b = rest; len(b) > 0; {
			back, ok := uvarint()
			if !ok || back == 0 || back > c.items || len(b) < 8 || (len(c.refs) > 0 && c.items-back <= c.refs[len(c.refs)-1][0]) {
				return c, false
			}
			var mask uint64
			for _, x := range b[:8] {
				mask = mask<<8 | uint64(x)
			}
			c.refs = append(c.refs, [2]uint64{c.items - back, mask})
			b = b[8:]
		}
	case named:
		c.replica = xxhash.Sum64String(string(rest))
	case len(rest) != 8:
		return c, false
	default:
		for _, x := range rest {
			c.replica = c.replica<<8 | uint64(x)
		}
	}
	return c, true
}

// ruleStateBytes is PROTOCOL.md 7.3 without the continuation.
func ruleStateBytes(c vecConstants, stateKey, member string) int64 {
	return c.StateOverhead + int64(len(stateKey)+len(member))*c.StateNameCost/100
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
		assert.Equal(t, v.Namespace+":"+tag+":o:", v.OwnerPrefix)
		assert.Equal(t, v.OwnerKey, v.LRUMember)
		assert.Equal(t, v.OwnerPrefix+v.LRUMember, v.State)
		assert.Equal(t, v.Namespace+":"+tag+":q:"+v.OwnerKey+":", v.AnswerPrefix)
		assert.Equal(t, v.Namespace+":"+tag+":lru", v.LRU)
		assert.Equal(t, v.Namespace+":"+tag+":part", v.Part)
		assert.Equal(t, v.Namespace+":{"+v.Namespace+"}:meta", v.Meta)
	}

	for _, v := range f.Scores {
		want := (v.TouchedMillis-c.ScoreEpochMillis)*c.ScoreTimeUnit + v.Size
		if v.Published {
			want += c.ScorePublished
		}
		assert.Equal(t, want, v.Score)
		assert.Less(t, v.Score, c.SeqLimit, "scores stay below 2^53")
	}

	assert.Equal(t, 3, c.ContinuationFormat)
	var valid, invalid int
	for _, v := range f.Continuations {
		b, err := hex.DecodeString(v.Hex)
		require.NoError(t, err, v.Name)
		got, ok := ruleDecode(b)
		require.Equal(t, v.Valid, ok, v.Name)
		if !v.Valid {
			invalid++
			continue
		}
		valid++
		socket, err := strconv.ParseUint(v.OriginSocket, 10, 64)
		require.NoError(t, err, v.Name)
		digest, err := strconv.ParseUint(v.Digest.Hex, 16, 64)
		require.NoError(t, err, v.Name)
		signature, err := strconv.ParseUint(v.Signature.Hex, 16, 64)
		require.NoError(t, err, v.Name)
		want := ruleContinuation{responseID: *v.ResponseID, socket: socket,
			items: uint64(*v.Items), bytes: uint64(*v.TranscriptBytes), digest: digest, signature: signature}
		assert.Equal(t, v.AnySocket, socket == 0, v.Name)
		if v.AnySocket {
			assert.Empty(t, *v.OriginReplica, v.Name)
			assert.Empty(t, v.OriginDigest, v.Name)
		} else {
			want.replica = xxhash.Sum64String(*v.OriginReplica)
			assert.Equal(t, fmt.Sprintf("%016x", want.replica), v.OriginDigest, v.Name)
		}
		for _, r := range v.References {
			mask, err := strconv.ParseUint(r.Mask.Hex, 16, 64)
			require.NoError(t, err, v.Name)
			want.refs = append(want.refs, [2]uint64{uint64(r.Item), mask})
		}
		if len(v.References) > 0 {
			assert.LessOrEqual(t, len(b), 64, "%s: references stay within hash-max-listpack-value", v.Name)
		}
		if !v.DecodeOnly {
			assert.Equal(t, hex.EncodeToString(want.encode()), v.Hex, v.Name)
		}
		assert.Equal(t, want, got, v.Name)
	}
	assert.NotZero(t, valid)
	assert.NotZero(t, invalid)

	for _, v := range f.TurnTokens {
		assert.Less(t, v.Seq, uint64(c.SeqLimit))
		assert.Equal(t, strconv.FormatUint(v.Seq*uint64(v.Partitions)+uint64(v.Partition), 10), v.Turn)
	}
	for _, v := range f.Sequences {
		micros := uint64((v.TimeSeconds-c.TurnEpochSeconds)*1_000_000 + v.TimeMicros)
		assert.Equal(t, micros, v.Micros, v.Name)
		seq := max(v.PartitionSeq+1, micros)
		if v.OwnerT != 0 {
			seq = max(seq, uint64(max(v.OwnerT, -v.OwnerT))+1)
		}
		assert.Equal(t, seq, v.Seq, v.Name)
		assert.Equal(t, strconv.FormatUint(seq*uint64(v.Partitions)+uint64(v.Partition), 10), v.Turn, v.Name)
		at, err := time.Parse(time.RFC3339Nano, v.Time)
		require.NoError(t, err)
		assert.Equal(t, v.TimeSeconds, at.Unix())
		assert.Equal(t, v.TimeMicros, int64(at.Nanosecond()/1000))
	}
	for _, v := range f.StoredBytes {
		esc := strings.NewReplacer("%", "%25", ":", "%3A")
		key := "m:" + esc.Replace(v.Session)
		if v.Agent != nil {
			key = "a:" + esc.Replace(v.Session) + ":" + esc.Replace(*v.Agent)
		}
		p := int(xxhash.Sum64String(key) % uint64(v.Partitions))
		assert.Equal(t, p, v.Partition)
		stateKey := fmt.Sprintf("%s:{%s:%02d}:o:%s", v.Namespace, v.Namespace, p, key)
		assert.Equal(t, len(stateKey), v.StateKeyBytes)
		assert.Equal(t, len(key), v.MemberBytes)
		socket, err := strconv.ParseUint(v.OriginSocket, 10, 64)
		require.NoError(t, err)
		cont := ruleContinuation{responseID: v.ResponseID, replica: xxhash.Sum64String(v.OriginReplica), socket: socket, items: uint64(v.Items), bytes: uint64(v.TranscriptBytes)}
		assert.Equal(t, len(cont.encode()), v.ContinuationBytes)
		assert.Equal(t, ruleStateBytes(c, stateKey, key), v.WithoutContinuation)
		assert.Equal(t, v.WithoutContinuation+int64(v.ContinuationBytes), v.WithContinuation)
		assert.Equal(t, min(v.WithContinuation, c.MaxStateBytes), v.ScoreSize)
	}

	keysLine := regexp.MustCompile(`(?m)^-- KEYS\[\d+\]`)
	argvLine := regexp.MustCompile(`(?m)^-- ARGV\[\d+(\+?)\]`)
	for _, v := range f.Scripts {
		src, err := os.ReadFile(filepath.Join("..", v.File))
		require.NoError(t, err)
		args := argvLine.FindAllStringSubmatch(string(src), -1)
		variadic := len(args) > 0 && args[len(args)-1][1] == "+"
		assert.Equal(t, len(keysLine.FindAllString(string(src), -1)), v.Keys, v.Name)
		assert.Equal(t, variadic, v.Variadic, v.Name)
		if variadic {
			assert.Equal(t, len(args)-1, v.Args, v.Name)
		} else {
			assert.Equal(t, len(args), v.Args, v.Name)
		}
		for _, lib := range slices.Backward(v.Libraries) {
			l, err := os.ReadFile(filepath.Join("..", lib))
			require.NoError(t, err)
			src = append(append(l, '\n'), src...)
		}
		sum := sha1.Sum(src)
		assert.Equal(t, hex.EncodeToString(sum[:]), v.SHA1, v.Name)
		assert.Equal(t, len(src), v.SourceLen, v.Name)
	}
	ruleFunctionLibrary(t, f.Scripts, f.Library)

	ruleScenario(t, c, f.Scenario)
}

// ruleChanged reports whether an owner script's reply says it changed
// something (and stored its answer).
func ruleChanged(script string, reply any) bool {
	switch script {
	case "reserve":
		return true
	case "record":
		s, _ := reply.(string)
		return strings.HasPrefix(s, "published:")
	default:
		return reply == 1.0
	}
}

// ruleReply is a reserve's reply read by 8.3: "<seq>:<existed>:<evicted>",
// then ":" and the continuation it consumed (given as {hex} in the file).
type ruleReply struct {
	seq, evicted string
	existed      int
	consumed     []byte // nil: none
}

func ruleReserveReply(t *testing.T, reply any) ruleReply {
	s, ok := reply.(string)
	if !ok {
		s = string(vectorscenario.UnHex(t, reply))
	}
	parts := strings.SplitN(s, ":", 4)
	require.GreaterOrEqual(t, len(parts), 3, "reserve reply %q", s)
	require.Contains(t, []string{"0", "1"}, parts[1], "reserve reply %q", s)
	r := ruleReply{seq: parts[0], existed: int(parts[1][0] - '0'), evicted: parts[2]}
	if len(parts) == 4 {
		r.consumed = []byte(parts[3])
	}
	_, okSeq := strconv.ParseUint(r.seq, 10, 64)
	_, okEv := strconv.ParseUint(r.evicted, 10, 64)
	require.True(t, okSeq == nil && okEv == nil, "reserve reply %q", s)
	return r
}

func ruleScenario(t *testing.T, c vecConstants, sc vecScenario) {
	deadlineAfter := int64(sc.Options["op_deadline_ms"].(float64))
	ttl := int64(sc.Options["ttl_ms"].(float64))
	partitions := uint64(sc.Options["partitions"].(float64))

	type firstRun struct {
		reply  any
		answer string // what its answer key holds once a later call moves it there (6.6)
		turn   string // the state's t after it, for a reserve
	}
	firsts := map[string]firstRun{} // op in hex → its first run
	resent := map[string]int{}
	for i, st := range sc.Steps {
		at, err := time.Parse(time.RFC3339Nano, st.ServerTime)
		require.NoError(t, err)
		now := at.UnixMilli() - c.ScoreEpochMillis
		states := map[string]map[string]any{}
		for _, k := range st.State {
			states[k.Key] = k.Hash
		}
		for _, call := range st.Calls {
			if call.Command != "EVALSHA" {
				continue
			}
			switch call.Script {
			case "reserve", "record", "abort", "clear":
			default:
				continue
			}
			args := vectorscenario.Strings(t, call.Args)
			// The owner scripts' keys and common arguments (8.2): reserve
			// and record send the state and its answer key, abort and clear
			// the state, the LRU, the accounting and the answer key.
			keys := map[string]int{"reserve": 2, "record": 2, "abort": 4, "clear": 4}[call.Script]
			require.Len(t, call.Keys, keys, st.Name)
			// The partition's prefix ends at the state key's first "}:o:";
			// the member is the state key after it, and the LRU's name is
			// one byte longer than "<prefix>o:".
			state := call.Keys[0]
			end := strings.Index(state, "}:o:")
			require.Positive(t, end, "%s: state %q", st.Name, state)
			base, member := state[:end+2], state[end+4:]
			require.True(t, member != "" && member == state[len(base+"lru")-1:], "%s: state %q", st.Name, state)
			var answer string
			switch call.Script {
			case "reserve", "record":
				answer = call.Keys[1]
			case "abort", "clear":
				assert.Equal(t, base+"lru", call.Keys[1], st.Name)
				assert.Equal(t, base+"part", call.Keys[2], st.Name)
				answer = call.Keys[3]
			}
			// The op: 5 bytes of id, then the low 32 bits of the deadline;
			// its answer key ends in it in hex (6.6).
			// Reserve and record send the idle TTL first, abort and clear
			// no clock argument at all (8.2).
			opAt := 1
			if call.Script == "abort" || call.Script == "clear" {
				opAt = 0
			}
			op := args[opAt]
			require.Len(t, op, c.OpBytes, st.Name)
			opHex := hex.EncodeToString([]byte(op))
			assert.Equal(t, base+"q:"+member+":"+opHex, answer, "%s: answer key", st.Name)
			if opAt == 1 {
				assert.Equal(t, strconv.FormatInt(ttl, 10), args[0], st.Name)
			}
			limits := regexp.MustCompile(`^\d+:\d+:` + strconv.Itoa(c.EvictionBudget) + `$`)
			switch call.Script {
			case "reserve":
				assert.Equal(t, strconv.FormatInt(ruleStateBytes(c, state, member), 10), args[2], st.Name)
				assert.Regexp(t, limits, args[3], "%s: limits", st.Name)
			case "record":
				assert.Equal(t, strconv.FormatInt(ruleStateBytes(c, state, member), 10), args[4], st.Name)
				assert.Regexp(t, limits, args[5], "%s: limits", st.Name)
				_, ok := ruleDecode([]byte(args[3]))
				assert.True(t, ok, "%s: continuation", st.Name)
			}
			deadline := vectorscenario.Deadline(op, now)
			if r, ok := call.Reply.([]any); ok && len(r) == 2 && r[0] == "expired" {
				// Past its deadline: refused with the server's clock, and
				// nothing changes (6.6).
				assert.LessOrEqual(t, deadline, now, st.Name)
				assert.Equal(t, float64(now), r[1], st.Name)
				vectorscenario.SameState(t, sc.Steps[i-1], st)
				continue
			}
			first, seen := firsts[opHex]
			if !seen {
				// A scenario's calls have their deadline a fixed time after
				// they are first sent.
				assert.Equal(t, now+deadlineAfter, deadline, "%s: deadline", st.Name)
				f := firstRun{reply: call.Reply}
				o, _ := states[state]["o"].(map[string]any)
				slots := ""
				if o != nil {
					slots = string(vectorscenario.UnHex(t, o))
				}
				switch {
				case !ruleChanged(call.Script, call.Reply):
					// A run that changed nothing leaves no answer.
					assert.False(t, strings.HasPrefix(slots, op) || (len(slots) == 20 && slots[11:] == op), "%s: answer in o", st.Name)
				case call.Script == "reserve":
					// Its op and answer's flags start the state's o.
					r := ruleReserveReply(t, call.Reply)
					flags := byte('0' + 2*r.existed)
					f.answer = fmt.Sprintf("%s:%d0", r.seq, r.existed)
					if r.consumed != nil {
						flags++
						f.answer = fmt.Sprintf("%s:%d1", r.seq, r.existed) + string(r.consumed)
					}
					assert.Equal(t, op+string(flags), slots[:min(len(slots), 10)], "%s: o", st.Name)
					f.turn, _ = states[state]["t"].(string)
				case call.Script == "record":
					// Its op follows the reserve's in o.
					assert.Len(t, slots, 20, st.Name)
					assert.Equal(t, op, slots[min(len(slots), 11):], "%s: o", st.Name)
					f.answer = "P"
				default:
					// Abort and clear keep their answer in their answer key.
					f.answer = map[string]string{"abort": "A", "clear": "C"}[call.Script]
				}
				firsts[opHex] = f
				continue
			}
			// Sent again with the same op: the first run's answer (a reserve
			// reports no evictions, and no continuation once its turn
			// published), and nothing changes.
			resent[call.Script]++
			if call.Script == "reserve" {
				want := ruleReserveReply(t, first.reply)
				want.evicted = "0"
				if strings.HasPrefix(fmt.Sprint(states[state]["t"]), "-") {
					want.consumed = nil
				}
				r := ruleReserveReply(t, call.Reply)
				assert.Equal(t, want, r, st.Name)
				// A reserve's token is its seq * P + the partition of its keys.
				pp := base[strings.LastIndex(base[:len(base)-2], ":")+1 : len(base)-2]
				p, err := strconv.ParseUint(pp, 10, 64)
				require.NoError(t, err, st.Name)
				seq, err := strconv.ParseUint(r.seq, 10, 64)
				require.NoError(t, err, st.Name)
				assert.Equal(t, strconv.FormatUint(seq*partitions+p, 10), st.Result["turn"], st.Name)
			} else {
				assert.Equal(t, first.reply, call.Reply, st.Name)
			}
			vectorscenario.SameState(t, sc.Steps[i-1], st)
		}
		// Every answer key holds the answer of its op's first run until
		// that op's deadline (6.6).
		for _, k := range st.State {
			i := strings.Index(k.Key, "}:q:")
			if i < 0 {
				continue
			}
			require.Equal(t, "string", k.Type, st.Name)
			opHex := k.Key[strings.LastIndex(k.Key, ":")+1:]
			f, ok := firsts[opHex]
			require.True(t, ok, "%s: answer key %s of no call", st.Name, k.Key)
			v, isText := k.String.(string)
			if !isText {
				v = string(vectorscenario.UnHex(t, k.String))
			}
			assert.Equal(t, f.answer, v, "%s: %s", st.Name, k.Key)
			b, err := hex.DecodeString(opHex)
			require.NoError(t, err)
			// PTTL counts from the server's clock, whose milliseconds
			// miniredis keeps a fraction of.
			left := vectorscenario.Deadline(string(b), now) - now
			assert.Contains(t, []int64{left - 1, left}, k.PTTL, "%s: %s lives until its op's deadline", st.Name, k.Key)
		}
		ruleState(t, c, st, ttl)
	}
	assert.NotZero(t, resent["reserve"], "a reserve sent again")
	assert.NotZero(t, resent["record"], "a record sent again")
}

// ruleState checks the keys after a step: owner states hold t, c and o and
// have their LRU entry, whose size the state's fields give, and each
// partition hash sums its LRU.
func ruleState(t *testing.T, c vecConstants, st vectorscenario.Step, ttl int64) {
	zsets := map[string][]vectorscenario.ZMember{}
	hashes := map[string]map[string]any{}
	for _, k := range st.State {
		zsets[k.Key], hashes[k.Key] = k.ZSet, k.Hash
	}
	for _, k := range st.State {
		if i := strings.Index(k.Key, "}:o:"); i >= 0 {
			require.Equal(t, "hash", k.Type, st.Name)
			member := k.Key[i+len("}:o:"):]
			for f := range k.Hash {
				assert.Contains(t, []string{"t", "c", "o"}, f, "%s: %s", st.Name, k.Key)
			}
			tv, err := strconv.ParseInt(k.Hash["t"].(string), 10, 64)
			require.NoError(t, err, st.Name)
			assert.NotZero(t, tv)
			size := ruleStateBytes(c, k.Key, member)
			if cv, ok := k.Hash["c"]; ok {
				b := vectorscenario.UnHex(t, cv)
				_, ok := ruleDecode(b)
				assert.True(t, ok, "%s: %s holds no continuation", st.Name, k.Key)
				size += int64(len(b))
			} else {
				assert.Positive(t, tv, "%s: %s published without c", st.Name, k.Key)
			}
			// o: the op of the reserve of its turn, that answer's flags and
			// the tick of the last refresh, then the op of the last record
			// that published (6.2).
			o := vectorscenario.UnHex(t, k.Hash["o"])
			if assert.Contains(t, []int{c.OpBytes + 2, 2*c.OpBytes + 2}, len(o), "%s: %s o", st.Name, k.Key) {
				assert.Contains(t, "0123", string(o[c.OpBytes]), "%s: %s o's flags", st.Name, k.Key)
			}
			lru := zsets[k.Key[:i]+"}:lru"]
			j := slices.IndexFunc(lru, func(m vectorscenario.ZMember) bool { return m.Member == member })
			if assert.True(t, j >= 0, "%s: %s has no LRU entry", st.Name, k.Key) {
				// The entry's size is the one the state's fields give (7.3).
				assert.Equal(t, min(size, c.MaxStateBytes), lru[j].Score%c.ScoreTimeUnit%c.ScorePublished, "%s: %s size", st.Name, k.Key)
				// o's tick is its entry's touch in 256ths of the TTL (8.2).
				tick := max(ttl/256, 1)
				assert.Equal(t, byte(lru[j].Score/c.ScoreTimeUnit/tick%256), o[min(len(o)-1, c.OpBytes+1)], "%s: %s tick", st.Name, k.Key)
			}
		}
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
			// The published bit says whether the state holds c (7.1).
			if h, ok := hashes[strings.TrimSuffix(key, "lru")+"o:"+m.Member]; ok {
				_, holds := h["c"]
				assert.Equal(t, holds, low >= c.ScorePublished, "%s: %s published bit", st.Name, m.Member)
			}
		}
		part := hashes[strings.TrimSuffix(key, "lru")+"part"]
		field := func(f string) any { // an absent field reads as 0 (6.4)
			if v, ok := part[f]; ok {
				return v
			}
			return "0"
		}
		assert.Equal(t, strconv.FormatInt(size, 10), field("bytes"), "%s: %s bytes", st.Name, key)
		assert.Equal(t, strconv.FormatInt(published, 10), field("published"), "%s: %s published", st.Name, key)
	}
}
