package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Breakers configures the circuit breakers of a Guard.
type Breakers struct {
	// Failures is how many consecutive failed calls open a breaker; 0:
	// never.
	Failures int
	// Cooldown is how long a breaker stays open before it lets one probe
	// call through.
	Cooldown time.Duration
	// Now is the breakers' clock.
	Now func() time.Time
	// Changed, when set, is told each change of a breaker, in order: by
	// the call that made the change, before that call returns, or, while
	// another call is passing on the breaker's earlier changes, by that
	// call. It is called outside any lock and must be fast and safe for
	// concurrent use.
	Changed func(BreakerStatus)
	// Open is the error of a call a breaker refuses.
	Open error
}

// Guard bounds the calls to one backend: each goes through the circuit
// breaker of its partition and returns within its timeout. It is safe for
// concurrent use.
type Guard struct {
	inline   bool
	open     error
	breakers []*breaker
	ticks    *ticks // the calls' deadlines (withTimeout)
}

// NewGuard returns a guard with one breaker for each of partitions
// partitions. inline says whether the backend returns by its context's
// deadline (in process; go-redis with HonoursDeadlines): Call then runs
// calls on the caller's goroutine.
func NewGuard(partitions int, inline bool, o Breakers) *Guard {
	g := &Guard{inline: inline, open: o.Open, breakers: make([]*breaker, partitions), ticks: newTicks(time.Millisecond, 2048)}
	for p := range g.breakers {
		g.breakers[p] = newBreaker(p, o)
	}
	return g
}

// noBreaker never opens: calls that span partitions use it.
var noBreaker = newBreaker(-1, Breakers{Now: time.Now})

func (g *Guard) of(p int) *breaker {
	if p < 0 {
		return noBreaker
	}
	return g.breakers[p]
}

// Closed reports whether partition p's breaker is closed: its calls reach
// the backend.
func (g *Guard) Closed(p int) bool {
	return g.of(p).snapshot().State == BreakerClosed
}

// Statuses returns the status of every breaker, by partition.
func (g *Guard) Statuses() []BreakerStatus {
	out := make([]BreakerStatus, len(g.breakers))
	for i, b := range g.breakers {
		out[i] = b.snapshot()
	}
	return out
}

// Call runs fn against partition p of g's backend through that partition's
// breaker (through none when p < 0), and returns within timeout whatever fn
// does: unless g's backend returns by its context's deadline, fn runs on a
// goroutine of its own (spawn), so that a client that ignores context
// deadlines or retries cannot hold the caller; the goroutine finishes in the
// background. fn's context ends at the timeout, or up to a millisecond
// before it (Guard.withTimeout).
//
// An error of fn counts as a failure of the backend, unless the caller gave
// up first or the process was too busy to read the answer in time
// (starved); a refusal of the breaker is Breakers.Open.
func Call[T any](ctx context.Context, g *Guard, p int, timeout time.Duration, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	b := g.of(p)
	ok, changed := b.allow()
	if changed {
		b.tell()
	}
	if !ok {
		return zero, g.open
	}
	opCtx, cancel := g.withTimeout(ctx, timeout)
	if cancel != nil {
		defer cancel()
	}
	type result struct {
		v   T
		err error
	}
	var r result
	if g.inline {
		r.v, r.err = fn(opCtx)
	} else {
		done := make(chan result, 1)
		spawn(func() {
			v, err := fn(opCtx)
			done <- result{v, err}
		})
		select {
		case r = <-done:
		case <-opCtx.Done():
			select {
			case r = <-done:
			default:
				r = result{zero, fmt.Errorf("no answer within %v: %w", timeout, opCtx.Err())}
			}
		}
	}
	o := succeeded
	switch {
	case r.err == nil:
	case ctx.Err() != nil, starved(r.err, opCtx, timeout):
		o = abandoned
	default:
		o = failed
	}
	if b.done(o) {
		b.tell()
	}
	return r.v, r.err
}

// handoff passes a function to a worker waiting for one (spawn).
var handoff = make(chan func())

// workerTicks times the workers' idleness.
var workerTicks = newTicks(250*time.Millisecond, 16)

// workerIdle is how long a worker waits for another function before it
// ends, give or take a quarter of a second.
const workerIdle = 2 * time.Second

// spawn runs f on a goroutine of its own: a worker that ran an earlier
// function and waits for another, or a new one. A worker's stack has
// grown to what the client's calls need, which a new goroutine's would
// have to do again for every call.
func spawn(f func()) {
	select {
	case handoff <- f:
	default:
		go work(f)
	}
}

// work runs f, then the functions spawn hands it, until none came for
// workerIdle.
func work(f func()) {
	for {
		f()
		_, idle := workerTicks.before(workerIdle)
		select {
		case f = <-handoff:
		case <-idle:
			return
		}
	}
}

// starved tells whether err says more about this process than about the
// backend: the client's own pool had no connection free in time, or the
// call timed out and its goroutine returned well after the deadline, so
// that the process was too busy to read an answer that may have been
// waiting. A backend that does not answer makes a call return at its
// deadline, give or take a timer's slack; a process short of CPU, late.
// The breaker guards against a failing Redis, not a busy gateway.
func starved(err error, opCtx context.Context, timeout time.Duration) bool {
	if errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	deadline, _ := opCtx.Deadline()
	return time.Since(deadline) > max(timeout/4, 10*time.Millisecond)
}
