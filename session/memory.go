package session

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// NewMemory returns an in-process store with the Redis store's semantics.
// It has no replicas: with MinReplicas > 0, SaveDurable publishes and then
// returns ErrNotDurable.
func NewMemory(opts Options) (*Store, error) {
	return newMemory(opts, time.Now)
}

// newMemory returns an in-process store whose sessions expire by now.
func newMemory(opts Options, now func() time.Time) (*Store, error) {
	return newStore(opts, true, func(o Options) backend {
		return &memory{opts: o, now: now, heads: map[string]memoryHead{}}
	})
}

// memory keeps sessions in process, encoded as Redis would hold them.
type memory struct {
	opts  Options
	now   func() time.Time
	mu    sync.Mutex
	heads map[string]memoryHead
}

type memoryHead struct {
	version uint64
	data    string
	expires time.Time // zero: never
}

// head returns the live head of id, and forgets it once it has expired.
// m.mu is held.
func (m *memory) head(id string) (memoryHead, bool) {
	h, ok := m.heads[id]
	if ok && !h.expires.IsZero() && !m.now().Before(h.expires) {
		delete(m.heads, id)
		return memoryHead{}, false
	}
	return h, ok
}

func (m *memory) save(ctx context.Context, s *Session, durable bool) (uint64, error) {
	data, err := encodeSession(s)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h, _ := m.head(s.ID)
	if h.version != s.Version {
		return 0, fmt.Errorf("%w: session %q is at version %d, this copy at %d", ErrConflict, s.ID, h.version, s.Version)
	}
	next := memoryHead{version: h.version + 1, data: data}
	if m.opts.TTL > 0 {
		next.expires = m.now().Add(m.opts.TTL)
	}
	m.heads[s.ID] = next
	if durable {
		return next.version, fmt.Errorf("%w: session %q version %d: 0 of %d replicas (in-process store)",
			ErrNotDurable, s.ID, next.version, m.opts.MinReplicas)
	}
	return next.version, nil
}

func (m *memory) load(ctx context.Context, id string) (*Session, error) {
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

func (m *memory) remove(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.heads, id)
	return nil
}
