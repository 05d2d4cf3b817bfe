package fingerprint

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// v3Parser parses with V3 under testKey.
var v3Parser = mustParser(V3(), testKey)

func TestV3MakesEqualWhatClientsSendBack(t *testing.T) {
	sent := `{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"T","annotations":[],"logprobs":[]}]}`
	for _, tc := range []struct{ name, a, b string }{
		{"the AI SDK's assistant message under store:false", sent, `{"role":"assistant","content":"T"}`},
		{"opencode's assistant message", sent, `{"role":"assistant","content":[{"type":"output_text","text":"T"}]}`},
		{"a user message in short form", `{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}`, `{"role":"user","content":"hi"}`},
		{"a developer message in short form", `{"type":"message","role":"developer","content":[{"type":"input_text","text":"be terse"}]}`, `{"role":"developer","content":"be terse"}`},
		{"a system message with type and string content", `{"type":"message","role":"system","content":"s"}`, `{"role":"system","content":[{"type":"input_text","text":"s"}]}`},
		{"type null is no type", `{"type":null,"role":"user","content":"hi"}`, `{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}`},
		{"empty annotations count as absent", `{"role":"assistant","content":[{"type":"output_text","text":"T","annotations":[]}]}`, `{"role":"assistant","content":"T"}`},
		{"Codex's turn metadata",
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}`,
			`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}],"internal_chat_message_metadata_passthrough":{"turn_id":"t1","create_time":1788214171.12}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.True(t, sameItemUnder(t, v3Parser, tc.a, tc.b))
			assert.False(t, sameItemUnder(t, testParser, tc.a, tc.b), "V2 keeps them apart")
		})
	}
}

func TestV3KeepsApartWhatChangesTheConversation(t *testing.T) {
	pairs := append([]struct{ name, a, b string }{
		{"an edited assistant text", `{"role":"assistant","content":"T"}`, `{"role":"assistant","content":"U"}`},
		{"a short message of another role", `{"role":"assistant","content":"T"}`, `{"role":"user","content":"T"}`},
		{"short user text is not assistant text", `{"role":"user","content":"T"}`, `{"type":"message","role":"user","content":[{"type":"output_text","text":"T"}]}`},
		{"non-empty annotations",
			`{"role":"assistant","content":[{"type":"output_text","text":"T","annotations":[{"type":"url_citation","url":"u"}]}]}`,
			`{"role":"assistant","content":"T"}`},
		{"non-empty logprobs",
			`{"role":"assistant","content":[{"type":"output_text","text":"T","logprobs":[{"token":"T"}]}]}`,
			`{"role":"assistant","content":"T"}`},
		{"an unknown role keeps its string", `{"role":"tool","content":"T"}`, `{"role":"tool","content":[{"type":"input_text","text":"T"}]}`},
		{"another type is not a message", `{"type":"x","role":"user","content":"T"}`, `{"type":"x","role":"user","content":[{"type":"input_text","text":"T"}]}`},
		{"a reference without type keeps its id", `{"id":"msg_1"}`, `{"id":"msg_2"}`},
		{"a reference is not its item", `{"type":"item_reference","id":"msg_1"}`, `{"id":"msg_1","type":"message","role":"assistant","content":"T"}`},
	}, apartItems...)
	for _, tc := range pairs {
		t.Run(tc.name, func(t *testing.T) {
			assert.False(t, sameItemUnder(t, v3Parser, tc.a, tc.b))
		})
	}
}

func TestV3ProfileID(t *testing.T) {
	assert.Equal(t, "v3;item=id,internal_chat_message_metadata_passthrough,parsed_arguments,status;part=parsed;prompt=client_metadata,metadata,prompt_cache_key,prompt_cache_retention,safety_identifier,stream,stream_options,user;empty=annotations,logprobs;forms=references,short-messages", V3().ID())
}

// transcriptOf returns the transcript of body's input and output under p.
func transcriptOf(t *testing.T, p *Parser, body string, output ...string) Transcript {
	t.Helper()
	r, err := p.Parse([]byte(body))
	require.NoError(t, err)
	out := make([]json.RawMessage, len(output))
	for i, o := range output {
		out[i] = json.RawMessage(o)
	}
	tr, err := r.Transcript(out)
	require.NoError(t, err)
	return tr
}

func TestReferencesStandForOutputItems(t *testing.T) {
	const (
		rs  = `{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"s"}]}`
		fc  = `{"id":"fc_1","type":"function_call","status":"completed","call_id":"c1","name":"f","arguments":"{}"}`
		msg = `{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"T","annotations":[]}]}`
	)
	tr := transcriptOf(t, v3Parser, `{"input":["hi"]}`, rs, fc)
	require.Equal(t, []int{1, 2}, []int{tr.References[0].Item, tr.References[1].Item})
	tail := `{"type":"function_call_output","call_id":"c1","output":"ok"}`
	for _, tc := range []struct {
		name  string
		input string
		want  bool
	}{
		{"both in full", `"hi",` + rs + `,` + fc, true},
		{"both referenced", `"hi",{"type":"item_reference","id":"rs_1"},{"type":"item_reference","id":"fc_1"}`, true},
		{"the AI SDK's mix: reasoning referenced, the call in full", `"hi",{"type":"item_reference","id":"rs_1"},` + fc, true},
		{"the other mix", `"hi",` + rs + `,{"id":"fc_1","type":"item_reference"}`, true},
		{"a reference to an id the turn did not have", `"hi",{"type":"item_reference","id":"rs_2"},` + fc, false},
		{"references in the wrong order", `"hi",{"type":"item_reference","id":"fc_1"},{"type":"item_reference","id":"rs_1"}`, false},
		{"a reference to an input item", `{"type":"item_reference","id":"rs_1"},{"type":"item_reference","id":"rs_1"},` + fc, false},
		{"a reference with more members", `"hi",{"type":"item_reference","id":"rs_1","status":"completed"},` + fc, false},
		{"the edited call in full", `"hi",{"type":"item_reference","id":"rs_1"},` + `{"type":"function_call","call_id":"c1","name":"g","arguments":"{}"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := v3Parser.Parse([]byte(`{"input":[` + tc.input + `,` + tail + `]}`))
			require.NoError(t, err)
			assert.Equal(t, tc.want, tr.PrefixOf(r))
			noRefs := tr
			noRefs.References = nil
			assert.Equal(t, tc.name == "both in full", noRefs.PrefixOf(r), "without references only the items themselves match")
		})
	}
	t.Run("a message's reference", func(t *testing.T) {
		tr := transcriptOf(t, v3Parser, `{"input":["hi"]}`, msg)
		r, err := v3Parser.Parse([]byte(`{"input":["hi",{"type":"item_reference","id":"msg_1"},"next"]}`))
		require.NoError(t, err)
		assert.True(t, tr.PrefixOf(r))
	})
	t.Run("V2 has no references", func(t *testing.T) {
		assert.Nil(t, transcriptOf(t, testParser, `{"input":["hi"]}`, rs, fc).References)
	})
	t.Run("a longer transcript than the request", func(t *testing.T) {
		r, err := v3Parser.Parse([]byte(`{"input":["hi",{"type":"item_reference","id":"rs_1"}]}`))
		require.NoError(t, err)
		assert.False(t, tr.PrefixOf(r))
	})
}
