package fingerprint

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestContinuedBody(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"previous_response_id is added first",
			`{"model":"m","input":["a",{"b":1}, "c" ],"store":true}`,
			`{"previous_response_id":"resp_1","model":"m","input":[{"b":1},"c"],"store":true}`},
		{"an existing previous_response_id is replaced",
			` { "previous_response_id" : null, "input" : ["a","b"] } `,
			` { "previous_response_id" : "resp_1", "input" : ["b"] } `},
		{"previous_response_id after input",
			`{"input":["a","b"],"previous_response_id":"old"}`,
			`{"input":["b"],"previous_response_id":"resp_1"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, tc.body)
			got, err := r.ContinuedBody("resp_1", 1)
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
}

func TestContinuedBodyKeepsItemsAsReceived(t *testing.T) {
	r := mustParse(t, `{"input":["a", {"z": 1, "a": "\u00e9"}]}`)
	got, err := r.ContinuedBody(`id"with\quote`, 1)
	require.NoError(t, err)
	assert.Equal(t, `{"previous_response_id":"id\"with\\quote","input":[{"z": 1, "a": "\u00e9"}]}`, string(got))
}

func TestContinuedBodyRefusesWhatLeavesNoDelta(t *testing.T) {
	r := mustParse(t, `{"input":["a","b"]}`)
	for _, from := range []int{-1, 0, 2, 3} {
		_, err := r.ContinuedBody("resp_1", from)
		assert.ErrorIs(t, err, ErrInvalidRequest, "from %d", from)
	}
	_, err := r.ContinuedBody("", 1)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = mustParse(t, `{"model":"m"}`).ContinuedBody("resp_1", 1)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

func TestExplain(t *testing.T) {
	prev := mustParse(t, `{"model":"m","instructions":"a","input":["q"]}`)
	out := []json.RawMessage{json.RawMessage(`{"type":"message","role":"assistant","content":"x"}`)}

	m, err := Explain(prev, out, mustParse(t, `{"model":"n","instructions":"a","tools":[],"input":["q",{"type":"message","role":"assistant","content":"x"},"more"]}`))
	require.NoError(t, err)
	assert.Equal(t, Mismatch{Prompt: []string{"model", "tools"}, Item: -1}, m)

	m, err = Explain(prev, out, mustParse(t, `{"model":"m","instructions":"a","client_metadata":{"t":1},"input":["q",{"type":"message","role":"user","content":"y","status":"completed"},"more"]}`))
	require.NoError(t, err)
	assert.Equal(t, Mismatch{Item: 1, Members: []string{"content", "role"}}, m, "ignored members are not differences")

	m, err = Explain(prev, out, mustParse(t, `{"model":"m","instructions":"a","input":["q"]}`))
	require.NoError(t, err)
	assert.Equal(t, Mismatch{Item: 1}, m, "a shorter request stops at its end")

	m, err = Explain(prev, out, mustParse(t, `{"model":"m","instructions":"a","input":["other"]}`))
	require.NoError(t, err)
	assert.Equal(t, Mismatch{Item: 0}, m, "items that are not both objects name no members")

	other := mustParser(V2(), Key{9})
	r, err := other.Parse([]byte(`{"input":[]}`))
	require.NoError(t, err)
	_, err = Explain(prev, out, r)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

// A string input becomes the one user message the API takes it for, its
// string as written, and the array a client sends next continues it.
func TestMessageInputBody(t *testing.T) {
	r := mustParse(t, `{"model":"m", "input" : "hi \u00e9" ,"store":true}`)
	got, ok := r.MessageInputBody()
	require.True(t, ok)
	assert.Equal(t, `{"model":"m", "input" : [{"role":"user","content":"hi \u00e9"}] ,"store":true}`, string(got))
	first := mustParse(t, string(got))
	next := mustParse(t, `{"model":"m","input":[{"role":"user","content":"hi é"},{"role":"assistant","content":"hello"}],"store":true}`)
	assert.Equal(t, first.Prefix(1), next.Prefix(1), "the next request's opening is the first's")
	assert.Equal(t, first.Signature(), next.Signature())

	for _, body := range []string{`{"model":"m","input":["hi"]}`, `{"model":"m"}`, `{"model":"m","input":[]}`} {
		r := mustParse(t, body)
		got, ok := r.MessageInputBody()
		assert.False(t, ok, body)
		assert.Equal(t, body, string(got))
	}
}
