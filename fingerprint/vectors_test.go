package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"encoding/hex"

	"github.com/minio/highwayhash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/vectorfile"
)

// testdata/fingerprint-vectors.json at the repository root holds the test
// vectors of canonical JSON and fingerprints for other implementations
// (PROTOCOL.md). TestVectors rebuilds it from this code and fails on any
// difference; -update-vectors rewrites it.
var updateVectors = flag.Bool("update-vectors", false, "rewrite ../testdata/fingerprint-vectors.json from the code")

var vecPath = filepath.Join("..", "testdata", "fingerprint-vectors.json")

// vecKey keys every digest of the vectors: the bytes 0, 1, …, 31.
var vecKey = func() (k Key) {
	for i := range k {
		k[i] = byte(i)
	}
	return k
}()

var vecParser = mustParser(V4(), vecKey)

// vecFile is the layout of testdata/fingerprint-vectors.json.
type vecFile struct {
	About     []string       `json:"about"`
	Constants vecConstants   `json:"constants"`
	Canonical []vecCanonical `json:"canonical"`
	Requests  []vecRequest   `json:"requests"`
}

var vecAbout = []string{
	"Test vectors of contstore's canonical JSON and request fingerprints (profile v4, since protocol version 6); PROTOCOL.md describes every rule they exercise.",
	"Regenerate with: go test ./fingerprint -run TestVectors -update-vectors. go test ./fingerprint fails when this file and the code disagree.",
	"Every digest is HighwayHash-64 keyed with constants.key_hex (the bytes 0..31); a namespace's real key is a random secret kept in its meta hash.",
	"A 64-bit digest is given as {hex: 16 lowercase hex digits, dec: the same 64 bits as a signed decimal int64, the form stored in Redis}.",
	"A text that is not valid UTF-8 is given in a *_hex field (its bytes in hex) instead of the plain field.",
}

type vecConstants struct {
	KeyHex             string            `json:"key_hex"`
	ProfileID          string            `json:"profile_id"`
	ChainSeedText      string            `json:"chain_seed_text"`
	ChainSeed          vectorfile.Digest `json:"chain_seed"`
	EmptySignatureText string            `json:"empty_signature_text"`
	EmptySignature     vectorfile.Digest `json:"empty_signature"`
	MaxDepth           int               `json:"max_depth"`
}

// ---- canonical values ----

type vecCanonical struct {
	Name     string  `json:"name"`
	Input    *string `json:"input,omitempty"`
	InputHex string  `json:"input_hex,omitempty"`
	// Item: canonicalised as a request item (the item rules of the v4
	// profile apply), else as a value (the canonical rules alone).
	Item      bool               `json:"item,omitempty"`
	Valid     bool               `json:"valid"`
	Canonical *string            `json:"canonical,omitempty"`
	Digest    *vectorfile.Digest `json:"digest,omitempty"`
}

