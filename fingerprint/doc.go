// Package fingerprint turns OpenAI Responses request bodies into
// fingerprints: a prompt signature and a chain of item digests, so that a
// store can tell whether a request continues an earlier turn by comparing a
// few numbers instead of transcripts.
//
// Two requests continue the same conversation when the upstream holds the
// same conversation for both, not when their bytes match. A [Profile] says
// which differences real clients introduce without changing the
// conversation ([V4] is the default); a [Parser] applies it under a secret
// [Key], and [Request] is what it returns. [Explain] says where a request
// departs from the transcript it was meant to continue.
//
// # Canonical JSON
//
// Digests are computed over a canonical form, so that two encodings of the
// same value always hash the same; other implementations of the protocol
// must reproduce it byte for byte (PROTOCOL.md):
//
//   - No insignificant whitespace anywhere. JSON whitespace (space, tab, line
//     feed, carriage return) before and after the value is accepted and
//     dropped; any other data after the value is an error.
//   - Objects are written as {"k1":v1,"k2":v2} with members sorted by key.
//     Keys are compared after decoding, as UTF-8 byte sequences
//     (bytes.Compare order, which differs from UTF-16 order). Two keys of one
//     object that are equal after decoding are an error, at any depth.
//   - Arrays are written as [v1,v2].
//   - Strings are decoded (every JSON escape, including \uXXXX and UTF-16
//     surrogate pairs) and re-encoded as a quote, the content and a quote,
//     where '"' becomes \", '\' becomes \\, U+0008 \b, U+000C \f,
//     U+000A \n, U+000D \r, U+0009 \t, every other code point below U+0020
//     becomes \u00xx with lowercase hex digits, and everything else ('/',
//     U+007F, U+2028, U+2029 and all non-ASCII characters included) is
//     written as raw UTF-8. So "\u00e9" and "é" are the same string, while
//     NFC and NFD forms of one text are not. A string holding invalid UTF-8,
//     an unpaired surrogate escape, or a raw byte below 0x20 is an error.
//   - Numbers must match the JSON number grammar and are copied exactly as
//     written: 1.0, 1 and 1e0 are three different canonical values.
//   - true, false and null are written as is.
//   - At most [MaxDepth] arrays and objects may be open at once, counted from
//     the root of the document being parsed. For a request the body object
//     is level 1, the input array level 2 and an input item's own object or
//     array level 3; an output item passed to [Request.Transcript] is level 1.
//
// # Items
//
// The elements of a request's input, and the output items passed to
// [Request.Transcript], are canonicalised with these rules on top:
//
//   - Inside an item, at any depth, a member whose value is null is left out:
//     {"a":null} and {} are the same item. Array elements that are null stay.
//   - The profile's ItemMembers are left out of the item's own object, unless
//     its type is "item_reference"; its PartMembers are left out of each
//     object in the item's content array.
//   - When an item is an object whose member "type" is the string
//     "function_call" and whose member "arguments" is a string, the decoded
//     content of that string is parsed as a JSON document by the canonical
//     rules alone (no null rule, no profile: a tool may treat {"a":null} and
//     {} differently), with its own depth count. If it parses, the canonical
//     value of "arguments" is the canonical string whose content is the
//     canonical form of that document, so "{\"a\":1,\"b\":2}" and
//     "{\"b\": 2, \"a\": 1}" are the same arguments. If it does not parse,
//     "arguments" is the canonical form of the string as for any other
//     string. The rule looks only at the top level of an item and does not
//     depend on member order.
//   - With the profile's EmptyPartMembers, such a member of a content part
//     whose value is [] is left out.
//   - With ShortMessages, an item with a role and no type is a message, and
//     a message's string content is one text part (output_text for the
//     assistant, input_text for user, system and developer).
//   - With References, an item without type and role is an item reference
//     and keeps every member, and [Request.Transcript] gives each output
//     item with an id a [Reference]: an item_reference naming that id
//     counts as the item ([Transcript.PrefixOf]).
//
// The prompt signature covers the canonical body without its input member
// and without the profile's PromptMembers, by the canonical rules alone.
//
// Errors wrap [ErrInvalidRequest] and give the byte offset of the problem
// and, where known, its path inside the value.
package fingerprint
