package main

import (
	"fmt"
	"io"
)

// headline is what the report opens with: the deployment's hit rate
// against the best one process can do and against per-replica stores,
// whether the shared store made any decision ground truth forbids, and
// whether the runs measured the store at all. The baselines' figures are
// absent when they were not played, and the ratio when (a) or (b) is no
// measurement.
type headline struct {
	// Result is PASS, FAIL or INCONCLUSIVE (decide); Inconclusive lists
	// the reasons runs are not a measurement of the store, also under FAIL.
	Result                       string         `json:"result"`
	Inconclusive                 []inconclusive `json:"inconclusive,omitempty"`
	HitRate                      float64        `json:"hit_rate"`
	OneReplicaHitRate            *float64       `json:"one_replica_hit_rate,omitempty"`
	RatioToOneReplica            *float64       `json:"ratio_to_one_replica,omitempty"`
	PerReplicaHitRate            *float64       `json:"per_replica_stores_hit_rate,omitempty"`
	PerReplicaWrongContinuations *int64         `json:"per_replica_stores_wrong_continuations,omitempty"`
	// Violations counts those of the shared-store runs, (a) and (b); Pass
	// says the result is PASS.
	Violations  int64        `json:"violations"`
	Pass        bool         `json:"pass"`
	Definitions []definition `json:"definitions"`
}

// definition says what a headline figure means.
type definition struct {
	Figure  string `json:"figure"`
	Meaning string `json:"meaning"`
}

// finish fills in the headline from the runs of cfg and adds the notes
// the runs call for.
func (r *report) finish(cfg *config) {
	a := &r.Run
	h := headline{HitRate: a.HitRate, Violations: a.Violations, Inconclusive: r.inconclusiveReasons()}
	if b := r.OneReplica; b != nil {
		h.OneReplicaHitRate = new(b.HitRate)
		h.Violations += b.Violations
		if b.HitRate > 0 && measured(a, h.Inconclusive) && measured(b, h.Inconclusive) {
			h.RatioToOneReplica = new(a.HitRate / b.HitRate)
		}
	}
	if c := r.PerReplica; c != nil {
		h.PerReplicaHitRate = new(c.HitRate)
		h.PerReplicaWrongContinuations = new(c.WrongContinuations)
	}
	h.Result = decide(h.Violations, h.Inconclusive)
	h.Pass = h.Result == resultPass
	h.Definitions = r.definitions(cfg)
	r.Headline = h

	if threads := int64(r.Threads); cfg.turns > 0 && cfg.turns < 2*threads {
		r.note("-turns %d over %d threads: each plays at most %d, and only a thread's second turn on can continue; "+
			"give more -turns or fewer -conversations", cfg.turns, threads, (cfg.turns+threads-1)/threads)
	}
	if !cfg.forward && a.Misses[missOriginElsewhere] > a.Turns/4 {
		r.note("%d turns of (a) could have continued on another replica's socket: forwarding (the default, -forward) or sticky routing lets them",
			a.Misses[missOriginElsewhere])
	}
	if a.Forwarding.Lookup.Count > 0 {
		r.note("directory lookup per forwarded turn: the origin replica's Lookup in the directory on the store's backend, " +
			"whose answers are cached in process as in the proxy; the network hop of a forwarded turn itself is measured " +
			"by the proxy's end-to-end tests, not here")
	}
	var cut, gaps, announce int64
	for _, run := range r.runs() {
		cut += run.IdleGapsCut
		gaps += run.Workload[eventIdle]
		announce += run.Forwarding.AnnounceErrors
	}
	if cut > 0 {
		r.note("%d of %d idle gaps were cut short at the end of a run, every owner with turns left being idle: "+
			"the expiry of the state after a gap longer than -ttl (%v) is checked on the others only; "+
			"a shorter -ttl or more -turns check more", cut, gaps, cfg.ttl)
	}
	if announce > 0 {
		r.note("%d directory announcements or withdrawals failed: the replicas they left out were served around", announce)
	}
}

