package session

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/names"
)

// Store keeps sessions. Implementations: [NewRedisStore], [NewMemoryStore].
type Store interface {
	// Save publishes s as the new head if the stored head version is
	// s.Version (the version s was loaded or last saved at; 0 for a session
	// never stored). Otherwise it returns ErrConflict and writes nothing.
	// On success s.Version advances.
	Save(ctx context.Context, s *Session) error
	// SaveDurable is Save, then waits until StoreOptions.MinReplicas
	// replicas acknowledge the write. When they do not in time it returns
	// ErrNotDurable after the head was published (and s.Version advanced):
	// the head may or may not survive a failover.
	SaveDurable(ctx context.Context, s *Session) error
	// Load returns the stored head, or ErrNotFound.
	Load(ctx context.Context, id string) (*Session, error)
	// Delete removes a session; deleting a missing one is not an error.
	Delete(ctx context.Context, id string) error
}

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

// StoreOptions configure a session store. Zero fields take defaults.
type StoreOptions struct {
	// Namespace prefixes every Redis key. Default "sess"; at most 64 bytes
	// of printable UTF-8, no spaces, no '{' or '}'.
	Namespace string
	// Mode is the persistence mode. Default Snapshot.
	Mode Mode
	// TTL expires a session that is not saved for that long; 0 keeps it.
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
	// Now, when set, is the clock a session's TTL runs on, in whole
	// milliseconds after the Unix epoch: a session not saved for TTL by
	// this clock is gone (tests set it to move time). Unset, the Redis
	// store leaves expiry to Redis's key TTL on the server's clock and the
	// in-process store uses time.Now. Redis expires the keys after TTL on
	// its own clock either way.
	Now func() time.Time
	// Observer, when set, sees every operation.
	Observer Observer
}

// withDefaults returns o with defaults filled in, or an error naming the
// first invalid field.
func (o StoreOptions) withDefaults() (StoreOptions, error) {
	if o.Namespace == "" {
		o.Namespace = "sess"
	}
	if o.DurableTimeout == 0 {
		o.DurableTimeout = time.Second
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 2 * time.Second
	}
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
	case o.DurableTimeout < 0 || o.OpTimeout < 0:
		return o, fmt.Errorf("%w: negative timeout", ErrInvalid)
	case o.OpTimeout > lua.MaxDeadline:
		return o, fmt.Errorf("%w: OpTimeout is %v, want at most %v", ErrInvalid, o.OpTimeout, lua.MaxDeadline)
	}
	return o, nil
}

// encodeSession returns the stored form of s (without its version):
// compact JSON, messages included, with no HTML escaping, so that a message
// loads back as the compact form of what was saved in either mode.
func encodeSession(s *Session) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, invalidMessage(s, 0, err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// compactMessage returns m as encodeSession stores it, or an error when m
// is not valid JSON.
func compactMessage(m json.RawMessage) ([]byte, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, m); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// decodeSession decodes a stored session, naming it when it does not decode.
func decodeSession(id string, data []byte) (*Session, error) {
	var s Session
	if err := json.Unmarshal(data, &s); err != nil {
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

// memoryStore keeps sessions in process, encoded as Redis would hold them.
type memoryStore struct {
	opts  StoreOptions
	mu    sync.Mutex
	heads map[string]memoryHead
}

type memoryHead struct {
	version uint64
	data    []byte
	expires time.Time // zero: never
}

// NewMemoryStore returns an in-process Store with the same semantics as the
// Redis one. It has no replicas: with MinReplicas > 0, SaveDurable publishes
// and then returns ErrNotDurable.
func NewMemoryStore(opts StoreOptions) (Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return observe(&memoryStore{opts: opts, heads: map[string]memoryHead{}}, opts.Observer), nil
}

// nowMilli reads the store's clock to the millisecond, as the Redis store
// passes it to its scripts.
func (m *memoryStore) nowMilli() time.Time { return time.UnixMilli(m.opts.Now().UnixMilli()) }

func (m *memoryStore) head(id string) (memoryHead, bool) {
	h, ok := m.heads[id]
	if ok && !h.expires.IsZero() && !m.nowMilli().Before(h.expires) {
		delete(m.heads, id)
		return memoryHead{}, false
	}
	return h, ok
}

func (m *memoryStore) Save(ctx context.Context, s *Session) error {
	if err := validSession(s); err != nil {
		return err
	}
	data, err := encodeSession(s)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h, _ := m.head(s.ID)
	if h.version != s.Version {
		return fmt.Errorf("%w: session %q is at version %d, this copy at %d", ErrConflict, s.ID, h.version, s.Version)
	}
	next := memoryHead{version: h.version + 1, data: data}
	if m.opts.TTL > 0 {
		next.expires = m.nowMilli().Add(m.opts.TTL)
	}
	m.heads[s.ID] = next
	s.Version = next.version
	return nil
}

func (m *memoryStore) SaveDurable(ctx context.Context, s *Session) error {
	if err := m.Save(ctx, s); err != nil {
		return err
	}
	if m.opts.MinReplicas > 0 {
		return fmt.Errorf("%w: session %q: 0 of %d replicas (in-process store)", ErrNotDurable, s.ID, m.opts.MinReplicas)
	}
	return nil
}

func (m *memoryStore) Load(ctx context.Context, id string) (*Session, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	h, ok := m.head(id)
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: session %q", ErrNotFound, id)
	}
	s, err := decodeSession(id, h.data)
	if err != nil {
		return nil, err
	}
	s.Version = h.version
	return s, nil
}

func (m *memoryStore) Delete(ctx context.Context, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.heads, id)
	return nil
}
