package proxy

import "sync/atomic"

// Stats counts what the proxy did since it started.
type Stats struct {
	// Turns counts the turns served (POST /v1/responses, and
	// response.create on a client WebSocket), passthrough ones included,
	// each once however often it went upstream (full-context retries).
	Turns int64
	// Continued counts turns sent as a continuation and answered.
	Continued int64
	// FullContextRetries counts continuations the upstream refused,
	// resent with the full context.
	FullContextRetries int64
	// ContinuationsPaused counts turns that could have continued, sent
	// with the full context because the upstream refuses continuations
	// of their model (see Learning).
	ContinuationsPaused int64
	// ContinuationsUnreachable counts turns offered a continuation that
	// no connection they could take held any more, sent with the full
	// context: its socket had carried another conversation's turn (a
	// credential with more conversations in flight than
	// WebSocketOptions.Sockets), closed, or is another replica's while
	// forwarding is off.
	ContinuationsUnreachable int64
	// NotKeptUpstream counts turns with "store": false over the HTTP
	// transport without forwarding: the upstream keeps no response of
	// theirs, so they went with the full context and continue nothing.
	NotKeptUpstream int64
	// Passthrough counts turns that carried their own
	// previous_response_id or conversation, sent upstream as received.
	Passthrough int64
	// Endpoints counts the requests to other endpoints than the turns'
	// (GET /v1/models, POST /v1/files…), relayed upstream as sent.
	Endpoints int64
	// Unread counts the turns sent upstream as the client sent them, not
	// counted in Turns, because the proxy cannot read their body: one the
	// fingerprint refuses, or in a content coding it does not decode.
	Unread int64
	// UpstreamErrors counts turns the upstream could not be reached for,
	// or that it dropped.
	UpstreamErrors int64
	// ErrorAnswers counts turns the upstream answered with an error: an
	// HTTP error status (a 429, a 500…), a failed response or an error
	// event.
	ErrorAnswers int64
	// Forwarded counts turns handed to the replica holding their socket
	// and answered there; ForwardFailures those it could not take, served
	// here with the full context; ForwardedIn the turns this replica
	// carried for others.
	Forwarded, ForwardFailures, ForwardedIn int64
	// ItemsReceived and ItemsSent count input items in client requests
	// and in upstream requests (retries and guesses included); the input
	// of a request that keeps its conversation upstream, or of any under
	// NoContinuation, is not read and counts none.
	ItemsReceived, ItemsSent int64
	// BytesReceived and BytesSent count request body bytes from clients
	// and to the upstream (retries and guesses included).
	BytesReceived, BytesSent int64
	// RefusedBusy counts requests answered 503 because the bodies in
	// flight held the whole MaxBytesInFlight.
	RefusedBusy int64
	// TooLarge counts requests answered 413: a body over MaxBodyBytes (a
	// turn) or MaxPassthroughBytes (another endpoint).
	TooLarge int64
	// Guessed counts turns sent upstream on a guess while the store
	// reserved them (store.Options.GuessOwners, see Config.Affinity);
	// GuessesOverruled those whose reservation did not agree (another
	// replica served the owner since, a concurrent turn of the owner):
	// the turn keeps the answer to its guess, which continues an older
	// response of the conversation than the reservation's, rather than
	// run twice upstream.
	Guessed, GuessesOverruled int64
}

// counter names one of the proxy's counters.
type counter int

const (
	cTurns counter = iota
	cContinued
	cRetries
	cPaused
	cUnreachable
	cNotKept
	cPassthrough
	cEndpoints
	cUnread
	cUpstreamErrors
	cErrorAnswers
	cForwarded
	cForwardFailures
	cForwardedIn
	cItemsReceived
	cItemsSent
	cBytesReceived
	cBytesSent
	cRefusedBusy
	cTooLarge
	cGuessed
	cGuessesOverruled
	nCounters
)