// definitions defines each headline figure of the runs of cfg.
func (r *report) definitions(cfg *config) []definition {
	defs := []definition{{"hit rate", "turns sent as a continuation that the upstream accepted, over all turns"}}
	a := fmt.Sprintf("%d replicas behind a %s balancer share the store", cfg.replicas, cfg.routing)
	switch {
	case cfg.upstream == anySocket:
		a += "; the upstream keeps every response (store=true), so any socket continues it"
	case cfg.forward:
		a += "; a response lives only on its upstream socket (store=false), so a turn whose continuation is on " +
			"another replica's socket is forwarded there when the directory knows that replica"
	default:
		a += "; a response lives only on its upstream socket (store=false), and a turn whose continuation is on " +
			"another replica's socket is sent with the full context (-forward=false)"
	}
	defs = append(defs, definition{"(a) deployment", a})
	if b := r.OneReplica; b != nil {
		defs = append(defs,
			definition{"(b) one replica", fmt.Sprintf("the same workload (seed %d, %d conversations, %d turns) on one replica "+
				"with %d upstream sockets, as many as (a)'s replicas have: the best one process can do",
				cfg.seed, cfg.conversations, b.Turns, min(cfg.replicas*cfg.sockets, maxSockets))},
			definition{"ratio (a)/(b)", "the share of the one process's hit rate the deployment keeps"})
	}
	if r.PerReplica != nil {
		defs = append(defs,
			definition{"(c) per-replica stores", fmt.Sprintf("the same workload on %d replicas that each keep their own "+
				"in-process store, as single-process gateways do today", cfg.replicas)},
			definition{"wrong continuations", "continuations (c)'s stores offered that ground truth forbids, such as an " +
				"older response of the conversation (the upstream would lose turns); contbench sends the full context instead"})
	}
	return append(defs,
		definition{"PASS", fmt.Sprintf("no violation, a decision of the shared store that ground truth forbids, in %s, "+
			"and every run a measurement; FAIL, and exit status %d, with a violation; INCONCLUSIVE, and exit status %d, "+
			"when a run is not a measurement", r.sharedRuns(), exitViolations, exitInconclusive)},
		definition{"not a measurement", fmt.Sprintf("a run in which the store failed open on more than %.0f%% of the "+
			"reservations, or failed more than %.0f%% of the records and aborts: its figures describe how often the store "+
			"answered within -op-timeout (%v) on this machine, not what it decided; and every run when a Redis server's clock fell "+
			"behind this machine's, which lets calls run after their deadline", 100*maxFailedShare, 100*maxFailedShare, cfg.opTimeout)})
}

// sharedRuns names the shared-store runs of the report.
func (r *report) sharedRuns() string {
	if r.OneReplica != nil {
		return "(a) and (b)"
	}
	return "(a)"
}

// replayHint points from the synthetic workload to real traffic.
const replayHint = "your own traffic: contbench replay TRACE.jsonl replays captured requests through the store (contbench replay -h)"

// writeHeadline prints the headline figures and the result, then their
// definitions.
func (r *report) writeHeadline(w io.Writer) {
	h := &r.Headline
	aligned(w, func(tw io.Writer) {
		hitRate := func(label string, x *runResult, more string) {
			if !measured(x, h.Inconclusive) {
				more += ", not a measurement"
			}
			fmt.Fprintf(tw, "hit rate %s\t%.3f\t%d of %d turns%s\n", label, x.HitRate, x.Continued, x.Turns, more)
		}
		hitRate(labelDeployment, &r.Run, "")
		if b := r.OneReplica; b != nil {
			hitRate(labelOneReplica, b, "")
			r.writeRatio(tw)
		}
		if c := r.PerReplica; c != nil {
			hitRate(labelPerReplica, c, fmt.Sprintf(", %d wrong continuations", c.WrongContinuations))
		}
		r.writeResult(tw)
	})
	fmt.Fprintln(w)
	for _, d := range h.Definitions {
		writeWrapped(w, d.Figure+": "+d.Meaning)
	}
	writeWrapped(w, replayHint)
}

// writeRatio prints the ratio of (a)'s hit rate to (b)'s, or why there
// is none.
func (r *report) writeRatio(tw io.Writer) {
	h := &r.Headline
	switch {
	case h.RatioToOneReplica != nil:
		fmt.Fprintf(tw, "ratio (a)/(b)\t%.3f\t\n", *h.RatioToOneReplica)
	case !measured(&r.Run, h.Inconclusive) || !measured(r.OneReplica, h.Inconclusive):
		fmt.Fprintf(tw, "ratio (a)/(b)\t-\tnot shown: (a) and (b) are not both measurements\n")
	default:
		fmt.Fprintf(tw, "ratio (a)/(b)\t-\t\n")
	}
}

// writeResult prints the result line: PASS or FAIL with the violations,
// or INCONCLUSIVE with its reasons; under FAIL, the reasons follow.
func (r *report) writeResult(tw io.Writer) {
	h := &r.Headline
	if h.Result == resultInconclusive {
		text := reasonsSentence(h.Inconclusive)
		if h.Violations > 0 {
			text += fmt.Sprintf("; the %d violations in %s are no verdict on the store", h.Violations, r.sharedRuns())
		}
		fmt.Fprintf(tw, "result\t%s: %s\n", h.Result, text)
		return
	}
	fmt.Fprintf(tw, "result\t%s\t%d violations in %s\n", h.Result, h.Violations, r.sharedRuns())
	for _, reason := range h.Inconclusive {
		fmt.Fprintf(tw, "\t\talso: %s\n", reason.Reason)
	}
}
