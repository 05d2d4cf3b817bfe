package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// canonMaxDepth is the maximum number of arrays and objects open at once.
const canonMaxDepth = 512

// Parsing modes of an object.
const (
	canonModeValue uint8 = iota // a plain value
	canonModeItem               // the root of an item: the function_call rule applies
	canonModeBody               // the request body: the input member is collected, not written
)

// Byte classes inside a JSON string.
const (
	canonStrSafe uint8 = iota
	canonStrQuote
	canonStrEscape
	canonStrControl
	canonStrNonASCII
)

var canonStrClass = func() (t [256]uint8) {
	for i := 0; i < 0x20; i++ {
		t[i] = canonStrControl
	}
	t['"'] = canonStrQuote
	t['\\'] = canonStrEscape
	for i := 0x80; i < 0x100; i++ {
		t[i] = canonStrNonASCII
	}
	return t
}()

// canonMember is one member of an object being canonicalised.
type canonMember struct {
	key    []byte // decoded key
	keyOff int    // offset of the key in the input
	start  int    // offset of the key in the output, -1 if the member is not written
	val    int    // offset of the value in the output
	end    int    // end of the value in the output
}

// canonFrame is one level of the path to the value being parsed, used in
// error messages.
type canonFrame struct {
	key   []byte
	index int // array index or member number; -1 before the first one
	array bool
}

// canonState is the scanner and canonicaliser. States are pooled; all
// buffers are reused between calls.
type canonState struct {
	data    []byte
	pos     int
	depth   int
	out     []byte
	members []canonMember
	keys    []byte // decoded keys that contained escapes
	path    []canonFrame
	scratch []byte
	escaped bool // the last scanned string contained an escape

	argDecoded []byte
	argOut     []byte

	// Request parsing.
	itemOut    []byte
	itemRaw    []json.RawMessage
	itemDigest []uint64
	itemBytes  int64

	errOff  int
	errMsg  string
	errChar bool
}

// Parser states are reused. A few are kept in canonStateCache, which, unlike
// canonStatePool, is not emptied by garbage collection, so that steady
// traffic of large bodies does not regrow the buffers after every cycle.
// Only states with moderate buffers are kept there; larger ones go to the
// pool, and very large ones are dropped.
var (
	canonStateCache = make(chan *canonState, max(4, runtime.GOMAXPROCS(0)))
	canonStatePool  = sync.Pool{New: func() any { return new(canonState) }}
)

const (
	canonCacheMaxBuffer = 4 << 20  // largest buffer of a state in canonStateCache
	canonPoolMaxBuffer  = 16 << 20 // largest buffer of a state in canonStatePool
)

func getCanonState(data []byte) *canonState {
	var p *canonState
	select {
	case p = <-canonStateCache:
	default:
		p = canonStatePool.Get().(*canonState)
	}
	p.reset(data)
	return p
}

func putCanonState(p *canonState) {
	size := max(cap(p.out), cap(p.itemOut), cap(p.scratch), cap(p.keys), cap(p.argDecoded), cap(p.argOut))
	if size > canonPoolMaxBuffer {
		return
	}
	p.data = nil
	clear(p.members[:cap(p.members)])
	clear(p.path[:cap(p.path)])
	clear(p.itemRaw[:cap(p.itemRaw)])
	if size <= canonCacheMaxBuffer {
		select {
		case canonStateCache <- p:
			return
		default:
		}
	}
	canonStatePool.Put(p)
}

func (p *canonState) reset(data []byte) {
	p.data = data
	p.pos = 0
	p.depth = 0
	p.out = p.out[:0]
	p.members = p.members[:0]
	p.keys = p.keys[:0]
	p.path = p.path[:0]
	p.itemRaw = p.itemRaw[:0]
	p.itemDigest = p.itemDigest[:0]
	p.itemBytes = 0
	p.errOff, p.errMsg, p.errChar = 0, "", false
}

