package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// ErrInvalidRequest is returned (wrapped, with what was wrong and where) for
// a body that is not a valid request.
var ErrInvalidRequest = errors.New("store: invalid request")

// requestChainSeed is the chain digest of an empty transcript, h(0): the
// xxhash64 of the ASCII string "contstore/chain/v1".
var requestChainSeed = xxhash.Sum64String("contstore/chain/v1")

// requestEmptySignature is the signature of a request without members other
// than input: the xxhash64 of "{}".
var requestEmptySignature = xxhash.Sum64String("{}")

// requestChainNext returns h(k) = xxhash64(le64(h(k-1)) || le64(d_k)).
func requestChainNext(prev, digest uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], prev)
	binary.LittleEndian.PutUint64(b[8:], digest)
	return xxhash.Sum64(b[:])
}

// Request is a parsed Responses-style request body: its input items with
// their digests, and the signature of everything else.
//
// The k-th input item, counting from 1, has the digest d_k = xxhash64 of its
// canonical form, which is its canonical JSON with the function_call rule
// (see Canonical). The chain digest of the first k items is
//
//	h(0) = xxhash64("contstore/chain/v1")
//	h(k) = xxhash64(le64(h(k-1)) || le64(d_k))
//
// over the 16-byte concatenation of the two little-endian 64-bit values.
//
// A nil *Request behaves as a request without input and without other
// members: Len 0, Input nil, Signature the xxhash64 of "{}", PrefixDigest(0)
// h(0), and Transcript and Fingerprint work as for any empty request.
//
// A Request is immutable and safe for concurrent use.
type Request struct {
	body      []byte
	items     []json.RawMessage
	digests   []uint64 // d_1..d_n
	prefix    []uint64 // h(0)..h(n)
	signature uint64
	bytes     int64
}

// Fingerprint identifies a transcript: its first Items items hash to Digest;
// Bytes is their canonical size.
type Fingerprint struct {
	// Items is the number of items in the transcript.
	Items int
	// Digest is the chain digest h(Items) of the items.
	Digest uint64
	// Bytes is the sum of the canonical lengths of the items.
	Bytes int64
}

// ParseRequest parses and validates a request body.
//
// The body must be one JSON object; all of it is validated by the rules
// described at Canonical. Its input member is either an array, each element
// of which is one item, or a string, which is a single item; a missing input
// means no items, and any other input (null included) is rejected. The
// signature is the xxhash64 of the canonical form of the body with the input
// member removed ("{}" when input is the only member).
//
// ParseRequest keeps its own copy of body, so the caller may reuse body
// afterwards. Errors wrap ErrInvalidRequest and name the byte offset and,
// where known, the path of the problem, such as input[3].content[0].
func ParseRequest(body []byte) (*Request, error) {
	buf := make([]byte, len(body))
	copy(buf, body)
	p := getCanonState(buf)
	defer putCanonState(p)
	p.skipWS()
	if p.pos >= len(buf) || buf[p.pos] != '{' {
		p.fail(p.pos, "body is not a JSON object")
		return nil, p.error("invalid request", "")
	}
	if !p.object(canonModeBody) {
		return nil, p.error("invalid request", "")
	}
	p.skipWS()
	if p.pos < len(buf) {
		p.failChar("after top-level value")
		return nil, p.error("invalid request", "")
	}
	n := len(p.itemRaw)
	r := &Request{
		body:      buf,
		signature: xxhash.Sum64(p.out),
		bytes:     p.itemBytes,
	}
	if n > 0 {
		r.items = make([]json.RawMessage, n)
		copy(r.items, p.itemRaw)
	}
	hashes := make([]uint64, 2*n+1)
	r.digests = hashes[:n:n]
	copy(r.digests, p.itemDigest)
	r.prefix = hashes[n:]
	r.prefix[0] = requestChainSeed
	for i, d := range r.digests {
		r.prefix[i+1] = requestChainNext(r.prefix[i], d)
	}
	return r, nil
}

