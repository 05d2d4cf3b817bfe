package store

import (
	"context"

	"github.com/contstore/contstore/identity"
)

// Evictions counts evicted owner states by cause.
type Evictions struct {
	// TTL: idle longer than Options.TTL.
	TTL int64
	// Owners: the partition held more than its share of MaxOwners.
	Owners int64
	// Bytes: the partition held more than its share of MaxTotalBytes.
	Bytes int64
}

// Total returns the evictions of every cause.
func (e Evictions) Total() int64 { return e.TTL + e.Owners + e.Bytes }

func (e *Evictions) add(o Evictions) {
	e.TTL += o.TTL
	e.Owners += o.Owners
	e.Bytes += o.Bytes
}

// PartitionStats describes one partition.
type PartitionStats struct {
	// Partition is the partition's number.
	Partition int
	// Owners counts owner states in the LRU, including idle ones that no
	// operation has pruned yet (run Sweep first for live owners only).
	Owners int64
	// StoredBytes estimates what those states cost in Redis 7 (key, hash,
	// TTL and LRU entries), computed the same way on every backend.
	StoredBytes int64
	// Published counts those states holding a continuation.
	Published int64
	// Evictions counts evictions since the namespace began.
	Evictions Evictions
}

func (p *PartitionStats) add(o PartitionStats) {
	p.Owners += o.Owners
	p.StoredBytes += o.StoredBytes
	p.Published += o.Published
	p.Evictions.add(o.Evictions)
}

// Stats describes the whole store.
type Stats struct {
	// Total sums the partitions.
	Total PartitionStats
	// Partitions describes each partition, in order.
	Partitions []PartitionStats
	// OwnerLimit and ByteLimit are each partition's share of MaxOwners and
	// MaxTotalBytes.
	OwnerLimit int
	ByteLimit  int64
	// Breakers are this store's circuit breakers, one per partition, as
	// they were when Stats was called.
	Breakers []BreakerStatus
}

// Stats reads every partition's counters. When that fails it returns the
// error and Stats holding only Breakers, which are this process's own.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Breakers: s.guard.Statuses()}
	parts, err := run(ctx, s, OpStats, identity.Owner{}, s.backend.stats)
	if err != nil {
		return st, err
	}
	st.Partitions, st.OwnerLimit, st.ByteLimit = parts, s.opts.partitionOwners(), s.opts.partitionBytes()
	for _, p := range parts {
		st.Total.add(p)
	}
	return st, nil
}
