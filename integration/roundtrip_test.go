package integration

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// TestEachOperationIsOneCommand counts, in the server's own statistics, the
// commands each store operation sends.
func TestEachOperationIsOneCommand(t *testing.T) {
	c := privateServer(t)
	ctx := context.Background()
	// A patient OpTimeout: a warm-up call that timed out on a loaded machine
	// would leave its script unloaded, and a later operation would send it.
	s, err := store.NewRedis(c, store.Options{Namespace: "rt", OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	owner, err := identity.Main("session-rt")
	require.NoError(t, err)
	r, err := s.ParseRequest([]byte(`{"model":"m","input":["one"]}`))
	require.NoError(t, err)

	// Warm up: the first call loads the scripts' library (FCALL answers
	// Function not found, then FUNCTION LOAD).
	res := s.Reserve(ctx, owner, r)
	require.NoError(t, res.Err)
	_, err = s.Record(ctx, res, store.Result{ResponseID: "resp", Socket: store.Socket{ID: 1}})
	require.NoError(t, err)
	_, err = s.Abort(ctx, res)
	require.NoError(t, err)
	require.NoError(t, s.Clear(ctx, owner))
	_, err = s.Inspect(ctx, owner)
	require.NoError(t, err)

	var res2 *store.Reservation
	ops := []struct {
		name string
		run  func()
		want map[string]int64 // top-level commands the client sent
	}{
		{"reserve", func() { res2 = s.Reserve(ctx, owner, r); require.NoError(t, res2.Err) },
			map[string]int64{"fcall": 1}},
		{"record", func() {
			_, err := s.Record(ctx, res2, store.Result{ResponseID: "resp", Socket: store.Socket{ID: 1}})
			require.NoError(t, err)
		}, map[string]int64{"fcall": 1}},
		{"is-current", func() { _, err := s.IsCurrent(ctx, res2); require.NoError(t, err) },
			map[string]int64{"fcall": 1}}, // inspect.lua
		{"inspect", func() { _, err := s.Inspect(ctx, owner); require.NoError(t, err) },
			map[string]int64{"fcall": 1}},
		{"abort", func() { _, err := s.Abort(ctx, res2); require.NoError(t, err) },
			map[string]int64{"fcall": 1}},
		{"clear", func() { require.NoError(t, s.Clear(ctx, owner)) },
			map[string]int64{"fcall": 1}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			before := commandStats(t, c)
			op.run()
			after := commandStats(t, c)
			// Commands that scripts call internally are counted too, so an
			// operation is checked on the script calls alone.
			for _, cmd := range []string{"fcall", "evalsha", "eval", "function|load"} {
				assert.Equal(t, op.want[cmd], after[cmd].calls-before[cmd].calls, "%s calls", cmd)
			}
			assert.Equal(t, int64(1), after["info"].calls-before["info"].calls, "nothing else ran")
		})
	}
}