// input parses the value of the body's input member.
func (p *canonState) input() bool {
	if p.pos >= len(p.data) {
		return p.fail(p.pos, "unexpected end of input")
	}
	switch p.data[p.pos] {
	case '"':
		return p.item()
	case '[':
	default:
		return p.fail(p.pos, "input must be an array or a string")
	}
	if p.depth >= canonMaxDepth {
		return p.fail(p.pos, "exceeds maximum nesting depth of 512")
	}
	p.depth++
	p.pos++
	frame := len(p.path)
	p.path = append(p.path, canonFrame{index: -1, array: true})
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for i := 0; ; i++ {
			p.path[frame].index = i
			if !p.item() {
				return false
			}
			p.skipWS()
			if p.pos < len(p.data) {
				if c := p.data[p.pos]; c == ',' {
					p.pos++
					p.skipWS()
					continue
				} else if c == ']' {
					p.pos++
					break
				}
			}
			return p.failChar("after array element")
		}
	}
	p.path = p.path[:frame]
	p.depth--
	return true
}

// item parses one input item and records its raw bytes and digest.
func (p *canonState) item() bool {
	start := p.pos
	saved := p.out
	p.out = p.itemOut[:0]
	ok := p.value(canonModeItem)
	canon := p.out
	p.itemOut = canon
	p.out = saved
	if !ok {
		return false
	}
	p.itemRaw = append(p.itemRaw, json.RawMessage(p.data[start:p.pos:p.pos]))
	p.itemDigest = append(p.itemDigest, xxhash.Sum64(canon))
	p.itemBytes += int64(len(canon))
	return true
}

// Len returns the number of input items.
func (r *Request) Len() int {
	if r == nil {
		return 0
	}
	return len(r.items)
}

// Input returns the input items exactly as they appear in the body, without
// surrounding whitespace. For a string input it returns the string token,
// quotes included. The returned slice and its contents must not be modified.
func (r *Request) Input() []json.RawMessage {
	if r == nil || len(r.items) == 0 {
		return nil
	}
	return r.items[:len(r.items):len(r.items)]
}

// Signature returns the prompt signature: the xxhash64 of the canonical body
// without its input member.
func (r *Request) Signature() uint64 {
	if r == nil {
		return requestEmptySignature
	}
	return r.signature
}

// TranscriptBytes returns the canonical size of the input: the sum of the
// canonical lengths of its items.
func (r *Request) TranscriptBytes() int64 {
	if r == nil {
		return 0
	}
	return r.bytes
}

// ItemDigest returns the digest of input item i, counting from 0: d_(i+1) in
// the chain formula of Request. It panics if i is out of range.
func (r *Request) ItemDigest(i int) uint64 {
	if r == nil {
		return []uint64(nil)[i]
	}
	return r.digests[i]
}

// PrefixDigest returns the chain digest h(n) of the first n input items,
// 0 <= n <= Len(). It panics if n is out of that range.
func (r *Request) PrefixDigest(n int) uint64 {
	if r == nil {
		return [1]uint64{requestChainSeed}[n]
	}
	return r.prefix[n]
}

// Fingerprint returns the fingerprint of the input alone:
// {Len(), PrefixDigest(Len()), TranscriptBytes()}.
func (r *Request) Fingerprint() Fingerprint {
	return Fingerprint{Items: r.Len(), Digest: r.PrefixDigest(r.Len()), Bytes: r.TranscriptBytes()}
}

// Transcript returns the fingerprint of the input followed by the output
// items, which are canonicalised like input items. An output item that is
// not valid JSON yields an error wrapping ErrInvalidRequest that names it as
// output[i], with the offset inside that item.
func (r *Request) Transcript(output []json.RawMessage) (Fingerprint, error) {
	fp := r.Fingerprint()
	if len(output) == 0 {
		return fp, nil
	}
	p := getCanonState(nil)
	defer putCanonState(p)
	for i, raw := range output {
		p.reset(raw)
		if !p.document(canonModeItem) {
			return Fingerprint{}, p.error("invalid request", "output["+strconv.Itoa(i)+"]")
		}
		fp.Items++
		fp.Digest = requestChainNext(fp.Digest, xxhash.Sum64(p.out))
		fp.Bytes += int64(len(p.out))
	}
	return fp, nil
}