// vecItemCases are canonicalised as items, with the function_call rule.
var vecItemCases = []canonicalCase{
	{name: "v2: null members are absent, at any depth", input: `{"type":"reasoning","summary":[],"content":null,"encrypted_content":"gAAA","x":{"y":null,"z":[null]}}`},
	{name: "v2: upstream ids and states are dropped", input: `{"id":"msg_1","status":"completed","type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}`},
	{name: "v2: an item_reference keeps its id", input: `{"type":"item_reference","id":"msg_1","status":"completed"}`},
	{name: "v2: parsed_arguments and parsed are dropped", input: `{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":null}","parsed_arguments":{"a":null},"content":[{"type":"output_text","text":"t","parsed":{"a":1}}]}`},
	{name: "v2: parsed is kept outside content parts", input: `{"type":"message","parsed":1,"content":"x"}`},
	{name: "v3: a short assistant message is its full form", input: `{"role":"assistant","content":"T"}`},
	{name: "v3: the full form the upstream sent", input: `{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"T","annotations":[],"logprobs":[]}]}`},
	{name: "v3: a short user message", input: `{"role":"user","content":"hi"}`},
	{name: "v3: a short developer message with type", input: `{"type":"message","role":"developer","content":"be terse"}`},
	{name: "v3: type null is no type", input: `{"type":null,"role":"system","content":"s"}`},
	{name: "v3: another role keeps its string", input: `{"role":"tool","content":"T"}`},
	{name: "v3: another type keeps its string", input: `{"type":"x","role":"user","content":"T"}`},
	{name: "v3: non-empty annotations stay", input: `{"role":"assistant","content":[{"type":"output_text","text":"T","annotations":[{"type":"url_citation","url":"u"}],"logprobs":[]}]}`},
	{name: "v3: an item without type and role is a reference", input: `{"id":"msg_1","status":"completed"}`},
	{name: "v4: a reasoning item without encrypted_content keeps its id", input: `{"id":"rs_1","status":"completed","type":"reasoning","summary":[],"content":null}`},
	{name: "v4: encrypted_content null is none", input: `{"encrypted_content":null,"summary":[],"type":"reasoning","id":"rs_1"}`},
	{name: "v4: with encrypted_content the id goes", input: `{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":"gAAA"}`},

	{name: "function_call arguments are canonicalised", input: `{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1.0}"}`},
	{name: "function_call rule does not depend on member order", input: `{"arguments":"{\"b\": 2, \"a\": 1.0}","type":"function_call"}`},
	{name: "arguments that do not parse stay as written", input: `{"type":"function_call","arguments":"{not json"}`},
	{name: "arguments with duplicate keys do not parse", input: `{"type":"function_call","arguments":"{\"a\":1,\"a\":2}"}`},
	{name: "arguments with trailing data do not parse", input: `{"type":"function_call","arguments":"{} x"}`},
	{name: "empty arguments do not parse", input: `{"type":"function_call","arguments":""}`},
	{name: "arguments holding a raw newline inside a string do not parse", input: `{"type":"function_call","arguments":"\"\n\""}`},
	{name: "arguments holding a scalar", input: `{"type":"function_call","arguments":" 1.0 "}`},
	{name: "arguments holding a string with escapes", input: `{"type":"function_call","arguments":" \"\\u0078\\n\" "}`},
	{name: "arguments with escapes inside", input: `{"type":"function_call","arguments":"{\"city\": \"Z\\u00fcrich\", \"q\": \"a\\\"b\\\\c\\n\"}"}`},
	{name: "type is compared after decoding", input: `{"type":"function\u005fcall","arguments":" [ 1 , \"\\u00e9\" ] "}`},
	{name: "rule needs type function_call", input: `{"type":"message","arguments":"{\"b\": 2, \"a\": 1}"}`},
	{name: "rule needs a string type", input: `{"type":["function_call"],"arguments":"{\"b\": 2, \"a\": 1}"}`},
	{name: "rule needs a string arguments", input: `{"type":"function_call","arguments":{"b":2,"a":1}}`},
	{name: "rule applies at the item's top level only (nested object)", input: `{"type":"wrapper","call":{"type":"function_call","arguments":"{\"b\": 2}"}}`},
	{name: "rule applies at the item's top level only (array item)", input: `[{"type":"function_call","arguments":"{\"b\": 2}"}]`},
	{name: "rule in an item that is a string", input: `"{\"type\":\"function_call\"}"`},
}

func vecCanonicals(t *testing.T) []vecCanonical {
	var vs []vecCanonical
	add := func(name, input string, item bool) {
		v := vecCanonical{Name: name, Item: item}
		v.Input, v.InputHex = vectorfile.Text(input)
		var got []byte
		var err error
		if item {
			got, err = canonical([]byte(input), vecParser.rules, placeItem)
		} else {
			got, err = canonicalExact([]byte(input))
		}
		if err == nil {
			s := string(got)
			d := vectorfile.NewDigest(vecParser.sum(got))
			v.Valid, v.Canonical, v.Digest = true, &s, &d
		} else {
			require.ErrorIs(t, err, ErrInvalidRequest)
		}
		vs = append(vs, v)
	}
	const maxLen = 4096
	for _, tc := range canonicalValid {
		if len(tc.input) <= maxLen {
			add(tc.name, tc.input, false)
		}
	}
	for _, tc := range canonicalInvalid {
		if len(tc.input) <= maxLen {
			add(tc.name, tc.input, false)
		}
	}
	for _, tc := range vecItemCases {
		add(tc.name, tc.input, true)
	}
	return vs
}

// ---- requests ----

type vecItem struct {
	Raw       string            `json:"raw"`
	Canonical string            `json:"canonical"`
	Digest    vectorfile.Digest `json:"digest"`
}

