package store

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/names"
)

// ErrInvalidOptions is wrapped by every error about an option out of range.
var ErrInvalidOptions = errors.New("store: invalid options")

// Defaults applied to zero-valued [Options] fields, as the fields' docs give
// them.
const (
	defaultNamespace       = "cont"
	defaultPartitions      = 16
	defaultTTL             = 30 * time.Minute
	defaultMaxOwners       = 10_000
	defaultMaxOwnerBytes   = 2_000_000
	defaultMaxTotalBytes   = 20_000_000
	defaultOpTimeout       = 200 * time.Millisecond
	defaultBreakerFailures = 5
	defaultBreakerCooldown = time.Second
)

// MaxPartitions is the largest Options.Partitions.
const MaxPartitions = 1024

// Limits on names.
const (
	maxNamespaceBytes  = names.MaxNamespaceBytes
	maxReplicaBytes    = names.MaxReplicaBytes
	maxResponseIDBytes = 512
)

// Options configure a [Store]. A zero field takes its default; a negative or
// otherwise invalid one makes the constructor fail with [ErrInvalidOptions].
//
// Owners are spread over Partitions partitions by a hash of their key (on
// Redis each partition is one hash tag, so one Cluster slot). Each partition
// keeps at most MaxOwners/Partitions owners and MaxTotalBytes/Partitions
// stored bytes (rounded down) and evicts on its own, inside the operations
// that add state: states idle longer than TTL, then the least recently
// touched of the partition while over a limit, at most 64 per operation (the
// rest on the next one). The total never exceeds the limits, but the fullest
// partition evicts before the others are full: with the defaults, from about
// 93% of MaxOwners (90–96% in 19 of 20 random arrivals). [Store.Sweep]
// prunes every partition for a maintenance loop, and [Store.Stats] reads the
// counters.
type Options struct {
	// Namespace prefixes every Redis key. Default "cont". At most 64 bytes of
	// printable UTF-8, no spaces, no '{' or '}'.
	Namespace string
	// Partitions spreads owners over this many hash tags. Default 16,
	// 1..1024. It is fixed for a namespace.
	Partitions int
	// TTL is how long an owner's state lives without a turn. A reserve
	// refreshes the state's TTL and its place in the LRU once 15 ticks of a
	// 256th of the TTL have passed since the last refresh, within a
	// sixteenth of it (turns that come sooner cost no LRU write), so a state
	// lives between 15/16 of the TTL and the TTL after its last turn, on
	// the Redis server's clock (in process, this process's). Default 30
	// minutes, at least a millisecond.
	TTL time.Duration
	// MaxOwners bounds how many owners keep state. Default 10,000, at least
	// Partitions.
	MaxOwners int
	// MaxOwnerBytes is the largest transcript (input and output, canonical
	// bytes) a continuation may cover; larger turns are not continued.
	// Default 2,000,000.
	MaxOwnerBytes int64
	// MaxTotalBytes bounds the bytes the store keeps. Default 20,000,000, at
	// least Partitions.
	MaxTotalBytes int64
	// Disabled makes every Reserve answer ReasonDisabled without touching
	// the store.
	Disabled bool
	// Replica names this gateway replica; it is the origin recorded with
	// responses whose socket names no replica. Default "replica-" and 12
	// random hex digits. At most 256 bytes of printable UTF-8, not starting
	// with '#'. States keep a 64-bit digest of it (see Socket).
	Replica string
	// OpTimeout bounds each operation, at most an hour: a call's copies
	// change nothing after it (internal/lua/oplog.lua). Default 200ms.
	OpTimeout time.Duration
	// BreakerFailures is how many consecutive failed operations open the
	// circuit breaker; while open, operations fail at once (Reserve fails
	// open) without calling Redis. Default 5; -1 disables the breaker.
	// A call that timed out because this process was too busy to read
	// its answer does not count (docs/operating.md, "When Redis fails").
	BreakerFailures int
	// BreakerCooldown is how long the breaker stays open before it lets one
	// probe operation through. Default 1s.
	BreakerCooldown time.Duration
	// Observer, when set, sees every operation and breaker change.
	Observer Observer
	// GuessOwners is how many owners' continuations this Store remembers
	// from its own records, the least recently recorded forgotten first,
	// for [Store.Guess]. Default 0: none, and Guess answers nil.
	GuessOwners int
	// now is the clock of the in-process backend and of the circuit
	// breakers: time.Now unless a test set another (internal/storehooks).
	// The Redis backend keeps every state on its server's clock.
	now func() time.Time

	// Profile says which differences between requests do not change a
	// conversation (package fingerprint). It is fixed for a namespace: a
	// store given one that differs from the namespace's fails every
	// operation open (ErrSchemaMismatch). Zero takes the namespace's own
	// when it is a built-in one (fingerprint.Named: a namespace made
	// before fingerprint.V4 was the default keeps working), and
	// fingerprint.V4() for a new namespace.
	Profile fingerprint.Profile

	// namespaceProfile tells that Profile was left zero: the namespace's
	// built-in profile is taken.
	namespaceProfile bool
}

