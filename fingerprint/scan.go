package fingerprint

import (
	"bytes"
	"encoding/binary"
	asmutf8 "github.com/segmentio/asm/utf8"
	"math/bits"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// MaxDepth is the maximum number of arrays and objects open at once.
const MaxDepth = 512

// Bounds on the members of one object: a body that names more top-level
// members than any request has, or an object with more members than any
// JSON schema or item needs, is refused before it costs more than its
// bytes.
const (
	// MaxBodyMembers bounds the members of a request body.
	MaxBodyMembers = 1024
	// MaxObjectMembers bounds the members of any other object.
	MaxObjectMembers = 1 << 17
)

// place says where a value stands, which decides the rules that apply to it.
type place uint8

const (
	placeExact   place = iota // compared byte for byte: prompt members, function arguments
	placeBody                 // the request body
	placeInput                // the body's input array: each element is an item
	placeItem                 // the root of an item
	placeContent              // the value of an item's content member
	placePart                 // an element of an item's content array
	placeNested               // any other value inside an item
)

// inItem reports whether values at pl follow the item rules.
func (pl place) inItem() bool { return pl >= placeItem }

// element returns the place of the elements of an array at pl.
func (pl place) element() place {
	switch pl {
	case placeInput, placeExact:
		return pl
	case placeContent:
		return placePart
	}
	return placeNested
}

// child returns the place of the value of member key of an object at pl.
func (pl place) child(key []byte) place {
	switch {
	case !pl.inItem():
		return placeExact
	case pl == placeItem && string(key) == "content":
		return placeContent
	}
	return placeNested
}

// member is one member of an object being canonicalised.
type member struct {
	key    []byte // decoded key
	keyOff int    // offset of the key in the input
	start  int    // offset of the key in the output, -1 if the member is not written
	val    int    // offset of the value in the output
	end    int    // end of the value in the output
}

// topMember is a member of a request body: its decoded key and the span
// of its value.
type topMember struct {
	key        []byte
	start, end int
}

// frame is one level of the path to the value being parsed, used in error
// messages.
type frame struct {
	key   []byte
	index int // array index or member number; -1 before the first one
	array bool
}

// scanner validates and canonicalises JSON. Scanners are pooled; all
// buffers are reused between calls.
type scanner struct {
	data    []byte
	pos     int
	depth   int
	out     []byte
	members []member
	keys    []byte // decoded keys that contained escapes
	path    []frame
	scratch []byte
	escaped bool // the last scanned string contained an escape
	// deferUTF8 leaves the UTF-8 check of strings to one pass over the
	// whole item they are in (checkedItemValue); deferredHigh tells that
	// one of them had a byte >= 0x80.
	deferUTF8, deferredHigh bool

	rules *rules // nil: no profile rules (placeExact everywhere)

	argDecoded []byte
	argOut     []byte

	// The item being parsed: whether the profile dropped one of its
	// members, whether it is an item_reference, and whether to keep every
	// member (the second pass over an item_reference).
	dropped, reference, keepMembers bool
	// itemID is the canonical value of the item's own id, whether or not
	// the profile leaves it out; hasID tells that the item has one, a
	// string.
	itemID  []byte
	hasID   bool
	formOut []byte // a short message's content in full form

	// Request parsing.
	parser     *Parser
	itemOut    []byte
	itemDigest []uint64
	itemChain  []uint64 // h(k) of each item k
	itemRef    []bool   // whether each item is an item_reference
	itemSpans  []uint32 // each item's start and end, from inputStart
	itemBytes  int64
	misses     int // items in a row the item cache did not hold
	inputStart int // span of the body's input value; -1 when absent
	inputEnd   int
	prevStart  int // span of the body's previous_response_id value; -1 when absent
	prevEnd    int
	top        []topMember // the body's members
	// inputSkipped tells that the input was passed over (skipInput),
	// which skim asks for every body.
	inputSkipped, skim bool
	// The run the input array resumed from (runcache.go), and what the
	// body's arrival learnt of it (Parser.ReadRequest), if it was read so.
	match   runMatch
	arrival *arrival

	errOff  int
	errMsg  string
	errChar bool
}

// Scanners are reused. A few are kept in scannerCache, which, unlike
// scannerPool, is not emptied by garbage collection, so that steady traffic
// of large bodies does not regrow the buffers after every cycle. Only
// scanners with moderate buffers are kept there; larger ones go to the
// pool, and very large ones are dropped.
var (
	scannerCache = make(chan *scanner, max(4, runtime.GOMAXPROCS(0)))
	scannerPool  = sync.Pool{New: func() any { return new(scanner) }}
)

const (
	cacheMaxBuffer = 4 << 20  // most bytes a scanner in scannerCache retains
	poolMaxBuffer  = 16 << 20 // most bytes a scanner in scannerPool retains
)

func getScanner(data []byte, r *rules) *scanner {
	var p *scanner
	select {
	case p = <-scannerCache:
	default:
		p = scannerPool.Get().(*scanner)
	}
	p.reset(data)
	p.rules = r
	return p
}

func putScanner(p *scanner) {
	size := p.retained()
	if size > poolMaxBuffer {
		return
	}
	p.data = nil
	p.rules = nil
	p.parser = nil
	p.match = runMatch{hasher: p.match.hasher}
	p.arrival = nil
	clear(p.members[:cap(p.members)])
	clear(p.path[:cap(p.path)])
	if size <= cacheMaxBuffer {
		select {
		case scannerCache <- p:
			return
		default:
		}
	}
	scannerPool.Put(p)
}

// retained returns about how many bytes p's buffers hold: its byte
// buffers and its per-item and per-member slices, which a body of many
// small items grows beyond the bytes.
func (p *scanner) retained() int {
	return cap(p.out) + cap(p.itemOut) + cap(p.scratch) + cap(p.keys) + cap(p.argDecoded) + cap(p.argOut) +
		cap(p.formOut) + cap(p.itemID) +
		cap(p.itemDigest)*8 + cap(p.itemChain)*8 + cap(p.itemRef) + cap(p.itemSpans)*4 +
		cap(p.members)*int(unsafe.Sizeof(member{})) + cap(p.path)*int(unsafe.Sizeof(frame{})) +
		cap(p.top)*int(unsafe.Sizeof(topMember{}))
}

func (p *scanner) reset(data []byte) {
	p.data = data
	p.pos = 0
	p.depth = 0
	p.out = p.out[:0]
	p.members = p.members[:0]
	p.keys = p.keys[:0]
	p.path = p.path[:0]
	p.itemDigest = p.itemDigest[:0]
	p.itemChain = p.itemChain[:0]
	p.itemRef = p.itemRef[:0]
	p.itemSpans = p.itemSpans[:0]
	p.itemBytes, p.misses = 0, 0
	p.inputStart, p.inputEnd, p.prevStart, p.prevEnd = -1, -1, -1, -1
	p.inputSkipped, p.skim = false, false
	p.match = runMatch{hasher: p.match.hasher}
	p.top = p.top[:0]
	p.errOff, p.errMsg, p.errChar = 0, "", false
	p.deferUTF8, p.deferredHigh = false, false
}

// canonical returns the canonical form of one JSON value at pl under r.
func canonical(value []byte, r *rules, pl place) ([]byte, error) {
	p := getScanner(value, r)
	defer putScanner(p)
	if !p.document(pl) {
		return nil, p.error("invalid JSON value", "")
	}
	return bytes.Clone(p.out), nil
}

// Byte classes inside a JSON string.
const (
	strSafe uint8 = iota
	strQuote
	strEscape
	strControl
	strNonASCII
)

var strClass = func() (t [256]uint8) {
	for i := 0; i < 0x20; i++ {
		t[i] = strControl
	}
	t['"'] = strQuote
	t['\\'] = strEscape
	for i := 0x80; i < 0x100; i++ {
		t[i] = strNonASCII
	}
	return t
}()

// syntaxError describes a rejected document.
type syntaxError struct {
	what string
	path string
	msg  string
	off  int
}

func (e *syntaxError) Error() string {
	var b strings.Builder
	b.WriteString("fingerprint: ")
	b.WriteString(e.what)
	b.WriteString(": ")
	if e.path != "" {
		b.WriteString(e.path)
		b.WriteString(": ")
	}
	b.WriteString(e.msg)
	b.WriteString(" at offset ")
	b.WriteString(strconv.Itoa(e.off))
	return b.String()
}

func (e *syntaxError) Unwrap() error { return ErrInvalidRequest }

// error converts the recorded failure into an error. The path stack is left
// as it was when the failure happened.
func (p *scanner) error(what, pathPrefix string) error {
	msg := p.errMsg
	if p.errChar {
		if p.errOff >= len(p.data) {
			msg = "unexpected end of input"
		} else {
			msg = "invalid character " + quoteByte(p.data[p.errOff]) + " " + msg
		}
	}
	return &syntaxError{what: what, path: p.pathString(pathPrefix), msg: msg, off: p.errOff}
}

func quoteByte(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	default:
		return "byte 0x" + strconv.FormatUint(uint64(c), 16)
	}
}

