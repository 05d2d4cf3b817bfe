package prommetrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/prommetrics"
)

// Wiring a store's metrics into a registry served by promhttp.
func Example() {
	reg := prometheus.NewRegistry()
	m := prommetrics.New(prommetrics.Options{})
	if err := m.Register(reg); err != nil {
		panic(err)
	}
	s, err := store.NewMemory(store.Options{Observer: m})
	if err != nil {
		panic(err)
	}
	reg.MustRegister(m.StatsCollector(s, time.Second))

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	owner, _ := identity.Main("session-42")
	req, _ := s.ParseRequest([]byte(`{"model":"m","input":["hi"]}`))
	res := s.Reserve(context.Background(), owner, req)
	_, _ = s.Abort(context.Background(), res)

	// What a scrape of /metrics shows: the non-zero counters and gauges,
	// leaving out the Stats call of the scrape itself (op="stats"), which
	// may be counted before or after the operations are collected.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	lines := bufio.NewScanner(rec.Body)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "#") || strings.HasSuffix(line, " 0") ||
			strings.Contains(line, "_duration_seconds") || strings.Contains(line, "breaker_state") || strings.Contains(line, `op="stats"`) {
			continue
		}
		fmt.Println(line)
	}
	// Output:
	// contstore_operations_total{op="abort",result="ok"} 1
	// contstore_operations_total{op="reserve",result="ok"} 1
	// contstore_reservations_total{reason="missing_state"} 1
	// contstore_stats_partition_limit_bytes 1.25e+06
	// contstore_stats_partition_limit_owners 625
	// contstore_stats_partitions 16
	// contstore_stats_up 1
}
