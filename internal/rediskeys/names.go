package rediskeys

import (
	"strconv"
	"strings"
)

// Namespace builds the Redis key names of one namespace. Every package
// that keeps keys in Redis (store, session, directory) names them here,
// so that the layout of PROTOCOL.md 6.1 has one home:
//
//	<ns>:{<ns>}:<name>        a key of the namespace as a whole (Shared)
//	<ns>:{<ns>:<id>}:<name>   a key sharing the hash tag of a partition or a session (Slot)
type Namespace string

// Shared returns the name of the namespace-wide key name:
// "<ns>:{<ns>}:<name>".
func (ns Namespace) Shared(name string) string {
	return string(ns) + ":{" + string(ns) + "}:" + name
}

// Slot returns the prefix of the keys that share the hash tag of id, a
// partition (Partition) or a session id: "<ns>:{<ns>:<id>}:".
func (ns Namespace) Slot(id string) string {
	return string(ns) + ":{" + string(ns) + ":" + id + "}:"
}

// Partition returns the slot id of partition p: its number in decimal, at
// least two digits.
func Partition(p int) string {
	if p < 10 {
		return "0" + strconv.Itoa(p)
	}
	return strconv.Itoa(p)
}

// StatePrefix ends the prefix of an owner's state key after its slot:
// "<ns>:{<ns>:<pp>}:o:<owner key>".
const StatePrefix = "o:"

// StateOwner returns the owner key of an owner's state key, and false for
// a key of another kind.
func StateOwner(key string) (string, bool) {
	const sep = "}:" + StatePrefix
	i := strings.Index(key, sep)
	if i < 0 {
		return "", false
	}
	return key[i+len(sep):], true
}
