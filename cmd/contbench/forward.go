package main

// Forwarding: the replicas announce themselves in the directory, and a
// turn whose continuation lives on another replica's upstream socket is
// handed to the replica the directory names.

import (
	"context"
	"sync"
	"time"
)

// announce has every replica announce itself in the directory, as a
// proxy does at start, and keep the announcement alive; the returned
// function withdraws them. Failures are counted, not fatal: a replica the
// directory does not know is served around, as the proxy does.
func (s *sim) announce(ctx context.Context) (withdraw func()) {
	failed := func(error) { s.announceErrors.Add(1) }
	for _, r := range s.replicas {
		if err := s.dir.Announce(ctx, r.name, r.name); err != nil {
			failed(err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range s.replicas {
		wg.Go(func() {
			if err := s.dir.Run(ctx, r.name, r.name, failed); err != nil {
				failed(err)
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// forwardTarget returns the replica to hand a turn to whose continuation
// lives on the socket of replica origin, found as the proxy finds it: by
// looking origin up in the directory. It returns nil, and the turn is
// served here with the full context, when forwarding is off, the lookup
// fails, or the directory does not know origin.
func (w *worker) forwardTarget(ctx context.Context, origin string) *replica {
	s, t := w.sim, &w.tally
	if !s.cfg.forward {
		t.misses[missOriginElsewhere]++
		return nil
	}
	start := time.Now()
	addr, err := s.dir.Lookup(ctx, origin)
	recordLatency(w.lookup, time.Since(start))
	target := s.byName[addr] // a replica announces its name as its address
	switch {
	case err != nil:
		t.lookupErrors++
		if t.firstLookupError == "" {
			t.firstLookupError = err.Error()
		}
	case target == nil:
		t.unknownOrigin++
	default:
		return target
	}
	t.misses[missForwardFallback]++
	return nil
}
