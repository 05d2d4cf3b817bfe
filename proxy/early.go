package proxy

import (
	"context"
	"fmt"
	"net/http"
	"runtime"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// early is a turn sent upstream on a guess while the store reserves it:
// the continuation this replica recorded last for the owner
// (store.Store.Guess). The turn keeps its answer whatever the reservation
// says (store.Reservation.Adopt): the guess continues a response the
// upstream keeps, of which the request is an append-only extension, so
// its answer is as right as one to the reservation, and sending the turn
// again would run it twice upstream.
type early struct {
	guess  *store.Reservation // what was sent
	c      *httpConn          // where it went
	cancel context.CancelFunc // ends the send, once the turn is over
	done   chan struct{}      // closed once rep and err are set
	rep    *reply             // the upstream's answer
	err    error              // or why there is none
}

// sendEarly sends t upstream on the store's guess for who, and returns the
// send in flight; or nil when there is no guess to send. Only a
// continuation of a response the upstream keeps is guessed, on the HTTP
// upstream, where dropping a request costs no connection's state; and
// only on a store with a round trip to save. It lets the send start
// before the caller reserves.
func (p *Proxy) sendEarly(r *http.Request, t *turn, who identity.Owner, req *fingerprint.Request) *early {
	up, ok := p.cfg.Upstream.(*httpUpstream)
	if !ok || p.cfg.Store.InProcess() || who.IsZero() {
		return nil
	}
	guess := p.cfg.Store.Guess(who, req)
	if guess == nil || !p.learn.open(learnedOf(r.Header, r.URL.RawQuery, member(req, "model").String())) {
		return nil
	}
	tg := t.target
	tg.want, tg.prev = guess.Origin, guess.PreviousResponseID
	if t.answers != nil {
		// Read on a goroutine of its own, held on the turn's budget in a
		// hold of its own that the turn takes over (keep).
		tg.answers = &hold{b: t.answers.b}
	}
	c := &httpConn{up: up, tg: &tg}
	if !c.continues(guess) {
		return nil // not kept upstream (store false)
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	e := &early{guess: guess, c: c, cancel: cancel, done: make(chan struct{})}
	p.stats.add(cGuessed, 1)
	go func() {
		defer close(e.done)
		defer func() {
			if v := recover(); v != nil { // as net/http recovers a handler's
				e.rep, e.err = nil, fmt.Errorf("sending the turn: panic: %v", v)
			}
		}()
		e.rep, e.err = p.send(ctx, c, guess, t.stream)
	}()
	// The upstream's answer, not the reserve's, is the turn's longer wait:
	// this goroutine yields its processor, so that the send usually runs
	// first, and the reserve after it or on another processor.
	runtime.Gosched()
	return e
}

// keep waits for the upstream's answer to the guess (rep and err), which
// the turn keeps and releases, and what reading it holds, which answers,
// the turn's, takes over, with the answers of the sends after it on the
// same connection. It returns the reservation the turn goes on
// (store.Reservation.Adopt) and whether its owner stays on this replica:
// res agrees with the guess, or the store decided nothing about it (it
// failed open, or no longer holds the owner's state: flushed, restarted
// empty, evicted).
func (e *early) keep(res *store.Reservation, answers *hold) (*store.Reservation, bool) {
	<-e.done
	answers.join(e.c.tg.answers)
	e.c.tg.answers = answers
	stays := res.Agrees(e.guess) || res.Reason == store.ReasonMissingState || res.Reason == store.ReasonStoreUnavailable
	return res.Adopt(e.guess), stays
}
