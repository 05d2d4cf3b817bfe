package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// probeCalls is how many calls measure reserve and record alone.
const probeCalls = 2000

// probeBody and probeResult are the request and the answer of the turns
// of throwaway owners.
var (
	probeBody   = []byte(`{"model":"gpt-5","input":[{"type":"message","role":"user","content":"probe"}]}`)
	probeResult = store.Result{ResponseID: "resp_probe", Socket: store.Socket{ID: 1},
		Output: []json.RawMessage{json.RawMessage(`{"type":"message","role":"assistant","content":"ok"}`)}}
)

// preciseOwners is how many owners make the used memory per owner a
// precise figure.
const preciseOwners = 10000

// calibrateFor is how long each ceiling is measured.
const calibrateFor = 3 * time.Second

// measureServer fills in the report's Redis figures: used memory and
// script time over the main run, from before to now, then the server time
// of reserve and of record measured alone. Used memory is read with the
// replicas' connections closed, so that their buffers count for no owner;
// they are opened again afterwards.
func measureServer(ctx context.Context, cfg *config, tgt *target, before serverSample, rep *report) {
	tgt.disconnect()
	after, err := tgt.sampleClosed(ctx, before.clients)
	if err := tgt.connect(ctx, cfg); err != nil {
		tgt.disconnect()
		rep.note("reconnecting after the run: %v", err)
		return
	}
	if err != nil {
		rep.note("Redis figures unavailable: %v", err)
		return
	}
	rs := &redisStats{
		UsedMemoryBefore: before.usedMemory,
		UsedMemoryAfter:  after.usedMemory,
		Scripts:          after.scriptsSince(before),
	}
	if st := rep.Run.State; st != nil && st.Owners > 0 {
		rs.BytesPerOwner = float64(after.dataMemory()-before.dataMemory()) / float64(st.Owners)
		if st.Owners < preciseOwners {
			rep.note("used_memory per owner is rough with %d owners: the server's hash tables grow in steps; "+
				"give more -conversations for a precise figure", st.Owners)
		}
	}
	rs.Reserve, rs.Record, err = probeScripts(ctx, cfg, tgt)
	if err != nil {
		rep.note("measuring reserve and record alone: %v", err)
	}
	rep.Redis = rs
}

