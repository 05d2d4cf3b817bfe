package session

import (
	"time"

	"github.com/contstore/contstore/internal/redisconn"
)

// Op names a session store operation, as observers see it.
type Op string

// Operations.
const (
	OpSave        Op = "save"
	OpSaveDurable Op = "save_durable"
	OpLoad        Op = "load"
	OpDelete      Op = "delete"
)

// Event describes one finished operation.
type Event struct {
	Op Op
	// ID is the session's id.
	ID string
	// Version is the head version the caller holds afterwards: for a save,
	// the session's Version (advanced on success and with ErrNotDurable,
	// unchanged otherwise); for a load, the loaded head's (0 on error);
	// 0 for a delete.
	Version uint64
	// Latency is the operation's duration as the caller saw it.
	Latency time.Duration
	// Err is the operation's error.
	Err error
}

// Observer sees each operation as it returns, and each change of the
// store's circuit breaker, in order. Its methods are called outside any
// lock and must be fast and safe for concurrent use.
type Observer interface {
	Observe(Event)
	BreakerChanged(BreakerStatus)
}

// BreakerStatus describes the store's circuit breaker as store.BreakerStatus
// does a partition's; its Partition is 0.
type BreakerStatus = redisconn.BreakerStatus
