package route

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/contstore/contstore/store"
)

func TestDecide(t *testing.T) {
	kept := store.Socket{Any: true}
	mine := store.Socket{Replica: "gw-1", ID: 7}
	theirs := store.Socket{Replica: "#00000000000000ab", ID: 7}
	cases := []struct {
		name string
		o    Offer
		want Where
	}{
		{"no continuation", Offer{Origin: mine, Stores: true, Holds: true, Forwarding: true}, Full},
		{"kept upstream, turn stores", Offer{Continues: true, Origin: kept, Stores: true}, Stored},
		{"kept upstream, turn stores nothing", Offer{Continues: true, Origin: kept}, Full},
		{"own socket holding it", Offer{Continues: true, Origin: mine, Holds: true}, Local},
		{"own socket holding it, turn stores", Offer{Continues: true, Origin: mine, Stores: true, Holds: true}, Local},
		{"own socket holding it no more", Offer{Continues: true, Origin: mine, Forwarding: true}, Full},
		{"another replica's socket", Offer{Continues: true, Origin: theirs, Forwarding: true}, Forward},
		{"another replica's socket, turn stores", Offer{Continues: true, Origin: theirs, Stores: true, Forwarding: true, Holds: true}, Forward},
		{"another replica's socket, no forwarding", Offer{Continues: true, Origin: theirs, Holds: true}, Full},
		{"unknown socket", Offer{Continues: true, Origin: store.Socket{Replica: "gw-1"}, Holds: true, Forwarding: true}, Full},
	}
	for _, c := range cases {
		c.o.Self = "gw-1"
		assert.Equal(t, c.want, Decide(c.o), c.name)
	}
	assert.True(t, Stored.Here())
	assert.True(t, Local.Here())
	assert.False(t, Full.Here())
	assert.False(t, Forward.Here())
	assert.Equal(t, "forward", Forward.String())
}