type vecFingerprint struct {
	Items  int               `json:"items"`
	Digest vectorfile.Digest `json:"digest"`
	Bytes  int64             `json:"bytes"`
	// References: for each output item with an id, the canonical
	// item_reference that counts as it, and the mask XOR-ing its digest
	// into the item's.
	References []vecReference `json:"references,omitempty"`
}

type vecReference struct {
	Item      int               `json:"item"`
	Canonical string            `json:"canonical"`
	Mask      vectorfile.Digest `json:"mask"`
}

type vecRequest struct {
	Name    string  `json:"name"`
	Body    *string `json:"body,omitempty"`
	BodyHex string  `json:"body_hex,omitempty"`
	Valid   bool    `json:"valid"`
	// SameAs names an earlier vector with the same signature and chain.
	SameAs string `json:"same_as,omitempty"`
	// SignatureText is the canonical body without its input member.
	SignatureText   *string             `json:"signature_text,omitempty"`
	Signature       *vectorfile.Digest  `json:"signature,omitempty"`
	Items           *[]vecItem          `json:"items,omitempty"`
	Chain           []vectorfile.Digest `json:"chain,omitempty"`
	TranscriptBytes *int64              `json:"transcript_bytes,omitempty"`
	// Output items appended by Record; Transcript is the fingerprint of
	// input and output.
	Output      []string        `json:"output,omitempty"`
	OutputItems []vecItem       `json:"output_items,omitempty"`
	Transcript  *vecFingerprint `json:"transcript,omitempty"`
}

type vecRequestCase struct {
	name, body string
	output     []string
	sameAs     string
}

