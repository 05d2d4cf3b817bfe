// Package oracle states once the rule by which a reservation continues the
// owner's previous turn, or says why it does not (PROTOCOL.md §5.1, rows 3
// to 8), for the checkers that judge a store's answers against ground
// truth: the conformance model (store/storetest), the linearizability and
// fault-load tests (integration) and contbench.
//
// The rule is written from the protocol, not from the store: it compares
// prompts and items by identities the checker supplies (bytes, canonical
// forms, digests, names) and knows nothing of fingerprints, Redis replies or
// the store's own decision code, so a wrong decision shared by every backend
// is still caught.
//
// The rows before the owner's state is read (store disabled, zero owner,
// store unavailable) are not part of the rule: they do not depend on the
// state.
package oracle

import "github.com/contstore/contstore/store"

// Item is the identity of one input or output item: two items are the same
// item exactly when their identities are equal. The checker picks what
// "the same" means: the bytes sent, a canonical form, a digest, a name.
type Item interface{ ~string | ~[]byte }

// Request is what the rule reads of a request: the identity of its prompt
// (every member but input) and the identities of its input items, in order.
type Request[I Item] struct {
	Prompt string
	Items  []I
}

// Continuation is the published response a reservation consumes: its id,
// and the prompt and transcript of the turn that published it. The
// transcript is that turn's input items followed by its response's output
// items.
type Continuation[I Item] struct {
	ResponseID string
	Prompt     string
	Transcript []I
	// References gives, for some transcript items, the identity of the
	// item_reference that counts as the item: output items with an id,
	// when the upstream keeps the response. Nil when none.
	References map[int]I
}

// Prior is the owner's state as a reservation finds it.
type Prior[I Item] struct {
	// Live: the owner has state (it was reserved, and since then neither
	// expired, evicted, cleared, aborted nor dropped).
	Live bool
	// Continuation is the response the state holds; nil when none was
	// published since the owner's last reservation. It is ignored unless
	// Live.
	Continuation *Continuation[I]
}

// Decision is what a reservation must answer.
type Decision struct {
	// Reason is store.ReasonNone exactly when continuing.
	Reason store.Reason
	// ResponseID is the response to continue from; empty unless continuing.
	ResponseID string
	// Prefix is how many of the request's items the continuation's
	// transcript covers: the delta is the request's items from Prefix on.
	// 0 unless continuing.
	Prefix int
	// UpstreamItems is how many items go upstream: the delta's length when
	// continuing, else the request's item count.
	UpstreamItems int
}

// Continues reports whether the reservation continues.
func (d Decision) Continues() bool { return d.Reason == store.ReasonNone }

// Reserve returns the decision for req given the owner's prior state. The
// first row that applies wins:
//
//	no live state                                  missing_state
//	no continuation                                superseded_turn
//	prompt differs                                 prompt_changed
//	transcript is not a prefix of the request      not_append_only
//	  (each item the same, or a reference standing for it)
//	transcript is the whole request                empty_delta
//	otherwise                                      continue, with the items after the transcript
func Reserve[I Item](prior Prior[I], req Request[I]) Decision {
	full := Decision{UpstreamItems: len(req.Items)}
	c := prior.Continuation
	switch {
	case !prior.Live:
		full.Reason = store.ReasonMissingState
	case c == nil:
		full.Reason = store.ReasonSupersededTurn
	case c.Prompt != req.Prompt:
		full.Reason = store.ReasonPromptChanged
	case !hasPrefix(req.Items, c.Transcript, c.References):
		full.Reason = store.ReasonNotAppendOnly
	case len(c.Transcript) == len(req.Items):
		full.Reason = store.ReasonEmptyDelta
	default:
		n := len(c.Transcript)
		return Decision{ResponseID: c.ResponseID, Prefix: n, UpstreamItems: len(req.Items) - n}
	}
	return full
}

// hasPrefix reports whether prefix is a prefix of items, where refs[i],
// when present, counts as prefix[i].
func hasPrefix[I Item](items, prefix []I, refs map[int]I) bool {
	if len(prefix) > len(items) {
		return false
	}
	for i := range prefix {
		if string(items[i]) == string(prefix[i]) {
			continue
		}
		if r, ok := refs[i]; !ok || string(items[i]) != string(r) {
			return false
		}
	}
	return true
}
