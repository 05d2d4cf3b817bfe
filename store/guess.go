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
// request, while the breaker of the owner's partition is not closed (its
// reserve may fail open), or when the owner does not stay on this
// Store. An owner stays once the turns this Store served found it new or
// as this Store had left it, 2^m times in a row for an owner this Store
// found moved m times: an owner whose turns go from store to store
// (round-robin replicas, a load balancer that moves it) costs a few
// guesses the reservation overrules, not one a turn. And the Store
// guesses only while owners stay on it: while its recent turns that found
// an owner's continuation (counted with a weight that falls by a
// sixteenth a turn) found the one it had left at least 4 times, and 7
// times as often as another store's or one it no longer remembers. A
// Store thus starts guessing after about five such turns in a row, and
// behind a load balancer that spreads an owner's turns over the replicas
// it does not start, or stops after a few overruled guesses. A guess
// reserves nothing: its Turn is 0, and Record and Abort ignore it.
//
// A gateway may send a guess upstream while Reserve runs, and keep the
// upstream's answer under the reservation [Reservation.Adopt] returns,
// whether the reservation agrees with the guess ([Reservation.Agrees]) or
// not: another store served the owner since, or the state is gone. A
// continuation is guessed once, until the owner's next record.
func (s *Store) Guess(owner identity.Owner, req *fingerprint.Request) *Reservation {
	if s.guesses == nil || s.opts.Disabled || owner.IsZero() || req == nil || req.InputSkipped() ||
		!s.guard.Closed(s.partition(owner)) {
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

// Adopt returns the reservation of a turn sent on guess, which keeps the
// upstream's answer to it whatever r decided: the guess continues a
// response the upstream keeps, of which the request is an append-only
// extension with the same prompt, so its answer is as right as one sent
// as r says, and sending the turn again would run it twice upstream. It
// is r continuing as guess does, recorded under r's turn (r's
// continuation, when r took one, is what Restore gives back); or guess,
// which records nothing, when r reserved no turn (the store failed open).
// r is returned as it is when guess does not continue or r agrees with it.
func (r *Reservation) Adopt(guess *Reservation) *Reservation {
	switch {
	case !guess.Continues() || r.Agrees(guess):
		return r
	case r.Turn == 0:
		return guess
	}
	a := *r
	a.PreviousResponseID, a.Delta, a.UpstreamItems, a.Origin, a.Reason = guess.PreviousResponseID, guess.Delta, guess.UpstreamItems, guess.Origin, ReasonNone
	return &a
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
	// stayed and moved count the turns that found an owner's
	// continuation: the one this Store had left, or another store's or
	// one it no longer remembers. Each such turn weighs 1, and every older
	// one a sixteenth less than before.
	stayed, moved float64
}

// Owners stay on a Store while guesses.stayed is at least minStayed and
// stayedPerMove times guesses.moved.
const (
	minStayed     = 4
	stayedPerMove = 7
)

// ownersStay reports whether owners stay on the Store.
func (g *guesses) ownersStay() bool {
	return g.stayed >= minStayed && g.stayed >= stayedPerMove*g.moved
}

// guessed is a remembered continuation.
type guessed struct {
	c       continuation
	at      time.Time // when its turn's reserve was sent
	stay    stay      // how the owner had stayed when its turn reserved
	guessed bool      // a guess was given
}

// stay is how an owner has stayed on a Store: the turns in a row that
// found it new or as the Store had left it, and how often a turn found it
// moved (its state another store's record) while the Store remembered it.
type stay struct {
	streak, moves int
}

// maxMoves caps stay.moves: an owner found moved this often is not guessed
// again while the Store remembers it.
const maxMoves = 16

// next returns how the owner stays after a reserve that found got, given
// this Store's last record of it (mine, nil when it remembers none).
func (mine *guessed) next(got reserved) stay {
	var st stay
	if mine != nil {
		st = mine.stay
	}
	switch {
	case !got.Existed: // a new owner, or one whose state ended: nobody else's
		st.streak++
	case got.Prev == nil: // a turn in flight took it: not known
		st.streak = 0
	case mine.left(got):
		st.streak++
	case mine != nil:
		st.streak, st.moves = 0, min(st.moves+1, maxMoves)
	default: // another store's record, of an owner this Store did not know
		st.streak = 0
	}
	return st
}

// left reports whether the reserve that found got took the continuation
// of this Store's last record (mine).
func (mine *guessed) left(got reserved) bool {
	return mine != nil && got.Prev != nil && got.Prev.ResponseID == mine.c.ResponseID
}

// stays reports whether the owner stays: 2^moves turns in a row.
func (st stay) stays() bool { return st.moves < maxMoves && st.streak >= 1<<st.moves }

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

// found counts a reserve that found got, given this Store's last record
// of its owner (mine, nil when it remembers none), in how owners stay. A
// continuation of an owner the Store does not remember counts as
// another store's: one it forgot cannot be guessed either.
func (g *guesses) found(mine *guessed, got reserved) {
	if g == nil || !got.Existed || got.Prev == nil {
		return // a new owner, or a turn in flight took the continuation
	}
	g.mu.Lock()
	g.stayed, g.moved = g.stayed*15/16, g.moved*15/16
	if mine.left(got) {
		g.stayed++
	} else {
		g.moved++
	}
	g.mu.Unlock()
}

// remember keeps c as owner's continuation, recorded in a turn whose
// reserve was sent at reserved and found the owner staying as st says: as
// the owner's state holds it, with the references its encoding keeps, so
// that a guess decides as a reserve that finds it does.
func (g *guesses) remember(owner identity.Owner, c continuation, reserved time.Time, st stay) {
	if g == nil {
		return
	}
	c, _ = asStored(c)
	g.mu.Lock()
	g.recent.Add(owner.Key(), &guessed{c: c, at: reserved, stay: st})
	g.mu.Unlock()
}

// putBack puts mine back as owner's continuation after a reserve that
// took it failed, unless a record since remembered a newer one: not to be
// guessed (the reserve may have consumed it), but so that the owner's
// next turn finds it as this Store left it, not moved.
func (g *guesses) putBack(owner identity.Owner, mine *guessed) {
	if g == nil || mine == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.recent.Contains(owner.Key()) {
		mine.guessed = true
		g.recent.Add(owner.Key(), mine)
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

// take drops owner's continuation and returns it; nil when there is none.
// A record still in flight on this Store may remember a continuation
// after a reserve took none: a guess from it is one the reservation
// overrules.
func (g *guesses) take(owner identity.Owner) *guessed {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	got, ok := g.recent.Peek(owner.Key())
	if !ok {
		return nil
	}
	g.recent.Remove(owner.Key())
	return got
}

// guess returns owner's continuation to guess from, once: while it lives,
// when the owner stays, while owners stay.
func (g *guesses) guess(owner identity.Owner) (continuation, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	got, ok := g.recent.Peek(owner.Key())
	if !ok || got.guessed || !got.stay.stays() || !g.ownersStay() || g.now().Sub(got.at) >= g.ttl {
		return continuation{}, false
	}
	got.guessed = true
	return got.c, true
}