func (p *scanner) pathString(prefix string) string {
	b := []byte(prefix)
	for _, f := range p.path {
		if f.index < 0 {
			break
		}
		if f.array {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(f.index), 10)
			b = append(b, ']')
			continue
		}
		if isIdent(f.key) {
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, f.key...)
		} else {
			b = append(b, '[')
			b = strconv.AppendQuote(b, string(f.key))
			b = append(b, ']')
		}
	}
	return string(b)
}

func isIdent(s []byte) bool {
	if len(s) == 0 {
		return false
	}
	for i, c := range s {
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// fail records an error at off and returns false.
func (p *scanner) fail(off int, msg string) bool {
	p.errOff, p.errMsg, p.errChar = off, msg, false
	return false
}

// failChar records an unexpected character (or end of input) at the current
// position; msg completes "invalid character 'x' ...".
func (p *scanner) failChar(msg string) bool {
	p.errOff, p.errMsg, p.errChar = p.pos, msg, true
	return false
}

func (p *scanner) skipWS() { p.pos = skipSpace(p.data, p.pos) }

// document parses one complete JSON text.
func (p *scanner) document(pl place) bool {
	p.skipWS()
	if pl == placeItem {
		return p.itemValue() && p.end()
	}
	return p.value(pl) && p.end()
}

// value parses the value at p.pos and appends its canonical form to p.out.
func (p *scanner) value(pl place) bool {
	if p.pos >= len(p.data) {
		return p.fail(p.pos, "unexpected end of input")
	}
	switch c := p.data[p.pos]; c {
	case '{':
		if pl == placeContent {
			pl = placeNested
		}
		return p.object(pl)
	case '[':
		return p.array(pl.element())
	case '"':
		p.out = append(p.out, '"')
		var ok bool
		p.out, ok = p.scanString(p.out, true)
		p.out = append(p.out, '"')
		return ok
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return p.number()
		}
		return p.failChar("looking for beginning of value")
	}
}

// open enters an array or object at p.pos.
func (p *scanner) open() bool {
	if p.depth >= MaxDepth {
		return p.fail(p.pos, "exceeds maximum nesting depth of 512")
	}
	p.depth++
	p.pos++
	p.skipWS()
	return true
}

// array parses the array at p.pos, each element at place elem. Elements of
// the body's input are items: they are collected, not written.
func (p *scanner) array(elem place) bool {
	if !p.open() {
		return false
	}
	items := elem == placeInput
	if !items {
		p.out = append(p.out, '[')
	}
	f := len(p.path)
	p.path = append(p.path, frame{index: -1, array: true})
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		resumed := 0 // items the run cache gave, p.pos after the last
		if items {
			resumed = p.resume()
		}
		for i := max(resumed-1, 0); ; i++ {
			p.path[f].index = i
			if i >= resumed {
				var ok bool
				if items {
					ok = p.item()
				} else {
					ok = p.value(elem)
				}
				if !ok {
					return false
				}
			}
			p.skipWS()
			if p.pos < len(p.data) {
				if c := p.data[p.pos]; c == ',' {
					if !items {
						p.out = append(p.out, ',')
					}
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
	if !items {
		p.out = append(p.out, ']')
	}
	p.path = p.path[:f]
	p.depth--
	return true
}

// input parses the value of the body's input member: an array of items or
// one string item.
func (p *scanner) input() bool {
	if p.pos >= len(p.data) {
		return p.fail(p.pos, "unexpected end of input")
	}
	p.inputStart = p.pos
	var ok bool
	switch p.data[p.pos] {
	case '"':
		ok = p.item()
	case '[':
		ok = p.array(placeInput)
	default:
		return p.fail(p.pos, "input must be an array or a string")
	}
	p.inputEnd = p.pos
	return ok
}

// upstreamHolds reports whether a member of the body read so far says the
// upstream holds the conversation: a previous_response_id or conversation
// that is not null.
func (p *scanner) upstreamHolds() bool {
	for _, m := range p.top {
		switch string(m.key) {
		case "previous_response_id", "conversation":
			if m.end > m.start && string(p.data[m.start:m.end]) != "null" {
				return true
			}
		}
	}
	return false
}

// skipInput passes over the body's input value, an array or a string,
// without reading its items: neither validated nor fingerprinted.
func (p *scanner) skipInput() bool {
	end := -1
	switch c := p.data[p.pos]; c {
	case '[':
		end = skipObject(p.data, p.pos)
	case '"':
		end = skipString(p.data, p.pos+1)
	default:
		return p.fail(p.pos, "input must be an array or a string")
	}
	if end < 0 {
		return p.fail(len(p.data), "unexpected end of input")
	}
	p.inputStart, p.inputEnd, p.pos, p.inputSkipped = p.pos, end, end, true
	return true
}

// itemValue parses the item at p.pos and appends its canonical form to
// p.out. An item_reference names the item it stands for by its id, so when
// the profile dropped a member of one, the item is parsed again keeping all.
func (p *scanner) itemValue() bool {
	from := p.mark()
	p.dropped, p.reference, p.keepMembers, p.hasID = false, false, false, false
	ok := p.value(placeItem)
	if ok && p.dropped && p.reference {
		p.rewind(from)
		p.keepMembers = true
		ok = p.value(placeItem)
	}
	return ok
}

// checkedItemValue is itemValue with one UTF-8 check for the whole item,
// where a string held a byte >= 0x80, instead of one for each such string.
// An item that holds invalid UTF-8, or that failed after such a byte, is
// parsed again checking each string, for the first error in it.
func (p *scanner) checkedItemValue() bool {
	from := p.mark()
	p.deferUTF8, p.deferredHigh = true, false
	ok := p.itemValue()
	p.deferUTF8 = false
	if !p.deferredHigh || ok && utf8Valid(p.data[from.pos:p.pos]) {
		return ok
	}
	p.rewind(from)
	return p.itemValue()
}

// parseMark is where a parse stood, to parse again from there.
type parseMark struct{ pos, out, depth, path int }

// mark returns where the parse stands.
func (p *scanner) mark() parseMark {
	return parseMark{p.pos, len(p.out), p.depth, len(p.path)}
}

// rewind takes the parse back to m, dropping what it wrote since.
func (p *scanner) rewind(m parseMark) {
	p.pos, p.out, p.depth, p.path = m.pos, p.out[:m.out], m.depth, p.path[:m.path]
}

// item parses one input item and records its raw bytes and digest: from
// the parser's item cache when it has seen the same object before.
func (p *scanner) item() bool {
	start := p.pos
	var key [2]uint64
	end := -1
	cache := p.itemCache()
	if cache != nil && p.misses < maxMisses {
		if end = skipObject(p.data, start); end > 0 {
			key = cache.hash(p.data[start:end])
			if it, ok := cache.get(key); ok {
				p.pos, p.misses = end, 0
				p.record(start, it)
				return true
			}
		}
		p.misses++
	}
	saved := p.out
	p.out = p.itemOut[:0]
	ok := p.checkedItemValue()
	canon := p.out
	p.itemOut = canon
	p.out = saved
	if !ok {
		return false
	}
	if p.parser == nil {
		p.itemBytes += int64(len(canon))
		return true
	}
	it := p.record(start, cachedItem{digest: p.parser.sum(canon), canonical: int64(len(canon)), reference: p.reference})
	if cache != nil {
		if end != p.pos {
			key = cache.hash(p.data[start:p.pos])
		}
		cache.put(key, it)
	}
	return true
}

// maxMisses is how many items in a row the item cache may miss before the
// rest of the request is canonicalised without looking: a turn's items
// the client sent before come first, its new ones last.
const maxMisses = 4

// itemCache returns the parser's item cache when the item at p.pos is an
// object of a request being parsed, else nil.
func (p *scanner) itemCache() *itemCache {
	if p.parser == nil || p.parser.items == nil || p.pos >= len(p.data) || p.data[p.pos] != '{' {
		return nil
	}
	return p.parser.items
}

// record records the item that starts at start and ends at p.pos, and
// returns it linked to the chain. An item linked before at h(k-1) gives
// the h(k) it gave then, the same function of the same input.
func (p *scanner) record(start int, it cachedItem) cachedItem {
	prev := p.parser.seed
	if n := len(p.itemChain); n > 0 {
		prev = p.itemChain[n-1]
	}
	if !it.linked || it.prev != prev {
		it.linked, it.prev, it.next = true, prev, p.parser.next(prev, it.digest)
	}
	p.itemSpans = append(p.itemSpans, uint32(start-p.inputStart), uint32(p.pos-p.inputStart))
	p.itemDigest = append(p.itemDigest, it.digest)
	p.itemChain = append(p.itemChain, it.next)
	p.itemRef = append(p.itemRef, it.reference)
	p.itemBytes += it.canonical
	return it
}

// object parses the object at p.pos at place pl.
func (p *scanner) object(pl place) bool {
	if !p.open() {
		return false
	}
	objStart := len(p.out)
	p.out = append(p.out, '{')
	base := len(p.members)
	keysBase := len(p.keys)
	f := len(p.path)
	p.path = append(p.path, frame{index: -1})
	sorted := true
	written := 0
	typeIdx, argsIdx, argsTok := -1, -1, 0
	roleIdx, contentIdx, idIdx, encIdx := -1, -1, -1, -1
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for n := 0; ; n++ {
			if p.pos >= len(p.data) || p.data[p.pos] != '"' {
				return p.failChar("looking for beginning of object key string")
			}
			if limit := MaxObjectMembers; n >= limit || (pl == placeBody && n >= MaxBodyMembers) {
				if pl == placeBody {
					limit = MaxBodyMembers
				}
				return p.fail(p.pos, "more than "+strconv.Itoa(limit)+" members in one object")
			}
			p.path[f].index = -1
			keyOff := p.pos
			commaAt := len(p.out)
			if written > 0 {
				p.out = append(p.out, ',')
			}
			start := len(p.out)
			key, ok := p.key()
			if !ok {
				return false
			}
			if len(p.members) > base {
				c := bytes.Compare(p.members[len(p.members)-1].key, key)
				if c == 0 {
					return p.fail(keyOff, "duplicate key "+strconv.Quote(string(key)))
				}
				if c > 0 {
					sorted = false
				}
			}
			p.path[f].key = key
			p.path[f].index = n
			p.skipWS()
			if p.pos >= len(p.data) || p.data[p.pos] != ':' {
				return p.failChar("after object key")
			}
			p.pos++
			p.skipWS()
			m := member{key: key, keyOff: keyOff, start: start}
			if pl == placeBody {
				k := key // in the body, which the request keeps, unless decoded
				if p.escaped {
					k = bytes.Clone(key)
				}
				p.top = append(p.top, topMember{key: k, start: p.pos})
			}
			if pl == placeBody && string(key) == "input" {
				p.out = p.out[:commaAt]
				if p.skim || p.upstreamHolds() {
					if !p.skipInput() {
						return false
					}
				} else if !p.input() {
					return false
				}
				m.start = -1
			} else {
				p.out = append(p.out, ':')
				m.val = len(p.out)
				if pl == placeBody && string(key) == "previous_response_id" {
					p.prevStart = p.pos
				}
				var ok bool
				switch {
				case pl != placeItem || p.pos >= len(p.data) || string(key) != "arguments" || p.data[p.pos] != '"':
					ok = p.value(pl.child(key))
				case typeIdx >= 0 && p.members[typeIdx].start >= 0 && string(p.out[p.members[typeIdx].val:p.members[typeIdx].end]) == `"function_call"`:
					ok = p.callArguments() // the type is known: one pass
				default: // the type may follow
					var call bool
					tok := p.pos
					if call, ok = p.untypedArguments(typeIdx < 0); !call {
						argsIdx, argsTok = len(p.members), tok // decided at the end
					}
				}
				if !ok {
					return false
				}
				m.end = len(p.out)
				if pl == placeBody && string(key) == "previous_response_id" {
					p.prevEnd = p.pos
				}
				if pl == placeItem {
					switch string(key) {
					case "type":
						typeIdx = len(p.members)
						if string(p.out[m.val:m.end]) == `"item_reference"` {
							p.reference = true
						}
					case "role":
						roleIdx = len(p.members)
					case "content":
						contentIdx = len(p.members)
					case "id":
						idIdx = len(p.members)
						p.itemID, p.hasID = append(p.itemID[:0], p.out[m.val:m.end]...), p.out[m.val] == '"'
					case "encrypted_content":
						encIdx = len(p.members)
					}
				}
				if p.drop(pl, key, p.out[m.val:m.end]) {
					p.out = p.out[:commaAt]
					m.start = -1
				} else {
					written++
				}
			}
			p.members = append(p.members, m)
			if pl == placeBody {
				p.top[len(p.top)-1].end = p.pos
			}
			p.skipWS()
			if p.pos < len(p.data) {
				if c := p.data[p.pos]; c == ',' {
					p.pos++
					p.skipWS()
					continue
				} else if c == '}' {
					p.pos++
					break
				}
			}
			return p.failChar("after object key:value pair")
		}
	}
	var repl []byte
	replVal := -1
	if typeIdx >= 0 && argsIdx >= 0 && p.members[argsIdx].start >= 0 {
		if t := &p.members[typeIdx]; t.start >= 0 && string(p.out[t.val:t.end]) == `"function_call"` {
			repl = p.arguments(argsTok)
			replVal = p.members[argsIdx].val
		}
	}
	if pl == placeItem && p.rules != nil && p.rules.reasoningIDs && p.keepReasoningID(typeIdx, idIdx, encIdx, written > 0) {
		sorted = false
		written++
	}
	if pl == placeItem && repl == nil && p.rules != nil {
		var added bool
		repl, replVal, added = p.itemForm(base, typeIdx, roleIdx, contentIdx, written > 0)
		sorted = sorted && !added
	}
	if !sorted || repl != nil {
		ms := p.members[base:]
		if !sorted {
			sortMembers(ms)
			for i := 1; i < len(ms); i++ {
				if bytes.Equal(ms[i-1].key, ms[i].key) {
					p.path[f].index = -1
					return p.fail(max(ms[i-1].keyOff, ms[i].keyOff), "duplicate key "+strconv.Quote(string(ms[i].key)))
				}
			}
		}
		p.rebuild(objStart+1, ms, repl, replVal)
	}
	p.out = append(p.out, '}')
	p.members = p.members[:base]
	p.keys = p.keys[:keysBase]
	p.path = p.path[:f]
	p.depth--
	return true
}

// drop reports whether the member key with canonical value val of an
// object at pl is left out of the canonical form: a member the profile
// ignores, or, inside an item, a member whose value is null.
func (p *scanner) drop(pl place, key, val []byte) bool {
	r := p.rules
	if r == nil {
		return false
	}
	switch pl {
	case placeBody:
		return r.prompt.has(key)
	case placeItem:
		if !p.keepMembers && r.item.has(key) {
			p.dropped = true
			return true
		}
	case placePart:
		if r.part.has(key) || (string(val) == "[]" && r.emptyPart.has(key)) {
			return true
		}
	}
	return pl.inItem() && string(val) == "null"
}

// typeKey and messageType spell the member a short message lacks.
var (
	typeKey     = []byte("type")
	messageType = []byte(`"message"`)
)

// keepReasoningID writes back the id the profile left out of an item,
// p.members[idIdx] (its value p.itemID), when the item is a reasoning
// item without encrypted_content (Profile.ReasoningIDs), and reports
// whether it did.
func (p *scanner) keepReasoningID(typeIdx, idIdx, encIdx int, comma bool) bool {
	given := func(i int) bool { return i >= 0 && p.members[i].start >= 0 }
	if idIdx < 0 || given(idIdx) || string(p.itemID) == "null" || given(encIdx) ||
		!given(typeIdx) || string(p.out[p.members[typeIdx].val:p.members[typeIdx].end]) != `"reasoning"` {
		return false
	}
	if comma {
		p.out = append(p.out, ',')
	}
	m := member{key: p.members[idIdx].key, keyOff: p.members[idIdx].keyOff, start: len(p.out)}
	p.out = append(p.out, `"id":`...)
	m.val = len(p.out)
	p.out = append(p.out, p.itemID...)
	m.end = len(p.out)
	p.members[idIdx] = m
	return true
}

// itemForm applies the profile's rules on the form of an item whose
// members, from p.members[base:], are all written: an item without type
// and role is an item_reference (parsed again keeping every member); with
// short messages, an item with a role and no type gets "type":"message",
// and a message's string content becomes one text part. It returns the
// content's new value and where the old one starts (nil, -1 when
// unchanged), and whether it added a member.
func (p *scanner) itemForm(base, typeIdx, roleIdx, contentIdx int, comma bool) (repl []byte, replVal int, added bool) {
	given := func(i int) bool { return i >= 0 && p.members[i].start >= 0 }
	value := func(i int) []byte { return p.out[p.members[i].val:p.members[i].end] }
	r := p.rules
	switch {
	case r.references && !given(typeIdx) && !given(roleIdx):
		p.reference = true
		return nil, -1, false
	case !r.shortMessages || !given(roleIdx):
		return nil, -1, false
	}
	if !given(typeIdx) {
		if comma {
			p.out = append(p.out, ',')
		}
		m := member{key: typeKey, keyOff: -1, start: len(p.out)}
		p.out = append(p.out, `"type":`...)
		m.val = len(p.out)
		p.out = append(p.out, messageType...)
		m.end = len(p.out)
		if typeIdx >= 0 { // "type":null, left out: the member stands for it
			m.keyOff = p.members[typeIdx].keyOff
			p.members[typeIdx] = m
		} else {
			typeIdx = len(p.members)
			p.members = append(p.members, m)
		}
		added = true
	}
	if !bytes.Equal(value(typeIdx), messageType) || !given(contentIdx) || p.out[p.members[contentIdx].val] != '"' {
		return nil, -1, added
	}
	var part string
	switch string(value(roleIdx)) {
	case `"assistant"`:
		part = "output_text"
	case `"user"`, `"system"`, `"developer"`:
		part = "input_text"
	default:
		return nil, -1, added
	}
	p.formOut = append(p.formOut[:0], `[{"text":`...)
	p.formOut = append(p.formOut, value(contentIdx)...)
	p.formOut = append(p.formOut, `,"type":"`...)
	p.formOut = append(p.formOut, part...)
	p.formOut = append(p.formOut, `"}]`...)
	return p.formOut, p.members[contentIdx].val, added
}

func sortMembers(ms []member) {
	if len(ms) <= 12 {
		for i := 1; i < len(ms); i++ {
			for j := i; j > 0 && bytes.Compare(ms[j-1].key, ms[j].key) > 0; j-- {
				ms[j-1], ms[j] = ms[j], ms[j-1]
			}
		}
		return
	}
	slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
}

// rebuild rewrites the members of the object whose content starts at body in
// the order of ms, replacing the value of the member whose value starts at
// replVal with repl when repl is not nil.
func (p *scanner) rebuild(body int, ms []member, repl []byte, replVal int) {
	p.scratch = append(p.scratch[:0], p.out[body:]...)
	p.out = p.out[:body]
	first := true
	for _, m := range ms {
		if m.start < 0 {
			continue
		}
		if !first {
			p.out = append(p.out, ',')
		}
		first = false
		if repl != nil && m.val == replVal {
			p.out = append(p.out, p.scratch[m.start-body:m.val-body]...)
			p.out = append(p.out, repl...)
			continue
		}
		p.out = append(p.out, p.scratch[m.start-body:m.end-body]...)
	}
}

// callArguments writes the arguments string of a function call at p.pos by
// the function_call rule.
func (p *scanner) callArguments() bool {
	var ok bool
	p.argDecoded, ok = p.scanString(p.argDecoded[:0], false)
	if ok {
		p.writeCallArguments()
	}
	return ok
}

// writeCallArguments writes the decoded arguments p.argDecoded by the
// function_call rule: the content's canonical form when it is a JSON
// document, else the content.
func (p *scanner) writeCallArguments() {
	content := p.argDecoded
	sub := getScanner(p.argDecoded, nil)
	defer putScanner(sub)
	sub.deferUTF8 = p.deferUTF8 // the content is checked with the item's
	if sub.document(placeExact) {
		content = sub.out
	}
	p.writeString(content)
}

// writeString writes the string of content s, valid UTF-8, in canonical
// encoding.
func (p *scanner) writeString(s []byte) {
	p.out = append(p.out, '"')
	p.out = appendContent(p.out, s)
	p.out = append(p.out, '"')
}

// untypedArguments writes the arguments string at p.pos of an item whose
// type has not been read: by the function_call rule when the type that
// follows is function_call as callFollows reads it (and the type member
// is kept), else as any string, its canonical encoding being that of its
// decoded content. It reports whether it applied the rule; when it did
// not, the type decides at the end of the item (arguments). typeUnread
// is false when a type was read and was not function_call.
func (p *scanner) untypedArguments(typeUnread bool) (call, ok bool) {
	if p.argDecoded, ok = p.scanString(p.argDecoded[:0], false); !ok {
		return false, false
	}
	if typeUnread && (p.rules == nil || p.keepMembers || !p.rules.item.has(typeKey)) && p.callFollows() {
		p.writeCallArguments()
		return true, true
	}
	p.writeString(p.argDecoded)
	return false, true
}

// callFollows reports whether the rest of the object, from p.pos, has the
// member "type":"function_call" written without escapes. It reads only
// brackets and strings and validates nothing: the object is parsed in
// full afterwards, and a duplicate type is refused then.
func (p *scanner) callFollows() bool {
	data := p.data
	depth := 0
	for i := p.pos; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return false
			}
			depth--
		case '"':
			end := skipString(data, i+1)
			if end < 0 {
				return false
			}
			if depth == 0 && string(data[i:end]) == `"type"` {
				j := skipSpace(data, end)
				if j < len(data) && data[j] == ':' {
					return bytes.HasPrefix(data[skipSpace(data, j+1):], functionCallType)
				}
			}
			i = end - 1
		}
	}
	return false
}

