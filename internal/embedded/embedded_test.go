package embedded_test

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/embedded"
)

func TestKeysExpireWithTheWallClock(t *testing.T) {
	mr := miniredis.RunT(t)
	stop := embedded.FollowRealTime(mr)
	defer stop()
	require.NoError(t, mr.Set("k", "v"))
	mr.SetTTL("k", 50*time.Millisecond)
	assert.True(t, mr.Exists("k"))
	assert.Eventually(t, func() bool { return !mr.Exists("k") }, 2*time.Second, 10*time.Millisecond)
}