func vecNest(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// vecArgs returns the JSON string token holding doc.
func vecArgs(doc string) string {
	b, _ := json.Marshal(doc)
	return string(b)
}

func vecRequestCases() []vecRequestCase {
	msgs := `{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello!\n"}]}],"model":"gpt-4.1","store":false}`
	msgsVariant := "{\n  \"store\" : false ,\n  \"model\": \"gpt-4.1\",\n  \"input\": [\n    { \"content\": \"hi\", \"role\": \"user\" },\n    {\"content\": [ {\"text\": \"Hello!\\u000a\", \"type\": \"output_text\"} ], \"role\": \"assistant\", \"type\": \"message\"}\n  ]\n}\n"
	call := `{"model":"gpt-4.1","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],"input":[{"role":"user","content":"Weather in Z\u00fcrich?"},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Z\\u00fcrich\", \"units\": \"c\"}"},{"type":"function_call_output","call_id":"call_1","output":"{\"temp\": 21}"}]}`
	deepArgs := func(n int) string {
		return `{"input":[{"type":"function_call","arguments":` + vecArgs(vecNest("[ ", " ]", n, "")) + `}]}`
	}
	return []vecRequestCase{
		{name: "empty object", body: `{}`},
		{name: "missing input", body: `{"model":"gpt-4.1","store":false}`},
		{name: "empty input array", body: `{"input":[],"model":"gpt-4.1","store":false}`, sameAs: "missing input"},
		{name: "string input", body: `{"model":"gpt-4.1","input":"Hello, w\u00f6rld!"}`},
		{name: "string input equals a one-string array", body: `{"model":"gpt-4.1","input":["Hello, wörld!"]}`, sameAs: "string input"},
		{name: "messages", body: msgs, output: []string{
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"How can I help?","annotations":[]}]}`,
		}},
		{name: "messages with other key order, escapes and whitespace", body: msgsVariant, sameAs: "messages"},
		{name: "unicode escapes", body: `{"instructions":"\u0041\u00e9","input":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \u2028 \/ \u001f \u007f"}]}`},
		{name: "unicode written raw", body: "{\"input\":[{\"content\":\"café 😀 \u2028 / \\u001f \x7f\",\"role\":\"user\"}],\"instructions\":\"Aé\"}", sameAs: "unicode escapes"},
		{name: "input key is matched after decoding", body: `{"\u0069nput":["x"],"model":"m"}`},
		{name: "number spelling is significant", body: `{"input":[{"a":1.0},{"a":1},{"a":1e0},{"a":-0}],"temperature":0.70}`},
		{name: "function call round trip", body: call, output: []string{
			` {"arguments": "{\"units\":\"c\",\n \"city\":\"Zürich\"}", "type": "function_call", "call_id": "call_2", "name": "get_weather"} `,
		}},
		{name: "function call with arguments first", body: `{"input":[{"arguments":"{\"units\":\"c\",\"city\":\"Zürich\"}","type":"function_call","name":"get_weather","call_id":"call_1"}]}`},
		{name: "function call with non-JSON arguments", body: `{"input":[{"type":"function_call","arguments":"city=Zürich"}]}`},
		{name: "function call arguments with duplicate keys stay as written", body: `{"input":[{"type":"function_call","arguments":"{\"a\": 1, \"a\": 2}"}]}`},
		{name: "function call rule only at the top level of an item", body: `{"input":[{"type":"message","content":[{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1}"}]}]}`},
		{name: "v2: Codex's echoed reasoning item", body: `{"model":"gpt-5.5","input":["q",{"type":"reasoning","id":"rs_1","summary":[],"content":null,"encrypted_content":"gAAA"}]}`, output: []string{`{"id":"rs_2","type":"reasoning","summary":[],"encrypted_content":"gAAB"}`}},
		{name: "v2: Codex's first reasoning item as the upstream sent it", body: `{"model":"gpt-5.5","input":["q",{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":"gAAA"}]}`, sameAs: "v2: Codex's echoed reasoning item"},
		{name: "v2: prompt members left out of the signature", body: `{"model":"gpt-5.5","client_metadata":{"turn_id":"t1"},"metadata":{"a":"b"},"user":"u","safety_identifier":"s","prompt_cache_key":"k","prompt_cache_retention":"24h","stream":true,"stream_options":{"include_obfuscation":false},"input":["q"]}`},
		{name: "v2: the same prompt without them", body: `{"model":"gpt-5.5","input":["q"]}`, sameAs: "v2: prompt members left out of the signature"},
		{name: "v2: null at the top level of the body counts", body: `{"model":"gpt-5.5","instructions":null,"input":["q"]}`},
		{name: "v4: previous_response_id and conversation null are no members", body: `{"model":"gpt-5.5","previous_response_id":null,"conversation":null,"input":["q"]}`, sameAs: "v2: the same prompt without them"},
		{name: "v3: the AI SDK's first turn", body: `{"model":"gpt-5.1","input":[{"role":"developer","content":"Be terse."},{"role":"user","content":[{"type":"input_text","text":"Where am I?"}]}]}`, output: []string{
			`{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Run pwd."}]}`,
			`{"id":"fc_1","type":"function_call","status":"completed","call_id":"call_1","name":"run","arguments":"{\"command\":\"pwd\"}"}`,
		}},
		{name: "v3: the AI SDK's next turn, with a reference", body: `{"model":"gpt-5.1","input":[{"role":"developer","content":"Be terse."},{"role":"user","content":[{"type":"input_text","text":"Where am I?"}]},{"type":"item_reference","id":"rs_1"},{"type":"function_call","call_id":"call_1","name":"run","arguments":"{\"command\":\"pwd\"}"},{"type":"function_call_output","call_id":"call_1","output":"/home"}]}`},
		{name: "v3: the same turn in full", body: `{"model":"gpt-5.1","input":[{"role":"developer","content":"Be terse."},{"role":"user","content":[{"type":"input_text","text":"Where am I?"}]},{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Run pwd."}]},{"type":"function_call","call_id":"call_1","name":"run","arguments":"{\"command\":\"pwd\"}"},{"type":"function_call_output","call_id":"call_1","output":"/home"}]}`},
		{name: "function call rule does not apply to the body", body: `{"type":"function_call","arguments":"{\"b\": 2, \"a\": 1}","input":[]}`},
		{name: "mixed items", body: `{"input":["text", 1.0, null, [true, {"b": 1, "a": 2}]], "instructions": "\u2028 \/ \u007f"}`},
		{name: "synthetic", body: string(syntheticBody(6, 3000))},
		{name: "item nesting 510 deep", body: `{"input":[` + vecNest("[", "]", 510, "") + `]}`},
		{name: "item nesting 511 deep", body: `{"input":[` + vecNest("[", "]", 511, "") + `]}`},
		{name: "arguments have their own depth count (512)", body: deepArgs(512)},
		{name: "arguments nesting 513 deep stay as written", body: deepArgs(513)},
		{name: "output item may nest 512 deep", body: `{"input":["q"]}`, output: []string{vecNest("[", "]", 512, "")}},
		{name: "input is null", body: `{"input":null}`},
		{name: "input is a number", body: `{"input":1}`},
		{name: "input is an object", body: `{"input":{"role":"user"}}`},
		{name: "duplicate input", body: `{"input":[],"input":[]}`},
		{name: "duplicate input after decoding", body: `{"input":[],"\u0069nput":[]}`},
		{name: "duplicate key in item", body: `{"input":[{"a":1,"a":1}]}`},
		{name: "duplicate key in another member", body: `{"input":[],"text":{"a":1,"a":1}}`},
		{name: "body is an array", body: `[{"input":[]}]`},
		{name: "body is a string", body: `"input"`},
		{name: "trailing data after the body", body: `{"input":[]} {}`},
		{name: "invalid UTF-8 in an item", body: "{\"input\":[\"\xff\"]}"},
		{name: "lone surrogate escape", body: `{"input":[],"instructions":"\ud800"}`},
	}
}

func vecItems(t *testing.T, raws []json.RawMessage) []vecItem {
	items := []vecItem{}
	for _, raw := range raws {
		canon, err := canonical(raw, vecParser.rules, placeItem)
		require.NoError(t, err)
		items = append(items, vecItem{Raw: string(raw), Canonical: string(canon), Digest: vectorfile.NewDigest(vecParser.sum(canon))})
	}
	return items
}

// outputID returns the canonical string of an output item's id.
func outputID(t *testing.T, item json.RawMessage) string {
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(item, &m))
	c, err := canonicalExact(m["id"])
	require.NoError(t, err)
	return string(c)
}

