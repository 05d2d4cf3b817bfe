package fakeupstream

import (
	"net/http"
)

// FaultKind is what goes wrong in a faulted call.
type FaultKind int

const (
	// NoFault answers the call normally.
	NoFault FaultKind = iota
	// FaultStatus answers with an error status before any event: over
	// HTTP a JSON error body with Fault.Status, over WebSocket an error
	// event carrying it.
	FaultStatus
	// FaultFailed ends the response with response.failed (status
	// "failed", error code server_error) right after response.created and
	// response.in_progress. A non-streaming request gets that failed
	// response object, with status 200.
	FaultFailed
	// FaultIncomplete ends the response with response.incomplete (status
	// "incomplete", reason max_output_tokens) instead of
	// response.completed, its output items sent as usual. A non-streaming
	// request gets that incomplete response object, with status 200.
	FaultIncomplete
	// FaultError sends an error event (code server_error) right after
	// response.created and response.in_progress, and no terminal response
	// event. A non-streaming request gets status 500 with that error.
	FaultError
	// FaultDrop drops the connection after Fault.Events events: the SSE
	// body is cut off, a non-streaming request is never answered, and a
	// WebSocket's TCP connection is closed without a close frame. The
	// response itself completes, and is stored if the request says so.
	FaultDrop
)

// Fault is a scripted failure of one call, as Options.Fault returns it. The
// zero Fault is no failure.
type Fault struct {
	// Kind is what goes wrong.
	Kind FaultKind
	// Status is the HTTP status of a FaultStatus (500 when zero).
	Status int
	// Events is the number of events a FaultDrop sends before it drops the
	// connection.
	Events int
}

// serverErrorMessage is what the real API says of its own failures.
const serverErrorMessage = "The server had an error while processing your request. Sorry about that!"

// statusError is the error body of a FaultStatus, typed as the real API
// types its errors of that status.
func statusError(status int) *Error {
	if status == 0 {
		status = http.StatusInternalServerError
	}
	switch {
	case status == http.StatusTooManyRequests:
		return &Error{Status: status, Type: "requests", Code: "rate_limit_exceeded",
			Message: "Rate limit reached for requests. Please try again later.",
			Headers: map[string]string{"retry-after": "1", "x-ratelimit-limit-requests": "60",
				"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}}
	case status >= 500:
		return &Error{Status: status, Type: "server_error", Message: serverErrorMessage}
	default:
		return &Error{Status: status, Type: "invalid_request_error", Message: http.StatusText(status) + "."}
	}
}

// streamError is the error a FaultError sends.
func streamError() *Error {
	return &Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "server_error",
		Message: serverErrorMessage}
}

// failure is the error member of a FaultFailed response.
var failure = member{"error", object{{"code", "server_error"}, {"message", serverErrorMessage}}}

// truncation is the incomplete_details member of a FaultIncomplete
// response.
var truncation = member{"incomplete_details", object{{"reason", "max_output_tokens"}}}
