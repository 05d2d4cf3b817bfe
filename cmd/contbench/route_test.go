package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/route"
)

// The replicas go where the gateway's route policy says: under a policy
// that never forwards, the deployment run forwards nothing and its
// socket-bound continuations elsewhere are lost; with the rule restored,
// the same workload forwards them and continues them.
func TestReplicasFollowTheRoutePolicy(t *testing.T) {
	const turns = 2000
	args := []string{"-backend", "memory", "-turns", "2000", "-baselines=false"}
	var never runResult
	t.Run("policy that never forwards", func(t *testing.T) {
		route.Swap(t, func(o route.Offer) route.Where {
			if w := route.Rule(o); w != route.Forward {
				return w
			}
			return route.Full
		})
		b := runBench(t, args...)
		requireSound(t, b, turns)
		never = b.report.Run
		assert.True(t, b.report.Forward, "forwarding is configured")
		assert.Zero(t, never.Forwarding.Forwarded)
		assert.Zero(t, never.Forwarding.Lookup.Count)
		assert.Greater(t, never.Misses[missOriginElsewhere], never.Turns/4)
	})
	b := runBench(t, args...)
	requireSound(t, b, turns)
	r := b.report.Run
	requireSameWorkload(t, r, &never)
	t.Logf("deployment: hit rate %.3f, %d forwarded under the rule; hit rate %.3f, %d forwarded, %d %s under a policy that never forwards",
		r.HitRate, r.Forwarding.Forwarded, never.HitRate, never.Forwarding.Forwarded, never.Misses[missOriginElsewhere], missOriginElsewhere)
	require.Positive(t, r.Forwarding.Forwarded)
	assert.Zero(t, r.Misses[missOriginElsewhere])
	assert.Equal(t, r.Forwarding.Forwarded, r.Forwarding.Lookup.Count, "one lookup per forwarded turn")
	assert.Greater(t, r.HitRate, never.HitRate+0.25)
}
