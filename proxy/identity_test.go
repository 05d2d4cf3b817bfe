package proxy

import (
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"strings"
	"testing"

	"github.com/minio/highwayhash"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
)

// testParser parses under profile v2 and the key 000102…1f of the
// protocol's vectors.
func testParser(t testing.TB) *fingerprint.Parser {
	t.Helper()
	var key fingerprint.Key
	for i := range key {
		key[i] = byte(i)
	}
	p, err := fingerprint.New(fingerprint.V4(), key)
	require.NoError(t, err)
	return p
}

// ownerOf returns DefaultIdentity's owner of a request, failing on an
// error.
func ownerOf(t testing.TB, p *fingerprint.Parser, h http.Header, body string) identity.Owner {
	t.Helper()
	return ownerWithQuery(t, p, h, "", body)
}

// ownerWithQuery returns DefaultIdentity's owner of a request with URL
// query query, failing on an error.
func ownerWithQuery(t testing.TB, p *fingerprint.Parser, h http.Header, query, body string) identity.Owner {
	t.Helper()
	req, err := p.Parse([]byte(body))
	require.NoError(t, err, body)
	o, err := DefaultIdentity.Owner(h, query, req)
	require.NoError(t, err, body)
	return o
}

func TestOwnersOfRealClients(t *testing.T) {
	p := testParser(t)
	owner := func(h http.Header, body string) identity.Owner { return ownerOf(t, p, h, body) }
	codexMain := owner(http.Header{"Session-Id": {"019a-root"}, "Thread-Id": {"019a-root"}},
		`{"client_metadata":{"session_id":"019a-root","thread_id":"019a-root"}}`)
	codexChild := owner(http.Header{"Session-Id": {"019a-root"}, "Thread-Id": {"019a-child"}, "X-Openai-Subagent": {"collab_spawn"}},
		`{"client_metadata":{"session_id":"019a-root","thread_id":"019a-child"}}`)
	require.False(t, codexMain.IsZero())
	assert.False(t, codexMain.IsAgent())
	assert.Len(t, codexMain.Session(), 16)
	assert.True(t, codexChild.IsAgent())
	assert.Equal(t, "019a-child", codexChild.AgentID())
	assert.NotEqual(t, codexMain, codexChild)

	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		want   identity.Owner
	}{
		{"Codex body only", nil, `{"client_metadata":{"session_id":"019a-root","thread_id":"019a-child"}}`, codexChild},
		{"gateway headers win", http.Header{"X-Session-Id": {"019a-root"}, "Session-Id": {"other"}}, `{}`, codexMain},
		{"metadata", nil, `{"metadata":{"session_id":"019a-root","agent_id":"019a-child"}}`, codexChild},
		{"prompt_cache_key", nil, `{"prompt_cache_key":"019a-root"}`, codexMain},
		{"nothing, no user message", nil, `{"model":"m"}`, identity.Owner{}},
		{"nothing, developer message only", nil, `{"input":[{"role":"developer","content":"x"}]}`, identity.Owner{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, owner(tc.header, tc.body))
		})
	}
}

