package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

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
	// Op is the operation; Owner is the owner it was about, zero for Sweep
	// and Stats.
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

// Observer sees the store's operations and the changes of its circuit
// breakers. Its methods are called outside any lock of the store and must be
// fast and safe for concurrent use.
type Observer interface {
	// Observe is called as an operation returns; operations answered
	// without touching the store (a Reserve of a disabled store, a Record
	// of a reservation without a turn, ...) report nothing.
	Observe(Event)
	// BreakerChanged is called with each change of a partition's breaker,
	// in order: by the operation that made the change, before it returns,
	// or, while another operation is passing on the partition's earlier
	// changes, by that operation.
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
	// Partition is the partition the breaker guards.
	Partition int
	// State is the breaker's state.
	State BreakerState
	// ConsecutiveFailures counts failures since the last success.
	ConsecutiveFailures int
	// Opens counts how often the breaker opened since the store started.
	Opens int64
	// Since is when the breaker entered State.
	Since time.Time
}

// breaker stops calling a failing backend: after threshold consecutive
// failures it opens for cooldown, then lets one probe through.
//
// Its changes reach the observer in the order they happen, outside mu: each
// change is queued under mu, and the goroutine that made it then tells the
// queue to the observer unless another goroutine is already telling it, in
// which case that one tells this change too.
type breaker struct {
	threshold int // 0: never opens
	cooldown  time.Duration
	now       func() time.Time
	observer  Observer // nil: changes are not queued

	mu      sync.Mutex
	status  BreakerStatus
	probing bool
	untold  []BreakerStatus // changes not yet given to the observer, oldest first
	telling bool            // a goroutine is giving untold to the observer
}

func newBreaker(partition, threshold int, cooldown time.Duration, now func() time.Time, observer Observer) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, now: now, observer: observer,
		status: BreakerStatus{Partition: partition, State: BreakerClosed, Since: now()}}
}

// allow reports whether an operation may reach the backend, and whether
// that changed the breaker.
func (b *breaker) allow() (ok, changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.status.State {
	case BreakerOpen:
		if b.now().Sub(b.status.Since) < b.cooldown {
			return false, false
		}
		b.set(BreakerHalfOpen)
		b.probing = true
		return true, true
	case BreakerHalfOpen:
		if b.probing {
			return false, false
		}
		b.probing = true
	}
	return true, false
}

// outcome is what an operation tells the breaker.
type outcome int

const (
	succeeded outcome = iota
	failed
	abandoned // the caller gave up first: says nothing about the backend
)

// done records an operation's outcome and reports whether it changed the
// breaker.
func (b *breaker) done(o outcome) (changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if o == abandoned {
		return false
	}
	before := b.status.State
	if o == succeeded {
		b.status.ConsecutiveFailures = 0
		if before == BreakerClosed {
			return false
		}
		b.set(BreakerClosed)
		return true
	}
	b.status.ConsecutiveFailures++
	if b.threshold > 0 && (before == BreakerHalfOpen || (before == BreakerClosed && b.status.ConsecutiveFailures >= b.threshold)) {
		b.status.Opens++
		b.set(BreakerOpen)
		return true
	}
	return false
}

// set moves the breaker to state s and queues the change for the observer.
// b.mu is held.
func (b *breaker) set(s BreakerState) {
	b.status.State = s
	b.status.Since = b.now()
	if b.observer != nil {
		b.untold = append(b.untold, b.status)
	}
}

// tell gives the queued changes to the observer, in order and outside b.mu,
// unless another goroutine is doing so (it then gives these too).
func (b *breaker) tell() {
	b.mu.Lock()
	if b.telling {
		b.mu.Unlock()
		return
	}
	b.telling = true
	done := false
	defer func() {
		if !done { // the observer panicked: the next change tells the rest
			b.mu.Lock()
			b.telling = false
			b.mu.Unlock()
		}
	}()
	for len(b.untold) > 0 {
		st := b.untold[0]
		b.untold = b.untold[1:]
		b.mu.Unlock()
		b.observer.BreakerChanged(st)
		b.mu.Lock()
	}
	b.untold = nil
	b.telling, done = false, true
	b.mu.Unlock()
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
	if changed {
		b.tell()
	}
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
	case r.err == nil:
	case ctx.Err() != nil, starved(r.err, opCtx, s.opts.OpTimeout):
		o = abandoned
	default:
		o = failed
	}
	if b.done(o) {
		b.tell()
	}
	return r.v, r.err
}

// starved tells whether err says more about this process than about the
// backend: the client's own pool had no connection free in time, or the
// operation timed out and its goroutine returned well after the deadline,
// so that the process was too busy to read an answer that may have been
// waiting. A backend that does not answer makes a call return at its
// deadline, give or take a timer's slack; a process short of CPU, late.
// The breaker guards against a failing Redis, not a busy gateway.
func starved(err error, opCtx context.Context, opTimeout time.Duration) bool {
	if errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	deadline, _ := opCtx.Deadline()
	return time.Since(deadline) > max(opTimeout/4, 10*time.Millisecond)
}

// breakers holds one breaker per partition.
type breakers []*breaker

// noBreaker never opens: operations that span partitions use it.
var noBreaker = newBreaker(-1, 0, 0, time.Now, nil)

func newBreakers(o Options) breakers {
	bs := make(breakers, o.Partitions)
	for p := range bs {
		bs[p] = newBreaker(p, o.BreakerFailures, o.BreakerCooldown, o.Now, o.Observer)
	}
	return bs
}

// statuses returns the status of every breaker.
func (bs breakers) statuses() []BreakerStatus {
	out := make([]BreakerStatus, len(bs))
	for i, b := range bs {
		out[i] = b.snapshot()
	}
	return out
}

func (bs breakers) of(p int) *breaker {
	if p < 0 {
		return noBreaker
	}
	return bs[p]
}

// observe reports a finished operation.
func (s *Store) observe(ev Event, start time.Time) {
	if s.opts.Observer != nil {
		ev.Latency = time.Since(start)
		s.opts.Observer.Observe(ev)
	}
}
