package store

import (
	"time"

	"github.com/contstore/contstore/internal/serverclock"
)

// Turn tokens are seq*partitions + partition, where a partition's seq is a
// hybrid logical clock: the largest of its previous value + 1, the clock in
// microseconds since turnEpochSeconds, and the owner's current seq + 1. A
// reserve takes longer than a microsecond, so seq does not run ahead of the
// clock and stays larger than every earlier one even when the partition's
// data is lost. The Redis scripts compute seq with the server's clock
// (internal/lua/reserve.lua); the store composes the 64-bit token.
const turnEpochSeconds = serverclock.EpochMillis / 1000 // 2025-01-01T00:00:00Z, the scripts' epoch

// nextSeq returns a partition's next sequence number, given its previous
// one and the owner's current one (0 for none).
func nextSeq(prev uint64, now time.Time, ownerSeq uint64) uint64 {
	seq := max(prev+1, ownerSeq+1)
	if us := clockMicros(now); us > seq {
		seq = us
	}
	return seq
}

// clockMicros returns the microseconds from turnEpochSeconds to now, 0
// before it.
func clockMicros(now time.Time) uint64 {
	us := now.UnixMicro() - turnEpochSeconds*1_000_000
	if us < 0 {
		return 0
	}
	return uint64(us)
}

// turnOf returns the token of sequence number seq in partition p.
func turnOf(seq uint64, partitions, p int) Turn {
	return Turn(seq*uint64(partitions) + uint64(p))
}

// seqOf returns t's sequence number, and false when t is no token of
// partition p.
func seqOf(t Turn, partitions, p int) (uint64, bool) {
	if uint64(t)%uint64(partitions) != uint64(p) {
		return 0, false
	}
	return uint64(t) / uint64(partitions), true
}
