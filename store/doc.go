// Package store decides, for each request of a conversation owner, whether a
// gateway may continue the upstream conversation with previous_response_id
// and only the new input items, and shares that decision across gateway
// replicas through Redis.
//
// # Turns
//
// A turn goes: [Store.ParseRequest] the client's body; [Store.Reserve],
// which consumes whatever continuation the owner had and returns a fencing
// turn token with the decision; send [Reservation.UpstreamBody] upstream
// (previous_response_id and the delta when [Reservation.Continues] and
// [Reservation.Local], the body as received otherwise); then [Store.Record]
// the response, which publishes it only if the turn is still the owner's
// current one, or [Store.Abort] the turn. Each operation is one round trip to Redis:
// one script call, or one HGET for [Store.IsCurrent]. [NewMemory] gives the same semantics in process, for a
// single replica and as the reference model of the Redis backend.
//
// Reserve never fails the gateway: when Redis is down or slower than
// Options.OpTimeout, the reservation says [ReasonStoreUnavailable] and the
// gateway sends the full context, as it would without the store.
//
// Requests are compared by fingerprints (package fingerprint, under the
// namespace's profile and secret key), not transcripts: a continuation
// stores the item count and chain digest of its transcript, the prompt
// signature, the response id and its origin socket — tens of bytes, whatever
// the transcript's size.
//
// # Limits
//
// Owners are spread over Options.Partitions partitions by a hash of their
// key; on Redis each partition has its own hash tag, so every script touches
// one Cluster slot. Each partition keeps at most MaxOwners/Partitions owners
// and MaxTotalBytes/Partitions stored bytes (rounded down) and evicts on its
// own, inside the operations that add state: first states idle longer than
// TTL, then the least recently touched while over either limit, at most 64
// per operation (what is left goes on the next one). [Store.Sweep] does the
// same over every partition for a maintenance loop, and [Store.Stats] reads
// the counters.
//
// The global limits are therefore approximate: the total never exceeds them,
// but the fullest partition starts evicting before the others are full. With
// the defaults (16 partitions of 625 owners), the first eviction comes when
// about 93% of MaxOwners are stored (90–96% in 19 of 20 random arrivals); as
// more owners arrive every partition fills to its share, and the total
// approaches MaxOwners less the rounding remainder. Likewise the owner
// evicted is the least recently touched of its partition, not of the whole
// store. The same holds for bytes. Stored bytes are an estimate of what an
// owner's state costs in Redis 7 (key, hash, TTL and LRU entries), computed
// the same way on every backend.
//
// # Redis layout
//
// Per owner, one hash with the current turn and, once published, the
// continuation, carrying a TTL that every touch refreshes. Per partition, a
// sorted set of owner keys by last touch (the LRU), an accounting hash
// (stored bytes, published continuations, evictions by cause) and the turn
// clock, in microseconds of the server's clock. Every operation that changes
// state leaves its answer for a few seconds under its own key, so that a
// client that sends the script again (its reply was lost) gets the first
// answer and nothing changes twice. Time is the Redis server's, never a
// replica's, unless Options.Now is set. The scripts live in package lua,
// each with a header naming its keys, arguments and replies.
package store
