package fakeupstream

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// do sends one request and returns the status and body of the answer.
func do(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

func TestStoredResponseEndpoints(t *testing.T) {
	_, srv := newTestUpstream(t, Script{}, nil)
	base := srv.URL + "/v1/responses"
	status, b := do(t, http.MethodPost, base, `{"model":"m","input":"hi"}`)
	require.Equal(t, http.StatusOK, status, "%s", b)
	var created struct{ ID, Object, Status string }
	require.NoError(t, json.Unmarshal(b, &created))

	status, got := do(t, http.MethodGet, base+"/"+created.ID, "")
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, string(b), string(got), "the stored response object")
	status, got = do(t, http.MethodPost, base+"/"+created.ID+"/cancel", "")
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, string(b), string(got))

	status, got = do(t, http.MethodPost, base+"/input_tokens", `{"model":"m","input":"again","previous_response_id":"`+created.ID+`"}`)
	require.Equal(t, http.StatusOK, status, "%s", got)
	var count struct {
		Object      string
		InputTokens int `json:"input_tokens"`
	}
	require.NoError(t, json.Unmarshal(got, &count))
	require.Equal(t, "response.input_tokens", count.Object)
	require.Greater(t, count.InputTokens, 1)

	status, got = do(t, http.MethodDelete, base+"/"+created.ID, "")
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"id":"`+created.ID+`","object":"response","deleted":true}`, string(got))
	status, _ = do(t, http.MethodGet, base+"/"+created.ID, "")
	require.Equal(t, http.StatusNotFound, status, "deleted")
	status, got = do(t, http.MethodPost, base, `{"model":"m","input":"x","previous_response_id":"`+created.ID+`"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(got), ErrorCodeNotFound, "a deleted response cannot be continued")

	status, _ = do(t, http.MethodPost, base, `{"model":"m","input":"x","store":false}`)
	require.Equal(t, http.StatusOK, status)
	status, _ = do(t, http.MethodGet, base+"/resp_unknown", "")
	require.Equal(t, http.StatusNotFound, status)
}

func TestChatCompletions(t *testing.T) {
	up, srv := newTestUpstream(t, Script{}, nil)
	url := srv.URL + "/v1/chat/completions?trace=1"
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	status, b := do(t, http.MethodPost, url, body)
	require.Equal(t, http.StatusOK, status, "%s", b)
	var done struct {
		Object  string
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &done))
	require.Equal(t, "chat.completion", done.Object)
	require.Equal(t, "assistant", done.Choices[0].Message.Role)
	require.Equal(t, "You said: hello", done.Choices[0].Message.Content)

	status, b = do(t, http.MethodPost, url, `{"model":"m","stream":true,"stream_options":{"include_usage":true},
		"messages":[{"role":"user","content":"hello"}]}`)
	require.Equal(t, http.StatusOK, status)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	require.Equal(t, "data: [DONE]", lines[len(lines)-1])
	var text strings.Builder
	for _, l := range lines[:len(lines)-1] {
		var c struct {
			Object  string
			Choices []struct{ Delta struct{ Content string } }
			Usage   *struct {
				TotalTokens int `json:"total_tokens"`
			}
		}
		require.True(t, strings.HasPrefix(l, "data: "), l)
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &c))
		require.Equal(t, "chat.completion.chunk", c.Object)
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	require.Equal(t, "You said: hello", text.String())
	require.Contains(t, lines[len(lines)-2], `"total_tokens"`, "the usage chunk")

	status, _ = do(t, http.MethodPost, url, `{"model":"m"}`)
	require.Equal(t, http.StatusBadRequest, status)

	reqs := up.Requests()
	require.Len(t, reqs, 3)
	require.Equal(t, http.MethodPost, reqs[0].Method)
	require.Equal(t, "/v1/chat/completions", reqs[0].Path)
	require.Equal(t, "trace=1", reqs[0].RawQuery)
	require.Equal(t, body, string(reqs[0].Body))
	require.Equal(t, "Bearer sk-test", reqs[0].Header.Get("Authorization"))
}
