// Package serverclock estimates Redis servers' clocks from the times their
// scripts report, so that a call can carry its deadline on the clock of the
// server that runs it (internal/lua/oplog.lua).
package serverclock

import (
	"context"
	"sync"
	"time"
)

// EpochMillis is the scripts' epoch, 2025-01-01T00:00:00Z, in milliseconds
// since the Unix epoch: the clock values scripts take and give are counted
// from it.
const EpochMillis = 1735689600000

// window is how long an observation counts: the estimate follows a server
// clock that steps back within two windows.
const window = time.Second

// Clock estimates the clocks of n servers (for the store, the servers of its
// partitions), each as an offset from a local clock. Until a server reports
// a time, its clock is taken to be the local one. It is safe for concurrent
// use.
type Clock struct {
	servers []server
	now     func() time.Time
}

// server is one server's estimate: the largest offset observed in the
// current window and in the one before. An observation (the server's time
// minus this process's when the reply arrived) is at most the true offset,
// by the reply's time in flight, so the largest is the closest.
type server struct {
	mu          sync.Mutex
	known       bool
	start       time.Time // the current window's start
	cur, before int64     // largest offsets in ms, in the current window and the one before
}

// New returns a Clock for n servers on the local clock now (time.Now
// when nil).
func New(n int, now func() time.Time) *Clock {
	if now == nil {
		now = time.Now
	}
	return &Clock{servers: make([]server, max(n, 1)), now: now}
}

// At returns the instant local (on the local clock) on server i's clock, in
// milliseconds since EpochMillis.
func (c *Clock) At(i int, local time.Time) int64 {
	return local.UnixMilli() + c.offset(i) - EpochMillis
}

// Deadline returns the deadline of a call to server i under ctx: ctx's, at
// most limit from now, on server i's clock in milliseconds since
// EpochMillis.
func (c *Clock) Deadline(ctx context.Context, i int, limit time.Duration) int64 {
	if end, ok := ctx.Deadline(); ok {
		limit = min(time.Until(end), limit)
	}
	return c.At(i, c.now().Add(limit))
}

// Refused takes the clock of server i from its refusal of a call whose
// deadline was deadline, made with at most limit to wait (both as Deadline
// takes them), and reports whether the caller, if it still waits, may send
// the call again as a new one: when the refusal came limit or more after
// the deadline. Then the estimate of the server's clock was that far
// behind when the call began, so every copy of it reached the server after
// its deadline and was refused (a copy in time would have made the
// deadline its caller's within limit), and a new call cannot repeat an
// effect. A refusal closer to the deadline may follow a copy that ran.
func (c *Clock) Refused(i int, serverMillis, deadline int64, limit time.Duration) bool {
	c.Observe(i, serverMillis)
	return serverMillis >= deadline+limit.Milliseconds()
}

func (c *Clock) offset(i int) int64 {
	s := &c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.known {
		return 0
	}
	return max(s.cur, s.before)
}

// Observe takes the time server i reported, in milliseconds since
// EpochMillis, in a reply that has just arrived.
func (c *Clock) Observe(i int, serverMillis int64) {
	received := c.now()
	s := &c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observe(serverMillis+EpochMillis-received.UnixMilli(), received)
}

// Seed takes the time a server reported, as Observe does, for each server
// whose clock is not known yet: the servers of one deployment keep their
// clocks close.
func (c *Clock) Seed(serverMillis int64) {
	received := c.now()
	for i := range c.servers {
		s := &c.servers[i]
		s.mu.Lock()
		if !s.known {
			s.observe(serverMillis+EpochMillis-received.UnixMilli(), received)
		}
		s.mu.Unlock()
	}
}

// observe takes an offset observed at received; s.mu is held.
func (s *server) observe(off int64, received time.Time) {
	switch age := received.Sub(s.start); {
	case !s.known || age >= 2*window:
		s.known, s.start, s.cur, s.before = true, received, off, off
	case age >= window:
		s.start, s.before, s.cur = received, s.cur, off
	default:
		s.cur = max(s.cur, off)
	}
}