// sampleClosed samples the server once the connections just closed are
// gone: when no more than clients clients are connected, or after a
// second (other clients of the server may have come meanwhile).
func (t *target) sampleClosed(ctx context.Context, clients int64) (serverSample, error) {
	deadline := time.Now().Add(time.Second)
	for {
		s, err := t.sample(ctx)
		if err != nil || s.clients <= clients || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// probeScripts measures the server time of reserve and of record, each
// alone, on throwaway owners of the namespace: it publishes a continuation
// for each owner, then reserves a turn for each (consuming it), then
// records each of those turns.
func probeScripts(ctx context.Context, cfg *config, tgt *target) (reserve, record scriptTime, err error) {
	req, owners, err := probeTurns(tgt, "contbench-probe-", probeCalls)
	if err != nil {
		return reserve, record, err
	}
	stores := tgt.stores
	reservations := make([]*store.Reservation, probeCalls)
	var (
		failed   atomic.Int64
		firstErr error
		once     sync.Once
	)
	fail := func(err error) {
		failed.Add(1)
		once.Do(func() { firstErr = err })
	}
	reserveAll := func() {
		parallel(cfg.concurrency, probeCalls, func(i int) {
			reservations[i] = stores[i%len(stores)].Reserve(ctx, owners[i], req)
			if err := reservations[i].Err; err != nil {
				fail(err)
			}
		})
	}
	recordAll := func() {
		parallel(cfg.concurrency, probeCalls, func(i int) {
			if _, err := stores[i%len(stores)].Record(ctx, reservations[i], probeResult); err != nil {
				fail(err)
			}
		})
	}

	reserveAll()
	recordAll()
	s0, err0 := tgt.sample(ctx)
	reserveAll()
	s1, err1 := tgt.sample(ctx)
	recordAll()
	s2, err2 := tgt.sample(ctx)
	if err := errors.Join(err0, err1, err2); err != nil {
		return reserve, record, err
	}
	reserve, record = s1.scriptsSince(s0), s2.scriptsSince(s1)
	if n := failed.Load(); n > 0 {
		return reserve, record, fmt.Errorf("%d of %d calls failed, the first with: %w", n, 4*probeCalls, firstErr)
	}
	return reserve, record, nil
}

// probeTurns returns the request of the turns of throwaway owners, parsed
// as the stores parse it, and n such owners, their session ids prefix
// followed by a number.
func probeTurns(tgt *target, prefix string, n int) (*fingerprint.Request, []identity.Owner, error) {
	req, err := tgt.stores[0].ParseRequest(probeBody)
	if err != nil {
		return nil, nil, err
	}
	owners := make([]identity.Owner, n)
	for i := range owners {
		if owners[i], err = identity.Main(fmt.Sprintf("%s%d", prefix, i)); err != nil {
			return nil, nil, err
		}
	}
	return req, owners, nil
}

// parallel calls fn(i) for i in 0..n-1 from up to workers goroutines.
func parallel(workers, n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// calibrate measures raw Redis ceilings with the replicas' clients and the
// run's concurrency, PING and a no-op script, and compares the main run's
// store throughput with the script ceiling.
func calibrate(ctx context.Context, cfg *config, tgt *target, rep *report) *calibration {
	switch {
	case cfg.backend == backendMemory:
		rep.note("-calibrate measures Redis ceilings: it does not apply to the memory backend")
		return nil
	case len(tgt.clients) == 0: // reconnecting failed, as a note says
		return nil
	}
	n := len(tgt.clients)
	// The key only routes the no-op script (it touches nothing), so that a
	// cluster's masters share the load.
	key := func(g int) []string { return []string{fmt.Sprintf("%s:calibrate:{%d}", tgt.ns, g)} }
	noop := redis.NewScript("return 1")
	pingOp := func(ctx context.Context, g int) error { return tgt.clients[g%n].Ping(ctx).Err() }
	evalOp := func(ctx context.Context, g int) error { return noop.Run(ctx, tgt.clients[g%n], key(g)).Err() }
	if len(tgt.rclients) == n { // -client rueidis: the stores' own clients
		rnoop := rueidis.NewLuaScript("return 1")
		pingOp = func(ctx context.Context, g int) error {
			c := tgt.rclients[g%n]
			return c.Do(ctx, c.B().Ping().Build()).Error()
		}
		evalOp = func(ctx context.Context, g int) error { return rnoop.Exec(ctx, tgt.rclients[g%n], key(g), nil).Error() }
	}
	ping, pingFailed := throughput(ctx, cfg.concurrency, pingOp)
	eval, evalFailed := throughput(ctx, cfg.concurrency, evalOp)
	turns, turnsFailed, err := storeAlone(ctx, cfg, tgt)
	if err != nil {
		rep.note("calibration: turns alone: %v", err)
	}
	if pingFailed+evalFailed+turnsFailed > 0 {
		rep.note("calibration: %d PING, %d EVALSHA and %d turns failed", pingFailed, evalFailed, turnsFailed)
	}
	c := &calibration{
		Seconds:             calibrateFor.Seconds(),
		PingPerSecond:       ping,
		EvalshaPerSecond:    eval,
		StorePerSecond:      rep.Run.StoreOpsPerSecond,
		StoreAlonePerSecond: 2 * turns,
	}
	if eval > 0 {
		c.FractionOfEvalsha = c.StorePerSecond / eval
		c.AloneFractionOfEvalsha = c.StoreAlonePerSecond / eval
	}
	return c
}

// aloneOwners is how many owners storeAlone cycles through: enough that an
// owner's turns come further apart than OpTimeout, as conversations' do, so
// that no call's answer leaves its state (internal/lua/oplog.lua).
const aloneOwners = 10000

// storeAlone plays turns (a reserve, then a record that publishes) of
// aloneOwners throwaway owners on the replicas' stores, from the run's
// concurrency, for calibrateFor: the store's own throughput, without the
// workload's requests and checks. It returns the turns per second and the
// number that failed.
func storeAlone(ctx context.Context, cfg *config, tgt *target) (float64, int64, error) {
	req, owners, err := probeTurns(tgt, "contbench-alone-", aloneOwners)
	if err != nil {
		return 0, 0, err
	}
	next := make([]int, cfg.concurrency) // each goroutine's owners: g, g + concurrency, …
	turns, failed := throughput(ctx, cfg.concurrency, func(ctx context.Context, g int) error {
		o := owners[(g+next[g]*cfg.concurrency)%len(owners)]
		next[g]++
		s := tgt.stores[g%len(tgt.stores)]
		res := s.Reserve(ctx, o, req)
		if res.Err != nil {
			return res.Err
		}
		_, err := s.Record(ctx, res, probeResult)
		return err
	})
	return turns, failed, nil
}

// throughput calls op from workers goroutines (g is the goroutine's
// number) for calibrateFor and returns the successful calls per second and
// the number of failed ones.
func throughput(ctx context.Context, workers int, op func(ctx context.Context, g int) error) (float64, int64) {
	ctx, cancel := context.WithTimeout(ctx, calibrateFor)
	defer cancel()
	var ok, failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := op(ctx, g); err == nil {
					ok.Add(1)
				} else if ctx.Err() == nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return perSecond(ok.Load(), time.Since(start).Seconds()), failed.Load()
}
