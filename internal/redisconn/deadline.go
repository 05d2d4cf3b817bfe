package redisconn

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// ticks hands out channels closed at instants a whole number of steps
// after base, one channel and one timer per instant, so that the calls
// whose deadlines round down to the same instant share them instead of
// each starting a timer of its own. Its timers are never stopped: it takes
// only deadlines less than a slot per step away, so that at most that many
// are pending, one in each slot. It is safe for concurrent use.
type ticks struct {
	base  time.Time // read on the monotonic clock
	step  time.Duration
	mu    sync.Mutex // held to make a tick
	slots []atomic.Pointer[tick]
}

// tick is the instant n steps after base, and its channel.
type tick struct {
	n    int64
	done chan struct{}
}

func newTicks(step time.Duration, slots int) *ticks {
	return &ticks{base: time.Now(), step: step, slots: make([]atomic.Pointer[tick], slots)}
}

// span is the longest wait before takes.
func (t *ticks) span() time.Duration { return time.Duration(len(t.slots)-1) * t.step }

// before returns the last instant at or before d from now, and its
// channel, closed at that instant; d is at most span.
func (t *ticks) before(d time.Duration) (time.Time, <-chan struct{}) {
	n := int64((time.Since(t.base) + d) / t.step)
	slot := &t.slots[uint64(n)%uint64(len(t.slots))]
	k := slot.Load()
	if k == nil || k.n != n {
		t.mu.Lock()
		if k = slot.Load(); k == nil || k.n != n {
			k = &tick{n: n, done: make(chan struct{})}
			if wait := time.Until(t.base.Add(time.Duration(n) * t.step)); wait > 0 {
				time.AfterFunc(wait, func() { close(k.done) })
			} else {
				close(k.done)
			}
			slot.Store(k)
		}
		t.mu.Unlock()
	}
	return t.base.Add(time.Duration(n) * t.step), k.done
}

// deadlineCtx is a context that ends at its deadline (a tick's instant)
// and has its parent's values; its parent has no deadline and cannot be
// canceled.
type deadlineCtx struct {
	context.Context
	deadline time.Time
	done     <-chan struct{}
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// withTimeout returns a context like context.WithTimeout(ctx, timeout)'s,
// and its cancel function (nil when there is nothing to cancel). When ctx
// has no deadline and cannot be canceled, and timeout is at most the span
// of g's ticks, the deadline is rounded down to a tick, sharing a timer
// with the calls of the same tick: the call may end up to a tick (a
// millisecond) before its timeout.
func (g *Guard) withTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || ctx.Done() != nil || timeout > g.ticks.span() {
		return context.WithTimeout(ctx, timeout)
	}
	deadline, done := g.ticks.before(timeout)
	return &deadlineCtx{Context: ctx, deadline: deadline, done: done}, nil
}
