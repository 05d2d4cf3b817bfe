package main

// A run's result: the workers' tallies and histograms summed into the
// figures of one simulation, with what the stores hold after it.

import (
	"context"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/contstore/contstore/store"
)

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

// storeState reads what stores, which share no state, hold between them.
func storeState(ctx context.Context, stores []*store.Store) (*stateStats, error) {
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
