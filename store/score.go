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
// entry and TTL: when they were refreshed a sixteenth of the TTL ago or
// earlier, in whole milliseconds as internal/lua/lru.lua reckons.
func (s score) refreshDue(now time.Time, ttl time.Duration) bool {
	return s < packScore(time.UnixMilli(now.UnixMilli()-ttl.Milliseconds()/16+1), false, 0)
}

// withContent returns s with its touch kept and its published bit and
// size replaced.
func (s score) withContent(published bool, size int64) score {
	return s - s%scoreTimeUnit + packScore(time.UnixMilli(scoreEpochMillis), published, size)
}

// touched returns when the state was last touched.
func (s score) touched() time.Time { return time.UnixMilli(int64(s)/scoreTimeUnit + scoreEpochMillis) }
