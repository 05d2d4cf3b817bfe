package store

import (
	"context"
	"errors"
	"time"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redisconn"
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
	OpRestore   Op = "restore"
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
	// Reason is Reserve's answer; Outcome is Record's and Restore's.
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

// BreakerState is the state of a partition's circuit breaker:
// BreakerClosed, BreakerOpen or BreakerHalfOpen.
type BreakerState = redisconn.BreakerState

// Breaker states.
const (
	// BreakerClosed: operations reach the backend.
	BreakerClosed = redisconn.BreakerClosed
	// BreakerOpen: operations fail at once with ErrBreakerOpen.
	BreakerOpen = redisconn.BreakerOpen
	// BreakerHalfOpen: one probe operation may reach the backend; its
	// result closes or reopens the breaker.
	BreakerHalfOpen = redisconn.BreakerHalfOpen
)

// BreakerStatus describes one partition's circuit breaker: its Partition,
// State, ConsecutiveFailures (since the last success), Opens (since the
// store started) and Since (when it entered State). Each partition has its
// own, so that on a Cluster a failed master stops only the partitions it
// serves.
type BreakerStatus = redisconn.BreakerStatus

// newGuard returns the guard of a store's calls: a breaker per partition,
// on the store's clock, telling the observer its changes. inline says
// whether the backend ends every call at its context's deadline.
func newGuard(o Options, inline bool) *redisconn.Guard {
	b := redisconn.Breakers{Failures: o.BreakerFailures, Cooldown: o.BreakerCooldown, Now: o.now, Open: ErrBreakerOpen}
	if o.Observer != nil {
		b.Changed = o.Observer.BreakerChanged
	}
	return redisconn.NewGuard(o.Partitions, inline, b)
}

// call runs fn against partition p of the backend through that
// partition's breaker (no breaker when p < 0), and returns within OpTimeout
// whatever fn does (redisconn.Call).
func call[T any](ctx context.Context, s *Store, p int, fn func(context.Context) (T, error)) (T, error) {
	return redisconn.Call(ctx, s.guard, p, s.opts.OpTimeout, fn)
}

// observe reports a finished operation.
func (s *Store) observe(ev Event, start time.Time) {
	if s.opts.Observer != nil {
		ev.Latency = time.Since(start)
		s.opts.Observer.Observe(ev)
	}
}
