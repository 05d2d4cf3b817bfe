package prommetrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/prommetrics"
)

var ctx = context.Background()

// errDown stands for any store failure.
var errDown = errors.New("redis down")

// testParser parses the tests' requests; the store parses them again under
// its own key.
var testParser, _ = fingerprint.New(fingerprint.V4(), fingerprint.Key{})

func parse(t *testing.T, body string) *fingerprint.Request {
	t.Helper()
	r, err := testParser.Parse([]byte(body))
	require.NoError(t, err)
	return r
}

func owner(t *testing.T, session string) identity.Owner {
	t.Helper()
	o, err := identity.Main(session)
	require.NoError(t, err)
	return o
}

func registered(t *testing.T, cs ...prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		require.NoError(t, reg.Register(c))
	}
	return reg
}

// A turn's life on the in-process store drives the reservation, record and
// operation counters and the latency histogram.
func TestObserverCountsATurn(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, m.Register(reg))
	s, err := store.NewMemory(store.Options{Observer: m, Replica: "gw-1"})
	require.NoError(t, err)
	o := owner(t, "s1")
	answer := store.Result{ResponseID: "resp_1", Socket: store.Socket{ID: 7},
		Output: []json.RawMessage{json.RawMessage(`"b"`)}}

	r1 := parse(t, `{"model":"m","input":["a"]}`)
	first := s.Reserve(ctx, o, r1)
	require.Equal(t, store.ReasonMissingState, first.Reason)
	got, err := s.Record(ctx, first, answer)
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, got)

	r2 := parse(t, `{"model":"m","input":["a","b","c"]}`)
	second := s.Reserve(ctx, o, r2)
	require.True(t, second.Continues())
	got, _ = s.Record(ctx, first, answer)
	require.Equal(t, store.OutcomeStale, got)
	aborted, err := s.Abort(ctx, second)
	require.NoError(t, err)
	require.True(t, aborted)

	third := s.Reserve(ctx, o, r2)
	require.Equal(t, store.ReasonMissingState, third.Reason)
	got, _ = s.Record(ctx, third, store.Result{}) // no response id
	require.Equal(t, store.OutcomeDropped, got)
	got, _ = s.Record(ctx, third, answer)
	require.Equal(t, store.OutcomeGone, got)
	require.NoError(t, s.Clear(ctx, o))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP contstore_reservations_total Reservations by reason: "continued" when the request continues, else why not.
# TYPE contstore_reservations_total counter
contstore_reservations_total{reason="continued"} 1
contstore_reservations_total{reason="disabled"} 0
contstore_reservations_total{reason="empty_delta"} 0
contstore_reservations_total{reason="full_context_retry"} 0
contstore_reservations_total{reason="missing_identity"} 0
contstore_reservations_total{reason="missing_state"} 2
contstore_reservations_total{reason="not_append_only"} 0
contstore_reservations_total{reason="prompt_changed"} 0
contstore_reservations_total{reason="store_unavailable"} 0
contstore_reservations_total{reason="superseded_turn"} 0
# HELP contstore_records_total Records by outcome; "error" when the store failed.
# TYPE contstore_records_total counter
contstore_records_total{outcome="dropped"} 1
contstore_records_total{outcome="error"} 0
contstore_records_total{outcome="gone"} 1
contstore_records_total{outcome="ignored"} 0
contstore_records_total{outcome="published"} 1
contstore_records_total{outcome="stale"} 1
`), "contstore_reservations_total", "contstore_records_total"))

	ops := map[string]float64{"reserve": 3, "record": 4, "abort": 1, "clear": 1}
	for _, op := range []string{"reserve", "record", "restore", "abort", "is_current", "clear", "inspect", "sweep", "stats"} {
		c, err := m.Metric("operations_total", op, "ok")
		require.NoError(t, err)
		assert.Equal(t, ops[op], testutil.ToFloat64(c), op)
	}
	assert.Equal(t, 9, testutil.CollectAndCount(m, "contstore_operation_duration_seconds"),
		"one latency series per operation")
	assert.Equal(t, uint64(3), sampleCount(t, reg, "contstore_operation_duration_seconds", "reserve"))
	assert.Equal(t, uint64(4), sampleCount(t, reg, "contstore_operation_duration_seconds", "record"))
	problems, err := testutil.CollectAndLint(m)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// sampleCount returns the number of observations of the histogram name
// with label op.
func sampleCount(t *testing.T, g prometheus.Gatherer, name, op string) uint64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return metric.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("no %s{op=%q}", name, op)
	return 0
}

// When Redis fails, Reserve fails open: the reservation counts as
// store_unavailable and the operation as an error, and the breaker's
// opening shows in the transitions and the open-breaker gauge.
func TestObserverCountsFailOpen(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	reg := registered(t, m)
	s, err := store.NewRedis(redistest.Failing(t), store.Options{Observer: m, BreakerFailures: 2, OpTimeout: time.Second})
	require.NoError(t, err)
	o := owner(t, "s1")
	r := parse(t, `{"input":["a"]}`)
	for range 3 {
		res := s.Reserve(ctx, o, r)
		require.Equal(t, store.ReasonStoreUnavailable, res.Reason)
	}
	_, err = s.Inspect(ctx, o)
	require.ErrorIs(t, err, store.ErrBreakerOpen)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP contstore_breaker_transitions_total Circuit breaker changes, by the state entered.
# TYPE contstore_breaker_transitions_total counter
contstore_breaker_transitions_total{state="closed"} 0
contstore_breaker_transitions_total{state="half_open"} 0
contstore_breaker_transitions_total{state="open"} 1
# HELP contstore_breakers_open Partitions whose circuit breaker is open or half-open.
# TYPE contstore_breakers_open gauge
contstore_breakers_open 1
`), "contstore_breaker_transitions_total", "contstore_breakers_open"))
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"reservations_total", []string{"store_unavailable"}, 3},
		{"operations_total", []string{"reserve", "error"}, 3},
		{"operations_total", []string{"reserve", "ok"}, 0},
		{"operations_total", []string{"inspect", "error"}, 1},
	} {
		metric, err := m.Metric(c.name, c.labels...)
		require.NoError(t, err)
		assert.Equal(t, c.want, testutil.ToFloat64(metric), "%s%v", c.name, c.labels)
	}
}

