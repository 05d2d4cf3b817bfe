package session

import "time"

// NewMemoryOnClock returns an in-process store whose sessions expire by
// now, for the tests that move time.
func NewMemoryOnClock(opts Options, now func() time.Time) (*Store, error) {
	return newMemory(opts, now)
}
