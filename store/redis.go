package store

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redisconn"
	"github.com/contstore/contstore/internal/serverclock"
)

// NewRedis returns a store whose state lives in Redis, shared by every
// replica that opens the same namespace. client may be a *redis.Client or a
// *redis.ClusterClient; the store makes no connections of its own.
//
// The first store to open a namespace records its schema version and
// partition count there; NewRedis fails with ErrSchemaMismatch when they
// differ from opts. It waits for that check up to 2 seconds (OpTimeout
// when longer): until the check reads the namespace's fingerprint key, the
// store digests under a key of its own, and the conversations of its first
// turns would not continue on other replicas. When Redis cannot be reached
// in that time, NewRedis still returns the store (a gateway must start
// without Redis) and the check runs again in the background until it
// succeeds. Running stores repeat it every few seconds, so a namespace
// whose data Redis lost is recorded again, and a store that finds a
// mismatch fails every operation open until it matches.
func NewRedis(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOptions)
	}
	return newRedisStore(redisconn.GoRedis(client), redisconn.HonoursDeadlines(client), opts)
}

// newRedisStore returns a store on conn; inline says whether conn ends every
// call at its context's deadline.
func newRedisStore(conn redisconn.Conn, inline bool, opts Options) (*Store, error) {
	return newStore(opts, inline, func(o Options) (backend, error) {
		r := newRedisBackend(conn, o)
		ctx, cancel := context.WithTimeout(context.Background(), max(o.OpTimeout, firstSchemaWait))
		defer cancel()
		checked := make(chan error, 1)
		go func() { checked <- r.checkSchema(ctx) }() // bounded even if the client ignores ctx
		select {
		case err := <-checked:
			if errors.Is(err, ErrSchemaMismatch) {
				return nil, err
			}
		case <-ctx.Done():
		}
		return r, nil
	})
}

// newRedisBackend returns a backend on conn for options o, defaults filled
// in, that has not checked the namespace's schema yet.
func newRedisBackend(conn redisconn.Conn, o Options) *redisBackend {
	r := &redisBackend{conn: conn, opts: o, keys: newKeyspace(o.Namespace, o.Partitions),
		servers:   serverclock.New(o.Partitions, nil), // deadlines are real time, whatever a test's clock says
		ttl:       strconv.FormatInt(o.TTL.Milliseconds(), 10),
		limits:    fmt.Sprintf("%d:%d:%d", o.partitionOwners(), o.partitionBytes(), evictionBudget),
		newCallID: lua.NewCallID}
	r.fp.Store(o.newParser())
	return r
}

// How long NewRedis waits for its first schema check, how often a store
// checks its namespace's schema again, and how soon it retries a check
// that could not reach Redis.
const (
	firstSchemaWait = 2 * time.Second
	schemaRecheck   = 5 * time.Second
	schemaRetry     = time.Second
)

type redisBackend struct {
	conn   redisconn.Conn
	opts   Options
	keys   keyspace
	schema schemaGuard
	// fp parses under the namespace's key once a schema check has read it;
	// before that, under the key this store proposes.
	fp atomic.Pointer[fingerprint.Parser]
	// servers estimates the clocks of the partitions' servers, on which
	// calls carry their deadlines.
	servers *serverclock.Clock
	// newCallID draws the id of a call that changes state, with its
	// deadline on the server's clock (internal/lua/oplog.lua).
	newCallID func(deadline int64) string
	// The scripts' constant arguments: idle TTL in milliseconds, and the
	// limits of the scripts that prune (internal/lua/lru.lua).
	ttl, limits string
}

func (r *redisBackend) parser() *fingerprint.Parser { return r.fp.Load() }

// schemaGuard remembers the last schema check: when it ran and whether it
// found a mismatch.
type schemaGuard struct {
	mu       sync.Mutex
	passedAt time.Time // last check that reached Redis and matched
	tried    time.Time // last check started
	running  bool
	mismatch error // the last check's ErrSchemaMismatch, or nil
	// passed is passedAt while mismatch is nil, else nil: schemaError
	// reads it without mu.
	passed atomic.Pointer[time.Time]
}

