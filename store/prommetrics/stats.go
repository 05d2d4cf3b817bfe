package prommetrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contstore/contstore/store"
)

// statsCollector exports store.Stats at each scrape.
type statsCollector struct {
	s       *store.Store
	timeout time.Duration

	owners, storedBytes, published, evictions *prometheus.Desc
	partitions, limitOwners, limitBytes, up   *prometheus.Desc
	breakerState                              *prometheus.Desc
	scrapeErrors                              prometheus.Counter
}

// StatsCollector returns a collector that calls s.Stats, bounded by
// timeout (none when timeout <= 0; the store's OpTimeout bounds it anyway),
// each time it is collected, and exports the store's counters, limits and
// breaker states under the Metrics' names (see the package documentation).
// When Stats fails it exports stats_up 0, counts the failure in
// stats_scrape_errors_total and still exports the breaker states; it never
// panics. Register it once per store.
func (m *Metrics) StatsCollector(s *store.Store, timeout time.Duration) prometheus.Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(m.opts.Namespace, m.opts.Subsystem, name), help,
			labels, m.opts.ConstLabels)
	}
	return &statsCollector{
		s:       s,
		timeout: timeout,
		owners: desc("stats_owners",
			"Owner states stored, idle ones no operation has pruned yet included."),
		storedBytes: desc("stats_stored_bytes",
			"Stored-bytes estimate of the owner states."),
		published: desc("stats_published_continuations",
			"Owner states holding a continuation."),
		evictions: desc("stats_evictions_total",
			"Owner states evicted since the namespace began, by cause (ttl, owners, bytes).", "cause"),
		partitions: desc("stats_partitions",
			"Number of partitions."),
		limitOwners: desc("stats_partition_limit_owners",
			"Each partition's share of MaxOwners."),
		limitBytes: desc("stats_partition_limit_bytes",
			"Each partition's share of MaxTotalBytes."),
		up: desc("stats_up",
			"1 when the last Stats call succeeded, else 0."),
		breakerState: desc("breaker_state",
			"1 for the current state of each partition's circuit breaker, else 0.", "partition", "state"),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: m.opts.Namespace, Subsystem: m.opts.Subsystem,
			Name: "stats_scrape_errors_total", Help: "Stats calls that failed.", ConstLabels: m.opts.ConstLabels}),
	}
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.owners, c.storedBytes, c.published, c.evictions,
		c.partitions, c.limitOwners, c.limitBytes, c.up, c.breakerState} {
		ch <- d
	}
	c.scrapeErrors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	st, err := c.s.Stats(ctx) // holds the breakers even when it fails
	for _, b := range st.Breakers {
		p := strconv.Itoa(b.Partition)
		for _, state := range knownStates {
			v := 0.0
			if b.State == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.breakerState, prometheus.GaugeValue, v, p, string(state))
		}
	}
	if err != nil {
		c.scrapeErrors.Inc()
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		ch <- c.scrapeErrors
		return
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(c.up, 1)
	gauge(c.owners, float64(st.Total.Owners))
	gauge(c.storedBytes, float64(st.Total.StoredBytes))
	gauge(c.published, float64(st.Total.Published))
	gauge(c.partitions, float64(len(st.Partitions)))
	gauge(c.limitOwners, float64(st.OwnerLimit))
	gauge(c.limitBytes, float64(st.ByteLimit))
	ev := st.Total.Evictions
	for _, e := range []struct {
		cause string
		n     int64
	}{{"ttl", ev.TTL}, {"owners", ev.Owners}, {"bytes", ev.Bytes}} {
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(e.n), e.cause)
	}
	ch <- c.scrapeErrors
}