// functionCallType is the canonical type of a function call.
var functionCallType = []byte(`"function_call"`)

// skipSpace returns the position of the first byte from data[i] on that
// is not JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// arguments applies the function_call rule to the string token at tok. It
// returns the canonical string to use instead of the plain canonical
// string, or nil when the two are the same. The document inside is
// compared exactly: no profile rule applies there.
func (p *scanner) arguments(tok int) []byte {
	end := p.pos
	p.pos = tok
	p.argDecoded, _ = p.scanString(p.argDecoded[:0], false)
	p.pos = end
	sub := getScanner(p.argDecoded, nil)
	defer putScanner(sub)
	sub.deferUTF8 = p.deferUTF8 // the content is checked with the item's
	if !sub.document(placeExact) || bytes.Equal(sub.out, p.argDecoded) {
		return nil
	}
	p.argOut = append(p.argOut[:0], '"')
	p.argOut = appendContent(p.argOut, sub.out)
	p.argOut = append(p.argOut, '"')
	return p.argOut
}

func (p *scanner) literal(lit string) bool {
	if len(p.data)-p.pos >= len(lit) && string(p.data[p.pos:p.pos+len(lit)]) == lit {
		p.out = append(p.out, lit...)
		p.pos += len(lit)
		return true
	}
	for i := 0; i < len(lit); i++ {
		if p.pos >= len(p.data) || p.data[p.pos] != lit[i] {
			return p.failChar("in literal " + lit)
		}
		p.pos++
	}
	return true // not reached
}