// A failed Record counts under outcome "error".
func TestObserverCountsFailedRecord(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	m.Observe(store.Event{Op: store.OpRecord, Err: errDown, Latency: time.Millisecond})
	c, err := m.Metric("records_total", "error")
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(c))
	c, err = m.Metric("operations_total", "record", "error")
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(c))
}

// Operations, reasons and outcomes the package does not know yet get their
// own series.
func TestObserverUnknownLabelValues(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	m.Observe(store.Event{Op: store.OpReserve, Reason: "brand_new"})
	m.Observe(store.Event{Op: "compact"})
	m.BreakerChanged(store.BreakerStatus{State: "tripped"})
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"reservations_total", []string{"brand_new"}},
		{"operations_total", []string{"compact", "ok"}},
		{"breaker_transitions_total", []string{"tripped"}},
	} {
		metric, err := m.Metric(c.name, c.labels...)
		require.NoError(t, err)
		assert.Equal(t, 1.0, testutil.ToFloat64(metric), "%s%v", c.name, c.labels)
	}
	open, err := m.Metric("breakers_open")
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(open), "an unknown state is not closed")
}

// Evictions reported by operations add up in evictions_total.
func TestObserverCountsEvictions(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	s, err := store.NewMemory(store.Options{Observer: m, Partitions: 1, MaxOwners: 2})
	require.NoError(t, err)
	for i := range 5 {
		s.Reserve(ctx, owner(t, fmt.Sprint("s", i)), nil)
	}
	c, err := m.Metric("evictions_total")
	require.NoError(t, err)
	assert.Equal(t, 3.0, testutil.ToFloat64(c))
}

// breakers_open counts the partitions whose last state is not closed.
func TestBreakersOpenGauge(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	gauge, err := m.Metric("breakers_open")
	require.NoError(t, err)
	status := func(p int, s store.BreakerState, opens int64) store.BreakerStatus {
		return store.BreakerStatus{Partition: p, State: s, Opens: opens}
	}
	for _, step := range []struct {
		st   store.BreakerStatus
		open float64
	}{
		{status(0, store.BreakerOpen, 1), 1},
		{status(1, store.BreakerOpen, 1), 2},
		{status(0, store.BreakerHalfOpen, 1), 2},
		{status(0, store.BreakerClosed, 1), 1},
		{status(1, store.BreakerHalfOpen, 1), 1},
		{status(1, store.BreakerOpen, 2), 1}, // the probe failed
		{status(1, store.BreakerHalfOpen, 2), 1},
		{status(1, store.BreakerClosed, 2), 0},
		{status(0, store.BreakerOpen, 2), 1},
	} {
		m.BreakerChanged(step.st)
		assert.Equal(t, step.open, testutil.ToFloat64(gauge), "after %+v", step.st)
	}
	for state, want := range map[store.BreakerState]float64{
		store.BreakerOpen: 4, store.BreakerHalfOpen: 3, store.BreakerClosed: 2,
	} {
		c, err := m.Metric("breaker_transitions_total", string(state))
		require.NoError(t, err)
		assert.Equal(t, want, testutil.ToFloat64(c), "every change counts: %s", state)
	}
}

