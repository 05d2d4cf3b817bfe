package store

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
)

// NewMemory returns a store that keeps its state in this process, with the
// same semantics, limits and eviction as the Redis backend and the clock of
// Options.Now. It suits a single gateway replica and is the reference model
// of the Redis backend. Eviction costs O(log n) per state.
func NewMemory(opts Options) (*Store, error) {
	return newStore(opts, true, func(o Options) (backend, error) {
		m := &memory{opts: o, parts: make([]memPartition, o.Partitions), fp: o.newParser()}
		for i := range m.parts {
			m.parts[i].owners = make(map[identity.Owner]*memOwner)
		}
		return m, nil
	})
}

// memory is the in-process backend: every partition behind one mutex. Its
// layout mirrors Redis: a state stays in its partition's map and LRU after
// its TTL has passed (reads treat it as gone) until pruning evicts it.
type memory struct {
	mu    sync.Mutex
	opts  Options
	parts []memPartition
	fp    *fingerprint.Parser // under a key of this process's own
}

func (m *memory) parser() *fingerprint.Parser { return m.fp }

type memPartition struct {
	seq       uint64
	owners    map[identity.Owner]*memOwner
	lru       lruHeap
	bytes     int64
	published int64
	evictions Evictions
}

type memOwner struct {
	owner identity.Owner
	key   string // owner.Key(), the LRU's tie-breaker as in Redis
	turn  Turn
	cont  *continuation
	score score
	index int // position in the LRU heap
}

// expired reports whether st's TTL has passed at now: Redis expires a key
// once the clock is past its deadline.
func (m *memory) expired(st *memOwner, now time.Time) bool {
	return st.score.idleBefore(now.Add(-m.opts.TTL))
}

func (m *memory) partition(owner identity.Owner) *memPartition {
	return &m.parts[owner.Partition(m.opts.Partitions)]
}

// live returns the owner's state unless it is missing or expired. Callers
// hold m.mu.
func (m *memory) live(owner identity.Owner, now time.Time) (*memPartition, *memOwner) {
	p := m.partition(owner)
	st := p.owners[owner]
	if st == nil || m.expired(st, now) {
		return p, nil
	}
	return p, st
}

// remove takes st out of its partition and its accounting.
func (p *memPartition) remove(st *memOwner) {
	heap.Remove(&p.lru, st.index)
	delete(p.owners, st.owner)
	p.bytes -= st.score.size()
	if st.score.published() {
		p.published--
	}
}

// touch (re)inserts st with a new score, replacing the owner's previous
// state if any.
func (p *memPartition) touch(st *memOwner, sc score) {
	if old := p.owners[st.owner]; old != nil {
		p.remove(old)
	}
	st.score = sc
	p.owners[st.owner] = st
	heap.Push(&p.lru, st)
	p.bytes += sc.size()
	if sc.published() {
		p.published++
	}
}

// pruneOne evicts from p as lua/lru.lua does, never keep, and returns what
// it evicted. keep was touched at now, so it is never idle.
func (m *memory) pruneOne(p *memPartition, keep *memOwner, now time.Time) Evictions {
	var ev Evictions
	done := 0
	for done < evictionBudget && len(p.lru) > 0 && m.expired(p.lru[0], now) {
		p.remove(p.lru[0])
		ev.TTL++
		done++
	}
	for done < evictionBudget && (len(p.owners) > m.opts.partitionOwners() || p.bytes > m.opts.partitionBytes()) {
		victim := p.lru.oldestExcept(keep)
		if victim == nil {
			break
		}
		if len(p.owners) > m.opts.partitionOwners() {
			ev.Owners++
		} else {
			ev.Bytes++
		}
		p.remove(victim)
		done++
	}
	p.evictions.add(ev)
	return ev
}

func (m *memory) reserve(_ context.Context, owner identity.Owner, size int64, _ uint64) (reserved, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	p := m.partition(owner)
	var got reserved
	var ownerTurn Turn
	if st := p.owners[owner]; st != nil {
		if m.expired(st, now) {
			p.evictions.TTL++
			got.Evicted++
		} else {
			got.Existed, got.Prev, ownerTurn = true, st.cont, st.turn
		}
	}
	p.seq = nextSeq(p.seq, now, ownerTurn, m.opts.Partitions)
	got.Turn = Turn(p.seq*uint64(m.opts.Partitions) + uint64(owner.Partition(m.opts.Partitions)))
	st := &memOwner{owner: owner, key: owner.Key(), turn: got.Turn}
	p.touch(st, packScore(now, false, size))
	got.Evicted += int(m.pruneOne(p, st, now).Total())
	return got, nil
}

func (m *memory) publish(_ context.Context, owner identity.Owner, turn Turn, c continuation, size int64) (published, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.Now()
	p, st := m.live(owner, now)
	switch {
	case st == nil:
		return published{Outcome: OutcomeGone}, nil
	case st.turn != turn:
		return published{Outcome: OutcomeStale}, nil
	}
	st.cont = &c
	p.touch(st, packScore(now, true, size))
	return published{Outcome: OutcomePublished, Evicted: int(m.pruneOne(p, st, now).Total())}, nil
}

func (m *memory) abort(_ context.Context, owner identity.Owner, turn Turn) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, st := m.live(owner, m.opts.Now())
	if st == nil || st.turn != turn {
		return false, nil
	}
	p.remove(st)
	return true, nil
}

func (m *memory) isCurrent(_ context.Context, owner identity.Owner, turn Turn) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, st := m.live(owner, m.opts.Now())
	return st != nil && st.turn == turn, nil
}

func (m *memory) clear(_ context.Context, owner identity.Owner) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.partition(owner)
	st := p.owners[owner]
	if st == nil {
		return false, nil
	}
	live := !m.expired(st, m.opts.Now())
	p.remove(st)
	return live, nil
}

func (m *memory) inspect(_ context.Context, owner identity.Owner) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, st := m.live(owner, m.opts.Now())
	if st == nil {
		return State{}, nil
	}
	return st.state(), nil
}

func (st *memOwner) state() State {
	out := State{Exists: true, Turn: st.turn, UpdatedAt: st.score.touched()}
	if st.cont != nil {
		out.setContinuation(*st.cont)
	}
	return out
}

func (m *memory) prune(_ context.Context, partition int) (Evictions, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pruneOne(&m.parts[partition], nil, m.opts.Now()), nil
}

func (m *memory) stats(context.Context) ([]PartitionStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PartitionStats, len(m.parts))
	for i, p := range m.parts {
		out[i] = PartitionStats{Partition: i, Owners: int64(len(p.owners)), StoredBytes: p.bytes, Published: p.published, Evictions: p.evictions}
	}
	return out, nil
}

// lruHeap orders states as Redis orders the LRU: by score, then by key.
type lruHeap []*memOwner

func (h lruHeap) Len() int { return len(h) }
func (h lruHeap) Less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score < h[j].score
	}
	return h[i].key < h[j].key
}
func (h lruHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *lruHeap) Push(x any) {
	st := x.(*memOwner)
	st.index = len(*h)
	*h = append(*h, st)
}
func (h *lruHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return st
}

// oldestExcept returns the least recently touched state other than keep.
func (h lruHeap) oldestExcept(keep *memOwner) *memOwner {
	switch {
	case len(h) == 0:
		return nil
	case h[0] != keep:
		return h[0]
	case len(h) == 1:
		return nil
	case len(h) == 2 || h.Less(1, 2):
		return h[1]
	default:
		return h[2]
	}
}
