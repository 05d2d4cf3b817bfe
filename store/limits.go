package store

import (
	"context"
	"errors"

	"github.com/contstore/contstore/identity"
)

// evictionBudget bounds the evictions one operation makes, so no script
// runs long.
const evictionBudget = 64

// ErrSchemaMismatch is returned by NewRedis when the namespace was created
// with another partition count, schema version or fingerprint profile.
var ErrSchemaMismatch = errors.New("store: namespace schema mismatch")

// schemaVersion is the Redis layout this package reads and writes.
const schemaVersion = 2

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
	// StoredBytes is the stored-bytes estimate of those states.
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

// Stats describes the whole store: Total sums the partitions.
type Stats struct {
	Total      PartitionStats
	Partitions []PartitionStats
	// OwnerLimit and ByteLimit are each partition's share of MaxOwners and
	// MaxTotalBytes.
	OwnerLimit int
	ByteLimit  int64
	// Breakers are this store's circuit breakers, one per partition.
	Breakers []BreakerStatus
}

// SweepResult says what Sweep evicted.
type SweepResult struct {
	Evicted Evictions
}

// Sweep prunes every partition as operations do (idle states first, then
// least recently touched while over a limit), until none has work left. Run
// it from a maintenance loop so idle partitions give their memory back.
func (s *Store) Sweep(ctx context.Context) (SweepResult, error) {
	var out SweepResult
	for p := range s.opts.Partitions {
		for {
			ev, err := run(ctx, s, OpSweep, identity.Owner{}, func(ctx context.Context) (Evictions, error) {
				return s.backend.prune(ctx, p)
			})
			if err != nil {
				return out, err
			}
			out.Evicted.add(ev)
			if ev.Total() < evictionBudget {
				break
			}
		}
	}
	return out, nil
}

// Stats reads every partition's counters.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	parts, err := run(ctx, s, OpStats, identity.Owner{}, s.backend.stats)
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Partitions: parts, OwnerLimit: s.opts.partitionOwners(), ByteLimit: s.opts.partitionBytes(), Breakers: s.Breakers()}
	for _, p := range parts {
		st.Total.add(p)
	}
	return st, nil
}

// partitionOwners is each partition's share of MaxOwners.
func (o Options) partitionOwners() int { return o.MaxOwners / o.Partitions }

// partitionBytes is each partition's share of MaxTotalBytes.
func (o Options) partitionBytes() int64 { return o.MaxTotalBytes / int64(o.Partitions) }
