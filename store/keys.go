package store

import (
	"fmt"

	"github.com/contstore/contstore/identity"
)

// keyspace builds every Redis key name of a namespace; nothing else does.
// All keys of a partition share the hash tag "{<ns>:<pp>}", so each script
// touches one Cluster slot.
//
//	<ns>:{<ns>}:meta                hash    schema version and partition count
//	<ns>:{<ns>:<pp>}:o:<owner key>  hash    one owner's state
//	<ns>:{<ns>:<pp>}:lru            zset    owner state keys by last touch
//	<ns>:{<ns>:<pp>}:part           hash    turn sequence, stored bytes, continuations, evictions
//
// <pp> is the partition number in decimal, at least two digits.
type keyspace struct {
	ns string
}

// tag returns the hash tag of partition p.
func (k keyspace) tag(p int) string { return fmt.Sprintf("{%s:%02d}", k.ns, p) }

func (k keyspace) partitionKey(p int, kind string) string {
	return k.ns + ":" + k.tag(p) + ":" + kind
}

// owner returns the key of an owner's state hash in its partition p.
func (k keyspace) owner(p int, o identity.Owner) string {
	return k.partitionKey(p, "o:"+o.Key())
}

// lru returns the key of partition p's LRU.
func (k keyspace) lru(p int) string { return k.partitionKey(p, "lru") }

// part returns the key of partition p's hash: its turn sequence and
// accounting.
func (k keyspace) part(p int) string { return k.partitionKey(p, "part") }

// meta returns the key of the namespace's schema hash.
func (k keyspace) meta() string { return k.ns + ":{" + k.ns + "}:meta" }
