package session

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/redisconn"
)

// Mode is how a store lays a session out.
type Mode int

// Persistence modes. Both load identically.
const (
	// Snapshot stores the whole session as one value on every save.
	Snapshot Mode = iota
	// Journal stores a header and an append-only message log: a save whose
	// messages extend the stored ones appends only the new messages; any
	// other change rewrites the log.
	Journal
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Snapshot:
		return "snapshot"
	case Journal:
		return "journal"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

// Options configure a [Store]. Zero fields take defaults.
type Options struct {
	// Namespace prefixes every Redis key. Default "sess"; at most 64 bytes
	// of printable UTF-8, no spaces, no '{' or '}'.
	Namespace string
	// Mode is the persistence mode. Default Snapshot.
	Mode Mode
	// TTL expires a session not saved for that long (on Redis, the keys'
	// TTL on the server's clock); 0 keeps it.
	TTL time.Duration
	// MinReplicas is how many replicas SaveDurable waits for. Default 0:
	// SaveDurable is Save.
	MinReplicas int
	// DurableTimeout bounds SaveDurable's wait. Default 1s.
	DurableTimeout time.Duration
	// OpTimeout bounds each operation (besides the durable wait), at most an
	// hour: a save's copies change nothing after it (internal/lua/oplog.lua).
	// Default 2s.
	OpTimeout time.Duration
	// BreakerFailures failed operations in a row (default 5; -1: never)
	// open the circuit breaker: operations fail at once for
	// BreakerCooldown (default 1s), then one probe goes through.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Observer, when set, sees every operation and breaker change.
	Observer Observer
}

// withDefaults returns o with defaults filled in, or an error naming the
// first invalid field.
func (o Options) withDefaults() (Options, error) {
	o.Namespace = cmp.Or(o.Namespace, "sess")
	o.DurableTimeout = cmp.Or(o.DurableTimeout, time.Second)
	o.OpTimeout = cmp.Or(o.OpTimeout, 2*time.Second)
	o.BreakerFailures = cmp.Or(o.BreakerFailures, 5)
	o.BreakerCooldown = cmp.Or(o.BreakerCooldown, time.Second)
	if err := names.Namespace(o.Namespace); err != nil {
		return o, fmt.Errorf("%w: Namespace %q %v", ErrInvalid, o.Namespace, err)
	}
	switch {
	case o.Mode != Snapshot && o.Mode != Journal:
		return o, fmt.Errorf("%w: Mode %v", ErrInvalid, o.Mode)
	case o.TTL < 0 || (o.TTL > 0 && o.TTL < time.Millisecond):
		return o, fmt.Errorf("%w: TTL is %v, want 0 or at least 1ms", ErrInvalid, o.TTL)
	case o.MinReplicas < 0:
		return o, fmt.Errorf("%w: MinReplicas is %d, want at least 0", ErrInvalid, o.MinReplicas)
	case o.DurableTimeout < 0 || o.OpTimeout < 0 || o.BreakerCooldown < 0:
		return o, fmt.Errorf("%w: negative duration", ErrInvalid)
	case o.OpTimeout > lua.MaxDeadline:
		return o, fmt.Errorf("%w: OpTimeout is %v, want at most %v", ErrInvalid, o.OpTimeout, lua.MaxDeadline)
	case o.BreakerFailures < -1:
		return o, fmt.Errorf("%w: BreakerFailures is %d, want -1 (off) or more than 0", ErrInvalid, o.BreakerFailures)
	}
	if o.BreakerFailures == -1 {
		o.BreakerFailures = 0 // the breaker never opens
	}
	return o, nil
}

// Store keeps sessions in Redis or in process. It is safe for concurrent
// use.
type Store struct {
	opts    Options
	backend backend
	guard   *redisconn.Guard // the circuit breaker, and whether calls run on the caller's goroutine
}

// backend is one storage of sessions: in process (memory.go) and Redis
// (redis.go). Its errors are those of the package or, for a failure of the
// storage, any other: the Store wraps those in ErrUnavailable.
type backend interface {
	// save publishes s if the stored head is at s.Version, and returns
	// the new version; with durable, it then waits for
	// Options.MinReplicas replicas (ErrNotDurable, with the new version,
	// when they do not acknowledge it). It does not change s.
	save(ctx context.Context, s *Session, durable bool) (uint64, error)
	// load returns the stored head, or ErrNotFound.
	load(ctx context.Context, id string) (*Session, error)
	// remove deletes a session.
	remove(ctx context.Context, id string) error
}

// errBreakerOpen is wrapped (with ErrUnavailable) by operations refused
// while the circuit breaker is open.
var errBreakerOpen = errors.New("session: circuit breaker open")

// newStore returns a store on b; inline says whether b ends every call at
// its context's deadline.
func newStore(opts Options, inline bool, open func(Options) backend) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := redisconn.Breakers{Failures: opts.BreakerFailures, Cooldown: opts.BreakerCooldown, Now: time.Now, Open: errBreakerOpen}
	if opts.Observer != nil {
		b.Changed = opts.Observer.BreakerChanged
	}
	return &Store{opts: opts, backend: open(opts), guard: redisconn.NewGuard(1, inline, b)}, nil
}