// Canonical returns the canonical form of one JSON value. Fingerprints are
// computed over this form so that two encodings of the same value always
// hash the same; other implementations of the protocol must reproduce it
// byte for byte:
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
//     written as raw UTF-8. So "\u00e9" and "é" are the same string. A string
//     holding invalid UTF-8, an unpaired surrogate escape, or a raw byte
//     below 0x20 is an error.
//   - Numbers must match the JSON number grammar and are copied exactly as
//     written: 1.0, 1 and 1e0 are three different canonical values.
//   - true, false and null are written as is.
//   - At most 512 arrays and objects may be open at once, counted from the
//     root of the document being parsed. For a request the body object is
//     level 1, the input array level 2 and an input item's own object or
//     array level 3; an output item passed to Request.Transcript is level 1.
//
// Items (the elements of a request's input and the output items passed to
// Request.Transcript) are canonicalised with one extra rule, which Canonical
// does not apply: when an item is an object whose member "type" is the string
// "function_call" and whose member "arguments" is a string, the decoded
// content of that string is parsed as a JSON document by the rules above,
// with its own depth count. If it parses, the canonical value of "arguments"
// is the canonical string whose content is the canonical form of that
// document, so "{\"a\":1,\"b\":2}" and "{\"b\": 2, \"a\": 1}" are the
// same arguments. If it does not parse, "arguments" is the canonical form of
// the string as for any other string. The rule looks only at the top level of
// an item and does not depend on member order.
//
// An error wraps ErrInvalidRequest and gives the byte offset of the problem
// and, where known, its path inside the value.
func Canonical(value []byte) ([]byte, error) {
	return canonicalize(value, canonModeValue)
}

// canonicalItem returns the canonical form of one request item: the rules of
// Canonical plus the function_call arguments rule described there.
func canonicalItem(value []byte) ([]byte, error) {
	return canonicalize(value, canonModeItem)
}

func canonicalize(value []byte, mode uint8) ([]byte, error) {
	p := getCanonState(value)
	defer putCanonState(p)
	if !p.document(mode) {
		return nil, p.error("invalid JSON value", "")
	}
	return bytes.Clone(p.out), nil
}

// canonSyntaxError describes a rejected document.
type canonSyntaxError struct {
	what string
	path string
	msg  string
	off  int
}

func (e *canonSyntaxError) Error() string {
	var b strings.Builder
	b.WriteString("store: ")
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

func (e *canonSyntaxError) Unwrap() error { return ErrInvalidRequest }

// error converts the recorded failure into an error. The path stack is left
// as it was when the failure happened.
func (p *canonState) error(what, pathPrefix string) error {
	msg := p.errMsg
	if p.errChar {
		if p.errOff >= len(p.data) {
			msg = "unexpected end of input"
		} else {
			msg = "invalid character " + canonQuoteByte(p.data[p.errOff]) + " " + msg
		}
	}
	return &canonSyntaxError{what: what, path: p.pathString(pathPrefix), msg: msg, off: p.errOff}
}

func canonQuoteByte(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	default:
		return "byte 0x" + strconv.FormatUint(uint64(c), 16)
	}
}

