package prommetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contstore/contstore/store"
)

// defaultNamespace is the metric namespace when Options.Namespace is empty.
const defaultNamespace = "contstore"

// defaultBuckets are the latency histogram's buckets, in seconds: from
// 100µs (an in-process store) to 1s (far past the default OpTimeout).
var defaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// Label values that are not a store constant.
const (
	// reasonContinued is the reason label of reservations that continue
	// (store.ReasonNone).
	reasonContinued = "continued"
	// outcomeError is the outcome label of Records that failed.
	outcomeError = "error"
	// resultOK and resultError are the result label of operations_total.
	resultOK    = "ok"
	resultError = "error"
)

// Options name the metrics.
type Options struct {
	// Namespace and Subsystem prefix every metric name, as in
	// contstore_reservations_total. Namespace defaults to "contstore";
	// Subsystem to none.
	Namespace string
	Subsystem string
	// ConstLabels are added to every metric, for example to tell two
	// stores of one process apart.
	ConstLabels prometheus.Labels
	// Buckets are the latency histogram's upper bounds in seconds; nil
	// means 100µs to 1s (.0001, .00025, .0005, ... .5, 1).
	Buckets []float64
}

// Metrics counts a store's operations and breaker changes. It is a
// store.Observer and a prometheus.Collector; its methods are safe for
// concurrent use.
type Metrics struct {
	opts Options

	reservations *prometheus.CounterVec
	records      *prometheus.CounterVec
	operations   *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	evictions    prometheus.Counter
	transitions  *prometheus.CounterVec
	breakersOpen prometheus.Gauge

	// The series of every known label value, resolved once so that
	// Observe does no label lookup; read-only after New.
	byReason  map[store.Reason]prometheus.Counter
	byOutcome map[store.Outcome]prometheus.Counter
	byOp      map[store.Op]opSeries
	byState   map[store.BreakerState]prometheus.Counter

	mu        sync.Mutex
	notClosed map[int]bool // partitions whose last state is not closed
}

// opSeries are one operation's series.
type opSeries struct {
	ok, failed prometheus.Counter
	latency    prometheus.Observer
}

var (
	knownOps = []store.Op{store.OpReserve, store.OpRecord, store.OpRestore, store.OpAbort, store.OpIsCurrent,
		store.OpClear, store.OpInspect, store.OpSweep, store.OpStats}
	knownReasons = []store.Reason{store.ReasonNone, store.ReasonDisabled, store.ReasonMissingIdentity,
		store.ReasonMissingState, store.ReasonSupersededTurn, store.ReasonPromptChanged,
		store.ReasonNotAppendOnly, store.ReasonEmptyDelta, store.ReasonFullContextRetry,
		store.ReasonStoreUnavailable}
	knownOutcomes = []store.Outcome{store.OutcomePublished, store.OutcomeStale, store.OutcomeGone,
		store.OutcomeDropped, store.OutcomeIgnored}
	knownStates = []store.BreakerState{store.BreakerClosed, store.BreakerOpen, store.BreakerHalfOpen}
)

