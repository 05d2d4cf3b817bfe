package fingerprint

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sameItem reports whether two items have the same digest under V2.
func sameItem(t *testing.T, a, b string) bool {
	t.Helper()
	return sameItemUnder(t, testParser, a, b)
}

// sameItemUnder reports whether two items have the same digest under p.
func sameItemUnder(t *testing.T, p *Parser, a, b string) bool {
	t.Helper()
	ra, err := p.Parse([]byte(`{"input":[` + a + `]}`))
	require.NoError(t, err)
	rb, err := p.Parse([]byte(`{"input":[` + b + `]}`))
	require.NoError(t, err)
	return ra.digests[0] == rb.digests[0]
}

// samePrompt reports whether two bodies have the same signature under V2.
func samePrompt(t *testing.T, a, b string) bool {
	t.Helper()
	return mustParse(t, a).Signature() == mustParse(t, b).Signature()
}

// apartItems are pairs of items that differ in what the upstream holds:
// every profile keeps them apart.
var apartItems = []struct{ name, a, b string }{
	{"1 vs 1.0", `{"type":"x","n":1}`, `{"type":"x","n":1.0}`},
	{"1 vs 1e0", `{"type":"x","n":1}`, `{"type":"x","n":1e0}`},
	{"null vs empty string", `{"type":"x","s":null}`, `{"type":"x","s":""}`},
	{"null vs false", `{"type":"x","s":null}`, `{"type":"x","s":false}`},
	{"null vs empty object", `{"type":"x","s":null}`, `{"type":"x","s":{}}`},
	{"null element of an array stays", `{"type":"x","a":[null]}`, `{"type":"x","a":[]}`},
	{"null inside arguments is kept",
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":null}"}`,
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`},
	{"null inside a string is text",
		`{"type":"message","role":"user","content":"{\"a\":null}"}`,
		`{"type":"message","role":"user","content":"{}"}`},
	{"NFC vs NFD", `{"type":"message","role":"user","content":"caf\u00e9"}`, `{"type":"message","role":"user","content":"cafe\u0301"}`},
	{"text", `{"type":"message","role":"user","content":"a"}`, `{"type":"message","role":"user","content":"b"}`},
	{"role", `{"type":"message","role":"user","content":"a"}`, `{"type":"message","role":"developer","content":"a"}`},
	{"call_id", `{"type":"function_call_output","call_id":"c1","output":"x"}`, `{"type":"function_call_output","call_id":"c2","output":"x"}`},
	{"encrypted_content", `{"type":"reasoning","summary":[],"encrypted_content":"a"}`, `{"type":"reasoning","summary":[],"encrypted_content":"b"}`},
	{"summary", `{"type":"reasoning","summary":[],"encrypted_content":"a"}`, `{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"a"}`},
	{"item_reference ids are content", `{"type":"item_reference","id":"msg_1"}`, `{"type":"item_reference","id":"msg_2"}`},
	{"id nested deeper is kept", `{"type":"x","c":{"id":"a"}}`, `{"type":"x","c":{"id":"b"}}`},
	{"parsed outside content parts is kept", `{"type":"x","parsed":1}`, `{"type":"x","parsed":2}`},
	{"arguments of a non-function call are a string", `{"type":"x","arguments":"{\"a\":1}"}`, `{"type":"x","arguments":"{\"a\": 1}"}`},
}

func TestV2MakesEqualWhatClientsRewrite(t *testing.T) {
	for _, tc := range []struct{ name, a, b string }{
		{"Codex adds content null to reasoning",
			`{"type":"reasoning","summary":[],"encrypted_content":"gAAA"}`,
			`{"type":"reasoning","summary":[],"content":null,"encrypted_content":"gAAA"}`},
		{"null nested in an item is absent",
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}`,
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi","annotations":null}]}`},
		{"ids are dropped",
			`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}`,
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}`},
		{"status is dropped",
			`{"type":"function_call","status":"completed","call_id":"c1","name":"f","arguments":"{}"}`,
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`},
		{"JS stream helper adds parsed_arguments",
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"}`,
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}","parsed_arguments":{"a":1}}`},
		{"JS stream helper adds parsed to content parts",
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"{}","annotations":[]}]}`,
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"{}","annotations":[],"parsed":{}}]}`},
		{"re-serialised arguments",
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1,\"b\":[1,2]}"}`,
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"b\": [1, 2], \"a\": 1}"}`},
		{"escapes and key order", `{"b":"\u00e9","a":1}`, `{"a":1,"b":"é"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.True(t, sameItem(t, tc.a, tc.b))
		})
	}
	for _, tc := range []struct{ name, a, b string }{
		{"client_metadata changes every user turn",
			`{"model":"m","client_metadata":{"turn_id":"1"},"input":[]}`, `{"model":"m","client_metadata":{"turn_id":"2"},"input":[]}`},
		{"metadata", `{"model":"m","metadata":{"a":"1"}}`, `{"model":"m"}`},
		{"user", `{"model":"m","user":"u1"}`, `{"model":"m","user":"u2"}`},
		{"safety_identifier", `{"model":"m","safety_identifier":"a"}`, `{"model":"m"}`},
		{"prompt_cache_key", `{"model":"m","prompt_cache_key":"k1"}`, `{"model":"m","prompt_cache_key":"k2"}`},
		{"prompt_cache_retention", `{"model":"m","prompt_cache_retention":"24h"}`, `{"model":"m"}`},
		{"stream", `{"model":"m","stream":true,"stream_options":{"include_obfuscation":false}}`, `{"model":"m","stream":false}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.True(t, samePrompt(t, tc.a, tc.b))
		})
	}
}

