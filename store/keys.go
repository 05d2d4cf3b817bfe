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
//	<ns>:{<ns>:<pp>}:seq            string  the partition's turn sequence
//	<ns>:{<ns>:<pp>}:lru            zset    owner state keys by last touch
//	<ns>:{<ns>:<pp>}:acct           hash    stored bytes, continuations, evictions
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

// seq returns the key of partition p's turn sequence.
func (k keyspace) seq(p int) string { return k.partitionKey(p, "seq") }

// lru returns the key of partition p's LRU.
func (k keyspace) lru(p int) string { return k.partitionKey(p, "lru") }

// acct returns the key of partition p's accounting hash.
func (k keyspace) acct(p int) string { return k.partitionKey(p, "acct") }

// meta returns the key of the namespace's schema hash.
func (k keyspace) meta() string { return k.ns + ":{" + k.ns + "}:meta" }
