package store

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
)

// Guess returns the reservation Reserve would give owner's request if the
// owner's state were still the continuation this Store last recorded for
// it, decided without a round trip; nil when the Store remembers none
// (Options.GuessOwners), or when that continuation would not continue
// the request. A guess reserves nothing: its Turn is 0, and Record and
// Abort ignore it.
//
// A gateway that sees every turn of an owner may send a guess upstream
// while Reserve runs, and keep the upstream's answer only when the
// reservation agrees with it ([Reservation.Agrees]); otherwise it drops
// that answer and sends as the reservation says. A continuation is
// guessed once: Guess, like Reserve, takes it until the owner's next
// record.
func (s *Store) Guess(owner identity.Owner, req *fingerprint.Request) *Reservation {
	if s.guesses == nil || s.opts.Disabled || owner.IsZero() || req == nil || req.InputSkipped() {
		return nil
	}
	prev, ok := s.guesses.take(owner)
	if !ok {
		return nil
	}
	req = s.reparse(req)
	res := &Reservation{Owner: owner, req: req, UpstreamItems: req.Len(), replica: s.opts.Replica}
	s.decide(res, true, &prev)
	if !res.Continues() {
		return nil
	}
	return res
}

// Agrees reports whether r continues as guess does: from the same
// response, on the same origin, with the same delta.
func (r *Reservation) Agrees(guess *Reservation) bool {
	return r.Continues() && guess.Continues() && r.PreviousResponseID == guess.PreviousResponseID &&
		r.Origin == guess.Origin && len(r.Delta) == len(guess.Delta)
}

// guesses remembers the continuation of each owner's last record on this
// Store, for at most Options.GuessOwners owners, while the owner's state
// surely lives: 15/16 of the TTL (see Options.TTL) from the moment the
// turn's reserve was sent, as a record does not refresh the state.
type guesses struct {
	mu     sync.Mutex
	recent *simplelru.LRU[string, guessed]
	ttl    time.Duration
	now    func() time.Time
}

// guessed is a remembered continuation and when its turn's reserve was
// sent.
type guessed struct {
	c  continuation
	at time.Time
}

// newGuesses returns the guesses of a Store with options o; nil when o
// keeps none.
func newGuesses(o Options) *guesses {
	if o.GuessOwners == 0 {
		return nil
	}
	recent, err := simplelru.NewLRU[string, guessed](o.GuessOwners, nil)
	if err != nil {
		panic("store: " + err.Error()) // not reached: GuessOwners is positive
	}
	return &guesses{recent: recent, ttl: o.TTL - o.TTL/16, now: o.now}
}

// remember keeps c as owner's continuation, recorded in a turn whose
// reserve was sent at reserved.
func (g *guesses) remember(owner identity.Owner, c continuation, reserved time.Time) {
	if g != nil {
		g.mu.Lock()
		g.recent.Add(owner.Key(), guessed{c: c, at: reserved})
		g.mu.Unlock()
	}
}

// forget drops owner's continuation.
func (g *guesses) forget(owner identity.Owner) {
	if g != nil {
		g.mu.Lock()
		g.recent.Remove(owner.Key())
		g.mu.Unlock()
	}
}

// take returns owner's continuation, if one lives, and forgets it.
func (g *guesses) take(owner identity.Owner) (continuation, bool) {
	g.mu.Lock()
	got, ok := g.recent.Peek(owner.Key())
	if ok {
		g.recent.Remove(owner.Key())
	}
	g.mu.Unlock()
	return got.c, ok && g.now().Sub(got.at) < g.ttl
}