// vecSignatureText returns the canonical body without its input member and
// the profile's prompt members, the text whose digest is the signature.
func vecSignatureText(t *testing.T, body []byte) string {
	c, err := canonical(body, vecParser.rules, placeBody)
	require.NoError(t, err)
	return string(c)
}

func vecRequests(t *testing.T) []vecRequest {
	var vs []vecRequest
	for _, c := range vecRequestCases() {
		v := vecRequest{Name: c.name, SameAs: c.sameAs}
		v.Body, v.BodyHex = vectorfile.Text(c.body)
		r, err := vecParser.Parse([]byte(c.body))
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidRequest)
			require.Empty(t, c.output)
			vs = append(vs, v)
			continue
		}
		v.Valid = true
		sigText := vecSignatureText(t, []byte(c.body))
		require.Equal(t, vecParser.sum([]byte(sigText)), r.Signature())
		sig := vectorfile.NewDigest(r.Signature())
		v.SignatureText, v.Signature = &sigText, &sig
		items := vecItems(t, r.Items())
		for i := range items {
			require.Equal(t, items[i].Digest, vectorfile.NewDigest(r.digests[i]))
		}
		v.Items = &items
		for i := 0; i <= r.Len(); i++ {
			v.Chain = append(v.Chain, vectorfile.NewDigest(r.Prefix(i)))
		}
		n := r.bytes
		v.TranscriptBytes = &n
		if len(c.output) > 0 {
			out := make([]json.RawMessage, len(c.output))
			for i, o := range c.output {
				out[i] = json.RawMessage(o)
			}
			fp, err := r.Transcript(out)
			require.NoError(t, err)
			v.Output = c.output
			trimmed := make([]json.RawMessage, len(out))
			for i, o := range out {
				trimmed[i] = bytes.TrimSpace(o)
			}
			v.OutputItems = vecItems(t, trimmed)
			v.Transcript = &vecFingerprint{Items: fp.Items, Digest: vectorfile.NewDigest(fp.Digest), Bytes: fp.Bytes}
			for _, ref := range fp.References {
				id := outputID(t, out[ref.Item-r.Len()])
				v.Transcript.References = append(v.Transcript.References, vecReference{
					Item: ref.Item, Canonical: `{"id":` + id + `,"type":"item_reference"}`, Mask: vectorfile.NewDigest(ref.Mask)})
			}
		}
		vs = append(vs, v)
	}
	return vs
}

func vecBuild(t *testing.T) vecFile {
	return vecFile{
		About: vecAbout,
		Constants: vecConstants{
			KeyHex: hex.EncodeToString(vecKey[:]), ProfileID: vecParser.ProfileID(),
			ChainSeedText: ChainSeedText, ChainSeed: vectorfile.NewDigest(vecParser.seed),
			EmptySignatureText: "{}", EmptySignature: vectorfile.NewDigest(vecParser.sum([]byte("{}"))),
			MaxDepth: MaxDepth,
		},
		Canonical: vecCanonicals(t),
		Requests:  vecRequests(t),
	}
}