func (p *canonState) pathString(prefix string) string {
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
		if canonIsIdent(f.key) {
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

func canonIsIdent(s []byte) bool {
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
func (p *canonState) fail(off int, msg string) bool {
	p.errOff, p.errMsg, p.errChar = off, msg, false
	return false
}

// failChar records an unexpected character (or end of input) at the current
// position; msg completes "invalid character 'x' ...".
func (p *canonState) failChar(msg string) bool {
	p.errOff, p.errMsg, p.errChar = p.pos, msg, true
	return false
}

func (p *canonState) skipWS() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// document parses one complete JSON text.
func (p *canonState) document(mode uint8) bool {
	p.skipWS()
	if !p.value(mode) {
		return false
	}
	p.skipWS()
	if p.pos < len(p.data) {
		return p.failChar("after top-level value")
	}
	return true
}

// value parses the value at p.pos and appends its canonical form to p.out.
func (p *canonState) value(mode uint8) bool {
	if p.pos >= len(p.data) {
		return p.fail(p.pos, "unexpected end of input")
	}
	switch c := p.data[p.pos]; c {
	case '{':
		return p.object(mode)
	case '[':
		return p.array()
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

func (p *canonState) literal(lit string) bool {
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
func (p *canonState) number() bool {
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
func (p *canonState) scanString(dst []byte, canon bool) ([]byte, bool) {
	data := p.data
	i := p.pos + 1
	start := i
	p.escaped = false
	for {
		// Skip plain ASCII eight bytes at a time. A byte of the mask has its
		// high bit set where x has a byte >= 0x80, < 0x20, '"' or '\\'; false
		// positives from borrows only occur above a true one, so the lowest
		// set bit marks the first byte that needs attention.
		for i+8 <= len(data) {
			x := binary.LittleEndian.Uint64(data[i:])
			const ones, highs = 0x0101010101010101, 0x8080808080808080
			q := x ^ (ones * '"')
			b := x ^ (ones * '\\')
			if m := (x | (x - ones*0x20) | (q - ones) | (b - ones)) & highs; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(data) && canonStrClass[data[i]] == canonStrSafe {
			i++
		}
		if i >= len(data) {
			return dst, p.fail(len(data), "unexpected end of input in string")
		}
		switch canonStrClass[data[i]] {
		case canonStrQuote:
			dst = append(dst, data[start:i]...)
			p.pos = i + 1
			return dst, true
		case canonStrNonASCII:
			j := i + 1
			for j < len(data) && data[j] >= utf8.RuneSelf {
				j++
			}
			if !utf8.Valid(data[i:j]) {
				for {
					r, size := utf8.DecodeRune(data[i:j])
					if r == utf8.RuneError && size <= 1 {
						return dst, p.fail(i, "invalid UTF-8 in string")
					}
					i += size
				}
			}
			i = j
		case canonStrControl:
			return dst, p.fail(i, "invalid control character in string")
		default: // backslash
			dst = append(dst, data[start:i]...)
			p.escaped = true
			var ok bool
			dst, i, ok = p.escape(dst, i, canon)
			if !ok {
				return dst, false
			}
			start = i
		}
	}
}

// escape handles the escape sequence at data[i] == '\\' and returns the
// position after it.
func (p *canonState) escape(dst []byte, i int, canon bool) ([]byte, int, bool) {
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
		r, ok := canonHex4(data, i+2)
		if !ok {
			return dst, i, p.fail(i, "invalid \\u escape in string")
		}
		n := i + 6
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if n+1 < len(data) && data[n] == '\\' && data[n+1] == 'u' {
				lo, ok := canonHex4(data, n+2)
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
			return canonAppendRune(dst, r), n, true
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

func canonHex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

const canonHexDigits = "0123456789abcdef"

// canonAppendRune appends the canonical string encoding of r.
func canonAppendRune(dst []byte, r rune) []byte {
	switch {
	case r == '"' || r == '\\':
		return append(dst, '\\', byte(r))
	case r < 0x20:
		return canonAppendControl(dst, byte(r))
	case r < utf8.RuneSelf:
		return append(dst, byte(r))
	default:
		return utf8.AppendRune(dst, r)
	}
}

func canonAppendControl(dst []byte, c byte) []byte {
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
	return append(dst, '\\', 'u', '0', '0', canonHexDigits[c>>4], canonHexDigits[c&0xf])
}

// canonAppendContent appends the canonical string encoding (without quotes)
// of s, which must be valid UTF-8.
func canonAppendContent(dst, s []byte) []byte {
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		if c < 0x20 {
			dst = canonAppendControl(dst, c)
		} else {
			dst = append(dst, '\\', c)
		}
		start = i + 1
	}
	return append(dst, s[start:]...)
}

// key parses an object key, appends its canonical form to p.out and returns
// the decoded key.
func (p *canonState) key() ([]byte, bool) {
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

func (p *canonState) array() bool {
	if p.depth >= canonMaxDepth {
		return p.fail(p.pos, "exceeds maximum nesting depth of 512")
	}
	p.depth++
	p.pos++
	p.out = append(p.out, '[')
	frame := len(p.path)
	p.path = append(p.path, canonFrame{index: -1, array: true})
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for i := 0; ; i++ {
			p.path[frame].index = i
			if !p.value(canonModeValue) {
				return false
			}
			p.skipWS()
			if p.pos < len(p.data) {
				if c := p.data[p.pos]; c == ',' {
					p.out = append(p.out, ',')
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
	p.out = append(p.out, ']')
	p.path = p.path[:frame]
	p.depth--
	return true
}

func (p *canonState) object(mode uint8) bool {
	if p.depth >= canonMaxDepth {
		return p.fail(p.pos, "exceeds maximum nesting depth of 512")
	}
	p.depth++
	p.pos++
	objStart := len(p.out)
	p.out = append(p.out, '{')
	base := len(p.members)
	keysBase := len(p.keys)
	frame := len(p.path)
	p.path = append(p.path, canonFrame{index: -1})
	sorted := true
	written := 0
	typeIdx, argsIdx, argsTok := -1, -1, 0
	p.skipWS()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for n := 0; ; n++ {
			if p.pos >= len(p.data) || p.data[p.pos] != '"' {
				return p.failChar("looking for beginning of object key string")
			}
			p.path[frame].index = -1
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
			p.path[frame].key = key
			p.path[frame].index = n
			p.skipWS()
			if p.pos >= len(p.data) || p.data[p.pos] != ':' {
				return p.failChar("after object key")
			}
			p.pos++
			p.skipWS()
			m := canonMember{key: key, keyOff: keyOff, start: start}
			if mode == canonModeBody && string(key) == "input" {
				p.out = p.out[:commaAt]
				if !p.input() {
					return false
				}
				m.start = -1
			} else {
				p.out = append(p.out, ':')
				m.val = len(p.out)
				if mode == canonModeItem && p.pos < len(p.data) {
					switch string(key) {
					case "type":
						typeIdx = len(p.members)
					case "arguments":
						if p.data[p.pos] == '"' {
							argsIdx = len(p.members)
							argsTok = p.pos
						}
					}
				}
				if !p.value(canonModeValue) {
					return false
				}
				m.end = len(p.out)
				written++
			}
			p.members = append(p.members, m)
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
	if typeIdx >= 0 && argsIdx >= 0 {
		t := &p.members[typeIdx]
		if string(p.out[t.val:t.end]) == `"function_call"` {
			repl = p.canonArguments(argsTok)
			replVal = p.members[argsIdx].val
		}
	}
	if !sorted || repl != nil {
		ms := p.members[base:]
		if !sorted {
			canonSortMembers(ms)
			for i := 1; i < len(ms); i++ {
				if bytes.Equal(ms[i-1].key, ms[i].key) {
					p.path[frame].index = -1
					return p.fail(max(ms[i-1].keyOff, ms[i].keyOff), "duplicate key "+strconv.Quote(string(ms[i].key)))
				}
			}
		}
		p.rebuild(objStart+1, ms, repl, replVal)
	}
	p.out = append(p.out, '}')
	p.members = p.members[:base]
	p.keys = p.keys[:keysBase]
	p.path = p.path[:frame]
	p.depth--
	return true
}

func canonSortMembers(ms []canonMember) {
	if len(ms) <= 12 {
		for i := 1; i < len(ms); i++ {
			for j := i; j > 0 && bytes.Compare(ms[j-1].key, ms[j].key) > 0; j-- {
				ms[j-1], ms[j] = ms[j], ms[j-1]
			}
		}
		return
	}
	slices.SortFunc(ms, func(a, b canonMember) int { return bytes.Compare(a.key, b.key) })
}

// rebuild rewrites the members of the object whose content starts at body in
// the order of ms, replacing the value of the member whose value starts at
// replVal with repl when repl is not nil.
func (p *canonState) rebuild(body int, ms []canonMember, repl []byte, replVal int) {
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

// canonArguments applies the function_call rule to the string token at tok.
// It returns the canonical string to use instead of the plain canonical
// string, or nil when the two are the same.
func (p *canonState) canonArguments(tok int) []byte {
	end := p.pos
	p.pos = tok
	p.argDecoded, _ = p.scanString(p.argDecoded[:0], false)
	p.pos = end
	sub := getCanonState(p.argDecoded)
	defer putCanonState(sub)
	if !sub.document(canonModeValue) || bytes.Equal(sub.out, p.argDecoded) {
		return nil
	}
	p.argOut = append(p.argOut[:0], '"')
	p.argOut = canonAppendContent(p.argOut, sub.out)
	p.argOut = append(p.argOut, '"')
	return p.argOut
}
