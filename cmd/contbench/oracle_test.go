package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// The second of two concurrent requests may get what the rule decides for
// a live owner with nothing published, no state (evicted meanwhile), a
// failed store or a continuation (judged by checkReserve); any other
// reason is a violation.
func TestCheckSupersededFollowsTheRule(t *testing.T) {
	id, err := identity.Main("s")
	require.NoError(t, err)
	o, rep := &owner{id: id}, &replica{name: "a"}
	for reason, violations := range map[store.Reason]int64{
		store.ReasonSupersededTurn: 0, store.ReasonMissingState: 0, store.ReasonStoreUnavailable: 0, store.ReasonNone: 0,
		store.ReasonPromptChanged: 1, store.ReasonNotAppendOnly: 1, store.ReasonEmptyDelta: 1,
	} {
		c := &oracle{}
		c.checkSuperseded(o, rep, &store.Reservation{Reason: reason})
		assert.Equal(t, violations, c.count, "reason %q", reason)
	}
}