// number validates a JSON number and copies it unchanged.
func (p *scanner) number() bool {
	data := p.data
	start := p.pos
	i := start
	if data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		p.pos = i
		return p.failChar("in numeric literal")
	case data[i] == '0':
		i++
	case data[i] >= '1' && data[i] <= '9':
		i++
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	default:
		p.pos = i
		return p.failChar("in numeric literal")
	}
	if i < len(data) && data[i] == '.' {
		i++
		if i >= len(data) || data[i] < '0' || data[i] > '9' {
			p.pos = i
			return p.failChar("after decimal point in numeric literal")
		}
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) || data[i] < '0' || data[i] > '9' {
			p.pos = i
			return p.failChar("in exponent of numeric literal")
		}
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	}
	p.out = append(p.out, data[start:i]...)
	p.pos = i
	return true
}

// scanString scans the string whose opening quote is at p.pos, appends its
// content to dst and leaves p.pos after the closing quote. With canon set the
// content is written in canonical encoding, otherwise decoded. p.escaped
// reports whether the string contained any escape.
//
// It writes the content to dst as it reads it, so that content the
// encoding keeps costs one load and one store: 32 bytes at a time where
// passContent can (passing over the escapes that stay as they are, and
// decoding a \u escape of a character that stands for itself), else eight
// at a time. It stops only where attention marks a byte: a quote, a
// backslash or a control character. Whether the content is valid UTF-8 is
// checked once, at the closing quote, and only when a byte >= 0x80 was
// passed; or with the item the string is in (deferUTF8). Whatever is
// invalid is handed to scanStringSlow, from the start of the string, for
// the error it reports.
func (p *scanner) scanString(dst []byte, canon bool) ([]byte, bool) {
	data := p.data
	dst0 := len(dst)
	buf := dst[:cap(dst)] // written up to o
	o := dst0
	open := p.pos + 1
	i := open
	escaped := false
	var high uint64 // the bytes passed over, ORed: a high bit says one was >= 0x80
	kept := &keptEscape
	if !canon {
		kept = &noEscapeKept
	}
	for {
		var hi, esc bool
		if i, o, hi, esc = passContent(data, i, buf, o, kept); hi {
			high |= highs
		}
		escaped = escaped || esc
		if len(buf)-o < 64 {
			buf = slices.Grow(buf[:o], 64)
			buf = buf[:cap(buf)]
		}
		x := load8(data, i)
		binary.LittleEndian.PutUint64(buf[o:], x)
		m := attention(x)
		if m == 0 {
			high |= x
			i += 8
			o += 8
			continue
		}
		high |= x & ((m&-m)>>7 - 1) // the bytes before the first marked
		k := bits.TrailingZeros64(m) >> 3
		i += k
		o += k
		if i >= len(data) {
			break // past the end: load8's NUL
		}
		c := data[i]
		if c == '"' {
			if high&highs != 0 {
				if p.deferUTF8 {
					p.deferredHigh = true
				} else if !utf8Valid(data[open:i]) {
					break
				}
			}
			p.escaped = escaped
			p.pos = i + 1
			return buf[:o], true
		}
		if c != '\\' || i+1 >= len(data) {
			break // a control character, or a backslash that ends the input
		}
		escaped = true
		c = data[i+1]
		if kept[c] {
			buf[o+1] = c // its canonical encoding is itself
			i += 2
			o += 2
			continue
		}
		if d := unescaped[c]; d != 0 {
			buf[o] = d
			i += 2
			o++
			continue
		}
		if r, ok := hex4(data, i+2); c == 'u' && ok && (r < 0xD800 || r >= 0xE000) && (!canon || r >= 0x20 && r != '"' && r != '\\') {
			o += utf8.EncodeRune(buf[o:], r)
			i += 6
			continue
		}
		dst, next, ok := p.escape(buf[:o], i, canon)
		if !ok {
			break
		}
		buf, o, i = dst[:cap(dst)], len(dst), next
	}
	return p.scanStringSlow(buf[:dst0], canon)
}

