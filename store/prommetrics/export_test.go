package prommetrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the series of the observer's metric name (without
// namespace) with the given label values.
func (m *Metrics) Metric(name string, labels ...string) (prometheus.Collector, error) {
	switch name {
	case "reservations_total":
		return m.reservations.GetMetricWithLabelValues(labels...)
	case "records_total":
		return m.records.GetMetricWithLabelValues(labels...)
	case "operations_total":
		return m.operations.GetMetricWithLabelValues(labels...)
	case "breaker_transitions_total":
		return m.transitions.GetMetricWithLabelValues(labels...)
	case "evictions_total":
		return m.evictions, nil
	case "breakers_open":
		return m.breakersOpen, nil
	}
	return nil, fmt.Errorf("no metric %q", name)
}
