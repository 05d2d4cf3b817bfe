package store_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/storehooks"
	"github.com/contstore/contstore/store"
)

// blackHole accepts connections and never answers, as a Redis behind a
// dead network path looks to a client. It returns a client for it, closed
// when the test ends after the black hole drops its connections (so the
// client's blocked reads end at once).
func blackHole(t *testing.T, opts redis.Options) *redis.Client {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	opts.Addr = l.Addr().String()
	client := redis.NewClient(&opts)
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		_ = client.Close()
	})
	return client
}

// breakerOf returns the status of owner's breaker, as Stats reports it even
// when it fails.
func breakerOf(s *store.Store, owner identity.Owner) store.BreakerStatus {
	st, _ := s.Stats(context.Background())
	return st.Breakers[owner.Partition(s.Options().Partitions)]
}

// recorder is an Observer that keeps what it sees.
type recorder struct {
	mu       sync.Mutex
	events   []store.Event
	breakers []store.BreakerState
}

func (r *recorder) Observe(e store.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) BreakerChanged(s store.BreakerStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.breakers = append(r.breakers, s.State)
}

func (r *recorder) states() []store.BreakerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]store.BreakerState(nil), r.breakers...)
}

// Whatever the client does with deadlines, a Reserve returns at
// OpTimeout, long before the client's own 10 s; after five failures the
// breaker answers without calling Redis, then lets a probe through. A
// call that comes back late because the machine is busy counts as the
// process's starvation, not as a failure (TestABusyProcessDoesNotOpenTheBreaker):
// on a loaded machine the breaker may take more than five calls to open,
// and a probe more than one to reopen it, never fewer.
func TestReserveFailsOpenWithinOpTimeout(t *testing.T) {
	t.Run("client ignores deadlines", func(t *testing.T) {
		// configured against every recommendation: no context deadlines,
		// a 10s read timeout, retries
		failsOpenWithinOpTimeout(t, redis.Options{ContextTimeoutEnabled: false,
			ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxRetries: 3, DialTimeout: 10 * time.Second})
	})
	t.Run("client honours deadlines", func(t *testing.T) {
		// the store calls it without a goroutine of its own
		failsOpenWithinOpTimeout(t, redis.Options{ContextTimeoutEnabled: true,
			ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxRetries: 3, DialTimeout: 10 * time.Second})
	})
}

