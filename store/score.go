package store

import "time"

// An LRU score packs when a state was last touched, whether it holds a
// continuation and its stored bytes, as internal/lua/lru.lua does:
//
//	score = (touched_ms - scoreEpochMillis) * scoreTimeUnit + published * scorePublished + size
type score int64

const (
	scoreEpochMillis = turnEpochSeconds * 1000
	scoreTimeUnit    = 8192
	scorePublished   = 4096
	maxStateBytes    = scorePublished - 1
)

func packScore(touched time.Time, published bool, size int64) score {
	s := (touched.UnixMilli()-scoreEpochMillis)*scoreTimeUnit + min(size, maxStateBytes)
	if published {
		s += scorePublished
	}
	return score(s)
}

func (s score) published() bool { return s%scoreTimeUnit >= scorePublished }
func (s score) size() int64     { return int64(s%scoreTimeUnit) % scorePublished }

// idleBefore reports whether the state was touched before cutoff.
func (s score) idleBefore(cutoff time.Time) bool { return s < packScore(cutoff, false, 0) }

// refreshDue reports whether a reserve at now refreshes a live state's LRU
// entry and TTL, as internal/lua/reserve.lua reckons: once 15 ticks (a
// 256th of the TTL each) have passed since they were, counted modulo 256.
func (s score) refreshDue(now time.Time, ttl time.Duration) bool {
	return (refreshTick(now, ttl)-refreshTick(s.touched(), ttl)+256)%256 >= 15
}

// refreshTick returns the tick of t for ttl, as internal/lua/lru.lua's
// refresh_tick: the time since the scripts' epoch in 256ths of the TTL (at
// least a millisecond), modulo 256.
func refreshTick(t time.Time, ttl time.Duration) int64 {
	unit := max(ttl.Milliseconds()/256, 1)
	return (t.UnixMilli() - scoreEpochMillis) / unit % 256
}

// withContent returns s with its touch kept and its published bit and
// size replaced.
func (s score) withContent(published bool, size int64) score {
	return s - s%scoreTimeUnit + packScore(time.UnixMilli(scoreEpochMillis), published, size)
}

// touched returns when the state was last touched.
func (s score) touched() time.Time { return time.UnixMilli(int64(s)/scoreTimeUnit + scoreEpochMillis) }
