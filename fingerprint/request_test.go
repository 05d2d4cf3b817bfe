package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustParse(t testing.TB, body string) *Request {
	t.Helper()
	r, err := testParser.Parse([]byte(body))
	require.NoError(t, err)
	return r
}

// bodyWithInput returns a request body whose input is the given items.
func bodyWithInput(rest string, items []json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteString(`{"input":[`)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteByte(']')
	if rest != "" {
		b.WriteByte(',')
		b.WriteString(rest)
	}
	b.WriteByte('}')
	return b.Bytes()
}

func TestSignatureIgnoresKeyOrderAndWhitespace(t *testing.T) {
	bodies := []string{
		`{"model":"gpt-4.1","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}],"store":false,"input":[]}`,
		`{"input":[],"store":false,"tools":[{"parameters":{"properties":{},"type":"object"},"name":"f","type":"function"}],"model":"gpt-4.1"}`,
		"\n{ \"store\" : false ,\n \"model\" : \"gpt\\u002d4.1\" , \"tools\" : [ { \"name\" : \"f\" , \"type\" : \"function\" , \"parameters\" : { \"properties\" : { } , \"type\" : \"object\" } } ] }\n",
		`{"model":"gpt-4.1","input":"a different input","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}],"store":false}`,
		`{"model":"gpt-4.1","input":[{"role":"user","content":"hi"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}],"store":false}`,
	}
	want := mustParse(t, bodies[0]).Signature()
	canon, err := canonicalExact([]byte(`{"model":"gpt-4.1","store":false,"tools":[{"name":"f","parameters":{"properties":{},"type":"object"},"type":"function"}]}`))
	require.NoError(t, err)
	assert.Equal(t, testParser.sum(canon), want, "signature is the hash of the canonical body without input")
	for i, body := range bodies {
		assert.Equal(t, want, mustParse(t, body).Signature(), "body %d", i)
	}
}

func TestSignatureChangesWithEveryOtherField(t *testing.T) {
	base := `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`
	variants := map[string]string{
		"model":           `{"model":"gpt-4.1-mini","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`,
		"instructions":    `{"model":"gpt-4.1","instructions":"Be brief!","service_tier":"auto","tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`,
		"service_tier":    `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"flex","tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`,
		"tools":           `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"g"}],"temperature":1.0,"input":[]}`,
		"tool order":      `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],"temperature":1.0,"input":[]}`,
		"number spelling": `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"f"}],"temperature":1,"input":[]}`,
		"added field":     `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":"auto","tools":[{"type":"function","name":"f"}],"temperature":1.0,"store":true,"input":[]}`,
		"removed field":   `{"model":"gpt-4.1","instructions":"Be brief.","tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`,
		"null field":      `{"model":"gpt-4.1","instructions":"Be brief.","service_tier":null,"tools":[{"type":"function","name":"f"}],"temperature":1.0,"input":[]}`,
	}
	want := mustParse(t, base).Signature()
	seen := map[uint64]string{want: "base"}
	for name, body := range variants {
		t.Run(name, func(t *testing.T) {
			got := mustParse(t, body).Signature()
			assert.NotEqual(t, want, got)
		})
		seen[mustParse(t, body).Signature()] = name
	}
	assert.Len(t, seen, len(variants)+1, "every variant has its own signature")
}

func TestSignatureOfInputOnlyBodyIsEmptyObject(t *testing.T) {
	want := sumString("{}")
	for _, body := range []string{`{}`, `{"input":[]}`, `{"input":"x"}`, ` { "input" : [ {"a":1} ] } `} {
		assert.Equal(t, want, mustParse(t, body).Signature(), body)
	}
}