func TestOwnersAreScopedByCredential(t *testing.T) {
	p := testParser(t)
	const body = `{"model":"m","input":[{"role":"user","content":"hi"}]}`
	owner := func(h http.Header) identity.Owner {
		h = h.Clone()
		if h == nil {
			h = http.Header{}
		}
		h.Set("X-Session-Id", "s1")
		return ownerOf(t, p, h, body)
	}
	none := owner(nil)
	a := owner(http.Header{"Authorization": {"Bearer sk-a"}})
	b := owner(http.Header{"Authorization": {"Bearer sk-b"}})
	azure := owner(http.Header{"Api-Key": {"sk-a"}})
	assert.NotEqual(t, a, b, "two credentials, one session id")
	assert.NotEqual(t, a, none)
	assert.NotEqual(t, a, azure)
	assert.NotEqual(t, azure, none)
	assert.Equal(t, a, owner(http.Header{"Authorization": {"Bearer sk-a"}}), "the same credential, the same owner")
	// Both credential headers count when both are sent: the upstream
	// may take either, even when the other is empty.
	both := owner(http.Header{"Authorization": {"Bearer sk-a"}, "Api-Key": {"sk-other"}})
	assert.NotEqual(t, a, both, "an api-key beside Authorization")
	assert.NotEqual(t, both, owner(http.Header{"Authorization": {"Bearer sk-a"}, "Api-Key": {"sk-third"}}))
	emptyAuth := func(key string) identity.Owner {
		return owner(http.Header{"Authorization": {""}, "Api-Key": {key}})
	}
	assert.NotEqual(t, emptyAuth("sk-a"), emptyAuth("sk-b"), "two api-keys beside an empty Authorization")
	assert.NotEqual(t, emptyAuth("sk-a"), owner(http.Header{"Authorization": {""}}))
	assert.Equal(t, emptyAuth("sk-a"), emptyAuth("sk-a"))
	// So do the other credential headers an upstream may take.
	for _, k := range []string{"X-Api-Key", "X-Goog-Api-Key", "Ocp-Apim-Subscription-Key"} {
		one := owner(http.Header{k: {"sk-a"}})
		assert.NotEqual(t, one, owner(http.Header{k: {"sk-b"}}), k)
		assert.NotEqual(t, one, none, k)
		assert.NotEqual(t, one, azure, k)
		assert.NotEqual(t, emptyAuth("sk-a"), owner(http.Header{"Authorization": {""}, "Api-Key": {"sk-a"}, k: {"sk-b"}}), k)
	}
	assert.Equal(t, a, owner(http.Header{"Authorization": {"Bearer sk-a"}, "Chatgpt-Account-Id": {"acct-1"}}),
		"a header the client asserts does not scope")
	org := owner(http.Header{"Authorization": {"Bearer sk-a"}, "Openai-Organization": {"org-1"}})
	proj := owner(http.Header{"Authorization": {"Bearer sk-a"}, "Openai-Project": {"org-1"}})
	assert.NotEqual(t, a, org)
	assert.NotEqual(t, org, proj, "the organization and the project are told apart")
	assert.NotEqual(t, org, owner(http.Header{"Authorization": {"Bearer sk-a"}, "Openai-Organization": {"org-2"}}))
	// A key in the query counts, as every query parameter the upstream
	// receives may carry one (?key=, ?api-key=), beside a header or alone.
	byQuery := func(h http.Header, query string) identity.Owner {
		h = h.Clone()
		h.Set("X-Session-Id", "s1")
		return ownerWithQuery(t, p, h, query, body)
	}
	keyA := byQuery(http.Header{}, "key=sk-a")
	assert.NotEqual(t, keyA, byQuery(http.Header{}, "key=sk-b"), "two keys in the query")
	assert.NotEqual(t, keyA, none)
	assert.NotEqual(t, keyA, byQuery(http.Header{}, "api-key=sk-a"))
	assert.Equal(t, keyA, byQuery(http.Header{}, "key=sk-a"))
	assert.NotEqual(t, byQuery(http.Header{"Authorization": {"Bearer sk-a"}}, "api-key=sk-b"),
		byQuery(http.Header{"Authorization": {"Bearer sk-a"}}, "api-key=sk-c"), "a query key beside Authorization")
	assert.NotEqual(t, a, byQuery(http.Header{"Authorization": {"Bearer sk-a"}}, "api-version=1"))
	assert.Equal(t, a, byQuery(http.Header{"Authorization": {"Bearer sk-a"}}, ""), "an empty query is none")
	assert.NotContains(t, keyA.Key(), "sk-", "no query key in an owner key")
	// So does any other header whose name says it may carry a credential:
	// a cookie, a gateway's own key header; not an idempotency key, new
	// on every request, nor the SDKs' other headers.
	for _, k := range []string{"Cookie", "Helicone-Auth", "Cf-Aig-Authorization", "X-Portkey-Api-Key", "Cf-Access-Client-Secret", "X_api_key", "X-Session-Token",
		"Cf-Access-Jwt-Assertion", "X-Goog-Iap-Jwt-Assertion", "X-Amzn-Oidc-Data", "X-Forwarded-Client-Cert", "X-Forwarded-User", "X-Forwarded-Email", "X-Ms-Client-Principal-Name"} {
		one := owner(http.Header{"Authorization": {"Bearer sk-a"}, k: {"sk-a"}})
		assert.NotEqual(t, a, one, k)
		assert.NotEqual(t, one, owner(http.Header{"Authorization": {"Bearer sk-a"}, k: {"sk-b"}}), k)
		assert.NotEqual(t, owner(http.Header{k: {"sk-a"}}), owner(http.Header{k: {"sk-b"}}), k)
	}
	// A load balancer's or CDN's cookies, which some set anew on every
	// answer, do not count: the session's cookie does.
	withCookie := func(c string) identity.Owner {
		return owner(http.Header{"Authorization": {"Bearer sk-a"}, "Cookie": {c}})
	}
	assert.Equal(t, a, withCookie("AWSALB=r1; __cf_bm=x1"), "only a balancer's cookies")
	assert.Equal(t, withCookie("session=s1"), withCookie("AWSALB=r1; session=s1; _cfuvid=u"))
	assert.Equal(t, withCookie("AWSALB=r1; session=s1"), withCookie("AWSALB=r2;session=s1"))
	assert.Equal(t, withCookie("session=s1"), withCookie("session=s1; BIGipServerpool_api=1677787402.36895.0000; incap_ses_1_2=x"))
	assert.NotEqual(t, withCookie("session=s1"), withCookie("session=s1; BIGip=1"), "a name that only begins like one")
	assert.NotEqual(t, withCookie("session=s1"), withCookie("session=s2"))
	assert.NotEqual(t, withCookie("AWSALB=x, session=s1"), withCookie("AWSALB=x, session=s2"), "cookies split at commas too")
	assert.NotEqual(t, owner(http.Header{"Helicone-Auth": {"x"}, "X-Portkey-Api-Key": {"y"}}),
		owner(http.Header{"Helicone-Auth": {"y"}, "X-Portkey-Api-Key": {"x"}}), "each header's values apart")
	for k, v := range map[string]string{"Idempotency-Key": "k1", "X-Idempotency-Key": "k1", "X-Stainless-Retry-Count": "1",
		"User-Agent": "OpenAI/JS 7.59.0", "X-Request-Id": "r1", "Traceparent": "00-1-2-01", "Chatgpt-Account-Id": "acct-1"} {
		assert.Equal(t, a, owner(http.Header{"Authorization": {"Bearer sk-a"}, k: {v}}), "%s does not scope", k)
	}

	for _, o := range []identity.Owner{a, b, azure, org} {
		assert.NotContains(t, o.Key(), "sk-", "no credential in an owner key")
		assert.NotContains(t, o.Key(), "s1", "no session id in an owner key")
	}

	// Sub-agents and owners without a session id are scoped too.
	agent := func(auth string) identity.Owner {
		return ownerOf(t, p, http.Header{"Authorization": {auth}, "X-Session-Id": {"s1"}, "X-Agent-Id": {"helper"}}, body)
	}
	assert.NotEqual(t, agent("Bearer sk-a"), agent("Bearer sk-b"))
	derived := func(auth string) identity.Owner {
		return ownerOf(t, p, http.Header{"Authorization": {auth}}, body)
	}
	assert.NotEqual(t, derived("Bearer sk-a"), derived("Bearer sk-b"))
	assert.Equal(t, derived("Bearer sk-a"), derived("Bearer sk-a"))
}

