package fingerprint

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// v4Parser parses with V4 under testKey.
var v4Parser = mustParser(V4(), testKey)

func TestV4KeepsTheIDOfAReasoningItemWithoutEncryptedContent(t *testing.T) {
	const rs1 = `{"id":"rs_1","type":"reasoning","summary":[]}`
	for _, tc := range []struct{ name, a, b string }{
		{"two responses' reasoning with the same summary", rs1, `{"id":"rs_2","type":"reasoning","summary":[]}`},
		{"encrypted_content null is none", rs1, `{"id":"rs_2","type":"reasoning","summary":[],"encrypted_content":null}`},
		{"the id last", `{"summary":[],"type":"reasoning","id":"rs_1"}`, `{"summary":[],"type":"reasoning","id":"rs_2"}`},
		{"an escaped key", rs1, `{"\u0069d":"rs_2","type":"reasoning","summary":[]}`},
		{"a reasoning item without its id", rs1, `{"type":"reasoning","summary":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.False(t, sameItemUnder(t, v4Parser, tc.a, tc.b))
			assert.True(t, sameItemUnder(t, v3Parser, tc.a, tc.b), "V3 makes them equal")
		})
	}
	for _, tc := range []struct{ name, a, b string }{
		{"status, content null and member order", rs1, `{"summary":[],"content":null,"status":"completed","type":"reasoning","id":"rs_1"}`},
		{"an escaped key", rs1, `{"\u0069d":"rs_1","type":"reasoning","summary":[]}`},
		{"Codex's turn metadata", rs1, `{"id":"rs_1","type":"reasoning","summary":[],"internal_chat_message_metadata_passthrough":{"turn_id":"t1"}}`},
		{"encrypted content: compared without the id, as Codex sends it",
			`{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":"gAAA"}`,
			`{"type":"reasoning","summary":[],"content":null,"encrypted_content":"gAAA"}`},
		{"a message's id still goes", `{"id":"msg_1","role":"assistant","content":"T"}`, `{"id":"msg_2","role":"assistant","content":"T"}`},
		{"id null is no id", `{"id":null,"type":"reasoning","summary":[]}`, `{"type":"reasoning","summary":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.True(t, sameItemUnder(t, v4Parser, tc.a, tc.b))
		})
	}
	t.Run("the canonical form", func(t *testing.T) {
		got, err := canonical([]byte(`{"status":"completed","type":"reasoning","summary":[],"id":"rs_1","content":null}`), v4Parser.rules, placeItem)
		require.NoError(t, err)
		assert.Equal(t, `{"id":"rs_1","summary":[],"type":"reasoning"}`, string(got))
	})
}

func TestV4ContinuesFromItsOwnReasoningOnly(t *testing.T) {
	const (
		rs  = `{"id":"rs_1","type":"reasoning","summary":[]}`
		msg = `{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"T","annotations":[]}]}`
	)
	tr := transcriptOf(t, v4Parser, `{"input":["hi"]}`, rs, msg)
	for _, tc := range []struct {
		name, input string
		want        bool
	}{
		{"the items sent back", rs + `,` + msg, true},
		{"the reasoning referenced", `{"type":"item_reference","id":"rs_1"},{"role":"assistant","content":"T"}`, true},
		{"another response's reasoning and the same text", `{"id":"rs_2","type":"reasoning","summary":[]},` + msg, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := v4Parser.Parse([]byte(`{"input":["hi",` + tc.input + `,"next"]}`))
			require.NoError(t, err)
			assert.Equal(t, tc.want, tr.PrefixOf(r))
		})
	}
}

func TestV4LeavesANullPreviousResponseOutOfThePrompt(t *testing.T) {
	sig := func(p *Parser, body string) uint64 {
		r, err := p.Parse([]byte(body))
		require.NoError(t, err)
		return r.Signature()
	}
	for _, member := range []string{"previous_response_id", "conversation"} {
		with, without := `{"model":"m","`+member+`":null,"input":[]}`, `{"model":"m","input":[]}`
		assert.Equal(t, sig(v4Parser, without), sig(v4Parser, with), member)
		assert.NotEqual(t, sig(v3Parser, without), sig(v3Parser, with), "V3 counts %s null", member)
	}
}

func TestV4ProfileID(t *testing.T) {
	assert.Equal(t, "v4;item=id,internal_chat_message_metadata_passthrough,parsed_arguments,status;part=parsed;prompt=client_metadata,conversation,metadata,previous_response_id,prompt_cache_key,prompt_cache_retention,safety_identifier,stream,stream_options,user;empty=annotations,logprobs;forms=reasoning-ids,references,short-messages", V4().ID())
	p, err := Named("v4")
	require.NoError(t, err)
	assert.Equal(t, V4().ID(), p.ID())
}