// counterTable is the one list of the counters: the Stats field each
// fills, and the name and help an exporter gives it.
var counterTable = [nCounters]struct {
	name, help string
	field      func(*Stats) *int64
}{
	cTurns:            {"turns_total", "Turns served (POST /v1/responses, and response.create on a client WebSocket), passthrough ones included; each once, however often it went upstream.", func(s *Stats) *int64 { return &s.Turns }},
	cContinued:        {"turns_continued_total", "Turns sent as a continuation and answered.", func(s *Stats) *int64 { return &s.Continued }},
	cRetries:          {"full_context_retries_total", "Continuations the upstream refused, resent with the full context.", func(s *Stats) *int64 { return &s.FullContextRetries }},
	cPaused:           {"continuations_paused_total", "Turns sent with the full context because the upstream refuses continuations of their model.", func(s *Stats) *int64 { return &s.ContinuationsPaused }},
	cUnreachable:      {"continuations_unreachable_total", "Turns offered a continuation that no connection they could take held any more (its socket carried another conversation's turn, closed, or is another replica's), sent with the full context.", func(s *Stats) *int64 { return &s.ContinuationsUnreachable }},
	cNotKept:          {"turns_not_kept_upstream_total", "Turns with store false over the HTTP transport: the upstream keeps none of their responses, so they go with the full context (the WebSocket transport continues them).", func(s *Stats) *int64 { return &s.NotKeptUpstream }},
	cPassthrough:      {"passthrough_total", "Turns carrying their own previous_response_id or conversation, sent upstream as received.", func(s *Stats) *int64 { return &s.Passthrough }},
	cEndpoints:        {"endpoint_requests_total", "Requests to other endpoints than the turns' (GET /v1/models, POST /v1/files…), relayed upstream as sent.", func(s *Stats) *int64 { return &s.Endpoints }},
	cUnread:           {"turns_unread_total", "Turns sent upstream as received, outside turns_total, their body one the proxy cannot read (refused by the fingerprint, or in a coding it does not decode).", func(s *Stats) *int64 { return &s.Unread }},
	cUpstreamErrors:   {"upstream_errors_total", "Turns the upstream could not be reached for, or dropped.", func(s *Stats) *int64 { return &s.UpstreamErrors }},
	cErrorAnswers:     {"upstream_error_answers_total", "Turns the upstream answered with an error: an HTTP error status (a 429, a 500…), a failed response or an error event.", func(s *Stats) *int64 { return &s.ErrorAnswers }},
	cForwarded:        {"forwarded_total", "Turns handed to the replica holding their socket and answered there.", func(s *Stats) *int64 { return &s.Forwarded }},
	cForwardFailures:  {"forward_failures_total", "Turns the origin replica could not take, served here with full context.", func(s *Stats) *int64 { return &s.ForwardFailures }},
	cForwardedIn:      {"forwarded_in_total", "Turns this replica carried for others.", func(s *Stats) *int64 { return &s.ForwardedIn }},
	cItemsReceived:    {"input_items_received_total", "Input items in client requests.", func(s *Stats) *int64 { return &s.ItemsReceived }},
	cItemsSent:        {"input_items_sent_total", "Input items sent upstream.", func(s *Stats) *int64 { return &s.ItemsSent }},
	cBytesReceived:    {"request_bytes_received_total", "Request body bytes from clients.", func(s *Stats) *int64 { return &s.BytesReceived }},
	cBytesSent:        {"request_bytes_sent_total", "Request body bytes sent upstream.", func(s *Stats) *int64 { return &s.BytesSent }},
	cRefusedBusy:      {"requests_refused_busy_total", "Requests answered 503 because the bodies in flight held the whole MaxBytesInFlight.", func(s *Stats) *int64 { return &s.RefusedBusy }},
	cTooLarge:         {"requests_too_large_total", "Requests answered 413: a body over -max-body (a turn) or -max-passthrough-body (another endpoint).", func(s *Stats) *int64 { return &s.TooLarge }},
	cGuessed:          {"turns_guessed_total", "Turns sent upstream on a guessed continuation while the store reserved them.", func(s *Stats) *int64 { return &s.Guessed }},
	cGuessesOverruled: {"guesses_overruled_total", "Guessed turns whose reservation disagreed (another replica served the owner since, a concurrent turn of the owner): the turn kept the answer to its guess, a continuation of an older response.", func(s *Stats) *int64 { return &s.GuessesOverruled }},
}

// counters holds the counters' values.
type counters [nCounters]atomic.Int64

// add adds n to counter c.
func (cs *counters) add(c counter, n int64) { cs[c].Add(n) }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	var s Stats
	for c, d := range counterTable {
		*d.field(&s) = p.stats[c].Load()
	}
	return s
}

// A Counter is one of the proxy's counters as an exporter shows it.
type Counter struct {
	// Name is the counter's name in snake case, ending in _total, such
	// as "turns_continued_total".
	Name string
	// Help says what it counts.
	Help string
	// Value is its value.
	Value int64
}

// Counters returns the proxy's counters, always in the same order, with
// the names and help an exporter gives them: the values of Stats.
func (p *Proxy) Counters() []Counter {
	out := make([]Counter, nCounters)
	for c, d := range counterTable {
		out[c] = Counter{Name: d.name, Help: d.help, Value: p.stats[c].Load()}
	}
	return out
}
