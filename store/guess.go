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
// (Options.GuessOwners), when that continuation would not continue the
// request, or when the owner does not stay on this Store: a continuation
// is guessed only when the turn that recorded it found the owner new or as
// this Store had left it, so that owners whose turns go from store to store
// (round-robin replicas) are not guessed. A guess reserves nothing: its
// Turn is 0, and Record and Abort ignore it.
//
// A gateway that sees every turn of an owner may send a guess upstream
// while Reserve runs, and keep the upstream's answer only when the
// reservation agrees with it ([Reservation.Agrees]); otherwise it drops
// that answer and sends as the reservation says. A continuation is
// guessed once, until the owner's next record.
func (s *Store) Guess(owner identity.Owner, req *fingerprint.Request) *Reservation {
	if s.guesses == nil || s.opts.Disabled || owner.IsZero() || req == nil || req.InputSkipped() {
		return nil
	}
	prev, ok := s.guesses.guess(owner)
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
	recent *simplelru.LRU[string, *guessed]
	ttl    time.Duration
	now    func() time.Time
}

// guessed is a remembered continuation.
type guessed struct {
	c       continuation
	at      time.Time // when its turn's reserve was sent
	stays   bool      // its turn found the owner new or as this Store left it
	guessed bool      // a guess was given
}

// newGuesses returns the guesses of a Store with options o; nil when o
// keeps none.
func newGuesses(o Options) *guesses {
	if o.GuessOwners == 0 {
		return nil
	}
	recent, err := simplelru.NewLRU[string, *guessed](o.GuessOwners, nil)
	if err != nil {
		panic("store: " + err.Error()) // not reached: GuessOwners is positive
	}
	return &guesses{recent: recent, ttl: o.TTL - o.TTL/16, now: o.now}
}

// remember keeps c as owner's continuation, recorded in a turn whose
// reserve was sent at reserved and found the owner staying (stays).
func (g *guesses) remember(owner identity.Owner, c continuation, reserved time.Time, stays bool) {
	if g != nil {
		g.mu.Lock()
		g.recent.Add(owner.Key(), &guessed{c: c, at: reserved, stays: stays})
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

// take drops owner's continuation and returns its response id; "" when
// there is none.
func (g *guesses) take(owner identity.Owner) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	got, ok := g.recent.Peek(owner.Key())
	if !ok {
		return ""
	}
	g.recent.Remove(owner.Key())
	return got.c.ResponseID
}

// guess returns owner's continuation to guess from, once: while it lives,
// when the owner stays.
func (g *guesses) guess(owner identity.Owner) (continuation, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	got, ok := g.recent.Peek(owner.Key())
	if !ok || got.guessed || !got.stays || g.now().Sub(got.at) >= g.ttl {
		return continuation{}, false
	}
	got.guessed = true
	return got.c, true
}
