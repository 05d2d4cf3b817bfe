package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/minio/highwayhash"
)

// ErrInvalidRequest is returned (wrapped, with what was wrong and where) for
// a body that is not a valid request, and for invalid arguments to a
// request's methods.
var ErrInvalidRequest = errors.New("fingerprint: invalid request")

// KeySize is the size of a [Key].
const KeySize = 32

// Key is the secret that keys every digest. Without it nobody can build two
// items with the same digest, so a client cannot make the store continue
// from a conversation it did not send. The store keeps one per namespace.
type Key [KeySize]byte

// ChainSeedText is the text whose digest starts every transcript chain.
const ChainSeedText = "contstore/chain/v2"

// A Parser parses requests under one profile and one key. It is immutable
// and safe for concurrent use.
type Parser struct {
	id    string
	rules *rules
	key   [KeySize]byte
	seed  uint64     // h(0)
	items *itemCache // what items seen before gave (itemcache.go)
	runs  *runCache  // what input arrays seen before gave (runcache.go)
}

// New returns a parser for profile and key. An invalid profile gives an
// error wrapping ErrInvalidProfile.
func New(profile Profile, key Key) (*Parser, error) {
	r, err := profile.validate()
	if err != nil {
		return nil, err
	}
	p := &Parser{id: profile.ID(), rules: r, key: key, items: newItemCache(), runs: newRunCache()}
	p.seed = p.sum([]byte(ChainSeedText))
	return p, nil
}

// ProfileID returns the identity of the parser's profile.
func (p *Parser) ProfileID() string { return p.id }

// Key returns the parser's key.
func (p *Parser) Key() Key { return p.key }

// sum returns the keyed digest of b: HighwayHash-64 under the parser's key.
func (p *Parser) sum(b []byte) uint64 { return highwayhash.Sum64(b, p.key[:]) }

// next returns h(k) = H(le64(h(k-1)) || le64(d_k)).
func (p *Parser) next(prev, digest uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], prev)
	binary.LittleEndian.PutUint64(b[8:], digest)
	return p.sum(b[:])
}

// Request is a parsed Responses request body: its input items with their
// digests, and the signature of everything else. It is immutable and safe
// for concurrent use.
//
// Digests are keyed: H(b) is HighwayHash-64 of b under the parser's key.
// The k-th input item, counting from 1, has the digest d_k = H(canonical
// item). The chain digest of the first k items is
//
//	h(0) = H("contstore/chain/v2")
//	h(k) = H(le64(h(k-1)) || le64(d_k))
//
// over the 16-byte concatenation of the two little-endian 64-bit values.
type Request struct {
	parser    *Parser
	body      []byte
	spans     []uint32                          // item i is body[input.start+spans[2i] : input.start+spans[2i+1]]
	items     atomic.Pointer[[]json.RawMessage] // Items, once asked for
	digests   []uint64                          // d_1..d_n
	prefix    []uint64                          // h(0)..h(n)
	refs      []bool                            // whether each item is an item_reference; nil when none is
	signature uint64
	bytes     int64
	input     span // the input member's value
	previous  span // the previous_response_id member's value
	skipped   bool // the input was not read (InputSkipped)
	top       []topMember
}

// span is a range of a body's bytes; start -1 when absent.
type span struct{ start, end int }

// Transcript identifies a sequence of items: its first Items items chain to
// Digest, and Bytes is their canonical size.
type Transcript struct {
	// Items is the number of items.
	Items int
	// Digest is the chain digest h(Items) of the items.
	Digest uint64
	// Bytes is the sum of the items' canonical lengths.
	Bytes int64
	// References lets an item_reference stand for an output item that
	// has an id, in increasing order of Item; nil when the profile has no
	// references. Keep them only when the upstream keeps the response:
	// only then does a reference name the item.
	References []Reference
}

// A Reference says that an item_reference naming the id of the
// transcript's item Item (counting from 0) counts as that item: its
// digest XOR Mask is the item's digest.
type Reference struct {
	Item int
	Mask uint64
}

// PrefixOf reports whether the transcript's items are the first items of
// r: each the same item, or, where a Reference allows it, an
// item_reference to it. r must come from the parser whose Transcript made
// t.
func (t Transcript) PrefixOf(r *Request) bool {
	if t.Items > r.Len() {
		return false
	}
	if r.prefix[t.Items] == t.Digest {
		return true
	}
	if r.refs == nil {
		return false
	}
	first := -1
	for _, ref := range t.References {
		if ref.Item < t.Items && r.refs[ref.Item] {
			first = ref.Item
			break
		}
	}
	if first < 0 {
		return false
	}
	h, refs := r.prefix[first], t.References
	for i := first; i < t.Items; i++ {
		d := r.digests[i]
		for len(refs) > 0 && refs[0].Item < i {
			refs = refs[1:]
		}
		if len(refs) > 0 && refs[0].Item == i && r.refs[i] {
			d ^= refs[0].Mask
		}
		h = r.parser.next(h, d)
	}
	return h == t.Digest
}