// checkSchema records or compares the namespace's schema now.
func (r *redisBackend) checkSchema(ctx context.Context) error {
	r.schema.mu.Lock()
	r.schema.tried = time.Now()
	r.schema.mu.Unlock()
	proposed := r.fp.Load()
	proposedKey := proposed.Key()
	got, err := slice(r.conn.Eval(ctx, lua.Schema, []string{r.keys.meta()}, []string{strconv.Itoa(schemaVersion),
		strconv.Itoa(r.opts.Partitions), proposed.ProfileID(), hex.EncodeToString(proposedKey[:])}))
	if err == nil && len(got) != 5 {
		err = fmt.Errorf("%w: schema: %d elements, want 5", errBadReply, len(got))
	}
	if err != nil {
		return err
	}
	if server, ok := got[4].(int64); ok {
		r.servers.Seed(server)
	}
	field := func(i int) string { s, _ := got[i].(string); return s }
	profile := r.opts.Profile
	if recorded, ok := r.namespaceProfile(field(2)); ok {
		profile = recorded
	}
	var mismatch error
	if field(0) != strconv.Itoa(schemaVersion) || field(1) != strconv.Itoa(r.opts.Partitions) || field(2) != profile.ID() {
		mismatch = fmt.Errorf("%w: namespace %q has schema %s with %s partitions and profile %q; this store has schema %d with %d partitions and profile %q",
			ErrSchemaMismatch, r.opts.Namespace, field(0), field(1), field(2), schemaVersion, r.opts.Partitions, profile.ID())
	} else if key, err := hex.DecodeString(field(3)); err != nil || len(key) != fingerprint.KeySize {
		mismatch = fmt.Errorf("%w: namespace %q holds no valid fingerprint key", ErrSchemaMismatch, r.opts.Namespace)
	} else if !bytes.Equal(key, proposedKey[:]) || profile.ID() != proposed.ProfileID() {
		p, err := fingerprint.New(profile, fingerprint.Key(key))
		if err != nil {
			return err // not reached: the profile was checked
		}
		r.fp.CompareAndSwap(proposed, p)
	}
	r.schema.mu.Lock()
	defer r.schema.mu.Unlock()
	r.schema.mismatch = mismatch
	r.schema.passed.Store(nil)
	if mismatch == nil {
		at := time.Now()
		r.schema.passedAt = at
		r.schema.passed.Store(&at)
	}
	return mismatch
}

// namespaceProfile returns the built-in profile whose identity is id, the
// namespace's, when the store takes the namespace's profile (Options.Profile
// left zero).
func (r *redisBackend) namespaceProfile(id string) (fingerprint.Profile, bool) {
	if !r.opts.namespaceProfile {
		return fingerprint.Profile{}, false
	}
	name, _, _ := strings.Cut(id, ";")
	p, err := fingerprint.Named(name)
	if err != nil || p.ID() != id {
		return fingerprint.Profile{}, false
	}
	return p, true
}

// schemaError returns the mismatch the last check found, and starts a check
// in the background when the last one is stale. Operations never wait for
// it: while Redis cannot be reached for the check, they proceed.
func (r *redisBackend) schemaError() error {
	g := &r.schema
	if at := g.passed.Load(); at != nil && time.Since(*at) < schemaRecheck {
		return nil // fresh, matched: no check due
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if !g.running && now.Sub(g.passedAt) >= schemaRecheck && now.Sub(g.tried) >= schemaRetry {
		g.running = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), r.opts.OpTimeout)
			defer cancel()
			_ = r.checkSchema(ctx)
			g.mu.Lock()
			g.running = false
			g.mu.Unlock()
		}()
	}
	return g.mismatch
}

// run refuses to run script while the namespace's schema mismatches.
func (r *redisBackend) run(ctx context.Context, script *lua.Script, keys []string, args ...string) (any, error) {
	if err := r.schemaError(); err != nil {
		return nil, err
	}
	return r.conn.Eval(ctx, script, keys, args)
}

// slice reads a reply that must be an array.
func slice(v any, err error) ([]any, error) {
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T, want an array", errBadReply, v)
	}
	return a, nil
}

// text reads a reply that must be a string.
func text(v any, err error) (string, error) {
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: %T, want a string", errBadReply, v)
	}
	return s, nil
}

// integer reads a reply that must be an integer.
func integer(v any, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %T, want an integer", errBadReply, v)
	}
	return n, nil
}

// ownerKeys returns an owner's partition and the keys of its scripts: state,
// LRU and accounting.
func (r *redisBackend) ownerKeys(owner identity.Owner) (int, []string) {
	p := owner.Partition(r.opts.Partitions)
	return p, []string{r.keys.owner(p, owner), r.keys.lru(p), r.keys.part(p)}
}

// change runs script, a call that changes the state of owner (of
// partition p), with keys and args: keys hold a place for the answer key
// of the call's id at index answer, and args a place for the id at index
// op (internal/lua/oplog.lua). Each send draws a new id, with ctx's deadline
// (at most OpTimeout from now) on the clock of the partition's server,
// and fills both places; a client that re-sends the call re-sends both.
// The call is sent once more, as a new one, when Redis refused it for its
// deadline and the refusal allows it (redisconn.ResendExpired).
func (r *redisBackend) change(ctx context.Context, script *lua.Script, p int, owner identity.Owner, keys, args []string, answer, op int) (any, error) {
	return redisconn.ResendExpired(ctx, r.servers, p, r.opts.OpTimeout, func() (any, int64, error) {
		deadline := r.servers.Deadline(ctx, p, r.opts.OpTimeout)
		id := r.newCallID(deadline)
		keys[answer], args[op] = r.keys.answer(p, owner, id), id
		reply, err := r.run(ctx, script, keys, args...)
		return reply, deadline, err
	})
}