func TestV2KeepsApartWhatChangesTheConversation(t *testing.T) {
	for _, tc := range apartItems {
		t.Run(tc.name, func(t *testing.T) {
			assert.False(t, sameItem(t, tc.a, tc.b))
		})
	}
	for _, tc := range []struct{ name, a, b string }{
		{"instructions", `{"model":"m","instructions":"a"}`, `{"model":"m","instructions":"b"}`},
		{"model", `{"model":"m"}`, `{"model":"n"}`},
		{"tools", `{"model":"m","tools":[]}`, `{"model":"m","tools":[{"type":"function","name":"f"}]}`},
		{"tool parameters default null", `{"model":"m","tools":[{"type":"function","name":"f","parameters":{"default":null}}]}`, `{"model":"m","tools":[{"type":"function","name":"f","parameters":{}}]}`},
		{"tool_choice", `{"model":"m","tool_choice":"auto"}`, `{"model":"m","tool_choice":"none"}`},
		{"reasoning", `{"model":"m","reasoning":{"effort":"low"}}`, `{"model":"m","reasoning":{"effort":"high"}}`},
		{"text", `{"model":"m","text":{"verbosity":"low"}}`, `{"model":"m"}`},
		{"include", `{"model":"m","include":["reasoning.encrypted_content"]}`, `{"model":"m"}`},
		{"temperature 1 vs 1.0", `{"model":"m","temperature":1}`, `{"model":"m","temperature":1.0}`},
		{"store", `{"model":"m","store":false}`, `{"model":"m","store":true}`},
		{"service_tier", `{"model":"m","service_tier":"flex"}`, `{"model":"m"}`},
		{"previous_response_id", `{"model":"m","previous_response_id":"resp_1"}`, `{"model":"m"}`},
		{"null at the top level is kept", `{"model":"m","instructions":null}`, `{"model":"m"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.False(t, samePrompt(t, tc.a, tc.b))
		})
	}
}

func TestItemReferenceKeepsEveryMember(t *testing.T) {
	r := mustParse(t, `{"input":[{"status":"completed","type":"item_reference","id":"msg_1","x":null}]}`)
	canon, err := canonical(r.Items()[0], testParser.rules, placeItem)
	require.NoError(t, err)
	assert.Equal(t, `{"id":"msg_1","status":"completed","type":"item_reference"}`, string(canon))
	assert.Equal(t, testParser.sum(canon), r.digests[0])
}

func TestOutputItemsFollowTheItemRules(t *testing.T) {
	a := mustParse(t, `{"input":["hi"]}`)
	sent := json.RawMessage(`{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":"e"}`)
	got, err := a.Transcript([]json.RawMessage{sent})
	require.NoError(t, err)
	echoed := mustParse(t, `{"input":["hi",{"type":"reasoning","summary":[],"content":null,"encrypted_content":"e"}]}`)
	assert.Equal(t, echoed.fp(), got)
}

func TestDigestsDependOnTheKey(t *testing.T) {
	other := testKey
	other[0] ^= 1
	p2 := mustParser(V2(), other)
	body := []byte(`{"model":"m","input":["a",{"type":"x"}]}`)
	a, err := testParser.Parse(body)
	require.NoError(t, err)
	b, err := p2.Parse(body)
	require.NoError(t, err)
	assert.NotEqual(t, a.Signature(), b.Signature())
	assert.NotEqual(t, a.Prefix(0), b.Prefix(0))
	assert.NotEqual(t, a.digests[1], b.digests[1])
	assert.NotEqual(t, a.Prefix(2), b.Prefix(2))
}

func TestProfileID(t *testing.T) {
	assert.Equal(t, "v2;item=id,parsed_arguments,status;part=parsed;prompt=client_metadata,metadata,prompt_cache_key,prompt_cache_retention,safety_identifier,stream,stream_options,user", V2().ID())
	p := V2()
	p.PromptMembers = append(p.PromptMembers, "user", "background")
	p.Name = "v2-site"
	assert.Contains(t, p.ID(), "prompt=background,client_metadata,")
	assert.NotEqual(t, V2().ID(), p.ID())
	assert.Equal(t, V2().ID(), mustParser(V2(), testKey).ProfileID())
}

func TestProfileIsCopied(t *testing.T) {
	prof := V2()
	ps := mustParser(prof, testKey)
	prof.ItemMembers[0] = "role"
	a, err := ps.Parse([]byte(`{"input":[{"type":"x","role":"a"}]}`))
	require.NoError(t, err)
	b, err := ps.Parse([]byte(`{"input":[{"type":"x","role":"b"}]}`))
	require.NoError(t, err)
	assert.NotEqual(t, a.digests[0], b.digests[0], "changing the caller's slice does not change the parser")
}

func TestInvalidProfiles(t *testing.T) {
	for _, p := range []Profile{
		{},
		{Name: "a b"},
		{Name: "x;y"},
		{Name: "x", ItemMembers: []string{"type"}},
		{Name: "x", ItemMembers: []string{""}},
		{Name: "x", PartMembers: []string{"a,b"}},
		{Name: "x", PromptMembers: []string{"input"}},
	} {
		_, err := New(p, testKey)
		assert.ErrorIs(t, err, ErrInvalidProfile, "%+v", p)
	}
}
