package redisconn

import (
	"sync"
	"time"
)

// BreakerState is the state of a circuit breaker.
type BreakerState string

// Breaker states.
const (
	// BreakerClosed: operations reach the backend.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: operations fail at once, without reaching the backend.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: one probe operation may reach the backend; its
	// result closes or reopens the breaker.
	BreakerHalfOpen BreakerState = "half_open"
)

// BreakerStatus describes one circuit breaker. A continuation store has
// one per partition, so that on a Cluster a failed master stops only the
// partitions it serves; a session store has one, partition 0.
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
	changed   func(BreakerStatus) // nil: changes are not queued

	mu      sync.Mutex
	status  BreakerStatus
	probing bool
	untold  []BreakerStatus // changes not yet given to the observer, oldest first
	telling bool            // a goroutine is giving untold to the observer
}

func newBreaker(partition int, o Breakers) *breaker {
	return &breaker{threshold: o.Failures, cooldown: o.Cooldown, now: o.Now, changed: o.Changed,
		status: BreakerStatus{Partition: partition, State: BreakerClosed, Since: o.Now()}}
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
	if b.changed != nil {
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
		b.changed(st)
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
