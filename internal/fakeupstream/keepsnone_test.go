package fakeupstream

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// An upstream that keeps no responses refuses every previous_response_id,
// stored or not, over both transports, as the real API refuses an unknown
// one; Calls counts every call, refused ones included.
func TestKeepsNoResponsesRefusesEveryContinuation(t *testing.T) {
	up := New(Options{KeepsNoResponses: true})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	url := srv.URL + "/v1/responses"

	first := post(t, url, `{"model":"m","store":true,"input":"one"}`)
	require.Equal(t, http.StatusOK, first.StatusCode)
	var r1 struct{ ID string }
	require.NoError(t, json.NewDecoder(first.Body).Decode(&r1))
	resp := post(t, url, `{"model":"m","previous_response_id":"`+r1.ID+`","input":"two"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	raw, _ := io.ReadAll(resp.Body)
	require.JSONEq(t, `{"error":{"message":"Previous response with id '`+r1.ID+`' not found.",
		"type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, string(raw))

	// Not even a socket's latest response, with store=false.
	ws := dial(t, srv)
	id := ws.completed(map[string]any{"model": "m", "store": false, "input": "one"})["id"].(string)
	ws.notFound(map[string]any{"model": "m", "store": false, "previous_response_id": id, "input": "two"})
	ws.notFound(map[string]any{"model": "m", "previous_response_id": r1.ID, "input": "two"})
	// The full context is answered.
	ws.completed(map[string]any{"model": "m", "store": false, "input": "one"})
	require.Equal(t, int64(6), up.Calls())

	// Without the option, the same calls continue.
	normal := New(Options{})
	res, apiErr := normal.Create(Request{Body: []byte(`{"model":"m","input":"one"}`)})
	require.Nil(t, apiErr)
	_, apiErr = normal.Create(Request{Body: []byte(`{"model":"m","previous_response_id":"` + res.ID + `","input":"two"}`)})
	require.Nil(t, apiErr)
	require.Equal(t, int64(2), normal.Calls())
}
