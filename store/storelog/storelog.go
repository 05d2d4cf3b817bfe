// Package storelog logs what a continuation store's operations and
// circuit breakers go through, with log/slog, without flooding the log when
// Redis is down.
//
// The observer that [New] returns logs:
//
//   - an operation that failed (a Reserve that failed open with
//     store.ReasonStoreUnavailable, or any other operation's error) at Warn,
//     at most one line per operation every Options.Every; the line's
//     "suppressed" attribute counts the failures of that operation left
//     unlogged since the previous line;
//   - a circuit breaker that opens at Warn and one that closes or goes
//     half-open at Info. The change that starts an outage of a partition
//     (closed to open) and the one that ends it (to closed) are always
//     logged, the close with "open_for", how long the outage lasted. The
//     probes in between (half-open, open again) are logged at most once per
//     partition every Options.Every, with "suppressed" counting the others;
//   - successful operations at Debug when Options.Debug is set, and
//     nothing otherwise.
//
// Suppressed counts are reported by the next line of the same kind, so a
// count stays pending while nothing more happens.
//
// Operation lines carry op, session (and agent, for a sub-agent owner),
// reason (Reserve) or outcome (Record), latency, evicted (when positive),
// error and suppressed; breaker lines carry partition, state,
// consecutive_failures, opens, open_for and suppressed.
package storelog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/contstore/contstore/store"
)

// defaultEvery is Options.Every's default.
const defaultEvery = 10 * time.Second

// Options configure the observer.
type Options struct {
	// Every is the least time between two lines about failures of one
	// operation, or about the probes of one partition's breaker. Default
	// 10s; a negative value logs every line.
	Every time.Duration
	// Now is the clock of the rate limit. Default time.Now.
	Now func() time.Time
	// Debug logs successful operations at Debug level.
	Debug bool
}

// Log messages.
const (
	MsgFailOpen      = "store unavailable: reservation fails open"
	MsgFailed        = "store operation failed"
	MsgOperation     = "store operation"
	MsgBreakerOpen   = "store circuit breaker opened"
	MsgBreakerProbe  = "store circuit breaker half-open"
	MsgBreakerClosed = "store circuit breaker closed"
)

type observer struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time
	debug bool

	mu    sync.Mutex
	ops   map[store.Op]*window
	parts map[int]*partition
}

// window is the rate limit of one kind of line.
type window struct {
	logged     time.Time // last line; zero before the first
	suppressed int
}

// allow reports whether a line may be logged at now and, if so, how many
// were suppressed before it.
func (w *window) allow(now time.Time, every time.Duration) (bool, int) {
	if !w.logged.IsZero() && now.Sub(w.logged) < every {
		w.suppressed++
		return false, 0
	}
	n := w.suppressed
	w.logged, w.suppressed = now, 0
	return true, n
}

// partition is what the observer knows of one partition's breaker.
type partition struct {
	down   bool      // the last change left the breaker open or half-open
	outage time.Time // when the current outage began (BreakerStatus.Since)
	window window
}

// New returns an observer that logs to logger (slog.Default() when nil),
// for store.Options.Observer. It is safe for concurrent use.
func New(logger *slog.Logger, opts Options) store.Observer {
	if logger == nil {
		logger = slog.Default()
	}
	if opts.Every == 0 {
		opts.Every = defaultEvery
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &observer{log: logger, every: opts.Every, now: opts.Now, debug: opts.Debug,
		ops: map[store.Op]*window{}, parts: map[int]*partition{}}
}

// Observe implements store.Observer.
func (o *observer) Observe(ev store.Event) {
	failed := ev.Err != nil || (ev.Op == store.OpReserve && ev.Reason == store.ReasonStoreUnavailable)
	if !failed {
		if o.debug && o.log.Enabled(context.Background(), slog.LevelDebug) {
			o.log.LogAttrs(context.Background(), slog.LevelDebug, MsgOperation, attrs(ev, -1)...)
		}
		return
	}
	now := o.now()
	o.mu.Lock()
	w := o.ops[ev.Op]
	if w == nil {
		w = &window{}
		o.ops[ev.Op] = w
	}
	ok, suppressed := w.allow(now, o.every)
	o.mu.Unlock()
	if !ok {
		return
	}
	msg := MsgFailed
	if ev.Op == store.OpReserve {
		msg = MsgFailOpen
	}
	o.log.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs(ev, suppressed)...)
}

// attrs describes ev; suppressed < 0 leaves that attribute out.
func attrs(ev store.Event, suppressed int) []slog.Attr {
	a := make([]slog.Attr, 0, 8)
	a = append(a, slog.String("op", string(ev.Op)))
	if !ev.Owner.IsZero() {
		a = append(a, slog.String("session", ev.Owner.Session()))
		if ev.Owner.IsAgent() {
			a = append(a, slog.String("agent", ev.Owner.AgentID()))
		}
	}
	switch ev.Op {
	case store.OpReserve:
		a = append(a, slog.String("reason", string(ev.Reason)))
	case store.OpRecord, store.OpRestore:
		if ev.Outcome != "" {
			a = append(a, slog.String("outcome", string(ev.Outcome)))
		}
	}
	a = append(a, slog.Duration("latency", ev.Latency))
	if ev.Evicted > 0 {
		a = append(a, slog.Int("evicted", ev.Evicted))
	}
	if ev.Err != nil {
		a = append(a, slog.String("error", ev.Err.Error()))
	}
	if suppressed >= 0 {
		a = append(a, slog.Int("suppressed", suppressed))
	}
	return a
}

// BreakerChanged implements store.Observer.
func (o *observer) BreakerChanged(st store.BreakerStatus) {
	now := o.now()
	o.mu.Lock()
	p := o.parts[st.Partition]
	if p == nil {
		p = &partition{}
		o.parts[st.Partition] = p
	}
	always := false
	var openFor time.Duration
	switch {
	case st.State == store.BreakerClosed:
		always = true
		if p.down {
			openFor = st.Since.Sub(p.outage)
		}
		p.down = false
	case !p.down:
		always = true
		p.down, p.outage = true, st.Since
	}
	var suppressed int
	if always {
		suppressed = p.window.suppressed
		p.window.logged, p.window.suppressed = now, 0
	} else if ok, n := p.window.allow(now, o.every); ok {
		suppressed = n
	} else {
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()

	level, msg := slog.LevelInfo, MsgBreakerProbe
	switch st.State {
	case store.BreakerOpen:
		level, msg = slog.LevelWarn, MsgBreakerOpen
	case store.BreakerClosed:
		msg = MsgBreakerClosed
	}
	a := []slog.Attr{
		slog.Int("partition", st.Partition),
		slog.String("state", string(st.State)),
		slog.Int("consecutive_failures", st.ConsecutiveFailures),
		slog.Int64("opens", st.Opens),
	}
	if st.State == store.BreakerClosed && openFor > 0 {
		a = append(a, slog.Duration("open_for", openFor))
	}
	a = append(a, slog.Int("suppressed", suppressed))
	o.log.LogAttrs(context.Background(), level, msg, a...)
}