// Parse parses and validates a request body.
//
// The body must be one JSON object of at most 4 GiB, valid as the package
// documentation describes. Its input member is either an array, each
// element of which is one item, or a string, which is a single item; a
// missing input means no items, and any other input (null included) is
// rejected. The signature is
// the digest of the canonical body without input and the profile's prompt
// members ("{}" when nothing is left).
//
// The Request refers to body rather than copying it: the caller must not
// modify body while it uses the Request or anything taken from it.
// Errors wrap ErrInvalidRequest and name the byte offset and, where
// known, the path of the problem, such as input[3].content[0].
func (p *Parser) Parse(body []byte) (*Request, error) { return p.parse(body, false, nil) }

// Skim parses body as Parse does, but passes over its input unread, as
// Parse does when the upstream holds the conversation (InputSkipped): for
// a gateway that reads a request's members and decides nothing for it,
// such as one that never continues. The request has no items.
func (p *Parser) Skim(body []byte) (*Request, error) { return p.parse(body, true, nil) }

// parse is Parse, or Skim when skim is set; a is what the body's arrival
// learnt (ReadRequest), or nil.
func (p *Parser) parse(body []byte, skim bool, a *arrival) (*Request, error) {
	if uint64(len(body)) > math.MaxUint32 {
		return nil, errorf("a body of %d bytes is larger than 4 GiB", len(body)) // spans are 32-bit
	}
	buf := body
	s := getScanner(buf, p.rules)
	defer putScanner(s)
	s.parser = p
	s.skim = skim
	s.arrival = a
	s.skipWS()
	if s.pos >= len(buf) || buf[s.pos] != '{' {
		s.fail(s.pos, "body is not a JSON object")
		return nil, s.error("invalid request", "")
	}
	if !s.document(placeBody) {
		return nil, s.error("invalid request", "")
	}
	n := len(s.itemSpans) / 2
	r := &Request{
		parser:    p,
		body:      buf,
		spans:     slices.Clone(s.itemSpans),
		signature: p.sum(s.out),
		bytes:     s.itemBytes,
		input:     span{s.inputStart, s.inputEnd},
		previous:  span{s.prevStart, s.prevEnd},
		skipped:   s.inputSkipped,
		top:       slices.Clone(s.top),
	}
	hashes := make([]uint64, 2*n+1)
	r.digests = hashes[:n:n]
	copy(r.digests, s.itemDigest)
	r.prefix = hashes[n:]
	r.prefix[0] = p.seed
	copy(r.prefix[1:], s.itemChain)
	if slices.Contains(s.itemRef, true) {
		r.refs = slices.Clone(s.itemRef)
	}
	s.keepRun(r)
	return r, nil
}

// Member returns the value of the body's top-level member name (compared
// after decoding), exactly as received, and whether the body has it. A
// gateway reads stream, store, previous_response_id and its identity
// sources with it, without parsing the body again.
func (r *Request) Member(name string) (json.RawMessage, bool) {
	for _, m := range r.top {
		if string(m.key) == name {
			return json.RawMessage(r.body[m.start:m.end:m.end]), true
		}
	}
	return nil, false
}

// ParsedBy reports whether p parsed r.
func (r *Request) ParsedBy(p *Parser) bool { return r.parser == p }

// InputSkipped reports whether the input was passed over without being
// read: by Skim, or by Parse because a member before it, a
// previous_response_id or conversation that is not null, says the
// upstream holds the conversation. There is nothing to fingerprint, and
// the request has no items (Len is 0).
func (r *Request) InputSkipped() bool { return r.skipped }

// Body returns the body as parsed. It must not be modified.
func (r *Request) Body() []byte { return r.body }

// Len returns the number of input items.
func (r *Request) Len() int { return len(r.spans) / 2 }

// Items returns the input items exactly as they appear in the body, without
// surrounding whitespace. For a string input it returns the string token,
// quotes included. The returned slice and its contents must not be modified.
func (r *Request) Items() []json.RawMessage {
	if r.Len() == 0 {
		return nil
	}
	if items := r.items.Load(); items != nil {
		return *items
	}
	items := make([]json.RawMessage, r.Len())
	for i := range items {
		items[i] = r.Item(i)
	}
	r.items.CompareAndSwap(nil, &items)
	return *r.items.Load()
}

