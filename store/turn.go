package store

import "time"

// Turn tokens are seq*partitions + partition, where a partition's seq is a
// hybrid logical clock: the largest of its previous value + 1, the clock in
// ticks since turnEpoch, and the owner's current seq + 1. The Redis scripts
// compute the same with the server's clock (lua/reserve.lua).
const (
	turnEpochSeconds = 1735689600 // 2025-01-01T00:00:00Z
	ticksPerMilli    = 8
)

// nextSeq returns a partition's next sequence number.
func nextSeq(prev uint64, now time.Time, ownerTurn Turn, partitions int) uint64 {
	seq := prev + 1
	if ticks := clockTicks(now); ticks > seq {
		seq = ticks
	}
	if ownerTurn != 0 {
		if next := uint64(ownerTurn)/uint64(partitions) + 1; next > seq {
			seq = next
		}
	}
	return seq
}

func clockTicks(now time.Time) uint64 {
	us := now.UnixMicro() - turnEpochSeconds*1_000_000
	if us < 0 {
		return 0
	}
	return uint64(us) * ticksPerMilli / 1000
}