// seqArg appends turn's sequence number to b as the scripts compare it:
// 0, which no state holds, for a token of another partition.
func (r *redisBackend) seqArg(b []byte, turn Turn, p int) []byte {
	seq, _ := seqOf(turn, r.opts.Partitions, p)
	return strconv.AppendUint(b, seq, 10)
}

// The calls below build their own strings (the owner's key, its stored
// bytes, ...) in one allocation, and cut them out of it.

func (r *redisBackend) reserve(ctx context.Context, owner identity.Owner) (reserved, error) {
	p := owner.Partition(r.opts.Partitions)
	var buf [128]byte
	b := r.keys.appendOwner(buf[:0], p, owner)
	key := len(b)
	s := string(strconv.AppendInt(b, r.keys.stateBytes(p, owner), 10))
	a := []string{s[:key], "", r.ttl, "", s[key:], r.limits}
	got, err := decodeReserve(r.change(ctx, lua.Reserve, p, owner, a[:2:2], a[2:], 1, 1))
	if err != nil {
		return reserved{}, err
	}
	r.servers.Observe(p, int64(got.seq/1000)) // the sequence counts the server's microseconds
	got.Turn = turnOf(got.seq, r.opts.Partitions, p)
	return got, nil
}

func (r *redisBackend) publish(ctx context.Context, owner identity.Owner, turn Turn, c continuation) (published, error) {
	p := owner.Partition(r.opts.Partitions)
	var buf [256]byte
	b := r.keys.appendOwner(buf[:0], p, owner)
	key := len(b)
	b = strconv.AppendInt(b, r.keys.stateBytes(p, owner), 10)
	size := len(b)
	b = r.seqArg(b, turn, p)
	seq := len(b)
	s := string(appendContinuation(b, c))
	a := []string{s[:key], "", r.ttl, "", s[size:seq], s[seq:], s[key:size], r.limits}
	return decodeRecord(r.change(ctx, lua.Record, p, owner, a[:2:2], a[2:], 1, 1))
}

func (r *redisBackend) abort(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	p := owner.Partition(r.opts.Partitions)
	var buf [128]byte
	b := r.keys.appendOwner(buf[:0], p, owner)
	key := len(b)
	s := string(r.seqArg(b, turn, p))
	a := []string{s[:key], r.keys.lru(p), r.keys.part(p), "", "", s[key:]}
	n, err := integer(r.change(ctx, lua.Abort, p, owner, a[:4:4], a[4:], 3, 0))
	return n == 1, err
}

func (r *redisBackend) isCurrent(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	st, err := r.inspect(ctx, owner)
	return st.Exists && st.Turn == turn, err
}

func (r *redisBackend) clear(ctx context.Context, owner identity.Owner) (bool, error) {
	p, keys := r.ownerKeys(owner)
	n, err := integer(r.change(ctx, lua.Clear, p, owner, append(keys, ""), []string{""}, 3, 0))
	return n == 1, err
}

func (r *redisBackend) inspect(ctx context.Context, owner identity.Owner) (State, error) {
	p, keys := r.ownerKeys(owner)
	reply, err := slice(r.run(ctx, lua.Inspect, keys[:2]))
	if err != nil {
		return State{}, err
	}
	return decodeInspect(reply, r.opts.Partitions, p)
}

func (r *redisBackend) prune(ctx context.Context, p int) (Evictions, error) {
	counts, err := slice(r.run(ctx, lua.Prune, []string{r.keys.lru(p), r.keys.part(p)},
		r.ttl, r.keys.ownerPrefix(p), r.limits))
	if err != nil {
		return Evictions{}, err
	}
	if len(counts) != 3 {
		return Evictions{}, fmt.Errorf("%w: prune: %v, want 3 counts", errBadReply, counts)
	}
	var n [3]int64
	for i, c := range counts {
		if n[i], err = integer(c, nil); err != nil || n[i] < 0 {
			return Evictions{}, fmt.Errorf("%w: prune: %v, want 3 counts", errBadReply, counts)
		}
	}
	return Evictions{TTL: n[0], Owners: n[1], Bytes: n[2]}, nil
}

