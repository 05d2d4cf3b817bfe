// Package embedded runs an in-process Redis (miniredis) whose clock is the
// wall clock, for first runs without a Redis server.
package embedded

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// expiryEvery is how often expired keys go. miniredis walks and sorts every
// key to expire them, and a load test leaves tens of thousands of keys, so
// it is not done at every command.
const expiryEvery = 250 * time.Millisecond

// FollowRealTime makes mr's clock the wall clock, as a real server's is:
// TIME, and every time a command reads (PXAT, the TTLs it sets), read the
// wall clock at the command, however late a starved process runs it. The
// store's scripts judge a call's deadline by TIME, so a command that runs
// after its caller gave up sees that it did. miniredis only expires keys
// when told to, with FastForward, which takes the time since the last
// tick (250 ms, more while the process is starved) off every TTL, set
// during it or before: a key set between two ticks expires up to a tick
// before its TTL ends, and up to a tick after it. It returns a function
// that stops the expiry.
func FollowRealTime(mr *miniredis.Miniredis) (stop func()) {
	mr.SetTime(time.Time{}) // no set time: miniredis reads time.Now
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(expiryEvery)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
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