func failsOpenWithinOpTimeout(t *testing.T, opts redis.Options) {
	c := blackHole(t, opts)
	obs := &recorder{}
	clk := redistest.NewClock(time.Now())
	const opTimeout = 300 * time.Millisecond
	s, err := store.NewRedis(c, storehooks.WithClock(store.Options{OpTimeout: opTimeout, Observer: obs}, clk.Now))
	require.NoError(t, err, "Redis not answering does not stop a gateway from starting")
	owner, _ := identity.Main("s")
	r, err := s.ParseRequest([]byte(`{"input":["a","b","c"]}`))
	require.NoError(t, err)

	const clientWait = 10 * time.Second
	calls := 0
	for ; breakerOf(s, owner).State != store.BreakerOpen; calls++ {
		require.Less(t, calls, 50, "a Redis that does not answer never opened the breaker")
		start := time.Now()
		res := s.Reserve(context.Background(), owner, r)
		elapsed := time.Since(start)
		assert.Equal(t, store.ReasonStoreUnavailable, res.Reason)
		assert.ErrorIs(t, res.Err, store.ErrUnavailable)
		assert.ErrorIs(t, res.Err, context.DeadlineExceeded)
		assert.Equal(t, 3, res.UpstreamItems)
		assert.Less(t, elapsed, clientWait/2, "call %d took %v", calls, elapsed)
	}
	assert.GreaterOrEqual(t, calls, 5, "the breaker opened at the fifth failure, not before")
	assert.Equal(t, []store.BreakerState{store.BreakerOpen}, obs.states())
	assert.Equal(t, store.BreakerOpen, breakerOf(s, owner).State)
	other, _ := identity.Main("another-partition")
	require.NotEqual(t, owner.Partition(16), other.Partition(16))
	assert.ErrorIs(t, s.Reserve(context.Background(), other, r).Err, context.DeadlineExceeded,
		"another partition's breaker is still closed: the call reaches Redis")

	// ErrBreakerOpen: refused before any call to Redis.
	res := s.Reserve(context.Background(), owner, r)
	assert.ErrorIs(t, res.Err, store.ErrBreakerOpen)
	_, err = s.Inspect(context.Background(), owner)
	assert.ErrorIs(t, err, store.ErrBreakerOpen)

	clk.Add(time.Second) // the cooldown: one probe at a time goes through, fails, reopens
	probes := 0
	for ; breakerOf(s, owner).State != store.BreakerOpen || probes == 0; probes++ {
		require.Less(t, probes, 50, "a probe of a Redis that does not answer never reopened the breaker")
		res = s.Reserve(context.Background(), owner, r)
		assert.ErrorIs(t, res.Err, context.DeadlineExceeded)
	}
	assert.Equal(t, []store.BreakerState{store.BreakerOpen, store.BreakerHalfOpen, store.BreakerOpen}, obs.states())
	assert.Equal(t, int64(2), breakerOf(s, owner).Opens)

	var reserves int
	for _, e := range obs.events {
		if e.Op == store.OpReserve {
			reserves++
			assert.Equal(t, store.ReasonStoreUnavailable, e.Reason)
			assert.Error(t, e.Err)
		}
	}
	assert.Equal(t, calls+2+probes, reserves, "the observer saw every reservation")
}

// Once Redis answers again, the probe closes the breaker.
// openBreaker returns a store on miniredis, on clock clk, whose owner
// "s" has opened its partition's breaker: miniredis fails two of its
// calls, and is then answering again. Its calls have seconds: on a busy
// machine one answered after a short OpTimeout would count as the
// process's starvation, not as a failure of Redis, and open nothing.
func openBreaker(t *testing.T, obs store.Observer) (*store.Store, identity.Owner, *redistest.Clock, *miniredis.Miniredis) {
	t.Helper()
	mr, c := redistest.Miniredis(t)
	clk := redistest.NewClock(time.Now())
	s, err := store.NewRedis(c, storehooks.WithClock(store.Options{OpTimeout: 5 * time.Second, Observer: obs, BreakerFailures: 2}, clk.Now))
	require.NoError(t, err)
	owner, _ := identity.Main("s")
	mr.SetError("LOADING Redis is loading the dataset in memory")
	for range 2 {
		require.Equal(t, store.ReasonStoreUnavailable, s.Reserve(context.Background(), owner, nil).Reason)
	}
	return s, owner, clk, mr
}

func TestBreakerClosesWhenRedisRecovers(t *testing.T) {
	obs := &recorder{}
	s, owner, clk, mr := openBreaker(t, obs)
	ctx := context.Background()
	st, err := s.Stats(ctx)
	require.Error(t, err)
	require.Len(t, st.Breakers, 16, "a failed Stats still holds the breakers")
	assert.Equal(t, store.BreakerOpen, st.Breakers[owner.Partition(16)].State)
	mr.SetError("")
	assert.ErrorIs(t, s.Reserve(ctx, owner, nil).Err, store.ErrBreakerOpen, "still cooling down")
	clk.Add(time.Second)
	assert.Equal(t, store.ReasonMissingState, s.Reserve(ctx, owner, nil).Reason, "the probe reaches Redis")
	assert.Equal(t, store.BreakerClosed, breakerOf(s, owner).State)
	assert.Equal(t, []store.BreakerState{store.BreakerOpen, store.BreakerHalfOpen, store.BreakerClosed}, obs.states())
	st, err = s.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, st.Breakers, 16)
	assert.Equal(t, store.BreakerClosed, st.Breakers[owner.Partition(16)].State)
	assert.Equal(t, int64(1), st.Breakers[owner.Partition(16)].Opens)
}

