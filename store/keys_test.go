package store

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/rediskeys"
)

// Key names are the Redis schema: these must never change silently.
func TestKeyNames(t *testing.T) {
	k := newKeyspace("cont", 1024)
	owner, _ := identity.Agent("s:1", "a")
	for _, c := range []struct{ got, want string }{
		{k.tag(7), "{cont:07}"},
		{k.tag(1000), "{cont:1000}"},
		{k.owner(7, owner), "cont:{cont:07}:o:a:s%3A1:a"},
		{k.lru(15), "cont:{cont:15}:lru"},
		{k.part(3), "cont:{cont:03}:part"},
		{k.seq(3), "cont:{cont:03}:seq"},
		{k.meta(), "cont:{cont}:meta"},
	} {
		assert.Equal(t, c.want, c.got)
	}
}

// tag returns the hash tag of partition p, as its keys carry it.
func (k keyspace) tag(p int) string { return "{" + k.ns + ":" + rediskeys.Partition(p) + "}" }
