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
// same semantics, limits, eviction and clock rules as the Redis backend on
// this process's clock. It suits a single gateway replica and is the
// reference model of the Redis backend. Eviction costs O(log n) per state.
func NewMemory(opts Options) (*Store, error) {
	return newStore(opts, true, func(o Options) (backend, error) {
		m := &memory{opts: o, keys: newKeyspace(o.Namespace, o.Partitions), parts: make([]memPartition, o.Partitions), fp: o.newParser()}
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
	keys  keyspace // Redis's key names, for the stored-bytes estimate and Audit
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
	cont  *continuation // the published continuation; nil once consumed
	kept  int64         // encoded bytes of the last continuation, which Redis keeps until the next publish
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
// state if any, and says what pruning must check, as internal/lua/lru.lua's touch
// does: the owner limit when the owner is new to the LRU, the byte limit
// when the stored bytes grew.
func (p *memPartition) touch(st *memOwner, sc score) (limits pruneChecks) {
	limits = pruneChecks{owners: true, bytes: sc.size() > 0}
	if old := p.owners[st.owner]; old != nil {
		limits = pruneChecks{bytes: sc.size() > old.score.size()}
		p.remove(old)
	}
	st.score = sc
	p.owners[st.owner] = st
	heap.Push(&p.lru, st)
	p.bytes += sc.size()
	if sc.published() {
		p.published++
	}
	return limits
}

// pruneChecks says which limits pruning checks besides idleness; when none
// and the write found no idle state of its own, it does not prune.
type pruneChecks struct{ owners, bytes, idle bool }

// pruneOne evicts from p as internal/lua/lru.lua does, never keep, and returns what
// it evicted: the least recently touched while it is idle or over a limit
// that check names.
func (m *memory) pruneOne(p *memPartition, keep *memOwner, now time.Time, check pruneChecks) Evictions {
	var ev Evictions
	for ev.Total() < evictionBudget && (check.owners || check.bytes || check.idle) {
		victim := p.lru.oldestExcept(keep)
		if victim == nil {
			break
		}
		switch {
		case m.expired(victim, now):
			ev.TTL++
		case check.owners && len(p.owners) > m.opts.partitionOwners():
			ev.Owners++
		case check.bytes && p.bytes > m.opts.partitionBytes():
			ev.Bytes++
		default:
			p.evictions.add(ev)
			return ev
		}
		p.remove(victim)
	}
	p.evictions.add(ev)
	return ev
}

func (m *memory) reserve(_ context.Context, owner identity.Owner) (reserved, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.now()
	part := owner.Partition(m.opts.Partitions)
	p := &m.parts[part]
	var got reserved
	var ownerSeq uint64
	st := &memOwner{owner: owner, key: owner.Key()}
	old := p.owners[owner]
	if old != nil {
		ownerSeq, _ = seqOf(old.turn, m.opts.Partitions, part)
		if m.expired(old, now) {
			p.evictions.TTL++
			got.Evicted++
		} else {
			got.Existed, got.Prev, st.kept = true, old.cont, old.kept
		}
	}
	p.seq = nextSeq(p.seq, now, ownerSeq)
	got.Turn = turnOf(p.seq, m.opts.Partitions, part)
	if got.Existed && !old.score.refreshDue(now, m.opts.TTL) {
		// internal/lua/reserve.lua keeps the entry of a state refreshed lately
		old.turn, old.cont = got.Turn, nil
		return got, nil
	}
	st.turn = got.Turn
	check := p.touch(st, packScore(now, st.kept > 0, m.keys.stateBytes(part, owner)+st.kept))
	check.idle = got.Evicted > 0
	got.Evicted += int(m.pruneOne(p, st, now, check).Total())
	return got, nil
}

func (m *memory) publish(_ context.Context, owner identity.Owner, turn Turn, c continuation) (published, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.now()
	p, st := m.live(owner, now)
	switch {
	case st == nil:
		return published{Outcome: OutcomeGone}, nil
	case st.turn != turn:
		return published{Outcome: OutcomeStale}, nil
	}
	c, kept := asStored(c) // the references Redis would keep
	st.cont, st.kept = &c, int64(kept)
	// internal/lua/record.lua keeps the touch: reserve refreshes it.
	sc := st.score.withContent(true, m.keys.stateBytes(owner.Partition(m.opts.Partitions), owner)+st.kept)
	if sc == st.score {
		return published{Outcome: OutcomePublished}, nil
	}
	check := p.touch(st, sc)
	return published{Outcome: OutcomePublished, Evicted: int(m.pruneOne(p, st, now, check).Total())}, nil
}

func (m *memory) abort(_ context.Context, owner identity.Owner, turn Turn) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, st := m.live(owner, m.opts.now())
	if st == nil || st.turn != turn {
		return false, nil
	}
	p.remove(st)
	return true, nil
}

func (m *memory) isCurrent(_ context.Context, owner identity.Owner, turn Turn) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, st := m.live(owner, m.opts.now())
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
	live := !m.expired(st, m.opts.now())
	p.remove(st)
	return live, nil
}

func (m *memory) inspect(_ context.Context, owner identity.Owner) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, st := m.live(owner, m.opts.now())
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
	return m.pruneOne(&m.parts[partition], nil, m.opts.now(), pruneChecks{owners: true, bytes: true, idle: true}), nil
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
