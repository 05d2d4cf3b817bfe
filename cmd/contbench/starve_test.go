package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/embedded"
	"github.com/contstore/contstore/internal/redistest"
)

// starvedArgs is a run with tight operation deadlines, as on a busy
// machine: many calls reach the server after their caller gave up.
var starvedArgs = []string{"-seed", "7", "-turns", "600", "-conversations", "20", "-op-timeout", "100ms", "-baselines=false"}

// In a starved process (one P, busy goroutines beside the store's, and an
// embedded server that stalls one script call in four past the callers'
// deadline) the store's answers still agree with ground truth: the
// embedded server's clock is the wall clock at every command, so a call
// that runs after its caller gave up changes nothing.
func TestStarvedEmbeddedRunHasNoViolation(t *testing.T) {
	b := runStarved(t, func(mr *miniredis.Miniredis) func() { return embedded.FollowRealTime(mr) })
	require.NotEqual(t, exitUsage, b.code, "stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
	assert.Zero(t, b.report.Run.Violations, "violations: %+v", b.report.Run.Examples)
	assert.NotEqual(t, exitViolations, b.code, b.stdout)
	assert.Positive(t, b.report.Run.FailOpen, "the stalls made calls miss their deadline")
}

// The negative control: the same run on an embedded server whose clock
// lags the wall clock (it moves in steps of 250 ms, as a ticker of a
// starved process does) lets late calls take turns: the checker sees the
// violation, and the clock watch makes the run inconclusive rather than a
// verdict on the store.
// Whether a stalled call lands inside the lag is up to the scheduler, and
// on a loaded machine most calls fail open before they reach the server
// (a run then sees no violation about half the time, and more often
// beside other heavy jobs), so the control plays up to ten runs to see a
// violation; every run is inconclusive.
func TestStarvedRunOnALaggingClockShowsTheViolation(t *testing.T) {
	var violations int64
	for run := range 10 {
		b := runStarved(t, laggingClock)
		require.Equal(t, exitInconclusive, b.code, "stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
		require.Positive(t, b.report.ClockLagMillis)
		t.Logf("run %d: %d violations, %d turns failed open", run+1, b.report.Run.Violations, b.report.Run.FailOpen)
		if violations = b.report.Run.Violations; violations > 0 {
			break
		}
	}
	assert.Positive(t, violations, "a lagging clock lets late calls take turns")
}

// runStarved plays starvedArgs on an embedded server whose clock clock
// starts, in a process starved of CPU.
func runStarved(t *testing.T, clock func(*miniredis.Miniredis) (stop func())) bench {
	old := startEmbedded
	t.Cleanup(func() { startEmbedded = old })
	startEmbedded = func() (*miniredis.Miniredis, func(), error) {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		var calls atomic.Int64
		mr.Server().SetPreHook(func(_ *server.Peer, cmd string, _ ...string) bool {
			if (cmd == "EVALSHA" || cmd == "evalsha") && calls.Add(1)%4 == 0 {
				time.Sleep(150 * time.Millisecond) // past the callers' 100 ms
			}
			return false
		})
		stop := clock(mr)
		return mr, func() { stop(); mr.Close() }, nil
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := redistest.Burn(1)
	defer stop()
	return runBench(t, starvedArgs...)
}

// laggingClock sets mr's clock to the wall clock every 250 ms: between two
// steps TIME reads up to 250 ms behind.
func laggingClock(mr *miniredis.Miniredis) (stop func()) {
	mr.SetTime(time.Now())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.SetTime(now)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