// withDefaults returns o with defaults filled in, or an error naming the
// first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		o.Namespace = defaultNamespace
	}
	if err := validNamespace(o.Namespace); err != nil {
		return o, err
	}
	o.Partitions = cmp.Or(o.Partitions, defaultPartitions)
	o.TTL = cmp.Or(o.TTL, defaultTTL)
	o.MaxOwners = cmp.Or(o.MaxOwners, defaultMaxOwners)
	o.MaxOwnerBytes = cmp.Or(o.MaxOwnerBytes, defaultMaxOwnerBytes)
	o.MaxTotalBytes = cmp.Or(o.MaxTotalBytes, defaultMaxTotalBytes)
	o.OpTimeout = cmp.Or(o.OpTimeout, defaultOpTimeout)
	o.BreakerFailures = cmp.Or(o.BreakerFailures, defaultBreakerFailures)
	o.BreakerCooldown = cmp.Or(o.BreakerCooldown, defaultBreakerCooldown)
	if o.now == nil {
		o.now = time.Now
	}
	if o.Replica == "" {
		o.Replica = randomReplica()
	}
	if o.Profile.Name == "" {
		o.Profile, o.namespaceProfile = fingerprint.V4(), true
	}
	if _, err := fingerprint.New(o.Profile, fingerprint.Key{}); err != nil {
		return o, fmt.Errorf("%w: Profile: %w", ErrInvalidOptions, err)
	}
	switch {
	case o.Partitions < 1 || o.Partitions > MaxPartitions:
		return o, fmt.Errorf("%w: Partitions is %d, want 1..%d", ErrInvalidOptions, o.Partitions, MaxPartitions)
	case o.TTL < time.Millisecond:
		return o, fmt.Errorf("%w: TTL is %v, want at least 1ms", ErrInvalidOptions, o.TTL)
	case o.MaxOwners < o.Partitions:
		return o, fmt.Errorf("%w: MaxOwners is %d, want at least Partitions (%d)", ErrInvalidOptions, o.MaxOwners, o.Partitions)
	case o.MaxOwnerBytes < 1:
		return o, fmt.Errorf("%w: MaxOwnerBytes is %d, want at least 1", ErrInvalidOptions, o.MaxOwnerBytes)
	case o.MaxTotalBytes < int64(o.Partitions):
		return o, fmt.Errorf("%w: MaxTotalBytes is %d, want at least Partitions (%d)", ErrInvalidOptions, o.MaxTotalBytes, o.Partitions)
	case o.OpTimeout <= 0 || o.OpTimeout > lua.MaxDeadline:
		return o, fmt.Errorf("%w: OpTimeout is %v, want more than 0 and at most %v", ErrInvalidOptions, o.OpTimeout, lua.MaxDeadline)
	case o.BreakerFailures < -1:
		return o, fmt.Errorf("%w: BreakerFailures is %d, want -1 (off) or more than 0", ErrInvalidOptions, o.BreakerFailures)
	case o.BreakerCooldown < 0:
		return o, fmt.Errorf("%w: BreakerCooldown is %v, want at least 0", ErrInvalidOptions, o.BreakerCooldown)
	case o.GuessOwners < 0:
		return o, fmt.Errorf("%w: GuessOwners is %d, want at least 0", ErrInvalidOptions, o.GuessOwners)
	}
	if o.BreakerFailures == -1 {
		o.BreakerFailures = 0 // the breaker never opens
	}
	if err := names.Replica(o.Replica); err != nil {
		return o, fmt.Errorf("%w: Replica %v", ErrInvalidOptions, err)
	}
	return o, nil
}

func validNamespace(ns string) error {
	if err := names.Namespace(ns); err != nil {
		return fmt.Errorf("%w: Namespace %q %v", ErrInvalidOptions, ns, err)
	}
	return nil
}

// validText checks a name that ends up in Redis (internal/names).
func validText(field, s string, max int) error {
	if err := names.Check(s, max); err != nil {
		return fmt.Errorf("%s %v", field, err)
	}
	return nil
}

// newParser returns a parser for the store's profile under a random key.
func (o Options) newParser() *fingerprint.Parser {
	var k fingerprint.Key
	_, _ = rand.Read(k[:])
	p, err := fingerprint.New(o.Profile, k)
	if err != nil {
		panic("store: " + err.Error()) // not reached: withDefaults checked the profile
	}
	return p
}

func randomReplica() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "replica-" + hex.EncodeToString(b[:])
}
