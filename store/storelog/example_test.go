package storelog_test

import (
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storelog"
)

// An outage as the log shows it: the first failure of each operation,
// then one line every ten seconds counting the failures in between, and
// the breaker's opening and closing.
func Example() {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // keep the output stable
			}
			return a
		},
	}))
	obs := storelog.New(logger, storelog.Options{Now: func() time.Time { return now }})
	// In a gateway: store.NewRedis(client, store.Options{Observer: obs}).

	owner, _ := identity.Main("session-42")
	down := errors.New("store: unavailable: reserve: dial tcp 10.0.0.7:6379: connect: connection refused")
	reserve := store.Event{Op: store.OpReserve, Owner: owner, Reason: store.ReasonStoreUnavailable,
		Latency: 3 * time.Millisecond, Err: down}

	obs.BreakerChanged(store.BreakerStatus{Partition: 3, State: store.BreakerOpen, ConsecutiveFailures: 5, Opens: 1, Since: now})
	for range 40 {
		obs.Observe(reserve)
		now = now.Add(time.Second / 2)
	}
	obs.BreakerChanged(store.BreakerStatus{Partition: 3, State: store.BreakerClosed, Opens: 1, Since: now})
	obs.Observe(store.Event{Op: store.OpReserve, Owner: owner, Reason: store.ReasonMissingState}) // not logged
	// Output:
	// level=WARN msg="store circuit breaker opened" partition=3 state=open consecutive_failures=5 opens=1 suppressed=0
	// level=WARN msg="store unavailable: reservation fails open" op=reserve session=session-42 reason=store_unavailable latency=3ms error="store: unavailable: reserve: dial tcp 10.0.0.7:6379: connect: connection refused" suppressed=0
	// level=WARN msg="store unavailable: reservation fails open" op=reserve session=session-42 reason=store_unavailable latency=3ms error="store: unavailable: reserve: dial tcp 10.0.0.7:6379: connect: connection refused" suppressed=19
	// level=INFO msg="store circuit breaker closed" partition=3 state=closed consecutive_failures=0 opens=1 open_for=20s suppressed=0
}
