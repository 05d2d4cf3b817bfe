package proxy

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
)

func TestOwnersOfRealClients(t *testing.T) {
	main, err := identity.Main("019a-root")
	require.NoError(t, err)
	child, err := identity.Agent("019a-root", "019a-child")
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		want   identity.Owner
	}{
		{"Codex main thread: thread-id is the session's", http.Header{"Session-Id": {"019a-root"}, "Thread-Id": {"019a-root"}},
			`{"client_metadata":{"session_id":"019a-root","thread_id":"019a-root"}}`, main},
		{"Codex sub-agent: its own thread under the parent's session",
			http.Header{"Session-Id": {"019a-root"}, "Thread-Id": {"019a-child"}, "X-Openai-Subagent": {"collab_spawn"}},
			`{"client_metadata":{"session_id":"019a-root","thread_id":"019a-child"}}`, child},
		{"Codex body only", nil, `{"client_metadata":{"session_id":"019a-root","thread_id":"019a-child"}}`, child},
		{"gateway headers win", http.Header{"X-Session-Id": {"019a-root"}, "Session-Id": {"other"}}, `{}`, main},
		{"metadata", nil, `{"metadata":{"session_id":"019a-root","agent_id":"019a-child"}}`, child},
		{"prompt_cache_key", nil, `{"prompt_cache_key":"019a-root"}`, main},
		{"nothing", nil, `{"model":"m"}`, identity.Owner{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DefaultIdentity.owner(tc.header, []byte(tc.body))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
