package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// scheduler hands owners to workers, one worker at a time per owner, and
// keeps parked owners aside until they wake. Once every owner with turns
// left is parked, with -turns bounding the run, it wakes them at once:
// their idle gaps are cut short rather than leave the run waiting.
type scheduler struct {
	mu       sync.Mutex
	rng      *rand.Rand // picks the next owner
	cutAtEnd bool
	free     []*owner
	parked   []*owner
	nextWake time.Time // the earliest wake of a parked owner
	busy     int       // owners a worker holds
	cut      int64     // idle gaps cut short
}

// take returns a free owner picked at random, waiting for one if need be;
// nil when every owner has played its turns or ctx ends first.
func (s *scheduler) take(ctx context.Context) *owner {
	for {
		s.mu.Lock()
		now := time.Now()
		stuck := s.cutAtEnd && len(s.free) == 0 && s.busy == 0
		if len(s.parked) > 0 && (stuck || !now.Before(s.nextWake)) {
			s.wake(now, stuck)
		}
		if n := len(s.free); n > 0 {
			i := s.rng.IntN(n)
			o := s.free[i]
			s.free[i] = s.free[n-1]
			s.free = s.free[:n-1]
			s.busy++
			s.mu.Unlock()
			return o
		}
		if s.busy == 0 && len(s.parked) == 0 {
			s.mu.Unlock()
			return nil
		}
		wait := time.Millisecond
		if len(s.parked) > 0 {
			wait = min(wait, s.nextWake.Sub(now))
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// wake frees the parked owners whose wake time has come, or all of them
// when all is set, cutting short the gaps of those still asleep.
func (s *scheduler) wake(now time.Time, all bool) {
	kept := s.parked[:0]
	s.nextWake = time.Time{}
	for _, o := range s.parked {
		if now.Before(o.wake) {
			if !all {
				kept = append(kept, o)
				if s.nextWake.IsZero() || o.wake.Before(s.nextWake) {
					s.nextWake = o.wake
				}
				continue
			}
			o.wakeEarly()
			s.cut++
		}
		s.free = append(s.free, o)
	}
	clear(s.parked[len(kept):])
	s.parked = kept
}

// put gives back o, which a worker took: for more turns, for turns from
// wake on when it went idle, or for none once it has played them all.
func (s *scheduler) put(o *owner, idle bool, wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy--
	switch {
	case o.left == 0:
	case idle:
		o.wake = wake
		if len(s.parked) == 0 || wake.Before(s.nextWake) {
			s.nextWake = wake
		}
		s.parked = append(s.parked, o)
	default:
		s.free = append(s.free, o)
	}
}

// cutShort returns how many idle gaps were cut short.
func (s *scheduler) cutShort() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cut
}
