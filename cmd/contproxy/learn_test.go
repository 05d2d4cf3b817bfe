package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/fakeupstream"
)

// converse plays turns of one conversation against contproxy at addr, each
// turn sending the whole history.
func converse(t *testing.T, addr string, turns int) {
	t.Helper()
	history := `{"role":"user","content":"hi"}`
	for range turns {
		resp, err := http.Post("http://"+addr+"/v1/responses", "application/json",
			strings.NewReader(`{"model":"m","metadata":{"session_id":"s1"},"input":[`+history+`]}`))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		output := gjson.GetBytes(b, "output").Raw
		history += "," + output[1:len(output)-1] + `,{"role":"user","content":"more"}`
	}
}

// In front of an upstream that keeps no responses, contproxy pauses
// continuing after three refusals, logs it once and shows it in /metrics;
// CONTPROXY_NO_CONTINUATION never continues.
func TestAnUpstreamThatCannotContinue(t *testing.T) {
	fake := fakeupstream.New(fakeupstream.Options{KeepsNoResponses: true})
	up := httptest.NewServer(fake)
	t.Cleanup(up.Close)

	var log syncBuffer
	addr, ops, stop := startWith(t, noEnv, &log, "-upstream", up.URL+"/v1")
	converse(t, addr, 6) // the 2nd to 4th refused and resent; the 5th and 6th sent in full
	assert.Equal(t, 3.0, metric(t, ops, "contproxy_full_context_retries_total"))
	assert.Equal(t, 2.0, metric(t, ops, "contproxy_continuations_paused_total"))
	assert.Equal(t, 1.0, metric(t, ops, `contproxy_continuation_paused{model="m"}`))
	assert.Equal(t, int64(9), fake.Calls())
	require.NoError(t, stop())
	assert.Equal(t, 1, strings.Count(log.String(), "upstream refuses continuations"), "%s", log.String())
	assert.Contains(t, log.String(), `level=WARN msg="upstream refuses continuations; sending full context for 1m0s" model=m`)

	c, err := parse([]string{"-upstream", up.URL + "/v1"}, []string{"CONTPROXY_NO_CONTINUATION=true"}, io.Discard)
	require.NoError(t, err)
	assert.True(t, c.noContinuation)
	addr, ops, _ = startWith(t, []string{"CONTPROXY_NO_CONTINUATION=true"}, io.Discard, "-upstream", up.URL+"/v1")
	calls := fake.Calls()
	converse(t, addr, 6)
	assert.Equal(t, calls+6, fake.Calls(), "never continued, never refused")
	assert.Zero(t, metric(t, ops, "contproxy_full_context_retries_total"))
	assert.Equal(t, 6.0, metric(t, ops, "contproxy_turns_total"))
}
