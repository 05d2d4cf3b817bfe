package store

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Sweep prunes every partition as operations do (idle states first, then
// least recently touched while over a limit), until none has work left or
// OpTimeout has passed, and returns what it evicted, also when it fails part
// way. It prunes up to sweepConcurrency partitions at once, and returns
// within OpTimeout like every operation: work left then waits for the next
// Sweep (or for the operations' own pruning), and is no error. Run it from a
// maintenance loop so idle partitions give their memory back. Each
// partition's sweep goes through its circuit breaker: an open one is
// skipped (no error), and one past its cooldown takes the sweep as its
// probe, so that it closes once Redis answers even when no owner calls it.
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
				// On the partition's breaker: a sweep is the call that
				// closes it again once Redis is back, when no owner's
				// call has come since.
				start := time.Now()
				ev, err := call(sweepCtx, s, p, func(ctx context.Context) (Evictions, error) {
					return s.backend.prune(ctx, p)
				})
				// The sweep's own time running out is no error of the
				// sweep's, nor reported as one; an open breaker, which it
				// skips, is reported but no error of the sweep's either.
				ranOut := sweepCtx.Err() != nil && ctx.Err() == nil
				if err != nil {
					err = unavailable(string(OpSweep), err)
				}
				observed := Event{Op: OpSweep}
				if !ranOut {
					observed.Err = err
				}
				s.observe(observed, start)
				mu.Lock()
				out.add(ev)
				if err != nil && !ranOut && !errors.Is(err, ErrBreakerOpen) {
					errs = append(errs, err)
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