// A breaker open on a partition no owner calls any more closes once Redis
// is back all the same: the sweep is its probe.
func TestASweepClosesABreakerNoOwnerProbes(t *testing.T) {
	s, owner, clk, mr := openBreaker(t, nil)
	ctx := context.Background()
	require.Equal(t, store.BreakerOpen, breakerOf(s, owner).State)
	mr.SetError("")
	_, err := s.Sweep(ctx)
	require.NoError(t, err, "an open breaker is skipped, no error")
	assert.Equal(t, store.BreakerOpen, breakerOf(s, owner).State, "still cooling down: the sweep skips it")
	clk.Add(time.Second)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, store.BreakerClosed, breakerOf(s, owner).State)
}

// A caller that cancels its own context does not count against Redis.
func TestCallerCancellationDoesNotOpenTheBreaker(t *testing.T) {
	_, c := redistest.Miniredis(t)
	s, err := store.NewRedis(c, store.Options{BreakerFailures: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	owner, _ := identity.Main("s")
	for range 3 {
		assert.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, owner, nil).Reason)
	}
	assert.Equal(t, store.BreakerClosed, breakerOf(s, owner).State)
}

func TestBreakerCanBeTurnedOff(t *testing.T) {
	c := blackHole(t, redis.Options{MaxRetries: -1})
	s, err := store.NewRedis(c, store.Options{OpTimeout: 20 * time.Millisecond, BreakerFailures: -1})
	require.NoError(t, err)
	owner, _ := identity.Main("s")
	for range 8 {
		assert.ErrorIs(t, s.Reserve(context.Background(), owner, nil).Err, context.DeadlineExceeded)
	}
	assert.Equal(t, store.BreakerClosed, breakerOf(s, owner).State)
}

// orderChecker is an Observer that checks each partition's breaker changes
// arrive in the order of the breaker's cycle: closed, open, half-open, then
// open again (one more opening) or closed; an operation let through before
// the breaker opened may also close it when it succeeds. It is slow, so
// that changes pile up while it is being told one.
type orderChecker struct {
	mu      sync.Mutex
	last    map[int]store.BreakerStatus
	changes int
	wrong   []string
}

func (o *orderChecker) Observe(store.Event) {}

func (o *orderChecker) BreakerChanged(st store.BreakerStatus) {
	time.Sleep(50 * time.Microsecond)
	o.mu.Lock()
	defer o.mu.Unlock()
	prev, ok := o.last[st.Partition]
	if !ok {
		prev = store.BreakerStatus{State: store.BreakerClosed}
	}
	var next bool
	switch st.State {
	case store.BreakerOpen:
		next = prev.State != store.BreakerOpen && st.Opens == prev.Opens+1
	case store.BreakerHalfOpen:
		next = prev.State == store.BreakerOpen && st.Opens == prev.Opens
	case store.BreakerClosed:
		next = prev.State != store.BreakerClosed && st.Opens == prev.Opens
	}
	if !next {
		o.wrong = append(o.wrong, fmt.Sprintf("partition %d: %s (opens %d) after %s (opens %d)",
			st.Partition, st.State, st.Opens, prev.State, prev.Opens))
	}
	o.last[st.Partition] = st
	o.changes++
}

