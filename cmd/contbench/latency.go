package main

// Latency: the store operations timed, the histograms that hold their
// latencies, and the figures drawn from them.

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Store operations, as the latency figures name them.
const (
	opReserve = iota
	opRecord
	opAbort
	numOps
)

// opNames names the store operations.
var opNames = [numOps]string{"reserve", "record", "abort"}

// maxLatencyMicros is the largest latency the histograms hold; larger
// ones are recorded as this.
const maxLatencyMicros = 60_000_000

// newLatencyHistogram returns an empty histogram of latencies in
// microseconds.
func newLatencyHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, maxLatencyMicros, 3)
}

// observe records the latency of one store call.
func (w *worker) observe(op int, d time.Duration) {
	recordLatency(w.latency[op], d)
}

// recordLatency adds the latency d to h.
func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(min(max(d.Microseconds(), 1), maxLatencyMicros))
}

// opStats describes one store operation: how many, how fast, and its
// latency percentiles in microseconds.
type opStats struct {
	Count     int64   `json:"count"`
	PerSecond float64 `json:"per_second"`
	P50       int64   `json:"p50_us"`
	P90       int64   `json:"p90_us"`
	P99       int64   `json:"p99_us"`
	P999      int64   `json:"p99_9_us"`
	Max       int64   `json:"max_us"`
}

// latencyStats merges the workers' histograms of one operation (hist
// picks a worker's) into its figures over secs seconds.
func latencyStats(workers []*worker, secs float64, hist func(*worker) *hdrhistogram.Histogram) opStats {
	h := newLatencyHistogram()
	for _, w := range workers {
		h.Merge(hist(w))
	}
	st := opStats{
		Count: h.TotalCount(),
		P50:   h.ValueAtQuantile(50),
		P90:   h.ValueAtQuantile(90),
		P99:   h.ValueAtQuantile(99),
		P999:  h.ValueAtQuantile(99.9),
		Max:   h.Max(),
	}
	st.PerSecond = perSecond(st.Count, secs)
	return st
}
