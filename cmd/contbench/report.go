package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/contstore/contstore/store"
)

// report is everything a run found; the table and the JSON file show the
// same figures.
type report struct {
	Target        string       `json:"target"`
	Namespace     string       `json:"namespace,omitempty"`
	Seed          uint64       `json:"seed"`
	Replicas      int          `json:"replicas"`
	Concurrency   int          `json:"concurrency"`
	Conversations int          `json:"conversations"`
	Owners        int          `json:"owners"`
	Sockets       int          `json:"sockets_per_replica"`
	Upstream      upstreamMode `json:"upstream"`
	Routing       routing      `json:"routing"`
	Forward       bool         `json:"forward"`
	TTLSeconds    float64      `json:"ttl_seconds"`
	Partitions    int          `json:"partitions"`
	Run           runResult    `json:"run"`
	Compare       *runResult   `json:"compare,omitempty"`
	Redis         *redisStats  `json:"redis,omitempty"`
	Calibrate     *calibration `json:"calibrate,omitempty"`
	Notes         []string     `json:"notes,omitempty"`
}

// runResult is what one simulation delivered.
type runResult struct {
	// Stores says which stores the replicas used.
	Stores            string             `json:"stores"`
	Seconds           float64            `json:"duration_seconds"`
	Turns             int64              `json:"turns"`
	TurnsPerSecond    float64            `json:"turns_per_second"`
	StoreOpsPerSecond float64            `json:"store_ops_per_second"`
	Ops               map[string]opStats `json:"ops"`
	// Offered counts the reservations that offered a continuation;
	// Continued the turns the upstream continued.
	Offered   int64   `json:"offered"`
	Continued int64   `json:"continued"`
	HitRate   float64 `json:"hit_rate"`
	// Misses counts the turns that did not continue, by reason: the
	// store's, then the gateway's (origin elsewhere, not found upstream,
	// upstream failed, refused by the oracle).
	Misses       map[string]int64 `json:"misses"`
	Forwarded    int64            `json:"forwarded"`
	Input        inputStats       `json:"input"`
	Records      map[string]int64 `json:"records"`
	AbortsMissed int64            `json:"aborts_missed"`
	FailOpen     int64            `json:"fail_open"`
	Errors       int64            `json:"errors"`
	FirstError   string           `json:"first_error,omitempty"`
	Workload     map[string]int64 `json:"workload"`
	Violations   int64            `json:"violations"`
	Examples     []violation      `json:"violation_examples,omitempty"`
	State        *stateStats      `json:"state,omitempty"`
	StateError   string           `json:"state_error,omitempty"`
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

// inputStats compares the input sent upstream with a full-context
// baseline.
type inputStats struct {
	ItemsSent     int64   `json:"items_sent"`
	ItemsFull     int64   `json:"items_full_context"`
	ItemsSaved    int64   `json:"items_saved"`
	ItemsSavedPct float64 `json:"items_saved_pct"`
	BytesSent     int64   `json:"bytes_sent"`
	BytesFull     int64   `json:"bytes_full_context"`
	BytesSaved    int64   `json:"bytes_saved"`
	BytesSavedPct float64 `json:"bytes_saved_pct"`
}

// stateStats is what the store holds after a run (store.Stats).
type stateStats struct {
	Owners      int64 `json:"owners"`
	Published   int64 `json:"published"`
	StoredBytes int64 `json:"stored_bytes"`
	Evictions   struct {
		TTL    int64 `json:"ttl"`
		Owners int64 `json:"owners"`
		Bytes  int64 `json:"bytes"`
	} `json:"evictions"`
}

// redisStats are the Redis server's figures.
type redisStats struct {
	UsedMemoryBefore int64 `json:"used_memory_before"`
	UsedMemoryAfter  int64 `json:"used_memory_after"`
	// BytesPerOwner is the growth of used_memory over the main run, script
	// cache left out, per live owner; both samples are taken without the
	// replicas' connections.
	BytesPerOwner float64 `json:"used_memory_per_owner"`
	// Scripts is the server time of every script during the main run;
	// Reserve and Record are measured alone after it.
	Scripts scriptTime `json:"scripts_main_run"`
	Reserve scriptTime `json:"reserve_alone"`
	Record  scriptTime `json:"record_alone"`
}

// scriptTime is the server time spent in script calls (INFO commandstats
// of EVALSHA and EVAL).
type scriptTime struct {
	Calls       int64   `json:"calls"`
	Usec        int64   `json:"usec"`
	UsecPerCall float64 `json:"usec_per_call"`
}

// calibration compares the store's throughput with raw Redis ceilings.
type calibration struct {
	Seconds           float64 `json:"seconds_each"`
	PingPerSecond     float64 `json:"ping_per_second"`
	EvalshaPerSecond  float64 `json:"noop_evalsha_per_second"`
	StorePerSecond    float64 `json:"store_ops_per_second"`
	FractionOfEvalsha float64 `json:"fraction_of_evalsha"`
}

// newReport starts the report of a run of cfg on tgt.
func newReport(cfg *config, tgt *target) *report {
	return &report{
		Target:        tgt.desc,
		Namespace:     tgt.ns,
		Seed:          cfg.seed,
		Replicas:      cfg.replicas,
		Concurrency:   cfg.concurrency,
		Conversations: cfg.conversations,
		Owners:        cfg.conversations * (1 + cfg.agents),
		Sockets:       cfg.sockets,
		Upstream:      cfg.upstream,
		Routing:       cfg.routing,
		Forward:       cfg.forward,
		TTLSeconds:    cfg.ttl.Seconds(),
		Partitions:    cfg.partitions,
	}
}

// note adds a remark printed with the report.
func (r *report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// storeReasons are the reasons a reservation may give for not continuing.
var storeReasons = []store.Reason{
	store.ReasonMissingState, store.ReasonSupersededTurn, store.ReasonPromptChanged,
	store.ReasonNotAppendOnly, store.ReasonEmptyDelta, store.ReasonStoreUnavailable,
	store.ReasonDisabled, store.ReasonMissingIdentity,
}

// missOrder lists every reason of runResult.Misses in report order.
var missOrder = func() []string {
	var names []string
	for _, r := range storeReasons {
		names = append(names, string(r))
	}
	return append(names, missOriginElsewhere, missNotFound, missUpstreamFailed, missRejected)
}()

// outcomeOrder lists the record outcomes in report order.
var outcomeOrder = []store.Outcome{
	store.OutcomePublished, store.OutcomeGone, store.OutcomeStale, store.OutcomeDropped, store.OutcomeIgnored,
}

// eventOrder lists the workload events in report order.
var eventOrder = []string{
	eventPromptChange, eventEdit, eventCompaction, eventConcurrent,
	eventUpstreamFail, eventNoID, eventSocketLoss, eventIdle,
}

// result sums the workers' figures into the result of the run.
func (s *sim) result(label string, workers []*worker, elapsed time.Duration) runResult {
	secs := elapsed.Seconds()
	res := runResult{
		Stores:    label,
		Seconds:   secs,
		Turns:     s.turns.Load(),
		Continued: s.continued.Load(),
		Ops:       map[string]opStats{},
		Misses:    map[string]int64{},
		Records:   map[string]int64{},
		Workload:  map[string]int64{},
	}
	for _, m := range missOrder {
		res.Misses[m] = 0
	}
	for _, o := range outcomeOrder {
		res.Records[string(o)] = 0
	}
	for _, e := range eventOrder {
		res.Workload[e] = 0
	}
	var in inputStats
	for _, w := range workers {
		t := &w.tally
		for k, v := range t.misses {
			res.Misses[k] += v
		}
		for k, v := range t.outcomes {
			res.Records[string(k)] += v
		}
		for k, v := range t.events {
			res.Workload[k] += v
		}
		res.Forwarded += t.forwarded
		res.FailOpen += t.failOpen
		res.Errors += t.errors
		res.AbortsMissed += t.abortsMissed
		if res.FirstError == "" {
			res.FirstError = t.firstError
		}
		in.ItemsSent += t.itemsSent
		in.ItemsFull += t.itemsFull
		in.BytesSent += t.bytesSent
		in.BytesFull += t.bytesFull
	}
	in.ItemsSaved, in.BytesSaved = in.ItemsFull-in.ItemsSent, in.BytesFull-in.BytesSent
	in.ItemsSavedPct, in.BytesSavedPct = percent(in.ItemsSaved, in.ItemsFull), percent(in.BytesSaved, in.BytesFull)
	res.Input = in

	var ops int64
	for op, name := range opNames {
		h := hdrhistogram.New(1, maxLatencyMicros, 3)
		for _, w := range workers {
			h.Merge(w.latency[op])
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
		res.Ops[name] = st
		ops += st.Count
	}
	res.Offered = res.Turns
	for _, r := range storeReasons {
		res.Offered -= res.Misses[string(r)]
	}
	res.TurnsPerSecond = perSecond(res.Turns, secs)
	res.StoreOpsPerSecond = perSecond(ops, secs)
	if res.Turns > 0 {
		res.HitRate = float64(res.Continued) / float64(res.Turns)
	}

	s.oracle.mu.Lock()
	res.Violations, res.Examples = s.oracle.count, s.oracle.examples
	s.oracle.mu.Unlock()
	return res
}

// storeState reads what stores hold; shared stores are read once.
func storeState(ctx context.Context, stores []*store.Store, shared bool) (*stateStats, error) {
	if shared {
		stores = stores[:1]
	}
	st := &stateStats{}
	for _, s := range stores {
		stats, err := s.Stats(ctx)
		if err != nil {
			return nil, err
		}
		t := stats.Total
		st.Owners += t.Owners
		st.Published += t.Published
		st.StoredBytes += t.StoredBytes
		st.Evictions.TTL += t.Evictions.TTL
		st.Evictions.Owners += t.Evictions.Owners
		st.Evictions.Bytes += t.Evictions.Bytes
	}
	return st, nil
}

// perSecond returns n per second over secs seconds.
func perSecond(n int64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(n) / secs
}

// percent returns part as a percentage of whole.
func percent(part, whole int64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// table lays out labelled rows of values in columns.
type table struct {
	rows [][]string
}

// section starts a group of rows; headers head the value columns.
func (t *table) section(name string, headers ...string) {
	if len(headers) == 0 {
		headers = []string{""} // keeps the line in the column block
	}
	t.rows = append(t.rows, append([]string{name}, headers...))
}

// row adds a row under the current section.
func (t *table) row(label string, values ...string) {
	t.rows = append(t.rows, append([]string{"  " + label}, values...))
}

// write prints the table.
func (t *table) write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// runs returns the simulations the report covers.
func (r *report) runs() []*runResult {
	runs := []*runResult{&r.Run}
	if r.Compare != nil {
		runs = append(runs, r.Compare)
	}
	return runs
}

// write prints the report as a table, then the violation examples and
// the notes.
func (r *report) write(w io.Writer) {
	fmt.Fprintf(w, "contbench: %s, %d replicas, %d workers, %d conversations (%d owners), upstream %s, routing %s",
		r.Target, r.Replicas, r.Concurrency, r.Conversations, r.Owners, r.Upstream, r.Routing)
	if r.Forward {
		fmt.Fprint(w, ", forwarding")
	}
	fmt.Fprintf(w, ", seed %d\n\n", r.Seed)

	runs := r.runs()
	var t table
	each := func(label string, f func(*runResult) string) {
		values := make([]string, len(runs))
		for i, run := range runs {
			values[i] = f(run)
		}
		t.row(label, values...)
	}
	headers := make([]string, len(runs))
	for i, run := range runs {
		headers[i] = run.Stores
	}

	t.section("run", headers...)
	each("duration", func(x *runResult) string { return fmt.Sprintf("%.2f s", x.Seconds) })
	each("turns", func(x *runResult) string { return fmt.Sprint(x.Turns) })
	each("turns/s", func(x *runResult) string { return fmt.Sprintf("%.0f", x.TurnsPerSecond) })
	each("store ops/s", func(x *runResult) string { return fmt.Sprintf("%.0f", x.StoreOpsPerSecond) })
	for _, op := range opNames {
		each(op+" ops/s", func(x *runResult) string {
			return fmt.Sprintf("%.0f (%d calls)", x.Ops[op].PerSecond, x.Ops[op].Count)
		})
	}

	latencyHeaders := make([]string, len(runs))
	for i := range latencyHeaders {
		latencyHeaders[i] = "p50 / p90 / p99 / p99.9 / max"
	}
	t.section("latency µs", latencyHeaders...)
	for _, op := range opNames {
		each(op, func(x *runResult) string {
			s := x.Ops[op]
			if s.Count == 0 {
				return "-"
			}
			return fmt.Sprintf("%d / %d / %d / %d / %d", s.P50, s.P90, s.P99, s.P999, s.Max)
		})
	}

	t.section("continuation")
	each("hit rate", func(x *runResult) string {
		return fmt.Sprintf("%.1f%% (%d of %d turns)", 100*x.HitRate, x.Continued, x.Turns)
	})
	each("offered by the store", func(x *runResult) string {
		return fmt.Sprintf("%.1f%% (%d turns)", percent(x.Offered, x.Turns), x.Offered)
	})
	each("forwarded to origin", func(x *runResult) string { return fmt.Sprint(x.Forwarded) })
	for _, m := range missOrder {
		each("miss: "+m, func(x *runResult) string { return fmt.Sprint(x.Misses[m]) })
	}

	t.section("input sent upstream vs full context")
	each("items", func(x *runResult) string {
		return fmt.Sprintf("%d of %d (%d saved, %.1f%%)", x.Input.ItemsSent, x.Input.ItemsFull, x.Input.ItemsSaved, x.Input.ItemsSavedPct)
	})
	each("bytes", func(x *runResult) string {
		return fmt.Sprintf("%s of %s (%s saved, %.1f%%)", bytesString(x.Input.BytesSent), bytesString(x.Input.BytesFull),
			bytesString(x.Input.BytesSaved), x.Input.BytesSavedPct)
	})

	t.section("store")
	each("records", func(x *runResult) string {
		parts := make([]string, len(outcomeOrder))
		for i, o := range outcomeOrder {
			parts[i] = fmt.Sprintf("%s %d", o, x.Records[string(o)])
		}
		return strings.Join(parts, ", ")
	})
	each("aborts finding no current turn", func(x *runResult) string { return fmt.Sprint(x.AbortsMissed) })
	each("fail-open reservations", func(x *runResult) string { return fmt.Sprint(x.FailOpen) })
	each("errors", func(x *runResult) string { return fmt.Sprint(x.Errors) })
	each("owners / published", func(x *runResult) string {
		if x.State == nil {
			return "-"
		}
		return fmt.Sprintf("%d / %d (%s stored)", x.State.Owners, x.State.Published, bytesString(x.State.StoredBytes))
	})
	each("evictions ttl / owners / bytes", func(x *runResult) string {
		if x.State == nil {
			return "-"
		}
		e := x.State.Evictions
		return fmt.Sprintf("%d / %d / %d", e.TTL, e.Owners, e.Bytes)
	})

	t.section("workload")
	for _, e := range eventOrder {
		each(e, func(x *runResult) string { return fmt.Sprint(x.Workload[e]) })
	}

	t.section("oracle")
	each("violations", func(x *runResult) string { return fmt.Sprint(x.Violations) })

	if rs := r.Redis; rs != nil {
		t.section("redis server")
		t.row("used_memory before / after", fmt.Sprintf("%s / %s", bytesString(rs.UsedMemoryBefore), bytesString(rs.UsedMemoryAfter)))
		t.row("used_memory per live owner", fmt.Sprintf("%.0f B", rs.BytesPerOwner))
		t.row("script µs per call, main run", scriptString(rs.Scripts))
		t.row("reserve alone", scriptString(rs.Reserve))
		t.row("record alone", scriptString(rs.Record))
	}
	if c := r.Calibrate; c != nil {
		t.section(fmt.Sprintf("calibration (%.0f s each)", c.Seconds))
		t.row("PING ops/s", fmt.Sprintf("%.0f", c.PingPerSecond))
		t.row("no-op EVALSHA ops/s", fmt.Sprintf("%.0f", c.EvalshaPerSecond))
		t.row("store ops/s (main run)", fmt.Sprintf("%.0f = %.1f%% of the EVALSHA ceiling", c.StorePerSecond, 100*c.FractionOfEvalsha))
	}
	t.write(w)

	for _, run := range runs {
		if run.FirstError != "" {
			fmt.Fprintf(w, "\nfirst store error (%s): %s\n", run.Stores, run.FirstError)
		}
		if run.StateError != "" {
			fmt.Fprintf(w, "\nreading the store's state (%s): %s\n", run.Stores, run.StateError)
		}
		if run.Violations == 0 {
			continue
		}
		fmt.Fprintf(w, "\nVIOLATIONS (%s): %d; the first %d:\n", run.Stores, run.Violations, len(run.Examples))
		for i, v := range run.Examples {
			fmt.Fprintf(w, "  %d. %s: %s turn %d on %s: expected %s; got %s\n", i+1, v.Kind, v.Owner, v.Turn, v.Replica, v.Expected, v.Got)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}
}

// writeJSON writes the report to path as indented JSON.
func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the JSON report: %w", err)
	}
	return nil
}

// scriptString describes server time in scripts.
func scriptString(s scriptTime) string {
	return fmt.Sprintf("%.1f (%d calls)", s.UsecPerCall, s.Calls)
}

// bytesString returns n bytes in binary units.
func bytesString(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), "KMGTPE"
	i := -1
	for (v >= unit || v <= -unit) && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, suffix[i])
}
