//go:build linux

package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/contstore/contstore/internal/agentchat"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// BenchmarkGatewayBusy plays callers conversations at once through
// contproxy, enough to keep the process's CPUs busy, on the in-process
// store and on the standalone Redis, with and without the store's guesses
// (scripts/redis-env.sh; left out as in
// BenchmarkGateway without it). Each caller plays convs conversations of
// about 260 kB (busyItems items), each an opening request and turns
// measured turns, one request at a time.
//
// Metrics, per target T:
//   - T-fail-open: the share of reservations that failed open (the store
//     unavailable within its OpTimeout, or its breaker open);
//   - T-continued: the share of measured turns continued;
//   - T-turns/s: measured and opening turns a second;
//   - contproxy-redis-guessed, -guesses-overruled: the shares of measured
//     turns sent on a guess, and of those overruled;
//   - contproxy-redis/contproxy-continued (and …-no-guesses/…): the Redis
//     store's continued share over the in-process store's.
//
// Run with -benchtime 1x; see BENCHMARKS.md.
func BenchmarkGatewayBusy(b *testing.B) {
	rc := gatewayRedis(b)
	for b.Loop() {
		fake := httptest.NewServer(fakeupstream.New(fakeupstream.Options{}))
		continued := map[string]float64{}
		targets := []string{"contproxy"}
		if rc != nil {
			targets = append(targets, "contproxy-redis", "contproxy-redis-no-guesses")
		}
		for _, name := range targets {
			var st *store.Store
			var err error
			obs := &failOpenCounter{}
			opts := store.Options{Replica: "bench", Observer: obs}
			if name == "contproxy" {
				st, err = store.NewMemory(opts)
			} else {
				opts.Namespace = redistest.Namespace(b)
				redistest.CleanupNamespace(b, rc, opts.Namespace)
				if name == "contproxy-redis" {
					opts.GuessOwners = gatewayGuessOwners
				}
				st, err = store.NewRedis(rc, opts)
			}
			if err != nil {
				b.Fatal(err)
			}
			continued[name] = runBusy(b, name, fake.URL, st, obs)
		}
		fake.Close()
		for _, name := range targets[1:] {
			b.ReportMetric(continued[name]/continued["contproxy"], name+"/contproxy-continued")
		}
	}
}

// The busy run's shape: callers at once, each playing convs conversations
// of busyItems items (about 260 kB) and turns measured turns.
const (
	busyCallers = 64
	busyConvs   = 2
	busyTurns   = 5
	busyItems   = 850
)

// failOpenCounter counts the reservations a store made and those that
// failed open.
type failOpenCounter struct {
	reserves, failedOpen atomic.Int64
}

func (f *failOpenCounter) Observe(ev store.Event) {
	if ev.Op != store.OpReserve {
		return
	}
	f.reserves.Add(1)
	if ev.Reason == store.ReasonStoreUnavailable {
		f.failedOpen.Add(1)
	}
}

func (f *failOpenCounter) BreakerChanged(store.BreakerStatus) {}

// runBusy plays the busy run through a Proxy on st in front of the fake
// upstream at upURL, reports its metrics under name and returns its
// continued share.
func runBusy(b *testing.B, name, upURL string, st *store.Store, obs *failOpenCounter) float64 {
	hu, err := NewHTTPUpstream(upURL+"/v1", nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Store: st, Upstream: hu})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	srv := httptest.NewServer(p)
	defer srv.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = busyCallers
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()

	history := agentchat.History(busyItems - 1)
	var measured atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for caller := range busyCallers {
		wg.Go(func() {
			for conv := range busyConvs {
				c := &gatewayConversation{
					b: b, client: client, url: srv.URL + "/v1/responses",
					session: fmt.Sprintf("busy-%s-%d-%d", name, caller, conv),
					items:   slices.Clone(history),
					fatalf: func(format string, args ...any) {
						b.Errorf(format, args...)
						runtime.Goexit()
					},
				}
				c.turn()
				for range busyTurns {
					c.turn()
					measured.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	// An opening request cannot continue: every continued turn is measured.
	stats := p.Stats()
	share := float64(stats.Continued) / float64(measured.Load())
	if st.Options().GuessOwners > 0 {
		b.ReportMetric(float64(stats.Guessed)/float64(measured.Load()), name+"-guessed")
		b.ReportMetric(float64(stats.GuessesOverruled)/float64(max(1, stats.Guessed)), name+"-guesses-overruled")
	}
	b.ReportMetric(float64(obs.failedOpen.Load())/float64(max(1, obs.reserves.Load())), name+"-fail-open")
	b.ReportMetric(share, name+"-continued")
	b.ReportMetric(float64(busyCallers*busyConvs*(busyTurns+1))/took.Seconds(), name+"-turns/s")
	return share
}
