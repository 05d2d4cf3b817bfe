//go:build e2e

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// codexChatGPTClient labels the Codex runs of
// TestCodexSignedInWithChatGPTSendsZstdTurnsThatContinue.
const codexChatGPTClient = "codex-chatgpt"

// TestCodexSignedInWithChatGPTSendsZstdTurnsThatContinue runs the Codex
// CLI signed in with ChatGPT (an auth.json of fake, unsigned tokens) with
// an HTTP-only provider named "OpenAI", which is when Codex sends its
// turns with Content-Encoding zstd: codex exec, then two runs of resume
// --last, through the round-robin proxy in front of a contproxy over a
// WebSocket upstream (Codex sends store:false). It proves that contproxy
// serves and continues zstd turns: every turn arrived zstd-encoded and was
// answered 200, each run printed the fake model's final answer, the
// upstream got every turn decoded (the items Codex sent, as compare
// checks), and at least 95% of the later turns were continued.
func TestCodexSignedInWithChatGPTSendsZstdTurnsThatContinue(t *testing.T) {
	tools := nodeClients(t)
	st, ctx, before := startCodexStack(t, "codex-chatgpt", codexChatGPTClient, stackConfig{
		transport: "ws",
		replicas:  1,
		redis:     redisAddr(t),
		toolCalls: toolCalls,
	})
	// Codex compresses only for a provider named "OpenAI" (its id may be
	// anything) when signed in with ChatGPT, and only over HTTP.
	config := codexConfig(`model_provider = "gw"
cli_auth_credentials_store = "file"
`, fmt.Sprintf(`
[model_providers.gw]
name = "OpenAI"
base_url = %q
wire_api = "responses"
requires_openai_auth = true
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
`, st.rr.baseURL()))
	// clientEnv leaves out OPENAI_API_KEY and CODEX_API_KEY: with
	// CODEX_API_KEY set, Codex signs in with the key and sends plain JSON.
	home := map[string]string{"config.toml": config, "auth.json": chatGPTAuth(t)}
	_, runErr := runCodexSession(filepath.Join(st.dir, codexChatGPTClient), home, clientEnv("RUST_LOG=warn"), tools, nil)
	calls := st.rr.callsOf(codexChatGPTClient)
	for i, c := range calls {
		if c.encoding != "zstd" || c.status != http.StatusOK {
			t.Errorf("turn %d: Content-Encoding %q, answered %d; want zstd, answered 200", i+1, c.encoding, c.status)
		}
	}
	if runErr != nil {
		t.Fatal(runErr)
	}
	if want := len(codexPrompts) * (toolCalls + 1); len(calls) != want {
		t.Errorf("Codex sent %d create-response requests, want %d (%d runs of %d tool calls and the answer)",
			len(calls), want, len(codexPrompts), toolCalls)
	}
	up, err := readTrace(st.up.trace)
	if err != nil {
		t.Fatal(err)
	}
	r := measure("codex-chatgpt-zstd-ws-1-replica", codexChatGPTClient, calls, up)
	d, err := st.settle(ctx, before, &r)
	if err != nil {
		t.Fatal(err)
	}
	d.compare(&r)
	for _, f := range r.failures {
		t.Errorf("Codex was sent an error: %s", f)
	}
	for _, m := range r.mismatches {
		t.Errorf("%s", m)
	}
	if !slices.Equal(r.stores, []string{"false"}) || !slices.Equal(r.transports, []string{"websocket"}) {
		t.Errorf("the upstream calls have store %v over %v, want false over websocket", r.stores, r.transports)
	}
	if r.conversations != 1 {
		t.Errorf("the upstream answered %d conversations, want Codex's one", r.conversations)
	}
	if r.later() == 0 || r.rate() < 0.95 {
		t.Errorf("%d of %d later turns were continued, want at least 95%%", r.continued, r.later())
	}
	t.Logf("%d Codex runs signed in with ChatGPT: %d zstd turns, %d of %d later turns continued (%.0f%%); "+
		"%d input items sent upstream of the %d of the full context",
		len(codexPrompts), len(calls), r.continued, r.later(), 100*r.rate(), r.itemsUp, r.itemsFull)
}

// chatGPTAuth returns an auth.json that signs Codex in with ChatGPT: its
// tokens are unsigned JWTs (Codex reads their claims but checks no
// signature) whose expiry, 10 years ahead, keeps Codex from trying to
// refresh them.
func chatGPTAuth(t *testing.T) string {
	t.Helper()
	now := time.Now()
	claims := map[string]any{
		"chatgpt_plan_type":  "pro",
		"chatgpt_user_id":    "user-fake",
		"user_id":            "user-fake",
		"chatgpt_account_id": "acct-fake",
	}
	jwt := func(payload map[string]any) string {
		payload["iss"], payload["sub"] = "https://auth.openai.com", "fake"
		payload["iat"], payload["exp"] = now.Unix(), now.AddDate(10, 0, 0).Unix()
		payload["https://api.openai.com/auth"] = claims
		header, err := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
		if err != nil {
			t.Fatal(err)
		}
		body, err := json.Marshal(payload)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(header) + "." + base64.RawURLEncoding.EncodeToString(body) + ".fakesig"
	}
	auth, err := json.MarshalIndent(map[string]any{
		"auth_mode":      "chatgpt",
		"OPENAI_API_KEY": nil,
		"tokens": map[string]any{
			"id_token": jwt(map[string]any{
				"aud":                            []string{"app_fake"},
				"email":                          "e2e@example.invalid",
				"https://api.openai.com/profile": map[string]string{"email": "e2e@example.invalid"},
			}),
			"access_token":  jwt(map[string]any{}),
			"refresh_token": "rt-fake",
			"account_id":    "acct-fake",
		},
		"last_refresh": now.UTC().Format(time.RFC3339Nano),
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(auth)
}