func TestInputShapes(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		input []string
		canon []string
	}{
		{"missing input has no items", `{"model":"m"}`, nil, nil},
		{"empty array has no items", `{"input":[ ]}`, nil, nil},
		{"string input is one item", `{"input":"h\u00e9llo"}`, []string{`"h\u00e9llo"`}, []string{`"héllo"`}},
		{"empty string input is one item", `{"input":""}`, []string{`""`}, []string{`""`}},
		{"escaped input key is the input member", `{"\u0069nput":["x"]}`, []string{`"x"`}, []string{`"x"`}},
		{"array elements are items", `{"input":[{"role":"user","content":"hi"}, "text", 1.0, null, [1,2]]}`,
			[]string{`{"role":"user","content":"hi"}`, `"text"`, `1.0`, `null`, `[1,2]`},
			[]string{`{"content":"hi","role":"user"}`, `"text"`, `1.0`, `null`, `[1,2]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, tc.body)
			require.Equal(t, len(tc.input), r.Len())
			if tc.input == nil {
				assert.Nil(t, r.Items())
			}
			var size int64
			for i, raw := range r.Items() {
				assert.Equal(t, tc.input[i], string(raw))
				assert.Equal(t, sumString(tc.canon[i]), r.digests[i])
				size += int64(len(tc.canon[i]))
			}
			assert.Equal(t, size, r.bytes)
		})
	}
}

func TestInputReturnsOriginalBytes(t *testing.T) {
	body := []byte("{\"model\":\"m\",\"input\":[\n  {\"content\": \"caf\\u00e9\",\n   \"role\":\"user\"} ,\t\"x\\/y\"\r\n, 1E+2 ]}")
	r, err := testParser.Parse(body)
	require.NoError(t, err)
	want := []string{"{\"content\": \"caf\\u00e9\",\n   \"role\":\"user\"}", `"x\/y"`, `1E+2`}
	got := make([]string, r.Len())
	for i, raw := range r.Items() {
		got[i] = string(raw)
	}
	assert.Equal(t, want, got)
	assert.Same(t, &body[0], &r.Body()[0], "the request refers to the body, uncopied")
	for i := range want {
		assert.Equal(t, want[i], string(r.Item(i)))
	}
	assert.Panics(t, func() { r.Item(len(want)) })

	items := r.Items()
	_ = append(items[0], "tail"...)
	assert.Equal(t, `"x\/y"`, string(r.Items()[1]), "appending to an item does not overwrite the next one")
}

func TestInvalidInputIsRejected(t *testing.T) {
	for _, input := range []string{`null`, `1`, `{}`, `{"role":"user"}`, `true`} {
		t.Run(input, func(t *testing.T) {
			body := `{"model":"m","input":` + input + `}`
			_, err := testParser.Parse([]byte(body))
			require.ErrorIs(t, err, ErrInvalidRequest)
			assert.Equal(t, "fingerprint: invalid request: input: input must be an array or a string at offset 21", err.Error())
		})
	}
}

func TestBodyMustBeAnObject(t *testing.T) {
	for _, body := range []string{`[]`, `[{"input":[]}]`, `"input"`, `1`, `null`, ``, `   `, `true`} {
		t.Run(strconv.Quote(body), func(t *testing.T) {
			r, err := testParser.Parse([]byte(body))
			require.ErrorIs(t, err, ErrInvalidRequest)
			assert.Nil(t, r)
			assert.Contains(t, err.Error(), "body is not a JSON object")
		})
	}
}

func TestInvalidBodyErrorsNamePathAndOffset(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"bad literal in an item", `{"input":[{"a":1},{"b":tru}]}`,
			`fingerprint: invalid request: input[1].b: invalid character '}' in literal true at offset 26`},
		{"bad string in a content part", `{"input":[{"content":[{"text":"a` + "\x01" + `"}]}]}`,
			`fingerprint: invalid request: input[0].content[0].text: invalid control character in string at offset 32`},
		{"invalid UTF-8 in string input", "{\"input\":\"\xff\"}",
			`fingerprint: invalid request: input: invalid UTF-8 in string at offset 10`},
		{"duplicate key in an item", `{"input":[{"role":"user","role":"user"}]}`,
			`fingerprint: invalid request: input[0]: duplicate key "role" at offset 25`},
		{"duplicate input", `{"input":[],"model":"m","input":[]}`,
			`fingerprint: invalid request: duplicate key "input" at offset 24`},
		{"duplicate top-level key", `{"model":"a","model":"b","input":[]}`,
			`fingerprint: invalid request: duplicate key "model" at offset 13`},
		{"error outside the input", `{"tools":[{"x":}],"input":[]}`,
			`fingerprint: invalid request: tools[0].x: invalid character '}' looking for beginning of value at offset 15`},
		{"missing comma between items", `{"input":[1 2]}`,
			`fingerprint: invalid request: input[0]: invalid character '2' after array element at offset 12`},
		{"truncated body", `{"input":[{"role":"user"`,
			`fingerprint: invalid request: input[0].role: unexpected end of input at offset 24`},
		{"trailing data", `{"input":[]} {}`,
			`fingerprint: invalid request: invalid character '{' after top-level value at offset 13`},
		{"invalid UTF-8 before another error in an item", "{\"input\":[{\"a\":\"\xff\",\"b\":tru}]}",
			`fingerprint: invalid request: input[0].a: invalid UTF-8 in string at offset 16`},
		{"invalid UTF-8 late in a long string of an item", "{\"input\":[{\"text\":\"" + strings.Repeat("é", 40) + "\xc3(\"}]}",
			`fingerprint: invalid request: input[0].text: invalid UTF-8 in string at offset 99`},
		{"invalid UTF-8 in function arguments", "{\"input\":[{\"type\":\"function_call\",\"arguments\":\"{\\\"a\\\":\\\"\xff\\\"}\"}]}",
			`fingerprint: invalid request: input[0].arguments: invalid UTF-8 in string at offset 56`},
		{"invalid arguments escape", `{"input":[{"type":"function_call","arguments":"\q"}]}`,
			`fingerprint: invalid request: input[0].arguments: invalid escape in string at offset 47`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := testParser.Parse([]byte(tc.body))
			require.Error(t, err)
			assert.Nil(t, r)
			assert.True(t, errors.Is(err, ErrInvalidRequest))
			assert.Equal(t, tc.want, err.Error())
		})
	}
}

func TestNestingDepthCountsFromTheBody(t *testing.T) {
	item := func(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }
	// The body object and the input array take two of the 512 levels.
	_, err := testParser.Parse([]byte(`{"input":[` + item(510) + `]}`))
	require.NoError(t, err)
	_, err = testParser.Parse([]byte(`{"input":[` + item(511) + `]}`))
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "exceeds maximum nesting depth of 512")

	fp, err := mustParse(t, `{}`).Transcript([]json.RawMessage{json.RawMessage(item(512))})
	require.NoError(t, err, "output items count from their own root")
	assert.Equal(t, 1, fp.Items)
	_, err = mustParse(t, `{}`).Transcript([]json.RawMessage{json.RawMessage(item(513))})
	require.ErrorIs(t, err, ErrInvalidRequest)
}

func TestItemDigestIsHashOfCanonicalItem(t *testing.T) {
	r, err := testParser.Parse(syntheticBody(30, 30000))
	require.NoError(t, err)
	var size int64
	for i, raw := range r.Items() {
		canon, err := canonical(raw, testParser.rules, placeItem)
		require.NoError(t, err)
		assert.Equal(t, testParser.sum(canon), r.digests[i], "item %d", i)
		size += int64(len(canon))
	}
	assert.Equal(t, size, r.bytes)
}

func TestPrefixDigestChain(t *testing.T) {
	r := mustParse(t, `{"input":["a",{"b":1},[2]]}`)
	h := sumString(ChainSeedText)
	require.Equal(t, h, r.Prefix(0))
	for i := 0; i < r.Len(); i++ {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], h)
		binary.LittleEndian.PutUint64(b[8:], r.digests[i])
		h = testParser.sum(b[:])
		assert.Equal(t, h, r.Prefix(i+1))
	}
	assert.Equal(t, Transcript{Items: 3, Digest: h, Bytes: int64(len(`"a"{"b":1}[2]`))}, r.fp())
}

func TestPrefixDigestEqualsDigestOfPrefixRequest(t *testing.T) {
	r, err := testParser.Parse(syntheticBody(24, 24000))
	require.NoError(t, err)
	items := r.Items()
	for n := 0; n <= r.Len(); n++ {
		prefix, err := testParser.Parse(bodyWithInput(`"model":"other"`, items[:n]))
		require.NoError(t, err)
		fp := prefix.fp()
		assert.Equal(t, n, fp.Items)
		assert.Equal(t, r.Prefix(n), fp.Digest, "prefix of %d items", n)
		if n == r.Len() {
			assert.Equal(t, r.fp(), fp)
		}
	}
}

func TestPrefixDigestPanicsOutOfRange(t *testing.T) {
	r := mustParse(t, `{"input":["a","b"]}`)
	assert.Panics(t, func() { r.Prefix(-1) })
	assert.Panics(t, func() { r.Prefix(3) })
	assert.NotPanics(t, func() { r.Prefix(2) })
}

func TestTranscriptEqualsFingerprintOfExtendedRequest(t *testing.T) {
	a, err := testParser.Parse(syntheticBody(12, 12000))
	require.NoError(t, err)
	output := []json.RawMessage{
		json.RawMessage(`{"type":"reasoning","id":"rs_1","summary":[]}`),
		json.RawMessage(`{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"location\":\"Paris\",\"days\":2}"}`),
		json.RawMessage(`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny in Par\u00eds \ud83d\ude80","annotations":[]}]}`),
	}
	fp, err := a.Transcript(output)
	require.NoError(t, err)

	// The next request carries the output back, formatted differently.
	echoed := []json.RawMessage{
		json.RawMessage(` { "summary" : [ ] , "id" : "rs_1" , "type" : "reasoning" } `),
		json.RawMessage(`{"arguments":"{\"days\": 2, \"location\": \"Paris\"}","name":"get_weather","call_id":"c1","type":"function_call"}`),
		json.RawMessage(`{"content":[{"annotations":[],"text":"Sunny in París 🚀","type":"output_text"}],"role":"assistant","type":"message","id":"msg_1"}`),
	}
	b, err := testParser.Parse(bodyWithInput(`"model":"gpt-4.1"`, append(append([]json.RawMessage{}, a.Items()...), echoed...)))
	require.NoError(t, err)
	assert.Equal(t, b.fp(), fp)
	assert.Equal(t, a.Len()+len(output), fp.Items)
	for n := 0; n <= a.Len(); n++ {
		assert.Equal(t, a.Prefix(n), b.Prefix(n))
	}

	none, err := a.Transcript(nil)
	require.NoError(t, err)
	assert.Equal(t, a.fp(), none)
}

func TestTranscriptRejectsInvalidOutputItem(t *testing.T) {
	r := mustParse(t, `{"input":["a"]}`)
	tests := []struct {
		name   string
		output []string
		want   string
	}{
		{"bad literal", []string{`{"a":1}`, `{"a":[tru]}`},
			`fingerprint: invalid request: output[1].a[0]: invalid character ']' in literal true at offset 9`},
		{"empty item", []string{``},
			`fingerprint: invalid request: output[0]: unexpected end of input at offset 0`},
		{"two values", []string{`"a"`, `"b"`, `1 2`},
			`fingerprint: invalid request: output[2]: invalid character '2' after top-level value at offset 2`},
		{"duplicate key", []string{`{"type":"message","type":"message"}`},
			`fingerprint: invalid request: output[0]: duplicate key "type" at offset 18`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			output := make([]json.RawMessage, len(tc.output))
			for i, s := range tc.output {
				output[i] = json.RawMessage(s)
			}
			fp, err := r.Transcript(output)
			require.ErrorIs(t, err, ErrInvalidRequest)
			assert.Equal(t, tc.want, err.Error())
			assert.Equal(t, Transcript{}, fp)
		})
	}
}

func TestFunctionCallArguments(t *testing.T) {
	tests := []struct {
		name  string
		a, b  string
		equal bool
	}{
		{"reserialised arguments match",
			`{"type":"function_call","name":"f","arguments":"{\"a\":1,\"b\":2}"}`,
			`{"type":"function_call","name":"f","arguments":"{\"b\": 2, \"a\": 1}"}`, true},
		{"reserialised arguments match with arguments first",
			`{"arguments":"{\"a\":1,\"b\":2}","name":"f","type":"function_call"}`,
			`{"type":"function_call","arguments":"{\n  \"b\": 2,\n  \"a\": 1\n}","name":"f"}`, true},
		{"escapes inside arguments are normalised",
			`{"type":"function_call","arguments":"{\"city\":\"Z\u00fcrich\"}"}`,
			`{"type":"function_call","arguments":"{\"city\":\"Z\\u00fcrich\"}"}`, true},
		{"different argument values differ",
			`{"type":"function_call","arguments":"{\"a\":1}"}`,
			`{"type":"function_call","arguments":"{\"a\":2}"}`, false},
		{"argument numbers are kept as written",
			`{"type":"function_call","arguments":"{\"a\":1}"}`,
			`{"type":"function_call","arguments":"{\"a\":1.0}"}`, false},
		{"non-JSON arguments compare as strings",
			`{"type":"function_call","arguments":"not json"}`,
			`{"type":"function_call","arguments":"not json"}`, true},
		{"non-JSON arguments differing in spacing differ",
			`{"type":"function_call","arguments":"not json"}`,
			`{"type":"function_call","arguments":"not  json"}`, false},
		{"truncated JSON arguments compare as strings",
			`{"type":"function_call","arguments":"{\"a\":1"}`,
			`{"type":"function_call","arguments":"{\"a\": 1"}`, false},
		{"arguments of other item types are plain strings",
			`{"type":"message","arguments":"{\"a\":1,\"b\":2}"}`,
			`{"type":"message","arguments":"{\"b\":2,\"a\":1}"}`, false},
		{"arguments without a type are plain strings",
			`{"arguments":"{\"a\":1,\"b\":2}"}`,
			`{"arguments":"{\"b\":2,\"a\":1}"}`, false},
		{"nested function calls are plain strings",
			`{"type":"message","content":[{"type":"function_call","arguments":"{\"a\":1,\"b\":2}"}]}`,
			`{"type":"message","content":[{"type":"function_call","arguments":"{\"b\":2,\"a\":1}"}]}`, false},
		{"a parsed argument string differs from an argument object",
			`{"type":"function_call","arguments":"{\"a\":1}"}`,
			`{"type":"function_call","arguments":{"a":1}}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ra := mustParse(t, `{"input":[`+tc.a+`]}`)
			rb := mustParse(t, `{"input":[`+tc.b+`]}`)
			if tc.equal {
				assert.Equal(t, ra.fp(), rb.fp())
			} else {
				assert.NotEqual(t, ra.digests[0], rb.digests[0])
			}
			fp, err := mustParse(t, `{}`).Transcript([]json.RawMessage{json.RawMessage(tc.b)})
			require.NoError(t, err)
			assert.Equal(t, rb.fp(), fp, "output items follow the same rule")
		})
	}
}

func TestSyntheticBodyParses(t *testing.T) {
	for _, size := range [][2]int{{1, 500}, {100, 200 << 10}, {500, 1 << 20}} {
		body := syntheticBody(size[0], size[1])
		assert.Equal(t, body, syntheticBody(size[0], size[1]), "deterministic")
		require.True(t, json.Valid(body))
		r, err := testParser.Parse(body)
		require.NoError(t, err)
		assert.Equal(t, size[0], r.Len())
		assert.InDelta(t, size[1], len(body), float64(size[1])*0.1+5000)
	}
}

func TestParseRequestConcurrentUse(t *testing.T) {
	bodies := [][]byte{syntheticBody(50, 50000), syntheticBody(7, 9000), []byte(`{"input":"x"}`)}
	want := make([]Transcript, len(bodies))
	sigs := make([]uint64, len(bodies))
	for i, body := range bodies {
		r, err := testParser.Parse(body)
		require.NoError(t, err)
		want[i], sigs[i] = r.fp(), r.Signature()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				k := (g + i) % len(bodies)
				r, err := testParser.Parse(bodies[k])
				if err == nil && (!reflect.DeepEqual(r.fp(), want[k]) || r.Signature() != sigs[k]) {
					err = fmt.Errorf("body %d parsed differently", k)
				}
				if err == nil {
					_, err = testParser.Parse([]byte(`{"input":[{"a":1,"a":2}]}`))
					if err == nil {
						err = errors.New("duplicate key accepted")
					} else {
						err = nil
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{}`,
		`{"input":"hello"}`,
		`{"input":[]}`,
		`{"input":null}`,
		`{"model":"m","input":[{"role":"user","content":"hi"}],"store":false}`,
		`{"input":[{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1}"},{"arguments":"x","type":"function_call"}]}`,
		`{"input":[{"type":"function_call","arguments":"{\"a\":{\"a\":1,\"a\":2}}"}]}`,
		`{"input":[{"type":"function_call","arguments":"[\"\\ud83d\\ude00\", 1e5]"}]}`,
		`{"input":[1.0, "\u00e9", null, [{"b":1,"a":2}]],"tools":[{"z":1,"a":[]}]}`,
		`{"input":[],"input":[]}`,
		`[{"input":[]}]`,
		"{\"input\":[\"\xff\"]}",
		`{"input":["\ud800"]}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Add(syntheticBody(4, 2000))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := testParser.Parse(body)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			require.Nil(t, r)
			return
		}
		require.True(t, json.Valid(body))
		n := r.Len()
		require.Len(t, r.Items(), n)

		// Rebuilding the body from canonical items gives the same digests.
		items := make([]json.RawMessage, n)
		var size int64
		for i, raw := range r.Items() {
			canon, err := canonical(raw, testParser.rules, placeItem)
			require.NoError(t, err)
			require.Equal(t, testParser.sum(canon), r.digests[i])
			items[i] = canon
			size += int64(len(canon))
		}
		require.Equal(t, size, r.bytes)
		rebuilt, err := testParser.Parse(bodyWithInput("", items))
		require.NoError(t, err)
		require.Equal(t, r.fp(), rebuilt.fp())

		// The canonical body is an equivalent request.
		canon, err := canonicalExact(body)
		require.NoError(t, err)
		again, err := testParser.Parse(canon)
		require.NoError(t, err)
		require.Equal(t, r.Signature(), again.Signature())
		require.Equal(t, r.fp(), again.fp())

		// Any split into input and output gives the same transcript.
		k := n / 2
		head, err := testParser.Parse(bodyWithInput("", r.Items()[:k]))
		require.NoError(t, err)
		fp, err := head.Transcript(r.Items()[k:])
		require.NoError(t, err)
		require.Equal(t, r.fp(), fp)
		for i := 0; i <= k; i++ {
			require.Equal(t, r.Prefix(i), head.Prefix(i))
		}
	})
}

func TestMemberGivesTopLevelValuesAsReceived(t *testing.T) {
	r := mustParse(t, `{"model":"m", "stream" : true,"st\u006fre":false,"metadata":{"session_id":"s1"},"input":["a"],"previous_response_id":null}`)
	for name, want := range map[string]string{
		"model": `"m"`, "stream": `true`, "store": `false`, "metadata": `{"session_id":"s1"}`,
		"input": `["a"]`, "previous_response_id": `null`,
	} {
		got, ok := r.Member(name)
		assert.True(t, ok, name)
		assert.Equal(t, want, string(got), name)
	}
	_, ok := r.Member("conversation")
	assert.False(t, ok)
	_, ok = r.Member("session_id")
	assert.False(t, ok, "only top-level members")
}

func TestMembersAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"input":[]`)
	for i := range MaxBodyMembers {
		fmt.Fprintf(&b, `,"m%d":1`, i)
	}
	b.WriteString("}")
	_, err := testParser.Parse([]byte(b.String()))
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.ErrorContains(t, err, "more than 1024 members")

	b.Reset()
	b.WriteString(`{"input":[{"type":"x"`)
	for i := range MaxObjectMembers {
		fmt.Fprintf(&b, `,"m%d":1`, i)
	}
	b.WriteString("}]}")
	_, err = testParser.Parse([]byte(b.String()))
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.ErrorContains(t, err, "members in one object")
}
