// Package prommetrics exports a continuation store's operations, circuit
// breakers and counters as Prometheus metrics.
//
// A [Metrics] is a [store.Observer]: pass it as store.Options.Observer (or
// compose it with others through [store.MultiObserver]) and register it with
// [Metrics.Register]. It counts what this process's store sees:
//
//	contstore_reservations_total{reason}          Reserve answers; reason "continued" when continuing
//	contstore_records_total{outcome}              Record outcomes; outcome "error" when Record failed
//	contstore_operations_total{op,result}         every operation; result "ok" or "error"
//	contstore_operation_duration_seconds{op}      latency as the caller saw it (histogram, 100µs to 1s)
//	contstore_evictions_total                     owners evicted by Reserve and Record
//	contstore_breaker_transitions_total{state}    circuit breaker changes, by the state entered
//	contstore_breakers_open                       partitions whose breaker is open or half-open
//
// Reservations answered without touching the store (Options.Disabled, a
// missing identity) and Records of a reservation without a turn report no
// event, so they are not counted.
//
// [Metrics.StatsCollector] adds what [store.Store.Stats] reads at each
// scrape:
//
//	contstore_stats_owners                        owner states stored, idle ones not yet pruned included
//	contstore_stats_stored_bytes                  stored-bytes estimate of those states
//	contstore_stats_published_continuations       states holding a continuation
//	contstore_stats_evictions_total{cause}        evictions since the namespace began: ttl, owners, bytes
//	contstore_stats_partitions                    number of partitions
//	contstore_stats_partition_limit_owners        each partition's share of MaxOwners
//	contstore_stats_partition_limit_bytes         each partition's share of MaxTotalBytes
//	contstore_stats_up                            1 when the last Stats call succeeded, else 0
//	contstore_stats_scrape_errors_total           failed Stats calls
//	contstore_breaker_state{partition,state}      1 for each partition's current breaker state, else 0
//
// On Redis the stats_ metrics describe the namespace that every replica
// shares: each replica exports the same values, so aggregate them with max,
// not sum, or collect them from one replica only. The breaker states are
// this process's own and are exported even when Stats fails.
//
// The namespace ("contstore" by default) and subsystem are set by
// [Options]. One Metrics serves one store; give each other store its own
// Metrics, with ConstLabels telling them apart.
//
// # Redis client instrumentation
//
// These metrics describe the store's operations. For the Redis client
// underneath (connection pool, command latency, traces), go-redis has its
// own OpenTelemetry instrumentation, github.com/redis/go-redis/extra/redisotel/v9,
// installed on the client before the store is opened:
//
//	client := redis.NewClient(&redis.Options{Addr: addr})
//	if err := redisotel.InstrumentTracing(client); err != nil {
//		return err
//	}
//	if err := redisotel.InstrumentMetrics(client); err != nil {
//		return err
//	}
//	s, err := store.NewRedis(client, store.Options{Observer: m})
//
// Both use the global OpenTelemetry providers unless given
// redisotel.WithTracerProvider or redisotel.WithMeterProvider; to see the
// client's metrics next to these, point the meter provider at a Prometheus
// exporter (go.opentelemetry.io/otel/exporters/prometheus) registered with
// the same registry. Spans record each command with its arguments by
// default, and the store's script arguments hold owner keys (session ids):
// pass redisotel.WithDBStatement(false) to InstrumentTracing to leave them
// out.
package prommetrics
