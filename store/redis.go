package store

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/lua"
)

// NewRedis returns a store whose state lives in Redis, shared by every
// replica that opens the same namespace. client may be a *redis.Client or a
// *redis.ClusterClient; the store makes no connections of its own.
//
// The first store to open a namespace records its schema version and
// partition count there; NewRedis fails with ErrSchemaMismatch when they
// differ from opts. When Redis cannot be reached, NewRedis still returns the
// store (a gateway must start without Redis) and the check runs again in
// the background until it succeeds. Running stores repeat it every few
// seconds, so a namespace whose data Redis lost is recorded again, and a
// store that finds a mismatch fails every operation open until it matches.
func NewRedis(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalidOptions)
	}
	return newStore(opts, false, func(o Options) (backend, error) {
		r := &redisBackend{client: client, opts: o, keys: keyspace{ns: o.Namespace}}
		r.fp.Store(o.newParser())
		ctx, cancel := context.WithTimeout(context.Background(), o.OpTimeout)
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

// How often a store checks its namespace's schema again, and how soon it
// retries a check that could not reach Redis.
const (
	schemaRecheck = 5 * time.Second
	schemaRetry   = time.Second
)

type redisBackend struct {
	client redis.UniversalClient
	opts   Options
	keys   keyspace
	schema schemaGuard
	// fp parses under the namespace's key once a schema check has read it;
	// before that, under the key this store proposes.
	fp atomic.Pointer[fingerprint.Parser]
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
}

// checkSchema records or compares the namespace's schema now.
func (r *redisBackend) checkSchema(ctx context.Context) error {
	r.schema.mu.Lock()
	r.schema.tried = time.Now()
	r.schema.mu.Unlock()
	proposed := r.fp.Load()
	proposedKey := proposed.Key()
	got, err := lua.Schema.Run(ctx, r.client, []string{r.keys.meta()},
		schemaVersion, r.opts.Partitions, proposed.ProfileID(), hex.EncodeToString(proposedKey[:])).Slice()
	if err == nil && len(got) != 4 {
		err = fmt.Errorf("%w: schema: %d elements, want 4", errBadReply, len(got))
	}
	if err != nil {
		return err
	}
	field := func(i int) string { s, _ := got[i].(string); return s }
	var mismatch error
	if field(0) != strconv.Itoa(schemaVersion) || field(1) != strconv.Itoa(r.opts.Partitions) || field(2) != proposed.ProfileID() {
		mismatch = fmt.Errorf("%w: namespace %q has schema %s with %s partitions and profile %q; this store has schema %d with %d partitions and profile %q",
			ErrSchemaMismatch, r.opts.Namespace, field(0), field(1), field(2), schemaVersion, r.opts.Partitions, proposed.ProfileID())
	} else if key, err := hex.DecodeString(field(3)); err != nil || len(key) != fingerprint.KeySize {
		mismatch = fmt.Errorf("%w: namespace %q holds no valid fingerprint key", ErrSchemaMismatch, r.opts.Namespace)
	} else if !bytes.Equal(key, proposedKey[:]) {
		p, err := fingerprint.New(r.opts.Profile, fingerprint.Key(key))
		if err != nil {
			return err // not reached: the profile was checked
		}
		r.fp.CompareAndSwap(proposed, p)
	}
	r.schema.mu.Lock()
	defer r.schema.mu.Unlock()
	r.schema.mismatch = mismatch
	if mismatch == nil {
		r.schema.passedAt = time.Now()
	}
	return mismatch
}

// schemaError returns the mismatch the last check found, and starts a check
// in the background when the last one is stale. Operations never wait for
// it: while Redis cannot be reached for the check, they proceed.
func (r *redisBackend) schemaError() error {
	g := &r.schema
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
func (r *redisBackend) run(ctx context.Context, script *lua.Script, keys []string, args ...any) *redis.Cmd {
	if err := r.schemaError(); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return script.Run(ctx, r.client, keys, args...)
}

// ownerKeys returns an owner's partition, state key, LRU and accounting keys.
func (r *redisBackend) ownerKeys(owner identity.Owner) (p int, state, lru, part string) {
	p = owner.Partition(r.opts.Partitions)
	return p, r.keys.owner(p, owner), r.keys.lru(p), r.keys.part(p)
}

// limits returns the trailing arguments of the scripts that prune.
func (r *redisBackend) limits() []any {
	return []any{r.opts.partitionOwners(), r.opts.partitionBytes(), evictionBudget}
}

func (r *redisBackend) ttlMillis() int64 { return r.opts.TTL.Milliseconds() }

func (r *redisBackend) reserve(ctx context.Context, owner identity.Owner, size int64, nonce uint64) (reserved, error) {
	p, state, lru, part := r.ownerKeys(owner)
	args := append([]any{r.ttlMillis(), r.opts.Partitions, p, size}, r.limits()...)
	args = append(args, strconv.FormatUint(nonce, 16))
	reply, err := r.run(ctx, lua.Reserve, []string{state, lru, part}, args...).Slice()
	if err != nil {
		return reserved{}, err
	}
	return decodeReserve(reply)
}

func (r *redisBackend) publish(ctx context.Context, owner identity.Owner, turn Turn, c continuation, size int64) (published, error) {
	_, state, lru, part := r.ownerKeys(owner)
	args := append([]any{turn.String(), r.ttlMillis(), c.ResponseID, c.Origin.Replica,
		strconv.FormatUint(c.Origin.ID, 10), c.Transcript.Items,
		digestString(c.Transcript.Digest), digestString(c.Signature),
		c.Transcript.Bytes, size}, r.limits()...)
	reply, err := r.run(ctx, lua.Record, []string{state, lru, part}, args...).Slice()
	if err != nil {
		return published{}, err
	}
	return decodeRecord(reply)
}

func (r *redisBackend) abort(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	_, state, lru, part := r.ownerKeys(owner)
	n, err := r.run(ctx, lua.Abort, []string{state, lru, part}, turn.String()).Int()
	return n == 1, err
}

func (r *redisBackend) isCurrent(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	if err := r.schemaError(); err != nil {
		return false, err
	}
	_, state, _, _ := r.ownerKeys(owner)
	cur, err := r.client.HGet(ctx, state, "t").Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return cur == turn.String(), err
}

func (r *redisBackend) clear(ctx context.Context, owner identity.Owner) (bool, error) {
	_, state, lru, part := r.ownerKeys(owner)
	n, err := r.run(ctx, lua.Clear, []string{state, lru, part}).Int()
	return n == 1, err
}

func (r *redisBackend) inspect(ctx context.Context, owner identity.Owner) (State, error) {
	_, state, lru, _ := r.ownerKeys(owner)
	reply, err := r.run(ctx, lua.Inspect, []string{state, lru}).Slice()
	if err != nil {
		return State{}, err
	}
	return decodeInspect(reply)
}

func (r *redisBackend) prune(ctx context.Context, p int) (Evictions, error) {
	counts, err := r.run(ctx, lua.Prune, []string{r.keys.lru(p), r.keys.part(p)},
		append([]any{r.ttlMillis()}, r.limits()...)...).Int64Slice()
	if err != nil {
		return Evictions{}, err
	}
	if len(counts) != 3 {
		return Evictions{}, fmt.Errorf("%w: prune: %d elements, want 3", errBadReply, len(counts))
	}
	return Evictions{TTL: counts[0], Owners: counts[1], Bytes: counts[2]}, nil
}

// stats reads every partition's LRU size and accounting in one pipeline
// (one round trip per node on a cluster).
func (r *redisBackend) stats(ctx context.Context) ([]PartitionStats, error) {
	pipe := r.client.Pipeline()
	cards := make([]*redis.IntCmd, r.opts.Partitions)
	parts := make([]*redis.SliceCmd, r.opts.Partitions)
	for p := range r.opts.Partitions {
		cards[p] = pipe.ZCard(ctx, r.keys.lru(p))
		parts[p] = pipe.HMGet(ctx, r.keys.part(p), "bytes", "published", "ev:ttl", "ev:owners", "ev:bytes")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]PartitionStats, r.opts.Partitions)
	for p := range out {
		v := parts[p].Val()
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
		out[p] = PartitionStats{Partition: p, Owners: cards[p].Val(), StoredBytes: n[0], Published: n[1],
			Evictions: Evictions{TTL: n[2], Owners: n[3], Bytes: n[4]}}
	}
	return out, nil
}

// errBadReply marks a Redis reply that does not have the shape a script's
// header promises.
var errBadReply = errors.New("store: malformed reply")

// Digests travel and rest as signed decimal int64 strings: Redis keeps them
// as compact integers and Lua never does arithmetic on them.
func digestString(d uint64) string { return strconv.FormatInt(int64(d), 10) }

func parseDigest(s string) (uint64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	return uint64(v), err
}

// decodeReserve decodes the reply of lua/reserve.lua.
func decodeReserve(reply []any) (reserved, error) {
	if len(reply) < 3 {
		return reserved{}, fmt.Errorf("%w: reserve: %d elements, want at least 3", errBadReply, len(reply))
	}
	turn, err := replyUint(reply[0])
	if err != nil || turn == 0 {
		return reserved{}, fmt.Errorf("%w: reserve: turn %v", errBadReply, reply[0])
	}
	existed, ok1 := reply[1].(int64)
	evicted, ok2 := reply[2].(int64)
	if !ok1 || !ok2 || evicted < 0 {
		return reserved{}, fmt.Errorf("%w: reserve: flags %v %v", errBadReply, reply[1], reply[2])
	}
	got := reserved{Turn: Turn(turn), Existed: existed == 1, Evicted: int(evicted)}
	if len(reply) == 3 || reply[3] == nil {
		return got, nil
	}
	names := []string{"r", "s", "i", "n", "d", "g", "b"}
	if len(reply) != 3+len(names) {
		return reserved{}, fmt.Errorf("%w: reserve: %d elements, want %d", errBadReply, len(reply), 3+len(names))
	}
	fields := make(map[string]string, len(names))
	for i, name := range names {
		s, ok := reply[3+i].(string)
		if !ok {
			return reserved{}, fmt.Errorf("%w: reserve: field %s is %T", errBadReply, name, reply[3+i])
		}
		fields[name] = s
	}
	c, err := decodeContinuation(fields)
	if err != nil {
		return reserved{}, fmt.Errorf("reserve: %w", err)
	}
	got.Prev = &c
	return got, nil
}

// decodeRecord decodes the reply of lua/record.lua.
func decodeRecord(reply []any) (published, error) {
	if len(reply) != 2 {
		return published{}, fmt.Errorf("%w: record: %d elements, want 2", errBadReply, len(reply))
	}
	status, ok1 := reply[0].(string)
	evicted, ok2 := reply[1].(int64)
	switch o := Outcome(status); {
	case !ok1 || !ok2 || evicted < 0:
		return published{}, fmt.Errorf("%w: record: %v", errBadReply, reply)
	case o == OutcomePublished || o == OutcomeStale || o == OutcomeGone:
		return published{Outcome: o, Evicted: int(evicted)}, nil
	default:
		return published{}, fmt.Errorf("%w: record: unexpected status %q", errBadReply, status)
	}
}

// decodeInspect decodes the reply of lua/inspect.lua.
func decodeInspect(reply []any) (State, error) {
	if len(reply) == 0 {
		return State{}, nil
	}
	if len(reply) != 2 {
		return State{}, fmt.Errorf("%w: inspect: %d elements, want 2", errBadReply, len(reply))
	}
	flat, ok := reply[1].([]any)
	if !ok || len(flat)%2 != 0 {
		return State{}, fmt.Errorf("%w: inspect: fields %v", errBadReply, reply[1])
	}
	fields := make(map[string]string, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		k, ok1 := flat[i].(string)
		v, ok2 := flat[i+1].(string)
		if !ok1 || !ok2 {
			return State{}, fmt.Errorf("%w: inspect: field %v", errBadReply, flat[i])
		}
		fields[k] = v
	}
	turn, err := strconv.ParseUint(fields["t"], 10, 64)
	if err != nil || turn == 0 {
		return State{}, fmt.Errorf("%w: owner state: turn %q", errBadReply, fields["t"])
	}
	st := State{Exists: true, Turn: Turn(turn)}
	if reply[0] != nil {
		s, ok := reply[0].(string)
		sc, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil {
			return State{}, fmt.Errorf("%w: inspect: LRU score %v", errBadReply, reply[0])
		}
		st.UpdatedAt = score(sc).touched()
	}
	if _, ok := fields["r"]; !ok {
		return st, nil
	}
	c, err := decodeContinuation(fields)
	if err != nil {
		return State{}, fmt.Errorf("owner state: %w", err)
	}
	st.setContinuation(c)
	return st, nil
}

// decodeContinuation reads the continuation fields of an owner hash.
func decodeContinuation(f map[string]string) (continuation, error) {
	c := continuation{ResponseID: f["r"], Origin: Socket{Replica: f["s"]}}
	var errs []error
	parse := func(name string, fn func(string) error) {
		if err := fn(f[name]); err != nil {
			errs = append(errs, fmt.Errorf("field %s=%q", name, f[name]))
		}
	}
	parse("i", func(s string) (err error) { c.Origin.ID, err = strconv.ParseUint(s, 10, 64); return })
	if c.Origin.ID == 0 { // stored for Socket{Any: true}
		c.Origin = Socket{Any: true}
	}
	parse("n", func(s string) (err error) { c.Transcript.Items, err = strconv.Atoi(s); return })
	parse("d", func(s string) (err error) { c.Transcript.Digest, err = parseDigest(s); return })
	parse("g", func(s string) (err error) { c.Signature, err = parseDigest(s); return })
	parse("b", func(s string) (err error) { c.Transcript.Bytes, err = strconv.ParseInt(s, 10, 64); return })
	if len(errs) > 0 {
		return continuation{}, fmt.Errorf("%w: continuation: %w", errBadReply, errors.Join(errs...))
	}
	if c.ResponseID == "" || c.Transcript.Items < 0 || c.Transcript.Bytes < 0 {
		return continuation{}, fmt.Errorf("%w: continuation: empty response id or negative size", errBadReply)
	}
	return c, nil
}

func replyUint(v any) (uint64, error) {
	switch v := v.(type) {
	case string:
		return strconv.ParseUint(v, 10, 64)
	case int64:
		if v < 0 {
			return 0, fmt.Errorf("negative %d", v)
		}
		return uint64(v), nil
	default:
		return 0, fmt.Errorf("type %T", v)
	}
}
