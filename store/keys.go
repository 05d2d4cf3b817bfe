package store

import (
	"errors"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/rediskeys"
)

// ErrSchemaMismatch is returned by NewRedis when the namespace was created
// with another partition count, schema version or fingerprint profile.
var ErrSchemaMismatch = errors.New("store: namespace schema mismatch")

// schemaVersion is the Redis layout this package reads and writes.
const schemaVersion = 4

// keyspace builds every Redis key name of a store's namespace, with
// internal/rediskeys, where the directory's and the sessions' are built too.
// All keys of a partition share the hash tag "{<ns>:<pp>}", so each script
// touches one Cluster slot.
//
//	<ns>:{<ns>}:meta                hash    schema version, partition count, fingerprint profile and key
//	<ns>:{<ns>:<pp>}:o:<owner key>  hash    one owner's state
//	<ns>:{<ns>:<pp>}:q:<owner key>:<op>  string  the answer of one call that changed the owner, until its deadline
//	<ns>:{<ns>:<pp>}:lru            zset    owner keys by last touch
//	<ns>:{<ns>:<pp>}:part           hash    stored bytes, continuations, evictions
//	<ns>:{<ns>:<pp>}:seq            string  the turn clock's last sequence number
//
// <pp> is the partition number in decimal, at least two digits. The LRU's
// members are owner keys: a state's key is its partition's owner prefix
// followed by the member.
type keyspace struct {
	ns    string
	parts []partitionKeys // by partition, built once
}

// partitionKeys are the key names of one partition.
type partitionKeys struct {
	prefix, answers, lru, part, seq string
}

func newKeyspace(ns string, partitions int) keyspace {
	k := keyspace{ns: ns, parts: make([]partitionKeys, partitions)}
	for p := range k.parts {
		base := rediskeys.Namespace(ns).Slot(rediskeys.Partition(p))
		k.parts[p] = partitionKeys{prefix: base + rediskeys.StatePrefix, answers: base + "q:", lru: base + "lru",
			part: base + "part", seq: base + "seq"}
	}
	return k
}

// ownerPrefix returns the prefix of partition p's owner state keys.
func (k keyspace) ownerPrefix(p int) string { return k.parts[p].prefix }

// owner returns the key of an owner's state hash in its partition p.
func (k keyspace) owner(p int, o identity.Owner) string { return k.parts[p].prefix + o.Key() }

// appendOwner appends the key of an owner's state hash in its partition p
// to b.
func (k keyspace) appendOwner(b []byte, p int, o identity.Owner) []byte {
	return append(append(b, k.parts[p].prefix...), o.Key()...)
}

// answer returns the answer key of the call of op on owner o in its
// partition p (internal/lua/oplog.lua).
func (k keyspace) answer(p int, o identity.Owner, op string) string {
	var buf [128]byte
	b := append(append(append(buf[:0], k.parts[p].answers...), o.Key()...), ':')
	return string(lua.AppendCallIDKey(b, op))
}

// lru returns the key of partition p's LRU.
func (k keyspace) lru(p int) string { return k.parts[p].lru }

// part returns the key of partition p's accounting hash.
func (k keyspace) part(p int) string { return k.parts[p].part }

// seq returns the key of partition p's turn clock.
func (k keyspace) seq(p int) string { return k.parts[p].seq }

// meta returns the key of the namespace's schema hash.
func (k keyspace) meta() string { return rediskeys.Namespace(k.ns).Shared("meta") }
