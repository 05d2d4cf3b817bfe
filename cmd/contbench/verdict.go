package main

// The result of a report: PASS, FAIL or INCONCLUSIVE, from the oracle's
// violations and the reasons its runs are not a measurement of the store.

import (
	"fmt"
	"slices"
	"strings"
)

// Results, as the headline and the JSON report name them.
const (
	resultPass         = "PASS"
	resultFail         = "FAIL"
	resultInconclusive = "INCONCLUSIVE"
)

// maxFailedShare is the largest share of a run's reservations that may
// fail open, and of its records and aborts that may fail, for the run to
// measure the store: beyond it the figures describe how often the store
// answered within -op-timeout on this machine, not what it decided.
const maxFailedShare = 0.05

// Kinds of inconclusive reason.
const (
	// inconclusiveUnavailable: too many reservations failed open.
	inconclusiveUnavailable = "store_unavailable"
	// inconclusiveErrors: too many records and aborts failed.
	inconclusiveErrors = "store_errors"
	// inconclusiveClockBehind: a server's clock fell behind this machine's
	// (clockwatch.go).
	inconclusiveClockBehind = "server_clock_behind"
	// inconclusiveInterrupted: the run was interrupted before its turns
	// were played.
	inconclusiveInterrupted = "interrupted"
)

// overridesViolations says, for each kind of inconclusive reason, whether
// it makes violations no verdict on the store, so that the result is
// INCONCLUSIVE even with violations. Under a kind that does not, a
// violation makes the result FAIL: a decision ground truth forbids is
// wrong however many calls failed around it.
var overridesViolations = map[string]bool{
	inconclusiveUnavailable: false,
	inconclusiveErrors:      false,
	inconclusiveClockBehind: true,
	inconclusiveInterrupted: false,
}

// inconclusive is one reason a report's runs are not a measurement of the
// store.
type inconclusive struct {
	Kind string `json:"kind"`
	// Reason says what happened, in a short sentence.
	Reason string `json:"reason"`
	// Runs labels the runs it concerns; none means all of them.
	Runs []string `json:"runs,omitempty"`
	// OverridesViolations: violations are no verdict on the store under
	// this reason (overridesViolations).
	OverridesViolations bool `json:"overrides_violations"`
}

// newInconclusive returns a reason of kind concerning runs.
func newInconclusive(kind, reason string, runs ...string) inconclusive {
	return inconclusive{Kind: kind, Reason: reason, Runs: runs, OverridesViolations: overridesViolations[kind]}
}

// inconclusiveReasons returns every reason the runs of r are no
// measurement of the store. A new kind of reason is computed here and
// listed in overridesViolations.
func (r *report) inconclusiveReasons() []inconclusive {
	var reasons []inconclusive
	for _, c := range failureChecks {
		if reason, ok := c.check(r.runs()); ok {
			reasons = append(reasons, reason)
		}
	}
	if r.ClockLagMillis > 0 {
		reasons = append(reasons, newInconclusive(inconclusiveClockBehind, clockLagReason(r.ClockLagMillis, r.ClockLagServer)))
	}
	if r.interrupted != "" {
		reasons = append(reasons, newInconclusive(inconclusiveInterrupted, r.interrupted))
	}
	return reasons
}

// failureCheck finds the runs in which more than maxFailedShare of some
// store calls failed.
type failureCheck struct {
	kind string
	// calls names the calls; failed counts those of x that failed, and
	// all of them.
	calls  string
	failed func(x *runResult) (failed, all int64)
	// sentence is the reason, a format of the shares of failed calls.
	sentence string
}

// failureChecks are the checks of failed store calls.
var failureChecks = []failureCheck{
	{inconclusiveUnavailable, "reservations", func(x *runResult) (int64, int64) {
		return x.FailOpen, x.Ops[opNames[opReserve]].Count
	}, "the store was unavailable for %s (see -op-timeout)"},
	{inconclusiveErrors, "records and aborts", func(x *runResult) (int64, int64) {
		return x.Errors, x.Ops[opNames[opRecord]].Count + x.Ops[opNames[opAbort]].Count
	}, "the store failed %s (see -op-timeout and the first store error)"},
}

// check returns the reason the runs over the bound give, such as "the
// store was unavailable for 95.3% of reservations in (a), 94.0% in (b)
// (see -op-timeout)", and whether there is one.
func (c failureCheck) check(runs []*runResult) (inconclusive, bool) {
	var labels, shares []string
	for _, x := range runs {
		n, all := c.failed(x)
		f := share(n, all)
		if f <= maxFailedShare {
			continue
		}
		of := ""
		if len(shares) == 0 {
			of = " of " + c.calls
		}
		labels = append(labels, x.Label)
		shares = append(shares, fmt.Sprintf("%.1f%%%s in %s", 100*f, of, shortLabel(x.Label)))
	}
	if len(shares) == 0 {
		return inconclusive{}, false
	}
	return newInconclusive(c.kind, fmt.Sprintf(c.sentence, strings.Join(shares, ", ")), labels...), true
}

// shortLabel returns the letter of a run's label: "(a)" of "(a) deployment".
func shortLabel(label string) string {
	short, _, _ := strings.Cut(label, " ")
	return short
}

// decide returns the result of violations under reasons: FAIL with
// violations, unless a reason overrides them; INCONCLUSIVE with reasons;
// PASS otherwise.
func decide(violations int64, reasons []inconclusive) string {
	overridden := slices.ContainsFunc(reasons, func(r inconclusive) bool { return r.OverridesViolations })
	switch {
	case violations > 0 && !overridden:
		return resultFail
	case len(reasons) > 0:
		return resultInconclusive
	}
	return resultPass
}

// measured reports whether run x is a measurement of the store: no
// reason concerns it.
func measured(x *runResult, reasons []inconclusive) bool {
	return !slices.ContainsFunc(reasons, func(r inconclusive) bool {
		return len(r.Runs) == 0 || slices.Contains(r.Runs, x.Label)
	})
}

// reasonsSentence joins reasons into one sentence.
func reasonsSentence(reasons []inconclusive) string {
	texts := make([]string, len(reasons))
	for i, r := range reasons {
		texts[i] = r.Reason
	}
	return strings.Join(texts, "; ")
}
