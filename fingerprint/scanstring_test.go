package fingerprint

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// utf8Valid accepts exactly what the standard library calls valid UTF-8,
// for every first two bytes and the tails that matter, alone and placed in
// ASCII text across the validator's 32-byte blocks and at the end of a
// long input, its last, partial block.
func TestUTF8ValidMatchesTheStandardLibrary(t *testing.T) {
	text := bytes.Repeat([]byte("a"), 96)
	for a := 0; a < 0x100; a++ {
		for b := 0; b < 0x100; b++ {
			for _, tail := range [][]byte{nil, {0x80}, {0xBF}, {0x80, 0x80}, {0x41}, {0xBF, 0xBF}, {0x90, 0x80}, {0x8F, 0xBF}} {
				s := append([]byte{byte(a), byte(b)}, tail...)
				for n := 1; n <= len(s); n++ {
					want := utf8.Valid(s[:n])
					if got := utf8Valid(s[:n]); got != want {
						t.Fatalf("% x: %v, want %v", s[:n], got, want)
					}
					for _, at := range []int{0, 30, 31, 61, len(text)} {
						in := append(append(text[:at:at], s[:n]...), text[at:]...)
						if got := utf8Valid(in); got != want {
							t.Fatalf("% x at %d: %v, want %v", s[:n], at, got, want)
						}
					}
				}
			}
		}
	}
}

// scanPieces and invalidPieces are the pieces of which randomStringToken
// builds string tokens: plain and non-ASCII text and every kind of escape,
// and what is invalid in a string.
var scanPieces = []string{
	"a", "b", "~", " ", "/", "\x7f", "0123456789abcdef", "é", "ü", "日", "€", "🚀", "Ω",
	`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`,
	`\u0041`, `\u003c`, `\u0022`, `\u005C`, `\u001f`, `\u0000`, `\u007f`, `\u00e9`, `\u20AC`, `\uFFFF`,
	`\ud83d\ude00`, `\uD83D\uDE00`, `\udbff\udfff`,
}

var invalidPieces = []string{
	`\ud800`, `\udc00`, `\ud83d\u0041`, `\ud83dx`, `\u12`, `\u12G4`, `\x`, `\a`, `\'`, `\`, "\\\xc3\xa9",
	"\x00", "\x01", "\x1f", "\n", "\t",
	"\x80", "\xbf", "\xc0\x80", "\xc1\xbf", "\xc3", "\xc3\x28", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80",
	"\xed\xbf\xbf", "\xe2\x82", "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xf0\x9f\x9a", "\xff", "\xfe",
}

// randomStringToken returns a string token of random pieces, mostly valid
// ones, with or without its closing quote, after a random number of bytes
// that shift it against the eight-byte words.
func randomStringToken(rng *rand.Rand) (data []byte, pos int) {
	var b strings.Builder
	pad := rng.IntN(9)
	b.WriteString(strings.Repeat(" ", pad))
	b.WriteByte('"')
	for k := rng.IntN(48); k > 0; k-- {
		switch r := rng.IntN(100); {
		case r < 40:
			b.WriteString(strings.Repeat(string(rune('a'+rng.IntN(26))), 1+rng.IntN(12)))
		case r < 97:
			b.WriteString(scanPieces[rng.IntN(len(scanPieces))])
		default:
			b.WriteString(invalidPieces[rng.IntN(len(invalidPieces))])
		}
	}
	if rng.IntN(10) > 0 {
		b.WriteByte('"')
	}
	if rng.IntN(2) == 0 {
		b.WriteString(strings.Repeat("x", rng.IntN(12)))
	}
	return []byte(b.String()), pad
}

// checkScanString checks that scanString gives what scanStringSlow gives
// for the string token at data[pos], in both modes and onto destinations
// with and without room: the same content, position, escape flag and
// error.
func checkScanString(t *testing.T, data []byte, pos int) {
	t.Helper()
	for _, canon := range []bool{true, false} {
		for _, prefix := range [][]byte{nil, []byte("prefix"), make([]byte, 3, 40), make([]byte, 3, 70), make([]byte, 3, 1000)} {
			fast := &scanner{data: data, pos: pos}
			slow := &scanner{data: data, pos: pos}
			gotOut, gotOK := fast.scanString(bytes.Clone(prefix), canon)
			wantOut, wantOK := slow.scanStringSlow(bytes.Clone(prefix), canon)
			require.Equal(t, wantOK, gotOK, "%q canon=%v", data, canon)
			if !wantOK {
				require.Equal(t, slow.errOff, fast.errOff, "%q canon=%v", data, canon)
				require.Equal(t, slow.errMsg, fast.errMsg, "%q canon=%v", data, canon)
				continue
			}
			require.Equal(t, string(wantOut), string(gotOut), "%q canon=%v", data, canon)
			require.Equal(t, slow.pos, fast.pos, "%q canon=%v", data, canon)
			require.Equal(t, slow.escaped, fast.escaped, "%q canon=%v", data, canon)
		}
	}
}

// The fast string scan gives what the reference one does, on random
// strings of valid and invalid pieces at every alignment, and on every
// piece alone, at every offset of a word and of a 32-byte block and at the
// end of the input; with AVX2 and without.
func TestScanStringMatchesTheReference(t *testing.T) {
	scanPaths(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 12))
		for n := 0; n < 20000; n++ {
			data, pos := randomStringToken(rng)
			checkScanString(t, data, pos)
		}
		for _, piece := range append(scanPieces[:len(scanPieces):len(scanPieces)], invalidPieces...) {
			for before := 0; before < 70; before++ {
				for _, after := range []string{"", `"`, `"` + strings.Repeat(" ", 8), strings.Repeat("a", 9) + `"`, strings.Repeat("a", 40) + `"`} {
					data := []byte(`"` + strings.Repeat("a", before) + piece + after)
					checkScanString(t, data, 0)
				}
			}
		}
	})
}

