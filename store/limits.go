package store

import (
	"context"
	"sync"

	"github.com/contstore/contstore/identity"
)

// evictionBudget bounds the evictions one operation makes, so no script
// runs long.
const evictionBudget = 64

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

// Sweep prunes every partition as operations do (idle states first, then
// least recently touched while over a limit), until none has work left or
// OpTimeout has passed, and returns what it evicted, also when it fails part
// way. It prunes up to sweepConcurrency partitions at once, and returns
// within OpTimeout like every operation: work left then waits for the next
// Sweep (or for the operations' own pruning), and is no error. Run it from a
// maintenance loop so idle partitions give their memory back.
func (s *Store) Sweep(ctx context.Context) (Evictions, error) {
	sweepCtx, cancel := context.WithTimeout(ctx, s.opts.OpTimeout)
	defer cancel()
	var (
		mu   sync.Mutex
		out  Evictions
		errs []error
		wg   sync.WaitGroup
	)
	slots := make(chan struct{}, sweepConcurrency)
	for p := range s.opts.Partitions {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			for sweepCtx.Err() == nil {
				ev, err := run(sweepCtx, s, OpSweep, identity.Owner{}, func(ctx context.Context) (Evictions, error) {
					return s.backend.prune(ctx, p)
				})
				mu.Lock()
				out.add(ev)
				if err != nil && (ctx.Err() != nil || sweepCtx.Err() == nil) {
					errs = append(errs, err) // not the sweep's own time running out
				}
				mu.Unlock()
				if err != nil || ev.Total() < evictionBudget {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return out, errs[0]
	}
	return out, ctx.Err()
}

// sweepConcurrency is how many partitions Sweep prunes at once.
const sweepConcurrency = 16

// Stats reads every partition's counters. When that fails it returns the
// error and Stats holding only Breakers, which are this process's own.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Breakers: s.breakers.statuses()}
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

// partitionOwners is each partition's share of MaxOwners.
func (o Options) partitionOwners() int { return o.MaxOwners / o.Partitions }

// partitionBytes is each partition's share of MaxTotalBytes.
func (o Options) partitionBytes() int64 { return o.MaxTotalBytes / int64(o.Partitions) }
