package redisconn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/serverclock"
)

// A call refused for its deadline is sent once more, as a new call, only
// when the refusal came at least the call's limit after its deadline (no
// copy of it can have run) and the caller still waits; any other refusal,
// and a second one, is ErrPastDeadline. Other replies pass as they are.
func TestResendExpiredSendsOnceMoreOnlyWhenNoCopyCanHaveRun(t *testing.T) {
	const limit = time.Second
	const deadline = int64(1_000_000)
	expired := func(server int64) any { return []any{"expired", server} }
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		replies []any // the replies of the successive sends
		sends   int
		want    any // the reply returned, or nil for ErrPastDeadline
	}{
		{"answered", context.Background(), []any{[]any{"ok", "1"}}, 1, []any{"ok", "1"}},
		{"a reply of another shape", context.Background(), []any{[]any{"expired", "1"}}, 1, []any{"expired", "1"}},
		{"refused long after the deadline", context.Background(), []any{expired(deadline + limit.Milliseconds()), int64(1)}, 2, int64(1)},
		{"refused just after the deadline", context.Background(), []any{expired(deadline + limit.Milliseconds() - 1)}, 1, nil},
		{"refused twice", context.Background(), []any{expired(deadline + 2*limit.Milliseconds()), expired(deadline + 3*limit.Milliseconds())}, 2, nil},
		{"the caller gave up", canceled, []any{expired(deadline + 2*limit.Milliseconds())}, 1, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			sends := 0
			got, err := ResendExpired(c.ctx, serverclock.New(1, nil), 0, limit, func() (any, int64, error) {
				sends++
				return c.replies[sends-1], deadline, nil
			})
			assert.Equal(t, c.sends, sends)
			if c.want == nil {
				require.ErrorIs(t, err, ErrPastDeadline)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// An error of the call ends it at once.
func TestResendExpiredPassesErrorsOn(t *testing.T) {
	boom := errors.New("boom")
	sends := 0
	_, err := ResendExpired(context.Background(), serverclock.New(1, nil), 0, time.Second, func() (any, int64, error) {
		sends++
		return nil, 0, boom
	})
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 1, sends)
}
