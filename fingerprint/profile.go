package fingerprint

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrInvalidProfile is wrapped by every error about a malformed [Profile].
var ErrInvalidProfile = errors.New("fingerprint: invalid profile")

// A Profile says which differences between two requests do not change the
// conversation the upstream holds, so that a request a client re-serialised
// still continues. Every replica sharing a namespace must use the same
// profile; the store records [Profile.ID] in the namespace and refuses a
// store opened with another.
//
// Beyond the members it names, every profile applies one rule: inside an
// item, at any depth, an object member whose value is null is the same as an
// absent member (a function call's arguments document is compared exactly,
// and the prompt members too).
type Profile struct {
	// Name names the profile, such as "v2". A gateway that extends a
	// profile gives the result a name of its own.
	Name string
	// ItemMembers are the top-level members of an item that are ignored,
	// except in an item of type "item_reference", whose id is its content.
	ItemMembers []string
	// PartMembers are the members ignored in each object of an item's
	// content array (its content parts).
	PartMembers []string
	// PromptMembers are the body members left out of the prompt
	// signature. "input" never counts in it and cannot be named.
	PromptMembers []string
	// EmptyPartMembers are the members of a content part that count as
	// absent when their value is an empty array.
	EmptyPartMembers []string
	// ShortMessages makes a message item in the short input form equal
	// its full form: an item with a role and no type is a message, and a
	// message's string content is one text part.
	ShortMessages bool
	// References makes an item without type and role an item_reference,
	// compared whole, and lets an item_reference to an output item of the
	// recorded turn count as that item when the upstream keeps responses
	// ([Request.Transcript], [Transcript.Matches]).
	References bool
	// ReasoningIDs keeps the id of a reasoning item that carries no
	// encrypted_content, even when ItemMembers names "id": the upstream
	// holds that reasoning by its id, and the item shows nothing else of
	// it.
	ReasoningIDs bool
}

// V2 returns the default profile since protocol version 2. Each rule answers
// what a real client does (PROTOCOL.md gives the evidence):
//
//   - item members id and status: the upstream's own item ids and states
//     carry no content; Codex CLI sends items back without them, other
//     clients with them.
//   - item member parsed_arguments and content part member parsed: added by
//     the OpenAI JS SDK's responses.stream() helper.
//   - prompt members client_metadata, metadata, user, safety_identifier,
//     prompt_cache_key, prompt_cache_retention, stream and stream_options:
//     they tag, route, cache or stream a request, and the model never sees
//     them; Codex CLI changes client_metadata on every user turn.
func V2() Profile {
	return Profile{
		Name:        "v2",
		ItemMembers: []string{"id", "parsed_arguments", "status"},
		PartMembers: []string{"parsed"},
		PromptMembers: []string{"client_metadata", "metadata", "prompt_cache_key", "prompt_cache_retention",
			"safety_identifier", "stream", "stream_options", "user"},
	}
}

// V3 returns the default profile since protocol version 5: V2, and the
// forms the Vercel AI SDK, opencode and Codex's built-in provider send
// back (PROTOCOL.md gives the evidence):
//
//   - item member internal_chat_message_metadata_passthrough: Codex's own
//     turn metadata (turn id, creation time), which its OpenAI provider
//     adds to every item it sends back and the model never sees;
//   - short messages: {"role":"assistant","content":"T"} is the message
//     the upstream sent with one output_text part "T";
//   - content part members annotations and logprobs count as absent when
//     empty: clients that rebuild a message from its text drop them;
//   - references: {"type":"item_reference","id":"rs_1"} counts as the
//     output item rs_1 of the recorded turn when the upstream keeps
//     responses.
func V3() Profile {
	p := V2()
	p.Name = "v3"
	p.ItemMembers = append(p.ItemMembers, "internal_chat_message_metadata_passthrough")
	p.EmptyPartMembers = []string{"annotations", "logprobs"}
	p.ShortMessages = true
	p.References = true
	return p
}