func TestMainThreadOwnerFollowsThePromptAndTheOpening(t *testing.T) {
	p := testParser(t)
	h := http.Header{"Authorization": {"Bearer sk-a"}, "X-Session-Id": {"s1"}}
	owner := func(h http.Header, body string) identity.Owner { return ownerOf(t, p, h, body) }
	main := owner(h, `{"model":"m","instructions":"code","input":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, main, owner(h, `{"model":"m","instructions":"code","stream":true,"metadata":{"x":"y"},"prompt_cache_key":"k",`+
		`"input":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}`),
		"the items and the members the signature leaves out do not move the main thread")
	title := owner(h, `{"model":"m","instructions":"write a title","input":[{"role":"user","content":"hi"}]}`)
	assert.NotEqual(t, main, title, "a side call with other instructions is a thread of its own")
	assert.NotEqual(t, main, owner(h, `{"model":"m2","instructions":"code","input":[]}`))

	// A session id may name many conversations (one prompt_cache_key per
	// user): each opening is a thread of its own.
	for _, other := range []string{
		`{"model":"m","instructions":"code","input":[{"role":"user","content":"bye"}]}`,
		`{"model":"m","instructions":"code","input":[{"role":"developer","content":"rules"},{"role":"user","content":"hi"}]}`,
		`{"model":"m","instructions":"code","input":[]}`,
	} {
		assert.NotEqual(t, main, owner(h, other), other)
	}
	none := owner(h, `{"model":"m","instructions":"code","input":[]}`)
	assert.Equal(t, none, owner(h, `{"model":"m","instructions":"code","input":[{"role":"developer","content":"rules"}]}`),
		"without a user message, the chain's seed is the opening")

	// A sub-agent keeps one owner whatever its prompt.
	ah := h.Clone()
	ah.Set("X-Agent-Id", "helper")
	agent := owner(ah, `{"model":"m","instructions":"code","input":[]}`)
	assert.Equal(t, agent, owner(ah, `{"model":"mini","instructions":"help","input":[]}`))
	assert.NotEqual(t, main.Session(), agent.Session())
	assert.Equal(t, "helper", agent.AgentID())
	assert.Len(t, agent.Session(), 16)
	other := h.Clone()
	other.Set("X-Session-Id", "s2")
	other.Set("X-Agent-Id", "helper")
	assert.NotEqual(t, agent, owner(other, `{"model":"m","instructions":"code","input":[]}`), "agent ids are per session")
}

func TestOwnersWithoutSessionFollowTheOpening(t *testing.T) {
	p := testParser(t)
	h := http.Header{"Authorization": {"Bearer sk-a"}}
	owner := func(body string) identity.Owner { return ownerOf(t, p, h, body) }
	const head = `{"model":"m","instructions":"code","input":[`
	first := owner(head + `{"role":"developer","content":"rules"},{"role":"user","content":"hi"}]}`)
	require.False(t, first.IsZero())
	assert.False(t, first.IsAgent())
	assert.Len(t, first.Session(), 16)
	for _, later := range []string{
		head + `{"role":"developer","content":"rules"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}`,
		head + `{"role":"developer","content":"rules"},{"\u0072ole":"user","content":"hi","id":"msg_1"}]}`,
		`{"instructions":"code","stream":true,"user":"u","model":"m","input":[{"role":"developer","content":"rules"},{"role":"user","content":"hi"}]}`,
	} {
		assert.Equal(t, first, owner(later), later)
	}
	for _, other := range []string{
		head + `{"role":"developer","content":"rules"},{"role":"user","content":"bye"}]}`,
		head + `{"role":"user","content":"hi"}]}`,
		`{"model":"m","instructions":"title","input":[{"role":"developer","content":"rules"},{"role":"user","content":"hi"}]}`,
	} {
		assert.NotEqual(t, first, owner(other), other)
	}
	str := owner(`{"model":"m","input":"hi"}`)
	require.False(t, str.IsZero(), "a string input is a user message")
	assert.Equal(t, str, owner(`{"model":"m","input":["hi",{"role":"assistant","content":"hello"}]}`))
	for _, none := range []string{
		`{"model":"m"}`,
		`{"model":"m","input":[]}`,
		`{"model":"m","input":[{"role":"system","content":"x"},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
		`{"model":"m","input":[{"type":"input_text","role":"user","text":"x"},{"type":"x","role":"user","content":"x"}]}`,
	} {
		assert.Equal(t, identity.Owner{}, owner(none), "no user message, no owner: %s", none)
	}
	// A session id, when present, names the owner instead.
	named := ownerOf(t, p, http.Header{"Authorization": {"Bearer sk-a"}, "X-Session-Id": {"s"}}, `{"model":"m","input":"hi"}`)
	assert.NotEqual(t, str, named)
}

