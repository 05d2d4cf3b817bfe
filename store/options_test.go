package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

func TestInvalidOptionsAreRefusedNamingTheField(t *testing.T) {
	for _, c := range []struct {
		opts store.Options
		want string
	}{
		{store.Options{Namespace: "a{b"}, "Namespace"},
		{store.Options{Namespace: "a b"}, "Namespace"},
		{store.Options{Namespace: "a\nb"}, "Namespace"},
		{store.Options{Partitions: -1}, "Partitions is -1"},
		{store.Options{Partitions: 1025}, "Partitions is 1025"},
		{store.Options{TTL: -time.Second}, "TTL"},
		{store.Options{TTL: time.Microsecond}, "TTL"},
		{store.Options{MaxOwners: -5}, "MaxOwners"},
		{store.Options{MaxOwners: 8}, "MaxOwners is 8, want at least Partitions (16)"},
		{store.Options{MaxOwnerBytes: -1}, "MaxOwnerBytes"},
		{store.Options{MaxTotalBytes: 3}, "MaxTotalBytes"},
		{store.Options{OpTimeout: -1}, "OpTimeout"},
		{store.Options{GuessOwners: -1}, "GuessOwners is -1"},
		{store.Options{Replica: string([]byte{0xff})}, "Replica"},
	} {
		t.Run(c.want, func(t *testing.T) {
			_, err := store.NewMemory(c.opts)
			require.ErrorIs(t, err, store.ErrInvalidOptions)
			assert.Contains(t, err.Error(), c.want)
			_, err = store.NewRedis(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), c.opts)
			require.ErrorIs(t, err, store.ErrInvalidOptions)
		})
	}
	_, err := store.NewRedis(nil, store.Options{})
	require.ErrorIs(t, err, store.ErrInvalidOptions)
}

func TestDefaults(t *testing.T) {
	s, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	o := s.Options()
	assert.Equal(t, "cont", o.Namespace)
	assert.Equal(t, 16, o.Partitions)
	assert.Equal(t, 30*time.Minute, o.TTL)
	assert.Equal(t, 10_000, o.MaxOwners)
	assert.Equal(t, int64(2_000_000), o.MaxOwnerBytes)
	assert.Equal(t, int64(20_000_000), o.MaxTotalBytes)
	assert.Equal(t, 200*time.Millisecond, o.OpTimeout)
	assert.Equal(t, 5, o.BreakerFailures)
	assert.Equal(t, time.Second, o.BreakerCooldown)
	assert.Regexp(t, `^replica-[0-9a-f]{12}$`, o.Replica)
	assert.Equal(t, fingerprint.V4().Name, o.Profile.Name)
}

func TestPartitionCountIsFixedPerNamespace(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	_, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fixed"})
	require.NoError(t, err)
	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fixed", Partitions: 16})
	require.NoError(t, err, "the same count opens")
	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fixed", Partitions: 8})
	require.ErrorIs(t, err, store.ErrSchemaMismatch)
	assert.Contains(t, err.Error(), "16 partitions")
	assert.Contains(t, err.Error(), "8 partitions")
	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "other", Partitions: 8})
	require.NoError(t, err, "another namespace is free")
	assert.Equal(t, "16", mr.HGet("fixed:{fixed}:meta", "partitions"))
}

// Replicas must agree on equality: a store opened with another fingerprint
// profile is refused, and every store of a namespace digests under the key
// the namespace recorded first.
func TestProfileAndKeyAreFixedPerNamespace(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	a, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fp"})
	require.NoError(t, err)
	key := mr.HGet("fp:{fp}:meta", "key")
	assert.Len(t, key, 64)
	assert.Equal(t, fingerprint.V4().ID(), mr.HGet("fp:{fp}:meta", "profile"))

	b, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fp"})
	require.NoError(t, err)
	body := []byte(`{"model":"m","input":["a",{"type":"x"}]}`)
	ra, err := a.ParseRequest(body)
	require.NoError(t, err)
	rb, err := b.ParseRequest(body)
	require.NoError(t, err)
	assert.Equal(t, ra.Signature(), rb.Signature(), "the second store adopted the namespace's key")
	assert.Equal(t, ra.Prefix(2), rb.Prefix(2))
	assert.Equal(t, key, mr.HGet("fp:{fp}:meta", "key"), "the key never changes")

	// A store whose first check answers after OpTimeout (a loaded
	// machine) still starts under the namespace's key.
	slow := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = slow.Close() })
	var calls atomic.Int32
	slow.AddHook(slowFirstCall{calls: &calls, wait: 300 * time.Millisecond})
	late, err := store.NewRedis(slow, store.Options{OpTimeout: 50 * time.Millisecond, Namespace: "fp"})
	require.NoError(t, err)
	rl, err := late.ParseRequest(body)
	require.NoError(t, err)
	assert.Equal(t, ra.Signature(), rl.Signature(), "a store whose first check was slow adopted the namespace's key")

	other := fingerprint.V2()
	other.Name = "v2-site"
	other.PromptMembers = append(other.PromptMembers, "background")
	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "fp", Profile: other})
	require.ErrorIs(t, err, store.ErrSchemaMismatch)
	assert.Contains(t, err.Error(), "v2-site")

	_, err = store.NewRedis(c, store.Options{Namespace: "fp2", Profile: fingerprint.Profile{Name: "bad name"}})
	require.ErrorIs(t, err, store.ErrInvalidOptions)
	require.ErrorIs(t, err, fingerprint.ErrInvalidProfile)
}

