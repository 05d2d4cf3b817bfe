package main

import (
	"bytes"
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
	// Headline is the comparison the report opens with.
	Headline      headline     `json:"headline"`
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
	// Run is the deployment's run, (a); OneReplica and PerReplica are the
	// baselines (b) and (c), when played.
	Run        runResult    `json:"deployment"`
	OneReplica *runResult   `json:"one_replica,omitempty"`
	PerReplica *runResult   `json:"per_replica_stores,omitempty"`
	Redis      *redisStats  `json:"redis,omitempty"`
	Calibrate  *calibration `json:"calibrate,omitempty"`
	Notes      []string     `json:"notes,omitempty"`
}

// runResult is what one simulation delivered.
type runResult struct {
	// Label names the run: (a), (b) or (c). Namespace is where its state
	// lived on Redis.
	Label             string             `json:"label"`
	Namespace         string             `json:"namespace,omitempty"`
	Seconds           float64            `json:"duration_seconds"`
	Turns             int64              `json:"turns"`
	TurnsPerSecond    float64            `json:"turns_per_second"`
	StoreOpsPerSecond float64            `json:"store_ops_per_second"`
	Ops               map[string]opStats `json:"ops"`
	// Offered counts the reservations that offered a continuation;
	// Continued the turns the upstream continued. OfferRate and HitRate
	// are their fractions of the turns.
	Offered   int64   `json:"offered"`
	OfferRate float64 `json:"offer_rate"`
	Continued int64   `json:"continued"`
	HitRate   float64 `json:"hit_rate"`
	// Misses counts the turns that did not continue, by reason: the
	// store's, then the gateway's (origin elsewhere, forward fallback,
	// not found upstream, upstream failed, refused by the oracle).
	Misses       map[string]int64 `json:"misses"`
	Forwarding   forwardStats     `json:"forwarding"`
	Input        inputStats       `json:"input"`
	Records      map[string]int64 `json:"records"`
	AbortsMissed int64            `json:"aborts_missed"`
	FailOpen     int64            `json:"fail_open"`
	Errors       int64            `json:"errors"`
	FirstError   string           `json:"first_error,omitempty"`
	// Workload counts the workload's events; they depend only on the seed
	// and the workload flags.
	Workload map[string]int64 `json:"workload"`
	// IdleGapsCut counts the idle gaps cut short because every owner with
	// turns left was idle; the expiry of their state is not checked.
	IdleGapsCut int64 `json:"idle_gaps_cut_short"`
	Violations  int64 `json:"violations"`
	// WrongContinuations counts the violations that are continuations
	// ground truth forbids.
	WrongContinuations int64       `json:"wrong_continuations"`
	Examples           []violation `json:"violation_examples,omitempty"`
	State              *stateStats `json:"state,omitempty"`
	StateError         string      `json:"state_error,omitempty"`
}

