package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/contstore/contstore/identity"
)

// ErrBreakerOpen is wrapped (with ErrUnavailable) by operations refused
// while the circuit breaker is open.
var ErrBreakerOpen = errors.New("store: circuit breaker open")

// Op names a store operation, as observers see it.
type Op string

// Operations.
const (
	OpReserve   Op = "reserve"
	OpRecord    Op = "record"
	OpAbort     Op = "abort"
	OpIsCurrent Op = "is_current"
	OpClear     Op = "clear"
	OpInspect   Op = "inspect"
	OpSweep     Op = "sweep"
	OpStats     Op = "stats"
)

// Event describes one finished operation.
type Event struct {
	Op    Op
	Owner identity.Owner
	// Reason is Reserve's answer; Outcome is Record's.
	Reason  Reason
	Outcome Outcome
	// Latency is the operation's duration as the caller saw it.
	Latency time.Duration
	// Err is the operation's error (for Reserve, the error behind
	// ReasonStoreUnavailable).
	Err error
	// Evicted counts the owners the operation evicted.
	Evicted int
}

// Observer sees every operation and every change of the circuit breaker.
// Its methods are called synchronously after the operation, outside any
// lock of the store: they must be fast and safe for concurrent use.
type Observer interface {
	Observe(Event)
	BreakerChanged(BreakerStatus)
}

// MultiObserver returns an Observer that passes every call to each of obs in turn,
// skipping nil ones; it returns nil when none is left and the observer
// itself when only one is.
func MultiObserver(obs ...Observer) Observer {
	var list multi
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multi []Observer

func (m multi) Observe(ev Event) {
	for _, o := range m {
		o.Observe(ev)
	}
}

func (m multi) BreakerChanged(st BreakerStatus) {
	for _, o := range m {
		o.BreakerChanged(st)
	}
}

// BreakerState is the state of the circuit breaker.
type BreakerState string

// Breaker states.
const (
	// BreakerClosed: operations reach the backend.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: operations fail at once with ErrBreakerOpen.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: one probe operation may reach the backend; its
	// result closes or reopens the breaker.
	BreakerHalfOpen BreakerState = "half_open"
)

// BreakerStatus describes one partition's circuit breaker. Each partition
// has its own, so that on a Cluster a failed master stops only the
// partitions it serves.
type BreakerStatus struct {
	Partition int
	State     BreakerState
	// ConsecutiveFailures counts failures since the last success.
	ConsecutiveFailures int
	// Opens counts how often the breaker opened since the store started.
	Opens int64
	// Since is when the breaker entered State.
	Since time.Time
}

// After reports whether s comes after o in one breaker's life: each opening
// increments Opens, and within one opening the breaker goes open, half-open,
// closed. The store reports changes outside its locks, so an observer may
// receive them out of order; After puts them back in order. A state this
// package does not know is taken as later.
func (s BreakerStatus) After(o BreakerStatus) bool {
	if s.Opens != o.Opens {
		return s.Opens > o.Opens
	}
	rs, oks := breakerCycle[s.State]
	ro, oko := breakerCycle[o.State]
	if !oks || !oko {
		return true
	}
	return rs > ro
}

var breakerCycle = map[BreakerState]int{BreakerOpen: 0, BreakerHalfOpen: 1, BreakerClosed: 2}

// breaker stops calling a failing backend: after threshold consecutive
// failures it opens for cooldown, then lets one probe through.
type breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration
	now       func() time.Time

	mu      sync.Mutex
	status  BreakerStatus
	probing bool
}

func newBreaker(partition, threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, now: now,
		status: BreakerStatus{Partition: partition, State: BreakerClosed, Since: now()}}
}

// allow reports whether an operation may reach the backend, and the new
// status when that changed it.
func (b *breaker) allow() (bool, *BreakerStatus) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.status.State {
	case BreakerOpen:
		if b.now().Sub(b.status.Since) < b.cooldown {
			return false, nil
		}
		b.set(BreakerHalfOpen)
		b.probing = true
		st := b.status
		return true, &st
	case BreakerHalfOpen:
		if b.probing {
			return false, nil
		}
		b.probing = true
	}
	return true, nil
}

// outcome is what an operation tells the breaker.
type outcome int

const (
	succeeded outcome = iota
	failed
	abandoned // the caller gave up first: says nothing about the backend
)

// done records an operation's outcome and returns the new status when it
// changed.
func (b *breaker) done(o outcome) *BreakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if o == abandoned {
		return nil
	}
	before := b.status.State
	if o == succeeded {
		b.status.ConsecutiveFailures = 0
		if before != BreakerClosed {
			b.set(BreakerClosed)
		}
	} else {
		b.status.ConsecutiveFailures++
		if b.threshold > 0 && (before == BreakerHalfOpen || (before == BreakerClosed && b.status.ConsecutiveFailures >= b.threshold)) {
			b.set(BreakerOpen)
			b.status.Opens++
		}
	}
	if b.status.State == before {
		return nil
	}
	st := b.status
	return &st
}

func (b *breaker) set(s BreakerState) {
	b.status.State = s
	b.status.Since = b.now()
}

func (b *breaker) snapshot() BreakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status
}

// call runs fn against partition p of the backend through that
// partition's breaker (no breaker when p < 0), and returns within OpTimeout
// whatever fn does: unless the backend returns by its context's deadline
// (in process; go-redis with ContextTimeoutEnabled), fn runs on its own
// goroutine, so a client that ignores context deadlines or retries cannot
// hold the caller; the goroutine finishes in the background.
func call[T any](ctx context.Context, s *Store, p int, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	b := s.breakers.of(p)
	ok, changed := b.allow()
	s.notifyBreaker(changed)
	if !ok {
		return zero, ErrBreakerOpen
	}
	opCtx, cancel := context.WithTimeout(ctx, s.opts.OpTimeout)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	var r result
	if s.inline {
		r.v, r.err = fn(opCtx)
	} else {
		done := make(chan result, 1)
		go func() {
			v, err := fn(opCtx)
			done <- result{v, err}
		}()
		select {
		case r = <-done:
		case <-opCtx.Done():
			select {
			case r = <-done:
			default:
				r = result{zero, fmt.Errorf("no answer within %v: %w", s.opts.OpTimeout, opCtx.Err())}
			}
		}
	}
	o := succeeded
	switch {
	case r.err != nil && ctx.Err() != nil:
		o = abandoned
	case r.err != nil:
		o = failed
	}
	s.notifyBreaker(b.done(o))
	return r.v, r.err
}

// breakers holds one breaker per partition.
type breakers []*breaker

// noBreaker never opens: operations that span partitions use it.
var noBreaker = newBreaker(-1, 0, 0, time.Now)

func newBreakers(o Options) breakers {
	bs := make(breakers, o.Partitions)
	for p := range bs {
		bs[p] = newBreaker(p, o.BreakerFailures, o.BreakerCooldown, o.Now)
	}
	return bs
}

func (bs breakers) of(p int) *breaker {
	if p < 0 {
		return noBreaker
	}
	return bs[p]
}

func (s *Store) notifyBreaker(st *BreakerStatus) {
	if st != nil && s.opts.Observer != nil {
		s.opts.Observer.BreakerChanged(*st)
	}
}

// observe reports a finished operation.
func (s *Store) observe(ev Event, start time.Time) {
	if s.opts.Observer != nil {
		ev.Latency = time.Since(start)
		s.opts.Observer.Observe(ev)
	}
}
