// Package embedded runs an in-process Redis (miniredis) whose clock follows
// the wall clock, for first runs without a Redis server.
package embedded

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// FollowRealTime keeps mr's clock (TIME and key expiry) moving with the
// wall clock, as a real server's does: miniredis only expires keys when told
// to with FastForward. It returns a function that stops the clock.
func FollowRealTime(mr *miniredis.Miniredis) (stop func()) {
	last := time.Now()
	mr.SetTime(last)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.SetTime(now)
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