// load8 returns the eight bytes at data[i], little-endian, with NUL for
// those past the end.
func load8(data []byte, i int) uint64 {
	if i <= len(data)-8 {
		return binary.LittleEndian.Uint64(data[i:])
	}
	var b [8]byte
	copy(b[:], data[i:])
	return binary.LittleEndian.Uint64(b[:])
}

// utf8Valid reports whether s is valid UTF-8, 32 bytes at a time where
// the processor allows.
func utf8Valid(s []byte) bool { return asmutf8.Valid(s) }

// Constants of the eight-byte string scan.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
	lows  = 0x7f7f7f7f7f7f7f7f
)

// attention returns the mask of the high bits of the bytes of x that end
// or interrupt a run of string content: '"', '\\' and those below 0x20.
// Unlike a borrow-based test it is exact for every byte, so bytes >= 0x80
// are never marked and a byte's mark does not depend on its neighbours.
func attention(x uint64) uint64 {
	low := x & lows
	notControl := low + ones*(0x80-0x20)
	notQuote := (low ^ ones*'"') + lows
	notBackslash := (low ^ ones*'\\') + lows
	return ^(notControl&notQuote&notBackslash | x) & highs
}

// unescaped gives the character each short escape stands for, 0 for \u
// and for what is not an escape.
var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// scanStringSlow is scanString one character at a time: the reference for
// its fast path, which hands a string over to it to report what is wrong
// with it.
func (p *scanner) scanStringSlow(dst []byte, canon bool) ([]byte, bool) {
	data := p.data
	i := p.pos + 1
	start := i
	p.escaped = false
	for {
		// Skip plain ASCII eight bytes at a time: the mask marks a byte >=
		// 0x80 and those attention marks.
		for i+8 <= len(data) {
			x := binary.LittleEndian.Uint64(data[i:])
			if m := attention(x) | x&highs; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(data) && strClass[data[i]] == strSafe {
			i++
		}
		if i >= len(data) {
			return dst, p.fail(len(data), "unexpected end of input in string")
		}
		switch strClass[data[i]] {
		case strQuote:
			dst = append(dst, data[start:i]...)
			p.pos = i + 1
			return dst, true
		case strNonASCII:
			n := utf8Len(data, i)
			if n == 0 {
				return dst, p.fail(i, "invalid UTF-8 in string")
			}
			i += n
		case strControl:
			return dst, p.fail(i, "invalid control character in string")
		default: // backslash
			p.escaped = true
			if canon && i+1 < len(data) && keptEscape[data[i+1]] {
				i += 2 // its canonical encoding is itself
				continue
			}
			dst = append(dst, data[start:i]...)
			var ok bool
			dst, i, ok = p.escape(dst, i, canon)
			if !ok {
				return dst, false
			}
			start = i
		}
	}
}

// utf8Len returns the length of the valid UTF-8 encoding of one character
// at b[i], a byte >= 0x80, or 0 when it is not one: a continuation byte,
// an overlong form, a surrogate, beyond U+10FFFF or cut short.
func utf8Len(b []byte, i int) int {
	c := b[i]
	lo, hi := byte(0x80), byte(0xBF) // the second byte's range
	n := 0
	switch {
	case c < 0xC2:
		return 0
	case c < 0xE0:
		n = 2
	case c < 0xF0:
		n = 3
		if c == 0xE0 {
			lo = 0xA0
		} else if c == 0xED {
			hi = 0x9F
		}
	case c < 0xF5:
		n = 4
		if c == 0xF0 {
			lo = 0x90
		} else if c == 0xF4 {
			hi = 0x8F
		}
	default:
		return 0
	}
	if i+n > len(b) || b[i+1] < lo || b[i+1] > hi {
		return 0
	}
	for k := 2; k < n; k++ {
		if b[i+k]&0xC0 != 0x80 {
			return 0
		}
	}
	return n
}

// keptEscape marks the characters c whose escape \c is its own canonical
// encoding.
var keptEscape = [256]bool{'"': true, '\\': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// noEscapeKept keeps no escape as it is: decoding decodes them all.
var noEscapeKept [256]bool

// escape handles the escape sequence at data[i] == '\\' and returns the
// position after it.
func (p *scanner) escape(dst []byte, i int, canon bool) ([]byte, int, bool) {
	data := p.data
	if i+1 >= len(data) {
		return dst, i, p.fail(len(data), "unexpected end of input in string")
	}
	c := data[i+1]
	var dec byte
	switch c {
	case '"', '\\':
		if canon {
			return append(dst, '\\', c), i + 2, true
		}
		return append(dst, c), i + 2, true
	case '/':
		return append(dst, '/'), i + 2, true
	case 'b':
		dec = '\b'
	case 'f':
		dec = '\f'
	case 'n':
		dec = '\n'
	case 'r':
		dec = '\r'
	case 't':
		dec = '\t'
	case 'u':
		r, ok := hex4(data, i+2)
		if !ok {
			return dst, i, p.fail(i, "invalid \\u escape in string")
		}
		n := i + 6
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if n+1 < len(data) && data[n] == '\\' && data[n+1] == 'u' {
				lo, ok := hex4(data, n+2)
				if !ok {
					return dst, i, p.fail(n, "invalid \\u escape in string")
				}
				if lo >= 0xDC00 && lo < 0xE000 {
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
					n += 6
					break
				}
			}
			return dst, i, p.fail(i, "unpaired surrogate escape in string")
		case r >= 0xDC00 && r < 0xE000:
			return dst, i, p.fail(i, "unpaired surrogate escape in string")
		}
		if canon {
			return appendRune(dst, r), n, true
		}
		return utf8.AppendRune(dst, r), n, true
	default:
		return dst, i, p.fail(i, "invalid escape in string")
	}
	if canon {
		return append(dst, '\\', c), i + 2, true
	}
	return append(dst, dec), i + 2, true
}

// hex4 returns the value of the four hexadecimal digits at data[i], and
// false when there are not four.
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	d := data[i : i+4]
	r := hexValue[d[0]]<<12 | hexValue[d[1]]<<8 | hexValue[d[2]]<<4 | hexValue[d[3]]
	return r, r >= 0
}

