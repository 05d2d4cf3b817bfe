package main

import (
	"fmt"
	"io"
)

// headline is what the report opens with: the deployment's hit rate
// against the best one process can do and against per-replica stores,
// and whether the shared store made any decision ground truth forbids.
// The baselines' figures are absent when they were not played.
type headline struct {
	HitRate                      float64  `json:"hit_rate"`
	OneReplicaHitRate            *float64 `json:"one_replica_hit_rate,omitempty"`
	RatioToOneReplica            *float64 `json:"ratio_to_one_replica,omitempty"`
	PerReplicaHitRate            *float64 `json:"per_replica_stores_hit_rate,omitempty"`
	PerReplicaWrongContinuations *int64   `json:"per_replica_stores_wrong_continuations,omitempty"`
	// Violations counts those of the shared-store runs, (a) and (b); Pass
	// says there are none.
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
	h := headline{HitRate: a.HitRate, Violations: a.Violations}
	if b := r.OneReplica; b != nil {
		h.OneReplicaHitRate = new(b.HitRate)
		h.Violations += b.Violations
		if b.HitRate > 0 {
			h.RatioToOneReplica = new(a.HitRate / b.HitRate)
		}
	}
	if c := r.PerReplica; c != nil {
		h.PerReplicaHitRate = new(c.HitRate)
		h.PerReplicaWrongContinuations = new(c.WrongContinuations)
	}
	h.Pass = h.Violations == 0
	h.Definitions = r.definitions(cfg)
	r.Headline = h

	if owners := int64(r.Owners); cfg.turns > 0 && cfg.turns < 2*owners {
		r.note("-turns %d over %d owners: each plays at most %d, and only an owner's second turn on can continue; "+
			"give more -turns or fewer -conversations", cfg.turns, owners, (cfg.turns+owners-1)/owners)
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
	runs := "(a)"
	if r.OneReplica != nil {
		runs = "(a) and (b)"
	}
	return append(defs, definition{"PASS", fmt.Sprintf("no violation, a decision of the shared store that ground truth "+
		"forbids, in %s; FAIL, and exit status 1, otherwise", runs)})
}

// writeHeadline prints the headline figures, then their definitions.
func (r *report) writeHeadline(w io.Writer) {
	h := &r.Headline
	verdict, runs := "PASS", "(a)"
	if !h.Pass {
		verdict = "FAIL"
	}
	if r.OneReplica != nil {
		runs = "(a) and (b)"
	}
	aligned(w, func(tw io.Writer) {
		hitRate := func(label string, x *runResult, more string) {
			fmt.Fprintf(tw, "hit rate %s\t%.3f\t%d of %d turns%s\n", label, x.HitRate, x.Continued, x.Turns, more)
		}
		hitRate(labelDeployment, &r.Run, "")
		if b := r.OneReplica; b != nil {
			hitRate(labelOneReplica, b, "")
			ratio := "-"
			if h.RatioToOneReplica != nil {
				ratio = fmt.Sprintf("%.3f", *h.RatioToOneReplica)
			}
			fmt.Fprintf(tw, "ratio (a)/(b)\t%s\t\n", ratio)
		}
		if c := r.PerReplica; c != nil {
			hitRate(labelPerReplica, c, fmt.Sprintf(", %d wrong continuations", c.WrongContinuations))
		}
		fmt.Fprintf(tw, "result\t%s\t%d violations in %s\n", verdict, h.Violations, runs)
	})
	fmt.Fprintln(w)
	for _, d := range h.Definitions {
		writeWrapped(w, d.Figure+": "+d.Meaning)
	}
}
