// Package store decides, for each request of a conversation owner, whether a
// gateway may continue the upstream conversation with previous_response_id
// and only the new input items, and shares that decision across gateway
// replicas through Redis ([NewRedis] on go-redis, [NewRueidis] on rueidis) or
// keeps it in process ([NewMemory], the reference model of the Redis backend).
//
// A turn goes: [Store.ParseRequest] the client's body; [Store.Reserve], which
// consumes the owner's continuation and returns a fencing turn token with the
// decision; send [Reservation.UpstreamBody] upstream, or that of
// [Reservation.FullContextRetry] when the turn continues on a socket this
// replica does not hold ([Reservation.Local] is false); then [Store.Record] the
// response, which publishes it only if the turn is still the owner's current
// one, or [Store.Abort] the turn. Each operation is one round trip to Redis,
// which a client may resend after a lost reply without changing anything
// twice. Reserve never fails the gateway: when Redis is down or slower than
// Options.OpTimeout it answers [ReasonStoreUnavailable], and the gateway
// sends the full context, as it would without the store.
//
// A gateway may also ask [Store.Guess], with Options.GuessOwners set, for
// the decision its own last record of an owner that stays on it gives,
// without a round trip, and send the turn upstream while Reserve runs; it
// keeps that send's answer under the reservation [Reservation.Adopt]
// makes of the two, so that the turn runs once upstream.
//
// Requests are compared by fingerprints (package fingerprint, under the
// namespace's profile and secret key), not transcripts: a continuation holds
// tens of bytes whatever the transcript's size. [Options] describes the
// limits on what the store keeps. PROTOCOL.md, at the root of the
// repository, specifies the Redis layout and scripts for gateways in other
// languages.
package store
