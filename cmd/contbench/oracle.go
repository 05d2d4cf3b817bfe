package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	rule "github.com/contstore/contstore/internal/oracle"
	"github.com/contstore/contstore/store"
)

// maxExamples is how many violations a report describes.
const maxExamples = 5

// violation is one answer of the store that ground truth does not allow.
type violation struct {
	Kind     string `json:"kind"`
	Owner    string `json:"owner"`
	Turn     int    `json:"turn"`
	Replica  string `json:"replica"`
	Expected string `json:"expected"`
	Got      string `json:"got"`
}

// offer is a continuation ground truth allows the store to offer: the
// response last published for an owner, with the transcript (its input
// and output) and the prompt it covers.
type offer struct {
	id        string
	items     []json.RawMessage
	promptGen int
}

// oracle checks the store's answers against ground truth and collects the
// violations.
type oracle struct {
	issued *responses
	owners []*owner

	mu    sync.Mutex
	count int64
	// wrong counts the violations that are continuations ground truth
	// forbids.
	wrong    int64
	examples []violation
}

// report records v.
func (c *oracle) report(v violation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count++
	if len(c.examples) < maxExamples {
		c.examples = append(c.examples, v)
	}
}

// reportContinuation records v, a continuation ground truth forbids.
func (c *oracle) reportContinuation(v violation) {
	c.report(v)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wrong++
}

// violation starts a violation about o's current turn on replica rep.
func (c *oracle) violation(o *owner, rep *replica, kind string) violation {
	return violation{Kind: kind, Owner: o.id.String(), Turn: o.turns, Replica: rep.name}
}

// checkReserve checks the reservation res of o's request input on replica
// rep, and consumes o's offer as the store consumes the owner's
// continuation. It reports whether res may be used as it is: false for a
// continuation ground truth does not allow.
//
// Ground truth is the rule of package oracle applied to o's offer: the
// response last published for o since its previous reservation, with the
// prompt and transcript it covers, and no state at all after an idle gap.
// Not continuing when the truth would allow it is no violation (the state
// may have been evicted); a continuation must be the one the rule makes,
// with the delta exactly the rest of input; after an idle gap the state
// must be gone, unless other conversations share the owner (-alike).
func (c *oracle) checkReserve(o *owner, rep *replica, input []json.RawMessage, res *store.Reservation) bool {
	off, idle := o.offer, o.idle
	o.idle = false
	if res.Reason == store.ReasonStoreUnavailable {
		// The reservation may or may not have reached the store: the
		// continuation may still be there.
		return true
	}
	o.offer = nil
	prior := rule.Prior[json.RawMessage]{Live: !idle}
	if off != nil {
		prior.Continuation = &rule.Continuation[json.RawMessage]{ResponseID: off.id, Prompt: promptID(off.promptGen), Transcript: off.items}
	}
	want := rule.Reserve(prior, rule.Request[json.RawMessage]{Prompt: promptID(o.promptGen), Items: input})
	if !res.Continues() {
		if want.Reason == store.ReasonMissingState && res.Reason != want.Reason && !o.shared {
			v := c.violation(o, rep, "state outlived its TTL")
			v.Expected, v.Got = string(want.Reason)+" after an idle gap longer than the TTL", string(res.Reason)
			c.report(v)
		}
		return true
	}

	v := c.violation(o, rep, "")
	v.Got = fmt.Sprintf("continue from %s with %d delta items", res.PreviousResponseID, len(res.Delta))
	if i, ok := c.issued.ownerOf(res.PreviousResponseID); ok && c.owners[i] != o {
		v.Kind, v.Expected = "cross-owner", "no response of another owner; "+res.PreviousResponseID+" answered "+c.owners[i].id.String()
		c.reportContinuation(v)
		return false
	}
	switch {
	case want.Reason == store.ReasonMissingState:
		v.Kind, v.Expected = "continued after an idle gap", "no continuation: the state expired"
	case want.Reason == store.ReasonSupersededTurn:
		v.Kind, v.Expected = "no continuation to offer", "no continuation: nothing published since the last reservation"
	case res.PreviousResponseID != off.id:
		v.Kind, v.Expected = "wrong response", "continue from "+off.id
	case !want.Continues():
		v.Kind, v.Expected = violationKinds[want.Reason], string(want.Reason)
	case res.UpstreamItems != want.UpstreamItems || !equalItems(res.Delta, input[want.Prefix:]):
		v.Kind, v.Expected = "wrong delta", fmt.Sprintf("continue from %s with the %d items after the first %d",
			off.id, want.UpstreamItems, want.Prefix)
		v.Got += fmt.Sprintf(" (UpstreamItems %d)", res.UpstreamItems)
	default:
		return true
	}
	c.reportContinuation(v)
	return false
}

// violationKinds names the violation of a continuation the rule refuses
// for the reason.
var violationKinds = map[store.Reason]string{
	store.ReasonPromptChanged: "prompt changed",
	store.ReasonNotAppendOnly: "not append-only",
	store.ReasonEmptyDelta:    "empty delta",
}

// promptID is the identity of the prompt of generation gen.
func promptID(gen int) string { return strconv.Itoa(gen) }

// checkSuperseded checks the reservation of the second of two concurrent
// requests of o, made while the first one's turn was current: the rule's
// decision for a live owner with nothing published (or no state, if the
// owner was evicted meanwhile).
func (c *oracle) checkSuperseded(o *owner, rep *replica, res *store.Reservation) {
	if o.shared {
		return // another conversation's turn may have come between the two
	}
	want := rule.Reserve(rule.Prior[json.RawMessage]{Live: true}, rule.Request[json.RawMessage]{})
	switch res.Reason {
	case want.Reason, store.ReasonMissingState, store.ReasonStoreUnavailable,
		store.ReasonNone: // a continuation, which checkReserve judges
		return
	}
	v := c.violation(o, rep, "concurrent turn not superseded")
	v.Expected, v.Got = string(want.Reason), string(res.Reason)
	c.report(v)
}

// checkOutcome reports a record outcome of o's turn that is not one of want.
func (c *oracle) checkOutcome(o *owner, rep *replica, kind string, got store.Outcome, want ...store.Outcome) {
	if slices.Contains(want, got) {
		return
	}
	v := c.violation(o, rep, kind)
	expected := make([]string, len(want))
	for i, w := range want {
		expected[i] = string(w)
	}
	v.Expected, v.Got = strings.Join(expected, " or "), string(got)
	c.report(v)
}

// equalItems reports whether a and b hold the same items, byte for byte.
func equalItems(a, b []json.RawMessage) bool {
	return slices.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}
