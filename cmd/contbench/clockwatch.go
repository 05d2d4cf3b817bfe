package main

// The server's clock, watched: the store's scripts judge a call's deadline
// by the server's TIME (internal/lua/oplog.lua), and the store estimates that clock
// from its replies (internal/serverclock). A server clock that falls behind
// the estimate lets a call run after its caller gave up on it, and the
// checker then reports what the store did not do. A run whose server
// clock fell behind is therefore no verdict on the store.

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Clock watch settings: how often the server's clock is read, how long an
// observation shapes the estimate (the store's estimate follows a server
// clock within two of its one-second windows), and the lag below which a
// reading counts as on time (TIME has microseconds; the scripts compare
// milliseconds).
const (
	clockEvery     = 10 * time.Millisecond
	clockWindow    = 2 * time.Second
	clockTolerance = time.Millisecond
)

// clockWatch reads the clocks of a target's servers during a run and keeps
// the largest lag it saw: how far a server's clock read behind the best
// estimate of it, formed as the store forms its own from earlier readings.
type clockWatch struct {
	mu     sync.Mutex
	lag    time.Duration
	server string
	stop   context.CancelFunc
	done   sync.WaitGroup
}

// watchClocks starts reading the clock of each of c's servers (every master
// of a Cluster) every clockEvery, until finish; a nil c has none.
func watchClocks(ctx context.Context, c redis.UniversalClient) *clockWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &clockWatch{stop: cancel}
	watch := func(ctx context.Context, node *redis.Client) error {
		w.done.Go(func() { w.follow(ctx, node) })
		return nil
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, watch)
	case *redis.Client:
		_ = watch(ctx, c)
	}
	return w
}

// follow reads node's clock until ctx ends. A reading sent at s and
// answered at r (local clock) with server time t bounds the offset of the
// server's clock from the local one to [t-r, t-s]; the estimate is the
// largest lower bound of the last clockWindow, and t-s below it is a
// clock that read behind it by the difference.
func (w *clockWatch) follow(ctx context.Context, node *redis.Client) {
	type bound struct {
		at  time.Time
		low time.Duration
	}
	var recent []bound
	tick := time.NewTicker(clockEvery)
	defer tick.Stop()
	for {
		sent := time.Now()
		t, err := node.Time(ctx).Result()
		got := time.Now()
		if err == nil {
			recent = append(recent, bound{got, t.Sub(got)})
			for len(recent) > 1 && got.Sub(recent[0].at) > clockWindow {
				recent = recent[1:]
			}
			est := recent[0].low
			for _, b := range recent {
				est = max(est, b.low)
			}
			if behind := est - t.Sub(sent); behind > clockTolerance {
				w.saw(behind, node.Options().Addr)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *clockWatch) saw(lag time.Duration, server string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if lag > w.lag {
		w.lag, w.server = lag, server
	}
}

// finish stops the watch and returns the largest lag seen (0 for none) and
// the server that showed it. It may be called again.
func (w *clockWatch) finish() (time.Duration, string) {
	w.stop()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lag, w.server
}

// clockLagReason says why runs whose server clock lagged by lag
// milliseconds are no verdict on the store.
func clockLagReason(lag float64, server string) string {
	return "the clock of the Redis server at " + server + " fell " + strconv.FormatFloat(lag, 'f', 1, 64) +
		" ms behind this machine's during the runs, so calls could run after their deadline: violations found then are not the store's"
}
