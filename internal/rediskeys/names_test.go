package rediskeys

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The key names are the Redis schema (PROTOCOL.md 6.1): these must never
// change silently.
func TestNamespaceNames(t *testing.T) {
	ns := Namespace("cont")
	assert.Equal(t, "cont:{cont}:meta", ns.Shared("meta"))
	assert.Equal(t, "cont:{cont}:replica:", ns.Shared("replica:"))
	assert.Equal(t, "cont:{cont:07}:", ns.Slot(Partition(7)))
	assert.Equal(t, "cont:{cont:1000}:", ns.Slot(Partition(1000)))
	assert.Equal(t, "cont:{cont:sess-1}:", ns.Slot("sess-1"))

	owner, ok := StateOwner(ns.Slot(Partition(3)) + StatePrefix + "m:s%3A1")
	assert.True(t, ok)
	assert.Equal(t, "m:s%3A1", owner)
	_, ok = StateOwner(ns.Slot(Partition(3)) + "lru")
	assert.False(t, ok)
}