// TestVectors rebuilds testdata/fingerprint-vectors.json from the code and fails when
// the stored file differs in any byte. Run with -update-vectors after an
// intended change of the protocol.
func TestVectors(t *testing.T) {
	vectorfile.Check(t, vecPath, vecBuild(t), *updateVectors, "go test ./fingerprint -run TestVectors -update-vectors")
}

// vecLoad reads the stored vectors.
func vecLoad(t *testing.T) vecFile {
	var f vecFile
	vectorfile.Load(t, vecPath, &f)
	return f
}

// TestVectorsFollowTheDocumentedRules checks the stored vectors with the
// formulas of PROTOCOL.md, written out here independently of the code that
// generates them.
func TestVectorsFollowTheDocumentedRules(t *testing.T) {
	f := vecLoad(t)
	c := f.Constants
	key, err := hex.DecodeString(c.KeyHex)
	require.NoError(t, err)
	sum := func(s string) uint64 { return highwayhash.Sum64([]byte(s), key) }
	vectorfile.CheckDigest(t, c.ChainSeed, sum(c.ChainSeedText), "chain seed")
	vectorfile.CheckDigest(t, c.EmptySignature, sum(c.EmptySignatureText), "empty signature")
	chainNext := func(prev, d uint64) uint64 {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], prev)
		binary.LittleEndian.PutUint64(b[8:], d)
		return highwayhash.Sum64(b[:], key)
	}
	hexValue := func(d vectorfile.Digest) uint64 {
		v, err := strconv.ParseUint(d.Hex, 16, 64)
		require.NoError(t, err)
		return v
	}

	for _, v := range f.Canonical {
		if v.Valid {
			vectorfile.CheckDigest(t, *v.Digest, sum(*v.Canonical), v.Name)
			again, err := canonicalExact([]byte(*v.Canonical))
			require.NoError(t, err, v.Name)
			assert.Equal(t, *v.Canonical, string(again), "%s: canonical form is a fixed point", v.Name)
		}
	}

	byName := map[string]vecRequest{}
	for _, v := range f.Requests {
		byName[v.Name] = v
		if !v.Valid {
			continue
		}
		vectorfile.CheckDigest(t, *v.Signature, sum(*v.SignatureText), v.Name+": signature")
		h := hexValue(c.ChainSeed)
		vectorfile.CheckDigest(t, v.Chain[0], h, v.Name+": h(0)")
		var size int64
		for i, it := range *v.Items {
			vectorfile.CheckDigest(t, it.Digest, sum(it.Canonical), v.Name+": item digest")
			h = chainNext(h, hexValue(it.Digest))
			vectorfile.CheckDigest(t, v.Chain[i+1], h, fmt.Sprintf("%s: h(%d)", v.Name, i+1))
			size += int64(len(it.Canonical))
		}
		assert.Len(t, v.Chain, len(*v.Items)+1, v.Name)
		assert.Equal(t, size, *v.TranscriptBytes, v.Name)
		if v.Transcript != nil {
			for _, it := range v.OutputItems {
				vectorfile.CheckDigest(t, it.Digest, sum(it.Canonical), v.Name+": output digest")
				h = chainNext(h, hexValue(it.Digest))
				size += int64(len(it.Canonical))
			}
			vectorfile.CheckDigest(t, v.Transcript.Digest, h, v.Name+": transcript")
			for _, ref := range v.Transcript.References {
				out := v.OutputItems[ref.Item-len(*v.Items)]
				vectorfile.CheckDigest(t, ref.Mask, hexValue(out.Digest)^sum(ref.Canonical), v.Name+": reference mask")
			}
			assert.Equal(t, len(*v.Items)+len(v.OutputItems), v.Transcript.Items, v.Name)
			assert.Equal(t, size, v.Transcript.Bytes, v.Name)
		}
		if v.SameAs != "" {
			o, ok := byName[v.SameAs]
			require.True(t, ok, "%s: same_as %q names an earlier vector", v.Name, v.SameAs)
			assert.Equal(t, o.Signature, v.Signature, v.Name)
			assert.Equal(t, o.Chain, v.Chain, v.Name)
			assert.Equal(t, o.TranscriptBytes, v.TranscriptBytes, v.Name)
		}
	}
}