// Concurrent operations on a partition whose Redis fails and recovers over
// and over tell the observer each change once, in order.
func TestBreakerChangesArriveInOrder(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	obs := &orderChecker{last: map[int]store.BreakerStatus{}}
	s, err := store.NewRedis(c, store.Options{Partitions: 1, BreakerFailures: 1, BreakerCooldown: time.Nanosecond, Observer: obs})
	require.NoError(t, err)
	owner, _ := identity.Main("s")
	// The run lasts until the observer has seen 50 changes (a loaded machine
	// needs longer than a quiet one), 30 s at most.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			obs.mu.Lock()
			enough := obs.changes >= 50
			obs.mu.Unlock()
			if enough {
				cancel()
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if i%2 == 0 {
				mr.SetError("LOADING Redis is loading the dataset in memory")
			} else {
				mr.SetError("")
			}
			time.Sleep(time.Millisecond)
		}
	})
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				s.Reserve(context.Background(), owner, nil)
			}
		})
	}
	wg.Wait()
	mr.SetError("")
	s.Reserve(context.Background(), owner, nil) // no operation is left telling

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.wrong) > 0 {
		t.Errorf("%d changes reported out of order, first: %s", len(obs.wrong), obs.wrong[0])
	}
	assert.Greater(t, obs.changes, 10)
	last := breakerOf(s, owner)
	assert.Equal(t, last, obs.last[0], "the observer's last change is the breaker's status")
}

// panicOnce is a recorder whose first BreakerChanged panics.
type panicOnce struct {
	recorder
	panicked bool
}

func (p *panicOnce) BreakerChanged(s store.BreakerStatus) {
	p.recorder.BreakerChanged(s)
	if !p.panicked {
		p.panicked = true
		panic("observer")
	}
}

// An observer that panics once does not keep later changes from it.
func TestBreakerChangesOutliveAPanickingObserver(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	obs := &panicOnce{}
	clk := redistest.NewClock(time.Now())
	s, err := store.NewRedis(c, storehooks.WithClock(store.Options{Partitions: 1, BreakerFailures: 1, Observer: obs}, clk.Now))
	require.NoError(t, err)
	owner, _ := identity.Main("s")
	mr.SetError("LOADING Redis is loading the dataset in memory")
	assert.Panics(t, func() { s.Reserve(context.Background(), owner, nil) })
	mr.SetError("")
	clk.Add(time.Second)
	assert.Equal(t, store.ReasonMissingState, s.Reserve(context.Background(), owner, nil).Reason)
	assert.Equal(t, []store.BreakerState{store.BreakerOpen, store.BreakerHalfOpen, store.BreakerClosed}, obs.states())
}

// stall holds every command for d before it goes to Redis, as a process
// too busy to run the caller's goroutine holds it.
type stall time.Duration

func (stall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d stall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(time.Duration(d))
		return next(ctx, cmd)
	}
}

func (stall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Deadlines the process missed because it was busy say nothing about Redis:
// a call whose goroutine comes back well after its deadline fails (the turn
// fails open) but does not count towards opening the breaker, while a Redis
// that does not answer opens it, on the same settings.
func TestABusyProcessDoesNotOpenTheBreaker(t *testing.T) {
	const opTimeout = 50 * time.Millisecond
	owner, _ := identity.Main("s")
	ctx := context.Background()

	mr, _ := redistest.Miniredis(t)
	busy := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = busy.Close() })
	busy.AddHook(stall(4 * opTimeout))
	s, err := store.NewRedis(busy, store.Options{OpTimeout: opTimeout, BreakerFailures: 2})
	require.NoError(t, err)
	for range 4 {
		res := s.Reserve(ctx, owner, nil)
		assert.Equal(t, store.ReasonStoreUnavailable, res.Reason)
		assert.ErrorIs(t, res.Err, context.DeadlineExceeded)
	}
	assert.Equal(t, store.BreakerClosed, breakerOf(s, owner).State, "a busy process")

	dead := blackHole(t, redis.Options{ContextTimeoutEnabled: true})
	s, err = store.NewRedis(dead, store.Options{OpTimeout: opTimeout, BreakerFailures: 2})
	require.NoError(t, err)
	// A call that comes back late on a loaded machine counts as starved,
	// not as a failure: it takes two timely ones to open the breaker.
	for calls := 0; breakerOf(s, owner).State != store.BreakerOpen; calls++ {
		require.Less(t, calls, 200, "a Redis that does not answer never opened the breaker")
		assert.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, owner, nil).Reason)
	}
}
