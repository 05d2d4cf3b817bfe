package fingerprint

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request whose previous_response_id or conversation, not null, comes
// before its input keeps its conversation upstream: Parse passes over the
// input without reading it. Named after the input, or null, it comes too
// late or says nothing, and the input is read as always.
func TestParseSkipsTheInputTheUpstreamHolds(t *testing.T) {
	const refused = `[{"role":"user","content":"a","content":"b"}]` // a duplicate key
	for _, tc := range []struct {
		body    string
		skipped bool
		items   int
	}{
		{`{"previous_response_id":"resp_1","input":` + refused + `}`, true, 0},
		{`{"model":"m","conversation":{"id":"conv_1"},"input":` + refused + `,"store":false}`, true, 0},
		{`{"conversation":"conv_1","input":"a \"string\" item"}`, true, 0},
		{`{"previous_response_id":null,"input":[{"role":"user","content":"a"}]}`, false, 1},
		{`{"input":[{"role":"user","content":"a"}],"previous_response_id":"resp_1"}`, false, 1},
		{`{"conversation":null,"input":"a"}`, false, 1},
	} {
		r, err := testParser.Parse([]byte(tc.body))
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.skipped, r.InputSkipped(), tc.body)
		assert.Equal(t, tc.items, r.Len(), tc.body)
		if tc.skipped {
			in, ok := r.Member("input")
			require.True(t, ok, tc.body)
			assert.Contains(t, tc.body, `"input":`+string(in), "the input member is the value passed over")
		}
	}
	for _, body := range []string{
		`{"previous_response_id":"resp_1","input":` + refused[:20],
		`{"previous_response_id":"resp_1","input":"open`,
		`{"previous_response_id":"resp_1","input":3}`,
		`{"previous_response_id":"resp_1","input":[],}`,
		`{"input":` + refused + `,"previous_response_id":"resp_1"}`,
	} {
		_, err := testParser.Parse([]byte(body))
		assert.ErrorIs(t, err, ErrInvalidRequest, body)
	}
}

// Skim passes over every body's input, wherever it stands, as Parse does
// over one the upstream holds; the rest of the body is parsed as always.
func TestSkimPassesOverTheInput(t *testing.T) {
	const refused = `[{"role":"user","content":"a","content":"b"}]` // a duplicate key
	for _, body := range []string{
		`{"model":"m","input":` + refused + `,"stream":true}`,
		`{"input":"a","previous_response_id":null}`,
		`{"model":"m"}`,
	} {
		r, err := testParser.Skim([]byte(body))
		require.NoError(t, err, body)
		assert.Zero(t, r.Len(), body)
		in, ok := r.Member("input")
		assert.Equal(t, ok, r.InputSkipped(), body)
		if ok {
			assert.Contains(t, body, `"input":`+string(in), body)
		}
	}
	for _, body := range []string{`{"model":"m","input":` + refused[:20], `{"model":"m","model":"n","input":[]}`, `[]`} {
		_, err := testParser.Skim([]byte(body))
		assert.ErrorIs(t, err, ErrInvalidRequest, body)
	}
	r, err := testParser.Parse([]byte(`{"input":"a"}`))
	require.NoError(t, err)
	assert.Equal(t, 1, r.Len(), "a skim leaves nothing behind for the next parse")
}