func FuzzScanString(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	for n := 0; n < 50; n++ {
		data, _ := randomStringToken(rng)
		f.Add(data)
	}
	f.Add(syntheticBody(2, 1000))
	f.Fuzz(func(t *testing.T, data []byte) {
		if i := bytes.IndexByte(data, '"'); i >= 0 {
			scanPaths(t, func(t *testing.T) { checkScanString(t, data, i) })
		}
	})
}

// appendContentByByte is appendContent one byte at a time: the reference.
func appendContentByByte(dst, s []byte) []byte {
	for _, c := range s {
		switch {
		case c < 0x20:
			dst = appendControl(dst, c)
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// appendContent gives what the byte-by-byte reference does, wherever the
// characters to escape fall.
func TestAppendContentMatchesTheReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	pieces := []string{"a", "bcdefgh", "é", "日本", "🚀", `"`, `\`, "\n", "\x00", "\x1f", "\t", "/", "\x7f"}
	for n := 0; n < 5000; n++ {
		var b strings.Builder
		for k := rng.IntN(40); k > 0; k-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := []byte(b.String())
		require.Equal(t, string(appendContentByByte([]byte("x"), s)), string(appendContent([]byte("x"), s)), "%q", s)
	}
}

// A function call's canonical form does not depend on where its type is:
// before its arguments, after them as callFollows reads it, or after them
// written with escapes, which the end of the item decides.
func TestFunctionCallArgumentsWhereverTheTypeIs(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	argsList := []string{`{"b": 2, "a": [1.0, "\u00e9"]}`, `{not json`, ``, ` "x" `, `{"a":1,"a":2}`, `[]`}
	for n := 0; n < 30; n++ {
		argsList = append(argsList, syntheticArguments(rng, 20+rng.IntN(200)))
	}
	for _, args := range argsList {
		tok, err := json.Marshal(args)
		require.NoError(t, err)
		members := []string{`"arguments":` + string(tok), `"call_id":"call_1"`, `"name":"f"`, `"status":"completed"`}
		for _, typ := range []string{`"type":"function_call"`, `"type" : "function_call"`, `"typ\u0065":"function_call"`, `"type":"function\u005fcall"`, `"type":"message"`} {
			want := map[*rules][]byte{}
			for k := len(members); k >= 0; k-- { // the type first last
				ms := append(append(append([]string{}, members[:k]...), typ), members[k:]...)
				item := []byte("{" + strings.Join(ms, ", ") + "}")
				for _, r := range []*rules{nil, testParser.rules} {
					got, err := canonical(item, r, placeItem)
					require.NoError(t, err, "%s", item)
					if want[r] == nil {
						want[r] = got
					}
					require.Equal(t, string(want[r]), string(got), "%s", item)
				}
			}
		}
	}
}
