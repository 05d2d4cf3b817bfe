package main

// The report as text: every run's figures in one table under the
// headline, then the errors, violations and notes.

import (
	"fmt"
	"io"
	"strings"
)

// write prints the report: the headline and its definitions, then every
// figure as a table, then the violation examples and, with notes, the
// notes.
func (r *report) write(w io.Writer, notes bool) {
	r.writeHeadline(w)
	fmt.Fprintf(w, "\ncontbench: %s, %d replicas, %d workers, %d conversations (%d owners), upstream %s, routing %s",
		r.Target, r.Replicas, r.Concurrency, r.Conversations, r.Owners, r.Upstream, r.Routing)
	if r.Alike > 1 {
		fmt.Fprintf(w, ", opening alike in groups of %d", r.Alike)
	}
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
		t.row("store ops/s (turns alone)", fmt.Sprintf("%.0f = %.3f of the EVALSHA ceiling", c.StoreAlonePerSecond, c.AloneFractionOfEvalsha))
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

// eventLabel is how the table names a workload event.
func eventLabel(event string) string { return strings.ReplaceAll(event, "_", " ") }

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