// Observe is called on every operation: it allocates nothing for the
// store's own label values.
func TestObserveDoesNotAllocate(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	events := []store.Event{
		{Op: store.OpReserve, Reason: store.ReasonMissingState, Latency: time.Millisecond},
		{Op: store.OpReserve, Reason: store.ReasonStoreUnavailable, Err: errDown},
		{Op: store.OpRecord, Outcome: store.OutcomePublished, Evicted: 2},
		{Op: store.OpRecord, Err: errDown},
		{Op: store.OpClear},
	}
	allocs := testing.AllocsPerRun(100, func() {
		for _, ev := range events {
			m.Observe(ev)
		}
	})
	assert.Zero(t, allocs)
}

// Observe and BreakerChanged may run concurrently with each other and with
// scrapes.
func TestObserverConcurrent(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	reg := registered(t, m)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				m.Observe(store.Event{Op: store.OpReserve, Reason: store.ReasonMissingState, Evicted: 1})
				m.BreakerChanged(store.BreakerStatus{Partition: g, State: store.BreakerOpen, Opens: int64(i + 1)})
				m.BreakerChanged(store.BreakerStatus{Partition: g, State: store.BreakerClosed, Opens: int64(i + 1)})
				if i%100 == 0 {
					_, err := reg.Gather()
					assert.NoError(t, err)
				}
			}
		})
	}
	wg.Wait()
	for name, want := range map[string]float64{"evictions_total": 4000, "breakers_open": 0} {
		c, err := m.Metric(name)
		require.NoError(t, err)
		assert.Equal(t, want, testutil.ToFloat64(c), name)
	}
	c, err := m.Metric("reservations_total", "missing_state")
	require.NoError(t, err)
	assert.Equal(t, 4000.0, testutil.ToFloat64(c))
}

// Namespace, Subsystem and ConstLabels name every metric, so two stores'
// metrics can share a registry.
func TestOptionsNameTheMetrics(t *testing.T) {
	a := prommetrics.New(prommetrics.Options{Namespace: "gw", Subsystem: "cont", ConstLabels: prometheus.Labels{"store": "a"}})
	b := prommetrics.New(prommetrics.Options{Namespace: "gw", Subsystem: "cont", ConstLabels: prometheus.Labels{"store": "b"}})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, a.Register(reg))
	require.NoError(t, b.Register(reg))
	require.Error(t, a.Register(reg), "registering twice fails")
	a.BreakerChanged(store.BreakerStatus{State: store.BreakerOpen, Opens: 1})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gw_cont_breakers_open Partitions whose circuit breaker is open or half-open.
# TYPE gw_cont_breakers_open gauge
gw_cont_breakers_open{store="a"} 1
gw_cont_breakers_open{store="b"} 0
`), "gw_cont_breakers_open"))
}

type counting struct {
	mu              sync.Mutex
	events, changes int
}

func (c *counting) Observe(store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
}

func (c *counting) BreakerChanged(store.BreakerStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changes++
}

func TestMultiObserverPassesEveryCall(t *testing.T) {
	assert.Nil(t, store.MultiObserver())
	assert.Nil(t, store.MultiObserver(nil, nil))
	one := &counting{}
	assert.Same(t, one, store.MultiObserver(nil, one))

	two := &counting{}
	m := prommetrics.New(prommetrics.Options{})
	obs := store.MultiObserver(one, nil, m, two)
	obs.Observe(store.Event{Op: store.OpClear})
	obs.BreakerChanged(store.BreakerStatus{State: store.BreakerOpen, Opens: 1})
	for _, c := range []*counting{one, two} {
		assert.Equal(t, 1, c.events)
		assert.Equal(t, 1, c.changes)
	}
	c, err := m.Metric("operations_total", "clear", "ok")
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(c))
}