// stats reads every partition's LRU size and accounting in one pipeline
// (one round trip per node on a cluster).
func (r *redisBackend) stats(ctx context.Context) ([]PartitionStats, error) {
	cmds := make([][]string, 0, 2*r.opts.Partitions)
	for p := range r.opts.Partitions {
		cmds = append(cmds, []string{"ZCARD", r.keys.lru(p)},
			[]string{"HMGET", r.keys.part(p), "bytes", "published", "ev:ttl", "ev:owners", "ev:bytes"})
	}
	replies, err := r.conn.Do(ctx, cmds...)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionStats, r.opts.Partitions)
	for p := range out {
		card, ok1 := replies[2*p].(int64)
		v, ok2 := replies[2*p+1].([]any)
		if !ok1 || !ok2 || len(v) != 5 {
			return nil, fmt.Errorf("%w: partition %d: LRU size %v, accounting %v", errBadReply, p, replies[2*p], replies[2*p+1])
		}
		n := make([]int64, len(v))
		for i, x := range v {
			if x == nil {
				continue
			}
			s, ok := x.(string)
			var err error
			if ok {
				n[i], err = strconv.ParseInt(s, 10, 64)
			}
			if !ok || err != nil {
				return nil, fmt.Errorf("%w: partition %d accounting: %v", errBadReply, p, x)
			}
		}
		out[p] = PartitionStats{Partition: p, Owners: card, StoredBytes: n[0], Published: n[1],
			Evictions: Evictions{TTL: n[2], Owners: n[3], Bytes: n[4]}}
	}
	return out, nil
}

// errBadReply marks a Redis reply that does not have the shape a script's
// header promises.
var errBadReply = errors.New("store: malformed reply")

// decodeReserve decodes the reply of internal/lua/reserve.lua,
// "<seq>:<existed>:<evicted>", then ":<continuation>" when it consumed one;
// the caller composes the turn from its sequence number.
func decodeReserve(v any, err error) (reserved, error) {
	s, err := text(v, err)
	if err != nil {
		return reserved{}, err
	}
	seqText, rest, ok0 := strings.Cut(s, ":")
	existed, rest, ok1 := strings.Cut(rest, ":")
	evictedText, c, consumed := strings.Cut(rest, ":")
	seq, err0 := strconv.ParseInt(seqText, 10, 64)
	evicted, err2 := strconv.Atoi(evictedText)
	if !ok0 || !ok1 || err0 != nil || seq <= 0 || (existed != "0" && existed != "1") || err2 != nil || evicted < 0 {
		return reserved{}, fmt.Errorf("%w: reserve: %.80q", errBadReply, s)
	}
	got := reserved{seq: uint64(seq), Existed: existed == "1", Evicted: evicted}
	if !consumed {
		return got, nil
	}
	prev, err := decodeContinuation([]byte(c))
	if err != nil {
		return reserved{}, fmt.Errorf("reserve: %w", err)
	}
	got.Prev = &prev
	return got, nil
}

// decodeRecord decodes the reply of internal/lua/record.lua,
// "<status>:<evicted>".
func decodeRecord(v any, err error) (published, error) {
	s, err := text(v, err)
	if err != nil {
		return published{}, err
	}
	status, count, ok := strings.Cut(s, ":")
	evicted, err := strconv.Atoi(count)
	switch o := Outcome(status); {
	case !ok || err != nil || evicted < 0:
		return published{}, fmt.Errorf("%w: record: %.80q", errBadReply, s)
	case o == OutcomePublished || o == OutcomeStale || o == OutcomeGone:
		return published{Outcome: o, Evicted: evicted}, nil
	default:
		return published{}, fmt.Errorf("%w: record: unexpected status %q", errBadReply, status)
	}
}

// decodeInspect decodes the reply of internal/lua/inspect.lua for an owner of
// partition p.
func decodeInspect(reply []any, partitions, p int) (State, error) {
	if len(reply) == 0 {
		return State{}, nil
	}
	if len(reply) != 3 {
		return State{}, fmt.Errorf("%w: inspect: %d elements, want 3", errBadReply, len(reply))
	}
	str := func(i int) string { s, _ := reply[i].(string); return s }
	t, err := strconv.ParseInt(str(1), 10, 64)
	if err != nil || t == 0 {
		return State{}, fmt.Errorf("%w: owner state: turn %v", errBadReply, reply[1])
	}
	st := State{Exists: true, Turn: turnOf(uint64(max(t, -t)), partitions, p)}
	if reply[0] != nil {
		sc, err := strconv.ParseInt(str(0), 10, 64)
		if err != nil {
			return State{}, fmt.Errorf("%w: inspect: LRU score %v", errBadReply, reply[0])
		}
		st.UpdatedAt = score(sc).touched()
	}
	if t > 0 {
		return st, nil
	}
	c, err := decodeContinuation([]byte(str(2)))
	if err != nil {
		return State{}, fmt.Errorf("owner state: %w", err)
	}
	st.setContinuation(c)
	return st, nil
}