// New returns the metrics, with every series of a known label value
// present at zero. Register them with Register and pass the Metrics as
// store.Options.Observer.
func New(opts Options) *Metrics {
	if opts.Namespace == "" {
		opts.Namespace = defaultNamespace
	}
	if opts.Buckets == nil {
		opts.Buckets = defaultBuckets
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: opts.Namespace, Subsystem: opts.Subsystem,
			Name: name, Help: help, ConstLabels: opts.ConstLabels}, labels)
	}
	m := &Metrics{
		opts: opts,
		reservations: counter("reservations_total",
			`Reservations by reason: "continued" when the request continues, else why not.`, "reason"),
		records: counter("records_total",
			`Records by outcome; "error" when the store failed.`, "outcome"),
		operations: counter("operations_total",
			"Store operations by operation and result (ok or error).", "op", "result"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: opts.Namespace, Subsystem: opts.Subsystem,
			Name: "operation_duration_seconds", Help: "Store operation latency as the caller saw it, failures included.",
			ConstLabels: opts.ConstLabels, Buckets: opts.Buckets}, []string{"op"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: opts.Namespace, Subsystem: opts.Subsystem,
			Name: "evictions_total", Help: "Owner states evicted by this process's reservations and records.",
			ConstLabels: opts.ConstLabels}),
		transitions: counter("breaker_transitions_total",
			"Circuit breaker changes, by the state entered.", "state"),
		breakersOpen: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: opts.Namespace, Subsystem: opts.Subsystem,
			Name: "breakers_open", Help: "Partitions whose circuit breaker is open or half-open.",
			ConstLabels: opts.ConstLabels}),
		byReason:  map[store.Reason]prometheus.Counter{},
		byOutcome: map[store.Outcome]prometheus.Counter{},
		byOp:      map[store.Op]opSeries{},
		byState:   map[store.BreakerState]prometheus.Counter{},
		notClosed: map[int]bool{},
	}
	for _, r := range knownReasons {
		m.byReason[r] = m.reservations.WithLabelValues(reasonLabel(r))
	}
	for _, o := range knownOutcomes {
		m.byOutcome[o] = m.records.WithLabelValues(string(o))
	}
	m.byOutcome[outcomeError] = m.records.WithLabelValues(outcomeError)
	for _, op := range knownOps {
		m.byOp[op] = m.series(op)
	}
	for _, s := range knownStates {
		m.byState[s] = m.transitions.WithLabelValues(string(s))
	}
	return m
}

func (m *Metrics) series(op store.Op) opSeries {
	return opSeries{
		ok:      m.operations.WithLabelValues(string(op), resultOK),
		failed:  m.operations.WithLabelValues(string(op), resultError),
		latency: m.duration.WithLabelValues(string(op)),
	}
}

func reasonLabel(r store.Reason) string {
	if r == store.ReasonNone {
		return reasonContinued
	}
	return string(r)
}

// Register registers the metrics with reg (prometheus.DefaultRegisterer
// when nil).
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	return reg.Register(m)
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.reservations, m.records, m.operations, m.duration,
		m.evictions, m.transitions, m.breakersOpen}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Observe implements store.Observer: it counts the operation, its result,
// its latency, Reserve's reason or Record's outcome and the owners it
// evicted. It takes no lock for the store's own operations, reasons and
// outcomes.
func (m *Metrics) Observe(ev store.Event) {
	s, ok := m.byOp[ev.Op]
	if !ok {
		s = m.series(ev.Op)
	}
	if ev.Err != nil {
		s.failed.Inc()
	} else {
		s.ok.Inc()
	}
	s.latency.Observe(ev.Latency.Seconds())
	switch ev.Op {
	case store.OpReserve:
		c, ok := m.byReason[ev.Reason]
		if !ok {
			c = m.reservations.WithLabelValues(reasonLabel(ev.Reason))
		}
		c.Inc()
	case store.OpRecord:
		outcome := ev.Outcome
		if ev.Err != nil {
			outcome = outcomeError
		}
		c, ok := m.byOutcome[outcome]
		if !ok {
			c = m.records.WithLabelValues(string(outcome))
		}
		c.Inc()
	}
	if ev.Evicted > 0 {
		m.evictions.Add(float64(ev.Evicted))
	}
}

// BreakerChanged implements store.Observer: it counts the transition and
// keeps breakers_open at the number of partitions whose last state is not
// closed.
func (m *Metrics) BreakerChanged(st store.BreakerStatus) {
	c, ok := m.byState[st.State]
	if !ok {
		c = m.transitions.WithLabelValues(string(st.State))
	}
	c.Inc()

	m.mu.Lock()
	defer m.mu.Unlock()
	if st.State == store.BreakerClosed {
		delete(m.notClosed, st.Partition)
	} else {
		m.notClosed[st.Partition] = true
	}
	m.breakersOpen.Set(float64(len(m.notClosed)))
}