// V4 returns the default profile since protocol version 6: V3, and
//
//   - a reasoning item without encrypted_content keeps its id. Its summary
//     is often empty, so without the id two such items of different
//     responses were equal, and a conversation could continue from
//     another that had shown the same text, its model then reasoning on
//     with the other's hidden reasoning. A client that sends such an item
//     back sends its id: the upstream needs it.
//   - prompt members previous_response_id and conversation: null, as a
//     client may send them, is the same request as none; any other value
//     keeps the conversation upstream, and the gateway does not continue
//     such a request.
func V4() Profile {
	p := V3()
	p.Name = "v4"
	p.ReasoningIDs = true
	p.PromptMembers = append(slices.Clone(p.PromptMembers), "conversation", "previous_response_id")
	return p
}

// Named returns the built-in profile called name: "v2", "v3" or "v4".
func Named(name string) (Profile, error) {
	switch name {
	case "v2":
		return V2(), nil
	case "v3":
		return V3(), nil
	case "v4":
		return V4(), nil
	}
	return Profile{}, fmt.Errorf("%w: no built-in profile %q (v2, v3 or v4)", ErrInvalidProfile, name)
}

// ID returns the profile's identity, the text a namespace records:
//
//	<name>;item=<members>;part=<members>;prompt=<members>[;empty=<members>][;forms=<forms>]
//
// with each list sorted, without duplicates and joined by commas; forms
// lists "reasoning-ids", "references" and "short-messages" when set. The optional parts are
// absent when empty, so that V2's identity is the one earlier versions
// recorded.
func (p Profile) ID() string {
	list := func(ms []string) string {
		s := slices.Clone(ms)
		slices.Sort(s)
		return strings.Join(slices.Compact(s), ",")
	}
	id := p.Name + ";item=" + list(p.ItemMembers) + ";part=" + list(p.PartMembers) + ";prompt=" + list(p.PromptMembers)
	if len(p.EmptyPartMembers) > 0 {
		id += ";empty=" + list(p.EmptyPartMembers)
	}
	var forms []string
	if p.ReasoningIDs {
		forms = append(forms, "reasoning-ids")
	}
	if p.References {
		forms = append(forms, "references")
	}
	if p.ShortMessages {
		forms = append(forms, "short-messages")
	}
	if len(forms) > 0 {
		id += ";forms=" + strings.Join(forms, ",")
	}
	return id
}

// validate checks the profile and compiles it.
func (p Profile) validate() (*rules, error) {
	if p.Name == "" || strings.ContainsAny(p.Name, ";=, \t\r\n") {
		return nil, fmt.Errorf("%w: name %q must be non-empty without ';', '=', ',' or spaces", ErrInvalidProfile, p.Name)
	}
	for _, l := range []struct {
		what  string
		names []string
		bad   string // a member that list cannot name
	}{{"item member", p.ItemMembers, "type"}, {"part member", p.PartMembers, ""}, {"prompt member", p.PromptMembers, "input"},
		{"empty part member", p.EmptyPartMembers, ""}} {
		for _, n := range l.names {
			if n == "" || n == l.bad || strings.ContainsAny(n, ";=,") {
				return nil, fmt.Errorf("%w: %s %q", ErrInvalidProfile, l.what, n)
			}
		}
	}
	return &rules{item: slices.Clone(p.ItemMembers), part: slices.Clone(p.PartMembers), prompt: slices.Clone(p.PromptMembers),
		emptyPart: slices.Clone(p.EmptyPartMembers), shortMessages: p.ShortMessages, references: p.References,
		reasoningIDs: p.ReasoningIDs}, nil
}

// rules is a validated profile, as the scanner applies it.
type rules struct {
	item, part, prompt, emptyPart           names
	shortMessages, references, reasoningIDs bool
}

// names is a short list of member names.
type names []string

func (ns names) has(key []byte) bool {
	for _, n := range ns {
		if n == string(key) {
			return true
		}
	}
	return false
}