// hexValue gives the value of each hexadecimal digit, -1 for the other
// bytes, which makes negative any combination of values it is in.
var hexValue = func() (t [256]rune) {
	for c := range t {
		switch {
		case c >= '0' && c <= '9':
			t[c] = rune(c - '0')
		case c >= 'a' && c <= 'f':
			t[c] = rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			t[c] = rune(c - 'A' + 10)
		default:
			t[c] = -1
		}
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendRune appends the canonical string encoding of r.
func appendRune(dst []byte, r rune) []byte {
	switch {
	case r == '"' || r == '\\':
		return append(dst, '\\', byte(r))
	case r < 0x20:
		return appendControl(dst, byte(r))
	case r < utf8.RuneSelf:
		return append(dst, byte(r))
	default:
		return utf8.AppendRune(dst, r)
	}
}

func appendControl(dst []byte, c byte) []byte {
	switch c {
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
}

// appendContent appends the canonical string encoding (without quotes)
// of s, which must be valid UTF-8.
func appendContent(dst, s []byte) []byte {
	start := 0
	for i := 0; i < len(s); {
		if i+8 <= len(s) {
			m := attention(binary.LittleEndian.Uint64(s[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		}
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		if c < 0x20 {
			dst = appendControl(dst, c)
		} else {
			dst = append(dst, '\\', c)
		}
		i++
		start = i
	}
	return append(dst, s[start:]...)
}

// key parses an object key, appends its canonical form to p.out and returns
// the decoded key.
func (p *scanner) key() ([]byte, bool) {
	tok := p.pos
	p.out = append(p.out, '"')
	var ok bool
	p.out, ok = p.scanString(p.out, true)
	if !ok {
		return nil, false
	}
	p.out = append(p.out, '"')
	if !p.escaped {
		return p.data[tok+1 : p.pos-1 : p.pos-1], true
	}
	end := p.pos
	k0 := len(p.keys)
	p.pos = tok
	p.keys, _ = p.scanString(p.keys, false)
	p.pos = end
	return p.keys[k0:len(p.keys):len(p.keys)], true
}

// end checks that only whitespace follows the value just parsed.
func (p *scanner) end() bool {
	p.skipWS()
	if p.pos < len(p.data) {
		return p.failChar("after top-level value")
	}
	return true
}
