package main

import (
	"encoding/json"
	"math/rand/v2"
	"time"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// owner is one conversation thread: what its client sends, and the ground
// truth about it. The scheduler hands an owner to one worker at a time,
// and only that worker touches it.
type owner struct {
	index int
	id    identity.Owner
	// shared tells whether other conversations' turns go to the same
	// store owner (-alike): their turns supersede this one's, and keep
	// the owner's state alive while this one is idle. opening is the
	// first user message the group's conversations send, until sent.
	shared  bool
	opening json.RawMessage
	// rng draws every decision of the owner's client and upstream (prompt
	// changes, edits, texts, failures, losses, idle gaps), so that the
	// workload depends only on the seed, never on which worker plays it.
	rng *rand.Rand
	// left is how many turns the owner still plays.
	left int64
	// socket is the upstream socket the owner uses on whichever replica
	// sends its turns; home is the replica sticky routing picks.
	socket uint64
	home   int

	prompt    prompt
	promptGen int    // counts prompt changes
	head      []byte // the request body up to the input items
	// transcript is what the client sends before its new items. Its items
	// are never changed in place: offers keep slices of it.
	transcript  []json.RawMessage
	pendingCall string // the call id the client owes an output for
	turns       int    // requests made

	// offer is the continuation the store may offer next; nil when none.
	offer *offer
	// idle: the owner comes back from a gap longer than the TTL; asleep is
	// its offer meanwhile, given back if the gap is cut short.
	idle   bool
	asleep *offer
	// wake is when a parked owner may take turns again.
	wake time.Time
}

// wakeEarly ends o's idle gap before the TTL has passed: its state may
// still be there, and its offer with it.
func (o *owner) wakeEarly() {
	o.offer, o.asleep, o.idle = o.asleep, nil, false
}

// orStale returns want, and stale too when o's store owner is shared: a
// turn of another conversation may have superseded o's.
func (o *owner) orStale(want ...store.Outcome) []store.Outcome {
	if o.shared {
		return append(want, store.OutcomeStale)
	}
	return want
}

// settle updates o's offer after the record of its current turn a, whose
// transcript is full: the response is now what the store may offer, unless
// the record said otherwise. A record that failed may have published.
func (o *owner) settle(a answer, full []json.RawMessage, got store.Outcome, ok bool) {
	if (!ok && a.res.Turn != 0) || got == store.OutcomePublished {
		o.offer = &offer{id: a.id, items: full, promptGen: o.promptGen}
	}
}