// Item returns input item i exactly as it appears in the body, as
// Items()[i] does, without building Items. It panics if i is out of the
// range [0, Len()). The returned bytes must not be modified.
func (r *Request) Item(i int) json.RawMessage {
	start, end := r.input.start+int(r.spans[2*i]), r.input.start+int(r.spans[2*i+1])
	return r.body[start:end:end]
}

// Signature returns the prompt signature.
func (r *Request) Signature() uint64 { return r.signature }

// Prefix returns the chain digest h(n) of the first n input items,
// 0 <= n <= Len(). It panics if n is out of that range.
func (r *Request) Prefix(n int) uint64 { return r.prefix[n] }

// Transcript returns the fingerprint of the input followed by the output
// items, which are canonicalised like input items. With a profile that
// has references, each output item with a string id gets a Reference: an
// item_reference naming that id counts as the item. An output item that
// is not valid JSON yields an error wrapping ErrInvalidRequest that names
// it as output[i], with the offset inside that item.
func (r *Request) Transcript(output []json.RawMessage) (Transcript, error) {
	t := Transcript{Items: r.Len(), Digest: r.prefix[r.Len()], Bytes: r.bytes}
	if len(output) == 0 {
		return t, nil
	}
	s := getScanner(nil, r.parser.rules)
	defer putScanner(s)
	for i, raw := range output {
		s.reset(raw)
		if !s.document(placeItem) {
			return Transcript{}, s.error("invalid request", "output["+strconv.Itoa(i)+"]")
		}
		d := r.parser.sum(s.out)
		if r.parser.rules.references && s.hasID && !s.reference {
			ref := append(append(append(s.scratch[:0], `{"id":`...), s.itemID...), `,"type":"item_reference"}`...)
			s.scratch = ref
			t.References = append(t.References, Reference{Item: t.Items, Mask: d ^ r.parser.sum(ref)})
		}
		t.Items++
		t.Digest = r.parser.next(t.Digest, d)
		t.Bytes += int64(len(s.out))
	}
	return t, nil
}

// ContinuedBody returns the body to send upstream when continuing response
// previousResponseID: the request's body with previous_response_id set to
// it (replacing the member's value, or added as the first member) and input
// holding only the items from index from on, each exactly as received.
// from must leave at least one item (1 <= from < Len()), and the id must be
// non-empty; otherwise the error wraps ErrInvalidRequest.
func (r *Request) ContinuedBody(previousResponseID string, from int) ([]byte, error) {
	if previousResponseID == "" {
		return nil, errorf("empty previous response id")
	}
	if from < 1 || from >= r.Len() || r.input.start < 0 {
		return nil, errorf("continuing from item %d of %d leaves no delta", from, r.Len())
	}
	id := append(appendContent([]byte{'"'}, []byte(previousResponseID)), '"')
	input := []byte{'['}
	for i := from; i < r.Len(); i++ {
		if i > from {
			input = append(input, ',')
		}
		input = append(input, r.Item(i)...)
	}
	input = append(input, ']')
	type edit struct {
		at, end int // body[at:end] becomes val
		val     []byte
	}
	edits := []edit{{r.input.start, r.input.end, input}}
	if r.previous.start >= 0 {
		edits = append(edits, edit{r.previous.start, r.previous.end, id})
	} else {
		open := bytes.IndexByte(r.body, '{') + 1
		edits = append(edits, edit{open, open, slices.Concat([]byte(`"previous_response_id":`), id, []byte{','})})
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.at - b.at })
	size := len(r.body)
	for _, e := range edits {
		size += len(e.val) - (e.end - e.at)
	}
	out := make([]byte, 0, size)
	last := 0
	for _, e := range edits {
		out = append(out, r.body[last:e.at]...)
		out = append(out, e.val...)
		last = e.end
	}
	return append(out, r.body[last:]...), nil
}

// MessageInputBody returns the body with a string input replaced by the
// array of the one user message the API takes it for,
// [{"role":"user","content":<the string as written>}], and true; the body
// and false when the input is not a string. A client that opens with a
// string and sends its history as an array after that resends its
// opening as that message: a gateway sending the first form continues
// the second.
func (r *Request) MessageInputBody() ([]byte, bool) {
	if r.input.start < 0 || r.body[r.input.start] != '"' {
		return r.body, false
	}
	return slices.Concat(r.body[:r.input.start], []byte(`[{"role":"user","content":`),
		r.body[r.input.start:r.input.end], []byte(`}]`), r.body[r.input.end:]), true
}

func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, args...)...)
}
