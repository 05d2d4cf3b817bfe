// Package embedded runs an in-process Redis (miniredis) whose clock follows
// the wall clock, for first runs without a Redis server.
package embedded

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Clock periods. TIME, by which the store's scripts judge whether an
// owner's state is still live, follows the wall clock closely; key expiry,
// which only frees the memory of expired state, runs less often: miniredis
// walks and sorts every key to expire them, and a load test leaves tens of
// thousands of keys.
const (
	timeEvery   = 5 * time.Millisecond
	expiryEvery = 250 * time.Millisecond
)

// FollowRealTime keeps mr's clock (TIME and key expiry) moving with the
// wall clock, as a real server's does: miniredis only expires keys when told
// to with FastForward. Keys expire up to 250 ms late. It returns a function
// that stops the clock.
func FollowRealTime(mr *miniredis.Miniredis) (stop func()) {
	last := time.Now()
	mr.SetTime(last)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(timeEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.SetTime(now)
				if d := now.Sub(last); d >= expiryEvery {
					mr.FastForward(d)
					last = now
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
