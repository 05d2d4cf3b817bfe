package main

// What a worker counts: the misses, record outcomes and workload events of
// its turns, by name, and the order the report lists them in.

import "github.com/contstore/contstore/store"

// tally counts what one worker saw; the report sums them.
type tally struct {
	misses     map[string]int64
	outcomes   map[store.Outcome]int64
	events     map[string]int64
	forwarded  int64
	itemsSent  int64
	itemsFull  int64
	bytesSent  int64
	bytesFull  int64
	failOpen   int64
	errors     int64
	firstError string
	// abortsMissed counts aborts that found their turn no longer current.
	abortsMissed int64
	// lookupErrors and unknownOrigin count the forward fallbacks by cause;
	// firstLookupError is the first lookup error.
	lookupErrors, unknownOrigin int64
	firstLookupError            string
}

// storeReasons are the reasons a reservation may give for not continuing.
var storeReasons = []store.Reason{
	store.ReasonMissingState, store.ReasonSupersededTurn, store.ReasonPromptChanged,
	store.ReasonNotAppendOnly, store.ReasonEmptyDelta, store.ReasonStoreUnavailable,
	store.ReasonDisabled, store.ReasonMissingIdentity,
}

// Reasons, besides the store's, why a turn did not continue: the gateway
// had to send the full context after all. origin_elsewhere: the
// continuation lives on another replica's socket and the route policy does
// not forward it (forwarding is off);
// forward_fallback: forwarding is on but the directory lookup failed or
// did not know the origin replica.
const (
	missOriginElsewhere = "origin_elsewhere"
	missForwardFallback = "forward_fallback"
	missNotFound        = "previous_response_not_found"
	missUpstreamFailed  = "upstream_failed"
	missRejected        = "rejected_by_oracle"
)

// missOrder lists every reason of runResult.Misses in report order.
var missOrder = func() []string {
	var names []string
	for _, r := range storeReasons {
		names = append(names, string(r))
	}
	return append(names, missOriginElsewhere, missForwardFallback, missNotFound, missUpstreamFailed, missRejected)
}()

// outcomeOrder lists the record outcomes in report order.
var outcomeOrder = []store.Outcome{
	store.OutcomePublished, store.OutcomeGone, store.OutcomeStale, store.OutcomeDropped, store.OutcomeIgnored,
}

// Workload events, as the JSON report names them.
const (
	eventPromptChange = "prompt_changes"
	eventEdit         = "edits"
	eventCompaction   = "compactions"
	eventConcurrent   = "concurrent_pairs"
	eventUpstreamFail = "upstream_failures"
	eventNoID         = "lost_response_ids"
	eventSocketLoss   = "socket_losses"
	eventIdle         = "idle_gaps"
)

// eventOrder lists the workload events in report order.
var eventOrder = []string{
	eventPromptChange, eventEdit, eventCompaction, eventConcurrent,
	eventUpstreamFail, eventNoID, eventSocketLoss, eventIdle,
}