// A store left without a profile takes the built-in one its namespace
// records: a namespace made under v3 keeps working, with v3's equality,
// beside stores that name v3; one that names v4 is refused. A new
// namespace gets v4.
func TestAStoreWithoutAProfileTakesTheNamespaces(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	opts := func(p fingerprint.Profile) store.Options {
		return store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "old", Profile: p}
	}
	old, err := store.NewRedis(c, opts(fingerprint.V3()))
	require.NoError(t, err)
	require.Equal(t, fingerprint.V3().ID(), mr.HGet("old:{old}:meta", "profile"))
	taking, err := store.NewRedis(c, opts(fingerprint.Profile{}))
	require.NoError(t, err)
	assert.Equal(t, fingerprint.V3().ID(), taking.ProfileID())
	_, err = store.NewRedis(c, opts(fingerprint.V4()))
	require.ErrorIs(t, err, store.ErrSchemaMismatch, "a store naming v4 is refused")

	ctx := context.Background()
	owner, _ := identity.Main("s")
	first, err := old.ParseRequest([]byte(`{"model":"m","input":["q"]}`))
	require.NoError(t, err)
	res := old.Reserve(ctx, owner, first)
	out, err := old.Record(ctx, res, store.Result{ResponseID: "resp_1", Socket: store.Socket{Any: true},
		Output: []json.RawMessage{json.RawMessage(`{"id":"rs_1","type":"reasoning","summary":[]}`)}})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)
	next, err := taking.ParseRequest([]byte(`{"model":"m","input":["q",{"id":"rs_2","type":"reasoning","summary":[]},"r"]}`))
	require.NoError(t, err)
	assert.True(t, taking.Reserve(ctx, owner, next).Continues(), "v3 compares reasoning without its id")

	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "new"})
	require.NoError(t, err)
	assert.Equal(t, fingerprint.V4().ID(), mr.HGet("new:{new}:meta", "profile"))
}

// A gateway starts even when Redis is down: the store fails open, and checks
// the namespace once Redis answers.
func TestUnreachableRedisFailsOpen(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	s, err := store.NewRedis(c, store.Options{OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	owner, _ := identity.Main("s")
	r, err := s.ParseRequest([]byte(`{"input":["a","b"]}`))
	require.NoError(t, err)
	res := s.Reserve(context.Background(), owner, r)
	assert.Equal(t, store.ReasonStoreUnavailable, res.Reason)
	assert.ErrorIs(t, res.Err, store.ErrUnavailable)
	assert.Zero(t, res.Turn)
	assert.Equal(t, 2, res.UpstreamItems)
	_, err = s.Inspect(context.Background(), owner)
	assert.ErrorIs(t, err, store.ErrUnavailable)
	_, err = s.Stats(context.Background())
	assert.ErrorIs(t, err, store.ErrUnavailable)
}

func TestSchemaIsCheckedOnceRedisAnswers(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	_, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "late", Partitions: 4})
	require.NoError(t, err)
	mr.SetError("LOADING Redis is loading the dataset in memory")
	s, err := store.NewRedis(c, store.Options{Namespace: "late", Partitions: 2, OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err, "not refused while Redis cannot answer")
	mr.SetError("")
	owner, _ := identity.Main("s")
	// The check runs again in the background; once it has, the store
	// refuses every operation.
	assert.Eventually(t, func() bool {
		res := s.Reserve(context.Background(), owner, nil)
		return errors.Is(res.Err, store.ErrSchemaMismatch) && res.Reason == store.ReasonStoreUnavailable
	}, 5*time.Second, 10*time.Millisecond)
}

// A namespace whose data Redis lost (a restart without persistence) is
// recorded again by the stores still running, so a store with another
// partition count is refused again.
func TestSchemaIsRecordedAgainAfterDataLoss(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	s, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "lost", Partitions: 4})
	require.NoError(t, err)
	mr.FlushAll()
	owner, _ := identity.Main("s")
	assert.Eventually(t, func() bool {
		s.Reserve(context.Background(), owner, nil)
		return mr.Exists("lost:{lost}:meta")
	}, 10*time.Second, 50*time.Millisecond)
	_, err = store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout, Namespace: "lost", Partitions: 8})
	assert.ErrorIs(t, err, store.ErrSchemaMismatch)
}

// slowFirstCall is a go-redis hook that makes the first command answer
// after wait, whatever its deadline.
type slowFirstCall struct {
	calls *atomic.Int32
	wait  time.Duration
}

func (slowFirstCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowFirstCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.calls.Add(1) == 1 {
			time.Sleep(h.wait)
		}
		return next(ctx, cmd)
	}
}

func (slowFirstCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
