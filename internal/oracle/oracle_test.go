package oracle_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/contstore/contstore/internal/oracle"
	"github.com/contstore/contstore/store"
)

// letters names one item per letter.
func letters(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "")
}

func request(prompt, items string) oracle.Request[string] {
	return oracle.Request[string]{Prompt: prompt, Items: letters(items)}
}

func published(id, prompt, transcript string) oracle.Prior[string] {
	return oracle.Prior[string]{Live: true, Continuation: &oracle.Continuation[string]{
		ResponseID: id, Prompt: prompt, Transcript: letters(transcript)}}
}

// The table holds every reason of the rule, and the order in which the
// rows apply where several would.
func TestEveryReason(t *testing.T) {
	none := oracle.Prior[string]{}
	superseded := oracle.Prior[string]{Live: true}
	seen := map[store.Reason]bool{}
	for _, c := range []struct {
		name  string
		prior oracle.Prior[string]
		req   oracle.Request[string]
		want  oracle.Decision
	}{
		{"no state", none, request("p", "ab"),
			oracle.Decision{Reason: store.ReasonMissingState, UpstreamItems: 2}},
		{"a continuation without live state is not offered", oracle.Prior[string]{Continuation: published("r1", "p", "a").Continuation}, request("p", "ab"),
			oracle.Decision{Reason: store.ReasonMissingState, UpstreamItems: 2}},
		{"state without continuation", superseded, request("p", "ab"),
			oracle.Decision{Reason: store.ReasonSupersededTurn, UpstreamItems: 2}},
		{"prompt changed", published("r1", "p", "a"), request("q", "ab"),
			oracle.Decision{Reason: store.ReasonPromptChanged, UpstreamItems: 2}},
		{"the prompt is checked before the items", published("r1", "p", "a"), request("q", "b"),
			oracle.Decision{Reason: store.ReasonPromptChanged, UpstreamItems: 1}},
		{"an edited item", published("r1", "p", "ax"), request("p", "bxc"),
			oracle.Decision{Reason: store.ReasonNotAppendOnly, UpstreamItems: 3}},
		{"an edited last item", published("r1", "p", "ax"), request("p", "ayc"),
			oracle.Decision{Reason: store.ReasonNotAppendOnly, UpstreamItems: 3}},
		{"a shorter request", published("r1", "p", "axb"), request("p", "ax"),
			oracle.Decision{Reason: store.ReasonNotAppendOnly, UpstreamItems: 2}},
		{"an empty request after a transcript", published("r1", "p", "a"), request("p", ""),
			oracle.Decision{Reason: store.ReasonNotAppendOnly}},
		{"the same items again", published("r1", "p", "ax"), request("p", "ax"),
			oracle.Decision{Reason: store.ReasonEmptyDelta, UpstreamItems: 2}},
		{"an empty transcript and an empty request", published("r1", "p", ""), request("p", ""),
			oracle.Decision{Reason: store.ReasonEmptyDelta}},
		{"one item appended", published("r1", "p", "ax"), request("p", "axb"),
			oracle.Decision{ResponseID: "r1", Prefix: 2, UpstreamItems: 1}},
		{"several items appended", published("r2", "p", "a"), request("p", "axbx"),
			oracle.Decision{ResponseID: "r2", Prefix: 1, UpstreamItems: 3}},
		{"an empty transcript continues with every item", published("r3", "p", ""), request("p", "ab"),
			oracle.Decision{ResponseID: "r3", Prefix: 0, UpstreamItems: 2}},
	} {
		seen[c.want.Reason] = true
		t.Run(c.name, func(t *testing.T) {
			got := oracle.Reserve(c.prior, c.req)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.want.Reason == store.ReasonNone, got.Continues())
		})
	}
	for _, r := range []store.Reason{store.ReasonMissingState, store.ReasonSupersededTurn, store.ReasonPromptChanged,
		store.ReasonNotAppendOnly, store.ReasonEmptyDelta, store.ReasonNone} {
		assert.True(t, seen[r], "no case of reason %q", r)
	}
}

// Items given as bytes compare by content, not by slice, without
// allocating (contbench checks every turn with them).
func TestByteItemsCompareByContent(t *testing.T) {
	raw := func(items ...string) []json.RawMessage {
		out := make([]json.RawMessage, len(items))
		for i, s := range items {
			out[i] = json.RawMessage(s) // a fresh copy each time
		}
		return out
	}
	prior := oracle.Prior[json.RawMessage]{Live: true, Continuation: &oracle.Continuation[json.RawMessage]{
		ResponseID: "r1", Prompt: "p", Transcript: raw(`{"a":1}`, `{"x":2}`)}}
	req := oracle.Request[json.RawMessage]{Prompt: "p", Items: raw(`{"a":1}`, `{"x":2}`, `{"b":3}`)}
	assert.Equal(t, oracle.Decision{ResponseID: "r1", Prefix: 2, UpstreamItems: 1}, oracle.Reserve(prior, req))

	edited := oracle.Request[json.RawMessage]{Prompt: "p", Items: raw(`{"a":1}`, `{"x": 2}`, `{"b":3}`)}
	assert.Equal(t, store.ReasonNotAppendOnly, oracle.Reserve(prior, edited).Reason, "bytes are the identity here")

	allocs := testing.AllocsPerRun(100, func() { _ = oracle.Reserve(prior, req) })
	assert.Zero(t, allocs)
}

// A reference counts as the transcript item it stands for, at that item's
// place only.
func TestReferencesStandForTheirItems(t *testing.T) {
	prior := published("r1", "p", "axy")
	prior.Continuation.References = map[int]string{1: "X", 2: "Y"}
	for _, c := range []struct {
		name, items string
		want        store.Reason
	}{
		{"the items themselves", "axyb", store.ReasonNone},
		{"both referenced", "aXYb", store.ReasonNone},
		{"one referenced", "aXyb", store.ReasonNone},
		{"a reference at another place", "aYXb", store.ReasonNotAppendOnly},
		{"a reference without one", "Axyb", store.ReasonNotAppendOnly},
		{"the same items again, referenced", "aXY", store.ReasonEmptyDelta},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, oracle.Reserve(prior, request("p", c.items)).Reason)
		})
	}
}
