// Package route states where a gateway replica sends a turn whose
// reservation may continue a previous response. The proxy and contbench's
// simulated replicas both ask Decide, so a change to the rule changes
// both.
//
// The rule, for a turn reserved on replica Self:
//
//	offer                             | turn stores | result
//	----------------------------------+-------------+-----------------------------
//	no continuation                   | either      | Full
//	origin any socket (kept upstream) | yes         | Stored
//	origin any socket (kept upstream) | no          | Full
//	origin socket N of Self           | either      | Local if N still holds the
//	                                  |             | previous response, else Full
//	origin socket N of replica R      | either      | Forward if forwarding is
//	(R other than Self)               |             | configured, else Full
//	origin socket unknown (N = 0)     | either      | Full
//
// A turn that stores nothing upstream ("store": false) cannot continue a
// response kept upstream; a response that lives on one socket can be
// continued only on that socket, whatever the turn stores. Forwarding
// hands the turn to R, which continues it on N while N holds the previous
// response and sends the full context otherwise.
package route

import "github.com/contstore/contstore/store"

// Offer is what a turn's reservation offers, and where the turn is.
type Offer struct {
	// Continues tells whether the reservation continues a previous
	// response (store.Reservation.Continues).
	Continues bool
	// Origin is where the previous response lives
	// (store.Reservation.Origin).
	Origin store.Socket
	// Stores tells whether the turn's request has the upstream keep its
	// response ("store" true or absent).
	Stores bool
	// Self is the replica deciding: its store's replica name
	// (store.Options.Replica).
	Self string
	// Forwarding tells whether Self can hand turns to other replicas.
	Forwarding bool
	// Holds tells whether Self's socket Origin.ID still holds the previous
	// response; it matters only when the origin is a socket of Self.
	Holds bool
}

// Where is where a turn goes.
type Where int

// Where a turn goes.
const (
	// Full sends the full context, on any connection of this replica.
	Full Where = iota
	// Stored continues on any connection: the upstream keeps the response.
	Stored
	// Local continues on this replica's socket Origin.ID.
	Local
	// Forward hands the turn to replica Origin.Replica, which holds the
	// socket.
	Forward
)

var whereNames = [...]string{Full: "full", Stored: "stored", Local: "local", Forward: "forward"}

func (w Where) String() string {
	if w >= 0 && int(w) < len(whereNames) {
		return whereNames[w]
	}
	return "unknown"
}

// Here tells whether the turn continues on a connection of the deciding
// replica: Stored or Local.
func (w Where) Here() bool { return w == Stored || w == Local }

// Decide returns where a turn with offer o goes, by the rule of the
// package comment.
func Decide(o Offer) Where {
	switch {
	case !o.Continues:
		return Full
	case o.Origin.Any:
		if o.Stores {
			return Stored
		}
		return Full
	case o.Origin.ID == 0:
		return Full
	case o.Origin.Replica == o.Self:
		if o.Holds {
			return Local
		}
		return Full
	case o.Forwarding:
		return Forward
	}
	return Full
}
