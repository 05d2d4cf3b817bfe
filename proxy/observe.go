package proxy

import (
	"time"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// An Observer sees the steps of each turn as the proxy takes them, to
// count them (contproxy exports them to Prometheus) or log them. Observe
// is called on the turn's goroutine, or StepEnd of a turn recorded on a
// goroutine of its own (while the client gets the end, see
// Config.Affinity) on that one once the store has answered: it must
// return quickly, not block and not panic.
type Observer interface {
	Observe(Event)
}

// Step names a step of a turn.
type Step string

// The steps of a turn, in the order they come.
const (
	// StepRoute is where the turn goes (Event.Result): "full", "stored",
	// "local" or "forward" (internal/route).
	StepRoute Step = "route"
	// StepAttempt is one send upstream, or to the origin replica, and how
	// it went: "answered", "unreachable", "not_carried" (the origin ran
	// nothing), "refused" (the upstream refused the continuation) or
	// "client_gone" (the client went away before an answer).
	StepAttempt Step = "attempt"
	// StepFallback is the full context sent instead of a continuation the
	// turn was offered; Cause says why: "paused" (the upstream refuses the
	// model's continuations), "not_carried" or "refused".
	StepFallback Step = "fallback"
	// StepEnd is how the turn ended: "recorded" (a completed response
	// stored as the owner's continuation), "not_recorded" (completed, but
	// the upstream keeps nothing to continue, or another turn of the
	// owner's was recorded first), "record_failed" (completed, but the
	// store could not record it: the owner's next turn sends its full
	// context), "not_reserved" (completed,
	// with no turn to record it for: a request without owner, such as one
	// carrying its own previous_response_id, or a store that failed
	// open), "aborted" (no completed response the client received),
	// "given_back" (as aborted, and the continuation the turn took given
	// back to its owner, Store.Restore: its next try continues),
	// "relayed_unkept" (answered, relayed as it came for want of room in
	// MaxBytesInFlight, and not recorded; the continuation the turn took
	// given back) or "failed" (the upstream could not be reached).
	// Latency is the turn's.
	StepEnd Step = "end"
)

// Event is one step of a turn.
type Event struct {
	Step Step
	// Owner and Turn name the turn.
	Owner identity.Owner
	Turn  store.Turn
	// Result is what the step came to; Cause why a fallback happened.
	Result, Cause string
	// Err is the error of an attempt that failed, or of a turn's end.
	Err error
	// Latency is the turn's time at its end, from the request's arrival
	// (its body read, its reservation and its send included).
	Latency time.Duration
}

// observe passes ev to the configured Observer, if any.
func (p *Proxy) observe(ev Event) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.Observe(ev)
	}
}

// tryNames are the attempt results as events name them.
var tryNames = [...]string{answered: "answered", unreachable: "unreachable", notCarried: "not_carried", refusedUpstream: "refused",
	clientGone: "client_gone"}
