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
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/serverclock"
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
	return newRedisStore(goRedis{client: client, refresh: newClusterRefresher(client)}, honoursDeadlines(client), opts)
}

// newRedisStore returns a store on conn; inline says whether conn ends every
// call at its context's deadline.
func newRedisStore(conn redisConn, inline bool, opts Options) (*Store, error) {
	return newStore(opts, inline, func(o Options) (backend, error) {
		r := newRedisBackend(conn, o)
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

// newRedisBackend returns a backend on conn for options o, defaults filled
// in, that has not checked the namespace's schema yet.
func newRedisBackend(conn redisConn, o Options) *redisBackend {
	r := &redisBackend{conn: conn, opts: o, keys: newKeyspace(o.Namespace, o.Partitions),
		servers: serverclock.New(o.Partitions, nil), // deadlines are real time, whatever Options.Now says
		ttl:     strconv.FormatInt(o.TTL.Milliseconds(), 10),
		limits:  fmt.Sprintf("%d:%d:%d", o.partitionOwners(), o.partitionBytes(), evictionBudget),
		newOp:   lua.NewOp}
	r.fp.Store(o.newParser())
	return r
}

// honoursDeadlines reports whether client ends every command at its
// context's deadline (ContextTimeoutEnabled: reads, writes, the pool wait and
// retry backoff all watch the context). The store then calls it on the
// caller's goroutine; otherwise each call runs on a goroutine of its own, so
// that OpTimeout bounds it whatever the client does.
func honoursDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// How often a store checks its namespace's schema again, and how soon it
// retries a check that could not reach Redis.
const (
	schemaRecheck = 5 * time.Second
	schemaRetry   = time.Second
)

// redisConn is what the Redis backend needs of a client library: scripts
// and pipelined commands, each sent to the master that serves its first
// key. Replies are int64, string, float64, nil or []any of them (the
// store's scripts and commands give no others); a nil reply is nil, not an
// error.
type redisConn interface {
	// eval runs s with EVALSHA, or with EVAL when the server lacks it,
	// after checking the counts of keys and args against its header.
	eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error)
	// do sends cmds in one round trip per node and returns their replies
	// in order, or the first error.
	do(ctx context.Context, cmds ...[]string) ([]any, error)
}

// goRedis is a redisConn on a go-redis client.
type goRedis struct {
	client redis.UniversalClient
	// refresh reloads a cluster client's slot map after errors that say
	// it may be stale (nil for a client of one server).
	refresh *clusterRefresher
}

func (g goRedis) eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	v, err := s.Run(ctx, g.client, keys, anys(args)...).Result()
	return g.reply(v, err)
}

// do sends each node's commands in one pipeline. On a cluster it sends
// them to the slot's master, whatever the client's read routing
// (ReadOnly, RouteByLatency, RouteRandomly): a read must see what the
// scripts, which run on the master, wrote.
func (g goRedis) do(ctx context.Context, cmds ...[]string) ([]any, error) {
	byNode := map[redis.Cmdable][]int{}
	for i, c := range cmds {
		node := redis.Cmdable(g.client)
		if cc, ok := g.client.(*redis.ClusterClient); ok {
			master, err := cc.MasterForKey(ctx, c[1])
			if _, err = g.reply(nil, err); err != nil {
				return nil, err
			}
			node = master
		}
		byNode[node] = append(byNode[node], i)
	}
	out := make([]any, len(cmds))
	for node, indices := range byNode {
		pipe := node.Pipeline()
		sent := make([]*redis.Cmd, len(indices))
		for j, i := range indices {
			sent[j] = pipe.Do(ctx, anys(cmds[i])...)
		}
		_, _ = pipe.Exec(ctx) // each command holds its own error
		for j, c := range sent {
			v, err := g.reply(c.Result())
			if err != nil {
				return nil, err
			}
			out[indices[j]] = v
		}
	}
	return out, nil
}

// reply passes on a command's reply, with redis.Nil as a nil reply, after
// showing its error to the slot map refresher.
func (g goRedis) reply(v any, err error) (any, error) {
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	g.refresh.observe(err)
	return v, err
}

func anys(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

type redisBackend struct {
	conn   redisConn
	opts   Options
	keys   keyspace
	schema schemaGuard
	// fp parses under the namespace's key once a schema check has read it;
	// before that, under the key this store proposes.
	fp atomic.Pointer[fingerprint.Parser]
	// servers estimates the clocks of the partitions' servers, on which
	// calls carry their deadlines.
	servers *serverclock.Clock
	// newOp draws the op of a call that changes state, with its deadline
	// on the server's clock (internal/lua/oplog.lua).
	newOp func(deadline int64) string
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
}

// checkSchema records or compares the namespace's schema now.
func (r *redisBackend) checkSchema(ctx context.Context) error {
	r.schema.mu.Lock()
	r.schema.tried = time.Now()
	r.schema.mu.Unlock()
	proposed := r.fp.Load()
	proposedKey := proposed.Key()
	got, err := slice(r.conn.eval(ctx, lua.Schema, []string{r.keys.meta()}, []string{strconv.Itoa(schemaVersion),
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
func (r *redisBackend) run(ctx context.Context, script *lua.Script, keys []string, args ...string) (any, error) {
	if err := r.schemaError(); err != nil {
		return nil, err
	}
	return r.conn.eval(ctx, script, keys, args)
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

// change returns the keys and the first arguments of a call that changes
// the state of owner (of partition p, whose keys ownerKeys gave), and its
// deadline: those keys and the answer key of a fresh op (internal/lua/oplog.lua);
// now, idle TTL and the op. A client that re-sends the call re-sends both.
// The deadline is ctx's (at most OpTimeout from now) on the clock of the
// partition's server, in milliseconds since the scripts' epoch.
func (r *redisBackend) change(ctx context.Context, p int, owner identity.Owner, keys []string) ([]string, []string, int64) {
	deadline := r.servers.Deadline(ctx, p, r.opts.OpTimeout)
	op := r.newOp(deadline)
	return append(keys[:3:3], r.keys.answer(p, owner, op)), []string{r.clock(), r.ttl, op}, deadline
}

// clock returns the scripts' "now" argument: the store's clock when
// Options.Now was given, else "0" for the server's.
func (r *redisBackend) clock() string {
	if !r.opts.clockGiven {
		return "0"
	}
	return strconv.FormatInt(r.opts.Now().UnixMilli(), 10)
}

// seqArg returns turn's sequence number as the scripts compare it: "0",
// which no state holds, for a token of another partition.
func (r *redisBackend) seqArg(turn Turn, p int) string {
	seq, _ := seqOf(turn, r.opts.Partitions, p)
	return strconv.FormatUint(seq, 10)
}

// errPastDeadline marks a call that reached Redis after its deadline and
// changed nothing (internal/lua/oplog.lua).
var errPastDeadline = errors.New("store: call reached Redis after its deadline")

// changing runs call, a call of partition p that changes state, which
// draws its op and returns its reply and deadline. When Redis refused it
// for its deadline, the store sends it once more as a new call while the
// caller still waits, if the refusal allows it (serverclock Refused: no
// copy can have run); else the refusal is an error.
func (r *redisBackend) changing(ctx context.Context, p int, call func() (any, int64, error)) (any, error) {
	for tries := 0; ; tries++ {
		reply, deadline, err := call()
		if err != nil {
			return nil, err
		}
		a, _ := reply.([]any)
		server, ok := int64(0), len(a) == 2 && a[0] == "expired"
		if ok {
			server, ok = a[1].(int64)
		}
		if !ok {
			return reply, nil
		}
		if !r.servers.Refused(p, server, deadline, r.opts.OpTimeout) || tries > 0 || ctx.Err() != nil {
			return nil, fmt.Errorf("%w (the server's clock read %s)", errPastDeadline,
				time.UnixMilli(server+serverclock.EpochMillis).UTC().Format(time.RFC3339Nano))
		}
	}
}

func (r *redisBackend) reserve(ctx context.Context, owner identity.Owner) (reserved, error) {
	p, keys := r.ownerKeys(owner)
	tail := []string{strconv.FormatInt(r.keys.stateBytes(p, owner), 10), r.limits}
	reply, err := slice(r.changing(ctx, p, func() (any, int64, error) {
		keys, args, deadline := r.change(ctx, p, owner, keys)
		reply, err := r.run(ctx, lua.Reserve, append(keys, r.keys.seq(p)), append(args, tail...)...)
		return reply, deadline, err
	}))
	if err != nil {
		return reserved{}, err
	}
	got, err := decodeReserve(reply)
	if err != nil {
		return reserved{}, err
	}
	r.servers.Observe(p, int64(got.seq/1000)) // the sequence counts the server's microseconds
	got.Turn = turnOf(got.seq, r.opts.Partitions, p)
	return got, nil
}

func (r *redisBackend) publish(ctx context.Context, owner identity.Owner, turn Turn, c continuation) (published, error) {
	p, keys := r.ownerKeys(owner)
	tail := []string{r.seqArg(turn, p), string(encodeContinuation(c)), strconv.FormatInt(r.keys.stateBytes(p, owner), 10), r.limits}
	reply, err := slice(r.changing(ctx, p, func() (any, int64, error) {
		keys, args, deadline := r.change(ctx, p, owner, keys)
		reply, err := r.run(ctx, lua.Record, keys, append(args, tail...)...)
		return reply, deadline, err
	}))
	if err != nil {
		return published{}, err
	}
	return decodeRecord(reply)
}

func (r *redisBackend) abort(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	p, keys := r.ownerKeys(owner)
	keys, args, _ := r.change(ctx, p, owner, keys)
	n, err := integer(r.run(ctx, lua.Abort, keys, append(args, r.seqArg(turn, p))...))
	return n == 1, err
}

func (r *redisBackend) isCurrent(ctx context.Context, owner identity.Owner, turn Turn) (bool, error) {
	st, err := r.inspect(ctx, owner)
	return st.Exists && st.Turn == turn, err
}

func (r *redisBackend) clear(ctx context.Context, owner identity.Owner) (bool, error) {
	p, keys := r.ownerKeys(owner)
	n, err := integer(r.changing(ctx, p, func() (any, int64, error) {
		keys, args, deadline := r.change(ctx, p, owner, keys)
		reply, err := r.run(ctx, lua.Clear, keys, args...)
		return reply, deadline, err
	}))
	return n == 1, err
}

func (r *redisBackend) inspect(ctx context.Context, owner identity.Owner) (State, error) {
	p, keys := r.ownerKeys(owner)
	reply, err := slice(r.run(ctx, lua.Inspect, keys[:2], r.clock(), r.ttl))
	if err != nil {
		return State{}, err
	}
	return decodeInspect(reply, r.opts.Partitions, p)
}

func (r *redisBackend) prune(ctx context.Context, p int) (Evictions, error) {
	counts, err := slice(r.run(ctx, lua.Prune, []string{r.keys.lru(p), r.keys.part(p)},
		r.clock(), r.ttl, r.keys.ownerPrefix(p), r.limits))
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
	replies, err := r.conn.do(ctx, cmds...)
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

// decodeReserve decodes the reply of internal/lua/reserve.lua; the caller composes
// the turn from its sequence number.
func decodeReserve(reply []any) (reserved, error) {
	if len(reply) < 3 || len(reply) > 4 {
		return reserved{}, fmt.Errorf("%w: reserve: %d elements, want 3 or 4", errBadReply, len(reply))
	}
	seq, ok0 := reply[0].(int64)
	existed, ok1 := reply[1].(int64)
	evicted, ok2 := reply[2].(int64)
	if !ok0 || seq <= 0 || !ok1 || !ok2 || evicted < 0 {
		return reserved{}, fmt.Errorf("%w: reserve: %v", errBadReply, reply[:3])
	}
	got := reserved{seq: uint64(seq), Existed: existed == 1, Evicted: int(evicted)}
	if len(reply) == 3 || reply[3] == nil {
		return got, nil
	}
	b, ok := reply[3].(string)
	if !ok {
		return reserved{}, fmt.Errorf("%w: reserve: continuation is %T", errBadReply, reply[3])
	}
	c, err := decodeContinuation([]byte(b))
	if err != nil {
		return reserved{}, fmt.Errorf("reserve: %w", err)
	}
	got.Prev = &c
	return got, nil
}

// decodeRecord decodes the reply of internal/lua/record.lua.
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