// Save publishes s as the new head if the stored head version is
// s.Version (the version s was loaded or last saved at; 0 for a session
// never stored). Otherwise it returns ErrConflict and writes nothing. On
// success s.Version advances.
func (st *Store) Save(ctx context.Context, s *Session) error {
	return st.save(ctx, OpSave, s, false)
}

// SaveDurable is Save, then waits until Options.MinReplicas replicas
// acknowledge the write. When they do not in time it returns ErrNotDurable
// after the head was published (and s.Version advanced): the head may or
// may not survive a failover.
func (st *Store) SaveDurable(ctx context.Context, s *Session) error {
	return st.save(ctx, OpSaveDurable, s, st.opts.MinReplicas > 0)
}

func (st *Store) save(ctx context.Context, op Op, s *Session, durable bool) error {
	start := time.Now()
	err := validSession(s)
	if err == nil {
		// The backend works on a copy: a call that outlives its caller
		// (timeout) must not read what the caller changes next.
		c := *s
		c.Messages = slices.Clone(s.Messages)
		limit := st.opts.OpTimeout
		if durable {
			limit += st.opts.DurableTimeout
		}
		var v uint64
		v, err = call(ctx, st, op, s.ID, limit, func(ctx context.Context) (uint64, error) {
			return st.backend.save(ctx, &c, durable)
		})
		if v > 0 {
			s.Version, s.saved = v, c.Messages
		}
	}
	ev := Event{Op: op, Err: err}
	if s != nil {
		ev.ID, ev.Version = s.ID, s.Version
	}
	st.observe(ev, start)
	return err
}

// Load returns the stored head, or ErrNotFound.
func (st *Store) Load(ctx context.Context, id string) (*Session, error) {
	start := time.Now()
	err := validID(id)
	var s *Session
	if err == nil {
		s, err = call(ctx, st, OpLoad, id, st.opts.OpTimeout, func(ctx context.Context) (*Session, error) {
			return st.backend.load(ctx, id)
		})
	}
	ev := Event{Op: OpLoad, ID: id, Err: err}
	if err != nil {
		s = nil
	} else {
		s.saved = slices.Clone(s.Messages)
		ev.Version = s.Version
	}
	st.observe(ev, start)
	return s, err
}

// Delete removes a session; deleting a missing one is not an error.
func (st *Store) Delete(ctx context.Context, id string) error {
	start := time.Now()
	err := validID(id)
	if err == nil {
		_, err = call(ctx, st, OpDelete, id, st.opts.OpTimeout, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, st.backend.remove(ctx, id)
		})
	}
	st.observe(Event{Op: OpDelete, ID: id, Err: err}, start)
	return err
}

// call runs fn through the store's breaker within limit (redisconn.Call).
// The errors of this package are answers of the backend, which count as
// successes; any other error is a failure of the backend, returned wrapped
// in ErrUnavailable with the operation and the session's id.
func call[T any](ctx context.Context, st *Store, op Op, id string, limit time.Duration, fn func(context.Context) (T, error)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	a, err := redisconn.Call(ctx, st.guard, 0, limit, func(ctx context.Context) (answer, error) {
		v, err := fn(ctx)
		if err != nil && !answered(err) {
			return answer{}, err
		}
		return answer{v, err}, nil
	})
	if err != nil {
		return a.v, fmt.Errorf("%w: %s %q: %w", ErrUnavailable, op, id, err)
	}
	return a.v, a.err
}

// answered reports whether err is an answer of the backend rather than a
// failure of it.
func answered(err error) bool {
	for _, e := range []error{ErrConflict, ErrNotFound, ErrNotDurable, ErrCorrupt, ErrInvalid} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// observe reports a finished operation.
func (st *Store) observe(ev Event, start time.Time) {
	if st.opts.Observer != nil {
		ev.Latency = time.Since(start)
		st.opts.Observer.Observe(ev)
	}
}

// encodeSession returns the stored form of s (without its version):
// compact JSON, messages included, with no HTML escaping, so that a message
// loads back as the compact form of what was saved in either mode. It is a
// string, as Redis takes it, built without a copy.
func encodeSession(s *Session) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return "", invalidMessage(s, 0, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// compactMessages returns the messages of s from index from on as
// encodeSession stores them, or an error naming the first that is not
// valid JSON. They are compacted into one buffer, copied once.
func compactMessages(s *Session, from int) ([]string, error) {
	var b bytes.Buffer
	size := 0
	for _, m := range s.Messages[from:] {
		size += len(m) // compacting never adds bytes
	}
	b.Grow(size)
	ends := make([]int, 0, len(s.Messages)-from)
	for _, m := range s.Messages[from:] {
		if err := json.Compact(&b, m); err != nil {
			return nil, invalidMessage(s, from, err)
		}
		ends = append(ends, b.Len())
	}
	all, start := b.String(), 0
	out := make([]string, len(ends))
	for i, end := range ends {
		out[i], start = all[start:end], end
	}
	return out, nil
}

// decodeSession decodes a stored session, naming it when it does not decode.
func decodeSession(id string, data string) (*Session, error) {
	var s Session
	if err := json.Unmarshal([]byte(data), &s); err != nil {
		return nil, fmt.Errorf("%w: session %q: %v", ErrCorrupt, id, err)
	}
	if s.ID != id {
		return nil, fmt.Errorf("%w: session %q: stored id is %q", ErrCorrupt, id, s.ID)
	}
	if len(s.Messages) == 0 {
		s.Messages = nil
	}
	return &s, nil
}