// forwardStats describes the turns handed to the replica holding their
// continuation's socket.
type forwardStats struct {
	// Forwarded counts the turns forwarded; Fallbacks those served here
	// with the full context instead, because the directory lookup failed
	// (LookupErrors) or did not know the origin replica (UnknownOrigin).
	Forwarded     int64 `json:"forwarded"`
	Fallbacks     int64 `json:"fallbacks"`
	LookupErrors  int64 `json:"lookup_errors"`
	UnknownOrigin int64 `json:"unknown_origin"`
	// Lookup is the latency of the directory lookup each forwarded turn
	// (or fallback) makes; FirstLookupError the first lookup error.
	Lookup           opStats `json:"directory_lookup"`
	FirstLookupError string  `json:"first_lookup_error,omitempty"`
	// AnnounceErrors counts the replicas' failed announcements and
	// withdrawals.
	AnnounceErrors int64 `json:"announce_errors"`
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
// baseline; the saved fractions are of the full context.
type inputStats struct {
	ItemsSent          int64   `json:"items_sent"`
	ItemsFull          int64   `json:"items_full_context"`
	ItemsSaved         int64   `json:"items_saved"`
	ItemsSavedFraction float64 `json:"items_saved_fraction"`
	BytesSent          int64   `json:"bytes_sent"`
	BytesFull          int64   `json:"bytes_full_context"`
	BytesSaved         int64   `json:"bytes_saved"`
	BytesSavedFraction float64 `json:"bytes_saved_fraction"`
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
	return append(names, missOriginElsewhere, missForwardFallback, missNotFound, missUpstreamFailed, missRejected)
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

// eventLabel is how the table names a workload event.
func eventLabel(event string) string { return strings.ReplaceAll(event, "_", " ") }

// result sums the workers' figures into the result of the run.
func (s *sim) result(label string, workers []*worker, elapsed time.Duration) runResult {
	secs := elapsed.Seconds()
	res := runResult{
		Label:       label,
		Seconds:     secs,
		Turns:       s.turns.Load(),
		Continued:   s.continued.Load(),
		Ops:         map[string]opStats{},
		Misses:      map[string]int64{},
		Records:     map[string]int64{},
		Workload:    map[string]int64{},
		IdleGapsCut: s.sched.cutShort(),
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
		f := &res.Forwarding
		f.Forwarded += t.forwarded
		f.LookupErrors += t.lookupErrors
		f.UnknownOrigin += t.unknownOrigin
		if f.FirstLookupError == "" {
			f.FirstLookupError = t.firstLookupError
		}
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
	in.ItemsSavedFraction, in.BytesSavedFraction = share(in.ItemsSaved, in.ItemsFull), share(in.BytesSaved, in.BytesFull)
	res.Input = in

	var ops int64
	for op, name := range opNames {
		st := latencyStats(workers, secs, func(w *worker) *hdrhistogram.Histogram { return w.latency[op] })
		res.Ops[name] = st
		ops += st.Count
	}
	f := &res.Forwarding
	f.Fallbacks = f.LookupErrors + f.UnknownOrigin
	f.Lookup = latencyStats(workers, secs, func(w *worker) *hdrhistogram.Histogram { return w.lookup })
	f.AnnounceErrors = s.announceErrors.Load()
	res.Offered = res.Turns
	for _, r := range storeReasons {
		res.Offered -= res.Misses[string(r)]
	}
	res.TurnsPerSecond = perSecond(res.Turns, secs)
	res.StoreOpsPerSecond = perSecond(ops, secs)
	res.OfferRate, res.HitRate = share(res.Offered, res.Turns), share(res.Continued, res.Turns)

	s.oracle.mu.Lock()
	res.Violations, res.WrongContinuations, res.Examples = s.oracle.count, s.oracle.wrong, s.oracle.examples
	s.oracle.mu.Unlock()
	return res
}

// latencyStats merges the workers' histograms of one operation (hist
// picks a worker's) into its figures over secs seconds.
func latencyStats(workers []*worker, secs float64, hist func(*worker) *hdrhistogram.Histogram) opStats {
	h := hdrhistogram.New(1, maxLatencyMicros, 3)
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

// share returns part as a fraction of whole; 0 when whole is.
func share(part, whole int64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// table lays out labelled rows of values in columns.
type table struct {
	cols int // value columns
	rows [][]string
}

// section starts a group of rows; headers head the value columns.
func (t *table) section(name string, headers ...string) {
	for len(headers) < t.cols {
		headers = append(headers, "") // keeps the line in the column blocks
	}
	t.rows = append(t.rows, append([]string{name}, headers...))
}

// row adds a row under the current section.
func (t *table) row(label string, values ...string) {
	t.rows = append(t.rows, append([]string{"  " + label}, values...))
}

// write prints the table.
func (t *table) write(w io.Writer) {
	aligned(w, func(tw io.Writer) {
		for _, r := range t.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
	})
}

// aligned prints to w the tab-separated lines fill writes, their columns
// aligned and no padding left at their ends.
func aligned(w io.Writer, fill func(tw io.Writer)) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	fill(tw)
	_ = tw.Flush()
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
}

// runs returns the simulations the report covers.
func (r *report) runs() []*runResult {
	runs := []*runResult{&r.Run}
	for _, b := range []*runResult{r.OneReplica, r.PerReplica} {
		if b != nil {
			runs = append(runs, b)
		}
	}
	return runs
}

// write prints the report: the headline and its definitions, then every
// figure as a table, then the violation examples and, with notes, the
// notes.
func (r *report) write(w io.Writer, notes bool) {
	r.writeHeadline(w)
	fmt.Fprintf(w, "\ncontbench: %s, %d replicas, %d workers, %d conversations (%d owners), upstream %s, routing %s",
		r.Target, r.Replicas, r.Concurrency, r.Conversations, r.Owners, r.Upstream, r.Routing)
	if r.Forward {
		fmt.Fprint(w, ", forwarding")
	}
	fmt.Fprintf(w, ", seed %d\n\n", r.Seed)

	runs := r.runs()
	t := table{cols: len(runs)}
	each := func(label string, f func(*runResult) string) {
		values := make([]string, len(runs))
		for i, run := range runs {
			values[i] = f(run)
		}
		t.row(label, values...)
	}
	headers := make([]string, len(runs))
	for i, run := range runs {
		headers[i] = run.Label
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
			return latencyString(x.Ops[op])
		})
	}
	each("directory lookup per forwarded turn", func(x *runResult) string { return latencyString(x.Forwarding.Lookup) })

	t.section("continuation")
	each("hit rate", func(x *runResult) string {
		return fmt.Sprintf("%.3f (%d of %d turns)", x.HitRate, x.Continued, x.Turns)
	})
	each("offered by the store", func(x *runResult) string {
		return fmt.Sprintf("%.3f (%d turns)", x.OfferRate, x.Offered)
	})
	each("forwarded to origin", func(x *runResult) string { return fmt.Sprint(x.Forwarding.Forwarded) })
	each("forward fallbacks", func(x *runResult) string {
		f := x.Forwarding
		return fmt.Sprintf("%d (%d lookup errors, %d unknown)", f.Fallbacks, f.LookupErrors, f.UnknownOrigin)
	})
	for _, m := range missOrder {
		each("miss: "+m, func(x *runResult) string { return fmt.Sprint(x.Misses[m]) })
	}

	t.section("input sent upstream vs full context")
	each("items", func(x *runResult) string {
		return fmt.Sprintf("%d of %d, saved %.3f", x.Input.ItemsSent, x.Input.ItemsFull, x.Input.ItemsSavedFraction)
	})
	each("bytes", func(x *runResult) string {
		return fmt.Sprintf("%s of %s, saved %.3f", bytesString(x.Input.BytesSent), bytesString(x.Input.BytesFull),
			x.Input.BytesSavedFraction)
	})

	t.section("store")
	for _, o := range outcomeOrder {
		each("record: "+string(o), func(x *runResult) string { return fmt.Sprint(x.Records[string(o)]) })
	}
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
		each(eventLabel(e), func(x *runResult) string { return fmt.Sprint(x.Workload[e]) })
	}

	t.section("oracle")
	each("violations", func(x *runResult) string { return fmt.Sprint(x.Violations) })
	each("of which wrong continuations", func(x *runResult) string { return fmt.Sprint(x.WrongContinuations) })
	each("idle gaps cut short", func(x *runResult) string { return fmt.Sprint(x.IdleGapsCut) })

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
		t.row("store ops/s (main run)", fmt.Sprintf("%.0f = %.3f of the EVALSHA ceiling", c.StorePerSecond, c.FractionOfEvalsha))
	}
	t.write(w)

	for _, run := range runs {
		if run.FirstError != "" {
			fmt.Fprintf(w, "\nfirst store error (%s): %s\n", run.Label, run.FirstError)
		}
		if e := run.Forwarding.FirstLookupError; e != "" {
			fmt.Fprintf(w, "\nfirst directory lookup error (%s): %s\n", run.Label, e)
		}
		if run.StateError != "" {
			fmt.Fprintf(w, "\nreading the store's state (%s): %s\n", run.Label, run.StateError)
		}
		if run.Violations == 0 {
			continue
		}
		if run == r.PerReplica {
			fmt.Fprintf(w, "\n%s: %d violations, expected (they do not fail the run); the first %d:\n",
				run.Label, run.Violations, len(run.Examples))
		} else {
			fmt.Fprintf(w, "\nVIOLATIONS (%s): %d; the first %d:\n", run.Label, run.Violations, len(run.Examples))
		}
		for i, v := range run.Examples {
			fmt.Fprintf(w, "  %d. %s: %s turn %d on %s: expected %s; got %s\n", i+1, v.Kind, v.Owner, v.Turn, v.Replica, v.Expected, v.Got)
		}
	}
	if notes && len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			writeWrapped(w, "note: "+n)
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

// wrapWidth is the width the report wraps its prose lines to.
const wrapWidth = 100

// writeWrapped prints text as lines of at most wrapWidth bytes where its
// words allow, the lines after the first indented.
func writeWrapped(w io.Writer, text string) {
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) > wrapWidth:
			fmt.Fprintln(w, line)
			line = "    " + word
		default:
			line += " " + word
		}
	}
	fmt.Fprintln(w, line)
}

// latencyString gives the percentiles of s, "-" when it has none.
func latencyString(s opStats) string {
	if s.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("%d / %d / %d / %d / %d", s.P50, s.P90, s.P99, s.P999, s.Max)
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