func TestOwnerErrors(t *testing.T) {
	p := testParser(t)
	for _, tc := range []struct {
		header http.Header
		body   string
		want   string
	}{
		{http.Header{"X-Session-Id": {""}}, `{"input":"hi"}`, "header X-Session-Id is empty"},
		{http.Header{"X-Agent-Id": {"a"}}, `{"input":"hi"}`, "no source names a session"},
		{http.Header{"Session-Id": {strings.Repeat("x", 300)}}, `{"input":"hi"}`, "header session-id"},
		{http.Header{"Session-Id": {"s"}, "X-Agent-Id": {"a\x01"}}, `{"input":"hi"}`, "header session-id or header X-Agent-Id"},
		{http.Header{"Session-Id": {"a", "b"}}, `{"input":"hi"}`, "sent 2 times"},
		{nil, `{"input":"hi","metadata":{"session_id":3}}`, "body metadata.session_id is a number"},
	} {
		req, err := p.Parse([]byte(tc.body))
		require.NoError(t, err)
		_, err = DefaultIdentity.Owner(tc.header, "", req)
		require.ErrorIs(t, err, errInvalidIdentity, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
}

// ownerVector is one derivation of PROTOCOL.md 2.4, spelled out here
// apart from the code under test.
type ownerVector struct {
	name string
	// credName is "authorization", "api-key", "x-api-key",
	// "authorization,api-key" or "", followed by ",?" (or "?" alone)
	// when query is not empty; cred, org and proj are the values of the
	// credential (the Authorization header's for both),
	// OpenAI-Organization and OpenAI-Project headers, and apiKey those of
	// the api-key header when credName names both.
	credName                string
	cred, apiKey, org, proj []string
	query                   string // the URL query
	// kind is "main", "session" (a sub-agent's session) or "opening".
	kind           string
	session, agent string
	sig, opening   uint64 // the prompt signature; h(k+1) of the opening items
	key            string // the owner key
}

// header returns the vector's request headers.
func (v ownerVector) header() http.Header {
	h := http.Header{}
	for _, c := range []struct {
		name string
		vs   []string
	}{{strings.TrimSuffix(strings.TrimSuffix(v.credName, ",?"), ",api-key"), v.cred}, {"Api-Key", v.apiKey}, {"OpenAI-Organization", v.org}, {"OpenAI-Project", v.proj}} {
		for _, x := range c.vs {
			h.Add(c.name, x)
		}
	}
	if v.session != "" {
		h.Set("X-Session-Id", v.session)
	}
	if v.agent != "" {
		h.Set("X-Agent-Id", v.agent)
	}
	return h
}

// ownerKey derives the vector's owner key under key.
func (v ownerVector) ownerKey(key []byte) string {
	str := func(b []byte, s string) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }
	values := func(b []byte, vs []string) []byte {
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, x := range vs {
			b = str(b, x)
		}
		return b
	}
	version := "/v1"
	if v.kind == "main" {
		version = "/v2" // with the opening
	}
	msg := str(nil, "contstore/owner/"+v.kind+version)
	msg = str(msg, v.credName)
	if v.credName != "?" { // the query alone: no header's values
		msg = values(msg, v.cred)
	}
	if strings.HasPrefix(v.credName, "authorization,api-key") {
		msg = values(msg, v.apiKey)
	}
	if v.query != "" {
		msg = values(msg, []string{v.query})
	}
	msg = values(values(msg, v.org), v.proj)
	switch v.kind {
	case "main":
		msg = binary.LittleEndian.AppendUint64(str(msg, v.session), v.sig)
		msg = binary.LittleEndian.AppendUint64(msg, v.opening)
	case "session":
		msg = str(msg, v.session)
	case "opening":
		msg = binary.LittleEndian.AppendUint64(msg, v.sig)
		msg = binary.LittleEndian.AppendUint64(msg, v.opening)
	}
	sum := highwayhash.Sum128(msg, key)
	id := base64.RawURLEncoding.EncodeToString(sum[:12])
	if v.kind == "session" {
		return "a:" + id + ":" + v.agent
	}
	return "m:" + id
}

// ownerVectors are the vectors of PROTOCOL.md 2.4, under the key
// 000102…1f.
var ownerVectors = []ownerVector{
	{name: "opening, no credential", kind: "opening", sig: 0x0123456789abcdef, opening: 0xfedcba9876543210,
		key: "m:HNgMV9Xg9tDuSptV"},
	{name: "opening, Authorization", credName: "authorization", cred: []string{"Bearer sk-a"}, kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:NWMydKtr6lqyDZDk"},
	{name: "opening, api-key", credName: "api-key", cred: []string{"sk-a"}, kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:wIfMhSEdC5joSwGt"},
	{name: "opening, x-api-key", credName: "x-api-key", cred: []string{"sk-a"}, kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:8U8Yg2gun31Dj9gm"},
	{name: "opening, Authorization and api-key", credName: "authorization,api-key", cred: []string{""}, apiKey: []string{"sk-a"},
		kind: "opening", sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:eJHXNUswbrsfpbOj"},
	{name: "opening, organization and project", credName: "authorization", cred: []string{"Bearer sk-a"},
		org: []string{"org-1"}, proj: []string{"proj-1"}, kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:wQnoHTJpsdDEWGBQ"},
	{name: "opening, Cookie", credName: "cookie", cred: []string{"session=a"}, kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:jOO2JSj8w3qiI511"},
	{name: "opening, query", credName: "?", query: "key=sk-a", kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:BUjYtEGnap3PeCmY"},
	{name: "opening, Authorization and query", credName: "authorization,?", cred: []string{"Bearer sk-a"},
		query: "api-version=2025-04-01-preview", kind: "opening",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:JmUAgu1ZT6Dvnq8F"},
	{name: "main thread", credName: "authorization", cred: []string{"Bearer sk-a"}, kind: "main", session: "s1",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543210, key: "m:WyzH4seQcQFb1FtE"},
	{name: "main thread, other prompt", credName: "authorization", cred: []string{"Bearer sk-a"}, kind: "main", session: "s1",
		sig: 0x0123456789abcdee, opening: 0xfedcba9876543210, key: "m:vj_ZdBxaWoTDHyph"},
	{name: "main thread, other opening", credName: "authorization", cred: []string{"Bearer sk-a"}, kind: "main", session: "s1",
		sig: 0x0123456789abcdef, opening: 0xfedcba9876543211, key: "m:J63QcbeFjxh9TfM1"},
	{name: "sub-agent", credName: "authorization", cred: []string{"Bearer sk-a"}, kind: "session", session: "s1", agent: "helper",
		key: "a:Fc1O4kqty37B6RGC:helper"},
}

// TestOwnerVectors pins the derivation of PROTOCOL.md 2.4 (key 000102…1f),
// and checks that Identity.Owner derives it from real requests.
func TestOwnerVectors(t *testing.T) {
	p := testParser(t)
	key := p.Key()
	for _, v := range ownerVectors {
		assert.Equal(t, v.key, v.ownerKey(key[:]), v.name)
	}

	const body = `{"model":"m","input":[{"role":"developer","content":"rules"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}`
	req, err := p.Parse([]byte(body))
	require.NoError(t, err)
	for _, v := range ownerVectors {
		v.sig, v.opening = req.Signature(), req.Prefix(2)
		got, err := DefaultIdentity.Owner(v.header(), v.query, req)
		require.NoError(t, err, v.name)
		assert.Equal(t, v.ownerKey(key[:]), got.Key(), v.name)
	}
}
