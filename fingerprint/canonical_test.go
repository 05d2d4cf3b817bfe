package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type canonicalCase struct {
	name  string
	input string
	want  string // canonical form; empty when the input must be rejected
}

// canonicalValid lists inputs and their canonical forms.
var canonicalValid = []canonicalCase{
	{"object members are sorted by key", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
	{"nested objects are sorted", `{"z":{"y":1,"x":[{"d":1,"c":2}]},"a":0}`, `{"a":0,"z":{"x":[{"c":2,"d":1}],"y":1}}`},
	{"sorted object stays as is", `{"a":1,"b":{"c":true,"d":null}}`, `{"a":1,"b":{"c":true,"d":null}}`},
	{"insignificant whitespace is removed", " \t\r\n{ \"a\" : [ 1 , 2 , { } , [ ] ] ,\n\"b\":\"x y\" }\n", `{"a":[1,2,{},[]],"b":"x y"}`},
	{"keys are compared after decoding", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
	{"keys are compared as UTF-8 bytes", `{"é":1,"z":2,"Z":3}`, `{"Z":3,"z":2,"é":1}`},
	{"UTF-8 order differs from UTF-16 order", `{"\ud83d\ude00":2,"\uff61":1}`, `{"｡":1,"😀":2}`},
	{"escaped quote key sorts by its decoded byte", `{"#":1,"\"":2}`, `{"\"":2,"#":1}`},
	{"empty key sorts first", `{"a":1,"":2}`, `{"":2,"a":1}`},
	{"prefix key sorts before longer key", `{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
	{"many members are sorted", `{"m":13,"l":12,"k":11,"j":10,"i":9,"h":8,"g":7,"f":6,"e":5,"d":4,"c":3,"b":2,"a":1,"n":14}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14}`},
	{"escaped e acute equals raw e acute", `"\u00e9"`, `"é"`},
	{"escaped slash equals raw slash", `"\/"`, `"/"`},
	{"escaped ASCII letter is decoded", `"\u0041\u0062"`, `"Ab"`},
	{"short escapes are kept", `"\b\f\n\r\t\"\\"`, `"\b\f\n\r\t\"\\"`},
	{"unicode escapes of short-escape characters use the short form", `"\u0008\u000c\u000A\u000d\u0009\u0022\u005C"`, `"\b\f\n\r\t\"\\"`},
	{"other control characters use lowercase hex", `"\u001F\u0000\u0001\u000b"`, `"\u001f\u0000\u0001\u000b"`},
	{"DEL is written raw", `"\u007f"`, "\"\x7f\""},
	{"line separators are written raw", `"\u2028\u2029"`, "\"\u2028\u2029\""},
	{"surrogate pair is decoded", `"\ud83d\ude00"`, `"😀"`},
	{"uppercase surrogate pair is decoded", `"\uD83D\uDE00"`, `"😀"`},
	{"raw non-ASCII is kept", `"日本語 🚀 café"`, `"日本語 🚀 café"`},
	{"replacement character is valid", "\"\uFFFD\"", "\"\uFFFD\""},
	{"noncharacter escape is valid", `"\uffff"`, "\"\uffff\""},
	{"HTML characters are written raw", `"\u003ca\u0026b\u003e"`, `"<a&b>"`},
	{"mixed escapes and raw text", `"a\"b\\c\/d\u00e9e\nf"`, `"a\"b\\c/dée\nf"`},
	{"empty string", `""`, `""`},
	{"decimal number keeps its fraction", `1.0`, `1.0`},
	{"integer stays integer", `1`, `1`},
	{"exponent is kept as written", `1e2`, `1e2`},
	{"exponent sign and case are kept", `-1.50E+02`, `-1.50E+02`},
	{"negative zero is kept", `-0`, `-0`},
	{"trailing zeros are kept", `0.000`, `0.000`},
	{"large integers are not rounded", `123456789012345678901234567890`, `123456789012345678901234567890`},
	{"numbers inside containers are kept", `[1.0, 1, 1e0, 10E-1]`, `[1.0,1,1e0,10E-1]`},
	{"literals", `[true,false,null]`, `[true,false,null]`},
	{"top-level literal with whitespace", " null ", `null`},
	{"empty object", `{}`, `{}`},
	{"empty array with whitespace", `[ ]`, `[]`},
	{"duplicate keys in sibling objects are fine", `[{"a":1},{"a":2}]`, `[{"a":1},{"a":2}]`},
	{"same key at different depths is fine", `{"a":{"a":{"a":1}}}`, `{"a":{"a":{"a":1}}}`},
	{"depth 512 is accepted", strings.Repeat("[", 512) + strings.Repeat("]", 512), strings.Repeat("[", 512) + strings.Repeat("]", 512)},
	{"depth 512 mixing objects and arrays", strings.Repeat(`{"a":[`, 256) + strings.Repeat("]}", 256), strings.Repeat(`{"a":[`, 256) + strings.Repeat("]}", 256)},
}

// canonicalInvalid lists inputs that must be rejected.
var canonicalInvalid = []canonicalCase{
	{name: "duplicate keys", input: `{"a":1,"a":2}`},
	{name: "duplicate keys out of order", input: `{"b":1,"a":1,"b":2}`},
	{name: "duplicate keys among many members", input: `{"m":1,"l":1,"k":1,"j":1,"i":1,"h":1,"g":1,"f":1,"e":1,"d":1,"c":1,"b":1,"a":1,"g":2}`},
	{name: "duplicate keys deep inside arrays", input: `{"x":[1,{"y":[{"k":1,"z":0,"k":2}]}]}`},
	{name: "keys equal after decoding", input: `{"a":1,"\u0061":2}`},
	{name: "keys equal after decoding escaped slash", input: `{"\/":1,"/":2}`},
	{name: "invalid UTF-8 byte", input: "\"\xff\""},
	{name: "truncated UTF-8 sequence", input: "\"\xe2\x82\""},
	{name: "truncated UTF-8 sequence before ASCII", input: "\"\xe2\x82a\""},
	{name: "overlong UTF-8 encoding", input: "\"\xc0\xaf\""},
	{name: "UTF-8 encoded surrogate", input: "\"\xed\xa0\x80\""},
	{name: "invalid UTF-8 in key", input: "{\"\xfe\":1}"},
	{name: "lone high surrogate", input: `"\ud800"`},
	{name: "high surrogate followed by text", input: `"\ud800x"`},
	{name: "high surrogate followed by non-surrogate escape", input: `"\ud800\u0041"`},
	{name: "two high surrogates", input: `"\ud800\ud800"`},
	{name: "lone low surrogate", input: `"\udc00"`},
	{name: "low surrogate before high surrogate", input: `"\ude00\ud83d"`},
	{name: "lone surrogate in key", input: `{"\ud800":1}`},
	{name: "raw newline in string", input: "\"a\nb\""},
	{name: "raw tab in string", input: "\"a\tb\""},
	{name: "raw NUL in string", input: "\"a\x00b\""},
	{name: "raw unit separator in string", input: "\"\x1f\""},
	{name: "unknown escape", input: `"\x41"`},
	{name: "single-quote escape", input: `"\'"`},
	{name: "short unicode escape", input: `"\u12"`},
	{name: "non-hex unicode escape", input: `"\u12g4"`},
	{name: "unterminated string", input: `"abc`},
	{name: "unterminated escape", input: `"abc\`},
	{name: "trailing value", input: `{} {}`},
	{name: "trailing number", input: `1 2`},
	{name: "trailing garbage", input: `{}x`},
	{name: "trailing comma after value", input: `[1],`},
	{name: "trailing NUL", input: "{}\x00"},
	{name: "byte order mark", input: "\xef\xbb\xbf{}"},
	{name: "depth 513", input: strings.Repeat("[", 513) + strings.Repeat("]", 513)},
	{name: "depth 513 in objects", input: strings.Repeat(`{"a":`, 513) + "1" + strings.Repeat("}", 513)},
	{name: "very deep nesting", input: strings.Repeat("[", 100000)},
	{name: "leading zero", input: `01`},
	{name: "fraction without digits", input: `1.`},
	{name: "fraction without integer part", input: `.5`},
	{name: "lone minus", input: `-`},
	{name: "exponent without digits", input: `1e`},
	{name: "exponent sign without digits", input: `1e+`},
	{name: "plus sign", input: `+1`},
	{name: "hex number", input: `0x10`},
	{name: "NaN", input: `NaN`},
	{name: "Infinity", input: `-Infinity`},
	{name: "truncated literal", input: `tru`},
	{name: "misspelled literal", input: `nul1`},
	{name: "capitalised literal", input: `True`},
	{name: "literal with trailing letters", input: `falsey`},
	{name: "empty input", input: ``},
	{name: "whitespace only", input: " \n\t "},
	{name: "trailing comma in array", input: `[1,]`},
	{name: "trailing comma in object", input: `{"a":1,}`},
	{name: "missing colon", input: `{"a" 1}`},
	{name: "missing value", input: `{"a":}`},
	{name: "missing comma", input: `[1 2]`},
	{name: "unquoted key", input: `{a:1}`},
	{name: "single-quoted string", input: `'a'`},
	{name: "unclosed object", input: `{"a":1`},
	{name: "unclosed array", input: `[1,2`},
	{name: "mismatched brackets", input: `[1}`},
	{name: "comment", input: `[1 /* two */]`},
}

func TestCanonical(t *testing.T) {
	for _, tc := range canonicalValid {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonicalExact([]byte(tc.input))
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

func TestCanonicalRejects(t *testing.T) {
	for _, tc := range canonicalInvalid {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonicalExact([]byte(tc.input))
			require.Error(t, err)
			assert.Nil(t, got)
			assert.ErrorIs(t, err, ErrInvalidRequest)
			assert.Contains(t, err.Error(), "at offset ")
		})
	}
}

func TestCanonicalIsIdempotent(t *testing.T) {
	for _, tc := range canonicalValid {
		t.Run(tc.name, func(t *testing.T) {
			once, err := canonicalExact([]byte(tc.input))
			require.NoError(t, err)
			twice, err := canonicalExact(once)
			require.NoError(t, err)
			assert.Equal(t, string(once), string(twice))
		})
	}
}

func TestCanonicalPreservesMeaning(t *testing.T) {
	inputs := []string{syntheticTools, string(syntheticBody(20, 20000))}
	for _, tc := range canonicalValid {
		inputs = append(inputs, tc.input)
	}
	for _, in := range inputs {
		got, err := canonicalExact([]byte(in))
		require.NoError(t, err)
		assert.Equal(t, decodeJSON(t, []byte(in)), decodeJSON(t, got), "input %q", in)
	}
}

func decodeJSON(t testing.TB, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v))
	return v
}

// referenceCanonical is a slow, straightforward implementation of the
// canonical form on top of encoding/json, for inputs without duplicate keys or
// invalid UTF-8.
func referenceCanonical(t testing.TB, data []byte) string {
	t.Helper()
	var b strings.Builder
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys) // Go strings compare as bytes
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				write(k)
				b.WriteByte(':')
				write(v[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			b.WriteByte(']')
		case string:
			b.WriteByte('"')
			for _, r := range v {
				switch {
				case r == '"':
					b.WriteString(`\"`)
				case r == '\\':
					b.WriteString(`\\`)
				case r == '\b':
					b.WriteString(`\b`)
				case r == '\f':
					b.WriteString(`\f`)
				case r == '\n':
					b.WriteString(`\n`)
				case r == '\r':
					b.WriteString(`\r`)
				case r == '\t':
					b.WriteString(`\t`)
				case r < 0x20:
					fmt.Fprintf(&b, `\u%04x`, r)
				default:
					b.WriteRune(r)
				}
			}
			b.WriteByte('"')
		case json.Number:
			b.WriteString(string(v))
		case bool:
			b.WriteString(strconv.FormatBool(v))
		case nil:
			b.WriteString("null")
		default:
			t.Fatalf("unexpected %T", v)
		}
	}
	write(decodeJSON(t, data))
	return b.String()
}

func TestCanonicalMatchesReference(t *testing.T) {
	for _, tc := range canonicalValid {
		assert.Equal(t, referenceCanonical(t, []byte(tc.input)), tc.want, tc.name)
	}
	body := syntheticBody(40, 40000)
	got, err := canonicalExact(body)
	require.NoError(t, err)
	assert.Equal(t, referenceCanonical(t, body), string(got))
}

// TestCanonicalStringsAtEveryAlignment checks strings whose special
// characters fall at every position of the eight-byte scanning window.
func TestCanonicalStringsAtEveryAlignment(t *testing.T) {
	pieces := []string{"a", "b", "~", " ", "/", "\x7f", "é", "日", "🚀", `\"`, `\\`, `\n`, `\u00e9`, `\ud83d\ude00`, `\u001f`, `\/`}
	rng := rand.New(rand.NewPCG(7, 7))
	for n := 0; n < 3000; n++ {
		var b strings.Builder
		b.WriteByte('"')
		for k := rng.IntN(40); k > 0; k-- {
			if rng.IntN(3) > 0 {
				b.WriteByte('a' + byte(rng.IntN(26)))
			} else {
				b.WriteString(pieces[rng.IntN(len(pieces))])
			}
		}
		b.WriteByte('"')
		in := b.String()
		got, err := canonicalExact([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, referenceCanonical(t, []byte(in)), string(got), in)

		// The same string with one byte replaced by something invalid.
		if len(in) > 2 {
			bad := []byte(in)
			pos := 1 + rng.IntN(len(in)-2)
			bad[pos] = []byte{0x01, 0x1f, 0xff, 0x80, '"'}[rng.IntN(5)]
			if _, err := canonicalExact(bad); err == nil {
				require.True(t, json.Valid(bad), "%q accepted", bad)
			}
		}
	}
}

func TestCanonicalDoesNotModifyInput(t *testing.T) {
	in := []byte(`{"b":"\u00e9","a":[1.0, 2]}`)
	orig := bytes.Clone(in)
	_, err := canonicalExact(in)
	require.NoError(t, err)
	assert.Equal(t, orig, in)
}

func TestCanonicalErrorNamesPathAndOffset(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  string
	}{
		{"bad literal in nested array", `{"a":[1,2,{"b":tru}]}`, `fingerprint: invalid JSON value: a[2].b: invalid character '}' in literal true at offset 18`},
		{"duplicate key names the object", `{"x":[{"k":1,"k":2}]}`, `fingerprint: invalid JSON value: x[0]: duplicate key "k" at offset 13`},
		{"duplicate key found when sorting", `{"b":1,"a":1,"b":2}`, `fingerprint: invalid JSON value: duplicate key "b" at offset 13`},
		{"odd key is quoted", `{"a b":[nul]}`, `fingerprint: invalid JSON value: ["a b"][0]: invalid character ']' in literal null at offset 11`},
		{"invalid UTF-8", "[\"ok\",\"a\xffb\"]", `fingerprint: invalid JSON value: [1]: invalid UTF-8 in string at offset 8`},
		{"lone surrogate", `{"s":"x\udc00"}`, `fingerprint: invalid JSON value: s: unpaired surrogate escape in string at offset 7`},
		{"raw control character", "{\"s\":\"a\x01\"}", `fingerprint: invalid JSON value: s: invalid control character in string at offset 7`},
		{"trailing data", `{} x`, `fingerprint: invalid JSON value: invalid character 'x' after top-level value at offset 3`},
		{"unexpected end", `{"a":[1,`, `fingerprint: invalid JSON value: a[1]: unexpected end of input at offset 8`},
		{"depth", strings.Repeat("[", 600), `fingerprint: invalid JSON value: ` + strings.Repeat("[0]", 512) + `: exceeds maximum nesting depth of 512 at offset 512`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := canonicalExact([]byte(tc.input))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidRequest))
			assert.Equal(t, tc.want, err.Error())
		})
	}
}

func TestCanonicalItemFunctionCallRule(t *testing.T) {
	tests := []struct {
		name string
		item string
		want string
	}{
		{
			"arguments of a function call are canonicalised",
			`{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1.0}"}`,
			`{"arguments":"{\"a\":1.0,\"b\":2}","type":"function_call"}`,
		},
		{
			"arguments before type",
			`{"arguments":"{\"b\": 2, \"a\": 1.0}","type":"function_call"}`,
			`{"arguments":"{\"a\":1.0,\"b\":2}","type":"function_call"}`,
		},
		{
			"escaped type is recognised",
			`{"type":"function\u005fcall","arguments":" [ 1 , \"\\u00e9\" ] "}`,
			`{"arguments":"[1,\"é\"]","type":"function_call"}`,
		},
		{
			"arguments that are not JSON stay a string",
			`{"type":"function_call","arguments":"{not json"}`,
			`{"arguments":"{not json","type":"function_call"}`,
		},
		{
			"arguments with duplicate keys stay a string",
			`{"type":"function_call","arguments":"{\"a\":1,\"a\":2}"}`,
			`{"arguments":"{\"a\":1,\"a\":2}","type":"function_call"}`,
		},
		{
			"empty arguments stay a string",
			`{"type":"function_call","arguments":""}`,
			`{"arguments":"","type":"function_call"}`,
		},
		{
			"scalar arguments are canonicalised",
			`{"type":"function_call","arguments":" \"x\" "}`,
			`{"arguments":"\"x\"","type":"function_call"}`,
		},
		{
			"arguments that are not a string are plain values",
			`{"type":"function_call","arguments":{"b":1,"a":2}}`,
			`{"arguments":{"a":2,"b":1},"type":"function_call"}`,
		},
		{
			"other item types keep arguments as given",
			`{"type":"message","arguments":"{\"b\": 2, \"a\": 1}"}`,
			`{"arguments":"{\"b\": 2, \"a\": 1}","type":"message"}`,
		},
		{
			"type must be a string",
			`{"type":["function_call"],"arguments":"{\"b\": 2}"}`,
			`{"arguments":"{\"b\": 2}","type":["function_call"]}`,
		},
		{
			"nested function calls are plain values",
			`{"type":"message","content":[{"type":"function_call","arguments":"{\"b\": 2}"}]}`,
			`{"content":[{"arguments":"{\"b\": 2}","type":"function_call"}],"type":"message"}`,
		},
		{
			"other members are sorted around the rewritten arguments",
			`{"type":"function_call","name":"f","call_id":"c","arguments":"{\"z\":{\"y\":1,\"x\":2}}","id":"i"}`,
			`{"arguments":"{\"z\":{\"x\":2,\"y\":1}}","call_id":"c","id":"i","name":"f","type":"function_call"}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonicalItem([]byte(tc.item))
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
			again, err := canonicalItem(got)
			require.NoError(t, err)
			assert.Equal(t, string(got), string(again), "canonical items are fixed points")
		})
	}
}

func TestCanonicalIgnoresFunctionCallRule(t *testing.T) {
	in := `{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1}"}`
	got, err := canonicalExact([]byte(in))
	require.NoError(t, err)
	assert.Equal(t, `{"arguments":"{\"b\": 2, \"a\": 1}","type":"function_call"}`, string(got))
}

func TestCanonicalConcurrentUse(t *testing.T) {
	body := syntheticBody(40, 40000)
	want, err := canonicalExact(body)
	require.NoError(t, err)
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 20; i++ {
				got, err := canonicalExact(body)
				if err == nil && !bytes.Equal(got, want) {
					err = errors.New("canonical form differs between calls")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		require.NoError(t, <-errs)
	}
}

func FuzzCanonical(f *testing.F) {
	for _, tc := range canonicalValid {
		f.Add([]byte(tc.input))
	}
	for _, tc := range canonicalInvalid {
		if len(tc.input) < 1000 {
			f.Add([]byte(tc.input))
		}
	}
	f.Add([]byte(syntheticTools))
	f.Add(syntheticBody(3, 1500))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := canonicalExact(in)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			require.Nil(t, got)
			return
		}
		require.True(t, json.Valid(in), "accepted input that encoding/json rejects")
		require.True(t, json.Valid(got), "canonical form is not valid JSON")
		again, err := canonicalExact(got)
		require.NoError(t, err)
		require.Equal(t, string(got), string(again), "canonical form is not a fixed point")
		require.Equal(t, decodeJSON(t, in), decodeJSON(t, got), "canonical form changed the value")
		require.Equal(t, referenceCanonical(t, in), string(got), "differs from the reference implementation")

		item, err := canonicalItem(in)
		require.NoError(t, err, "an item is valid whenever the value is")
		itemAgain, err := canonicalItem(item)
		require.NoError(t, err)
		require.Equal(t, string(item), string(itemAgain), "canonical item is not a fixed point")
		plain, err := canonicalExact(item)
		require.NoError(t, err)
		require.Equal(t, string(item), string(plain), "canonical item is not canonical")
	})
}
