package proxy

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
)

// errInvalidIdentity is wrapped by the error a request gets when a source
// holds an empty or invalid session or agent id (the turn then goes
// upstream with its full context, outside the store).
var errInvalidIdentity = errors.New("proxy: invalid identity")

// Source is one place a request may name its conversation: a request
// header or a string member of the JSON body.
type Source struct {
	// Header names a request header (case-insensitive).
	Header string
	// Field is the dotted path of a string member of the body, such as
	// "metadata.session_id". Set Header or Field, not both.
	Field string
}

// String names the source as error messages do: "header session-id" or
// "body client_metadata.session_id".
func (s Source) String() string {
	if s.Header != "" {
		return "header " + s.Header
	}
	return "body " + s.Field
}

// Identity lists, in order, where a request's session and agent ids are
// read. The first source present wins. An agent id equal to the session id
// names the session's main thread, as Codex sends its own thread id on
// every request.
//
// [Identity.Owner] turns what a request names into its owner, always
// scoped by the client's credential: the main thread of a named session
// also by the request's prompt signature, a sub-agent by its agent id, and
// a request that names no session by the opening items of its
// conversation (PROTOCOL.md, section 2.4).
type Identity struct {
	// Session are the sources of the session id.
	Session []Source
	// Agent are the sources of the sub-agent id within the session.
	Agent []Source
}

// DefaultIdentity covers what the real clients send: the X-Session-Id and
// X-Agent-Id headers and metadata members a gateway's own clients set; the
// Codex CLI's session-id and thread-id headers and client_metadata (a Codex
// sub-agent sends its parent's session id and its own thread id); then
// prompt_cache_key, which Codex and opencode set per conversation and
// other applications per user or per application.
var DefaultIdentity = Identity{
	Session: []Source{
		{Header: "X-Session-Id"},
		{Header: "session-id"},
		{Field: "client_metadata.session_id"},
		{Field: "metadata.session_id"},
		{Field: "prompt_cache_key"},
	},
	Agent: []Source{
		{Header: "X-Agent-Id"},
		{Field: "metadata.agent_id"},
		{Header: "thread-id"},
		{Field: "client_metadata.thread_id"},
	},
}

// validate checks that every source names exactly one place.
func (id Identity) validate() error {
	for _, list := range [][]Source{id.Session, id.Agent} {
		for _, s := range list {
			if (s.Header == "") == (s.Field == "") {
				return fmt.Errorf("%w: identity source %+v must set Header or Field", ErrInvalidConfig, s)
			}
		}
	}
	return nil
}

// Domain strings of the owner ids Owner derives, one per kind of owner.
const (
	domainMain    = "contstore/owner/main/v2"    // a named session's main thread
	domainSession = "contstore/owner/session/v1" // the session of a named sub-agent
	domainOpening = "contstore/owner/opening/v1" // a conversation that names no session
)

// Headers of the credential scope: the credential is every credential
// header present (an upstream may take any of them); the organization
// and project headers narrow it.
const (
	headerAuthorization = "Authorization"
	headerAPIKey        = "Api-Key"
	headerOrganization  = "Openai-Organization"
	headerProject       = "Openai-Project"
	// queryName stands for the URL query in the credential scope.
	queryName = "?"
)

// credentialHeaders are the headers an upstream may authenticate a
// request by, in the order the credential scope takes them: OpenAI's
// Authorization, Azure OpenAI's api-key, the x-api-key of other APIs and
// gateways, Gemini's x-goog-api-key and Azure API Management's
// subscription key.
var credentialHeaders = []string{headerAuthorization, headerAPIKey, "X-Api-Key", "X-Goog-Api-Key", "Ocp-Apim-Subscription-Key"}

// credentialWords mark the other headers that may carry a credential, or
// the identity an authenticating proxy vouches for: a header whose
// lowercase name holds one (Cookie, Helicone-Auth, x-portkey-api-key,
// Cf-Access-Jwt-Assertion, X-Forwarded-User, X-Forwarded-Client-Cert,
// X-Ms-Client-Principal…) is in the credential scope too, but for
// notCredentials.
var credentialWords = []string{"auth", "key", "token", "secret", "cookie", "credential", "password",
	"jwt", "oidc", "assertion", "cert", "user", "email", "principal"}

// notCredentials are headers whose names hold a credential word and that
// carry none: an idempotency key, new on every request, the client
// software's name, and the organization and project, which the scope
// takes apart.
var notCredentials = []string{"idempotency-key", "x-idempotency-key", "user-agent", "openai-organization", "openai-project"}

// scopePart is one part of a credential scope: a header's lowercase name
// and its values as the scope takes them, or the query (queryName).
type scopePart struct {
	name   string
	values []string
}

// credentialParts returns the headers of h in its credential scope, as
// PROTOCOL.md 2.4 orders them: the credential headers present, in
// credentialHeaders' order, then the others whose names hold a credential
// word, in the order of their lowercase names (a Cookie header's values
// without the load balancers' cookies, and none when only those are left).
func credentialParts(h http.Header) []scopePart {
	var parts, others []scopePart
	for _, k := range credentialHeaders {
		if vs := h.Values(k); len(vs) > 0 {
			parts = append(parts, scopePart{strings.ToLower(k), vs})
		}
	}
	for k, vs := range h {
		lk := strings.ToLower(k)
		switch {
		case !slices.ContainsFunc(credentialWords, func(w string) bool { return strings.Contains(lk, w) }),
			slices.Contains(notCredentials, lk), slices.ContainsFunc(credentialHeaders, func(c string) bool { return strings.EqualFold(c, k) }):
		case lk == "cookie":
			if vs = sessionCookies(vs); slices.ContainsFunc(vs, func(v string) bool { return v != "" }) {
				others = append(others, scopePart{lk, vs})
			} // else only the load balancers' cookies: none
		default:
			others = append(others, scopePart{lk, vs})
		}
	}
	slices.SortFunc(others, func(a, b scopePart) int { return strings.Compare(a.name, b.name) })
	return append(parts, others...)
}

// infraCookies are the cookies that load balancers and CDNs set, some anew
// on every answer, which the gateway relays: a client that keeps them
// would start a new owner each turn, and none is a credential. A name
// ending in "*" stands for those it begins.
var infraCookies = []string{"AWSALB", "AWSALBCORS", "AWSALBTG", "AWSALBTGCORS", "AWSELB", "__cf_bm", "_cfuvid", "__cflb", "__cfruid",
	"ARRAffinity", "ARRAffinitySameSite", "ApplicationGatewayAffinity", "ApplicationGatewayAffinityCORS", "GCLB",
	"INGRESSCOOKIE", "SERVERID", "BIGipServer*", "TS01*", "bm_sv", "bm_sz", "ak_bmsc", "_abck", "incap_ses_*", "visid_incap_*", "nlbi_*"}

// infraCookie reports whether name is one of infraCookies.
func infraCookie(name string) bool {
	return slices.ContainsFunc(infraCookies, func(c string) bool {
		p, prefix := strings.CutSuffix(c, "*")
		return name == c || prefix && strings.HasPrefix(name, p)
	})
}

// sessionCookies returns the Cookie header values vs without their
// infraCookies: each value's other cookies (split at ";", or at ",",
// which some clients write), trimmed, joined by "; ".
func sessionCookies(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		var kept []string
		for c := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == ';' || r == ',' }) { // a cookie's value holds neither
			c = strings.TrimSpace(c)
			name, _, _ := strings.Cut(c, "=")
			if c != "" && !infraCookie(strings.TrimSpace(name)) {
				kept = append(kept, c)
			}
		}
		out[i] = strings.Join(kept, "; ")
	}
	return out
}

// accountHeaders are the request headers that name the client's account:
// they scope its owners, and a configured upstream credential replaces
// them all (passthrough.go).
var accountHeaders = append(slices.Clone(credentialHeaders), headerOrganization, headerProject)

// carriesCredential reports whether headers h carry a credential: a
// credential header that is not empty.
func carriesCredential(h http.Header) bool {
	return slices.ContainsFunc(credentialHeaders, func(k string) bool { return h.Get(k) != "" })
}

// Owner returns the owner of a request with headers h, URL query query
// (as received, without the "?") and parsed body req, the zero owner when
// it has none, or an error naming the source of an empty or invalid id;
// the proxy sends such a turn with its full context.
//
// Every owner is scoped by the client's credential: a keyed digest of the
// credential headers present (credentialHeaders) and of the other headers
// named like one (credentialParts: Cookie, but for the cookies load
// balancers set, Helicone-Auth…), of the query (an upstream may take a
// key there, as ?key= or ?api-key=) and of the OpenAI-Organization and
// OpenAI-Project headers, so that clients with other credentials never
// share a conversation, whatever ids they send.
// Within that scope:
//
//   - a named session's main thread is identity.Main of a digest of the
//     session id, the request's prompt signature and its opening items, up
//     to and including the first user message (none without one): a side
//     call under the same session with another prompt (a title, a
//     summary) is a thread of its own, and so is each conversation under a
//     session id that names more than one, such as a prompt_cache_key an
//     application sets per user;
//   - a named sub-agent is identity.Agent of a digest of the session id,
//     and its agent id;
//   - a request that names no session is identity.Main of a digest of its
//     prompt signature and of its opening items, up to and including the
//     first user message; without a user message it has no owner.
//
// The digests are keyed with the key req was parsed under, the
// namespace's secret: an owner id reveals neither the credential nor the
// session, and no client can compute another's. The derivation is
// specified in PROTOCOL.md, section 2.4.
func (id Identity) Owner(h http.Header, query string, req *fingerprint.Request) (identity.Owner, error) {
	session, from, err := lookup(id.Session, h, req)
	if err != nil {
		return identity.Owner{}, err
	}
	agent, agentFrom, err := lookup(id.Agent, h, req)
	if err != nil {
		return identity.Owner{}, err
	}
	switch {
	case session == "" && agent != "":
		return identity.Owner{}, fmt.Errorf("%w: %s names an agent but no source names a session", errInvalidIdentity, agentFrom)
	case session == "":
		k := firstUserMessage(req)
		if k < 0 {
			return identity.Owner{}, nil
		}
		b := scoped(domainOpening, h, query)
		b = binary.LittleEndian.AppendUint64(b, req.Signature())
		b = binary.LittleEndian.AppendUint64(b, req.Prefix(k+1))
		return identity.Main(derivedID(req, b))
	case agent == "" || agent == session:
		if _, err := identity.Main(session); err != nil {
			return identity.Owner{}, fmt.Errorf("%w: %s: %v", errInvalidIdentity, from, err)
		}
		b := appendString(scoped(domainMain, h, query), session)
		b = binary.LittleEndian.AppendUint64(b, req.Signature())
		// The opening: h(0), the chain's seed, without a user message.
		b = binary.LittleEndian.AppendUint64(b, req.Prefix(firstUserMessage(req)+1))
		return identity.Main(derivedID(req, b))
	default:
		if _, err := identity.Agent(session, agent); err != nil {
			return identity.Owner{}, fmt.Errorf("%w: %s or %s: %v", errInvalidIdentity, from, agentFrom, err)
		}
		b := appendString(scoped(domainSession, h, query), session)
		return identity.Agent(derivedID(req, b), agent)
	}
}

// scoped starts the message of a derived id: the domain, then the
// credential scope of headers h and URL query query. The credential is
// the values of the headers that may carry one (credentialParts), under
// their lowercase names joined by ",", each header's values in turn (an
// upstream may take any of them, even beside an empty one), then a query
// that is not empty, under the name "?" (no header's name), as its one
// value; a request with none has the empty name and no values. Each
// header's values are sent as the HTTP parser gives them, in order.
func scoped(domain string, h http.Header, query string) []byte {
	b := make([]byte, 0, 128)
	b = appendString(b, domain)
	parts := credentialParts(h)
	if query != "" {
		parts = append(parts, scopePart{queryName, []string{query}})
	}
	if parts == nil {
		parts = []scopePart{{}} // the empty name, no values
	}
	names := make([]string, len(parts))
	for i, c := range parts {
		names[i] = c.name
	}
	b = appendString(b, strings.Join(names, ","))
	for _, c := range append(parts, scopePart{values: h.Values(headerOrganization)}, scopePart{values: h.Values(headerProject)}) {
		b = binary.AppendUvarint(b, uint64(len(c.values)))
		for _, v := range c.values {
			b = appendString(b, v)
		}
	}
	return b
}

// appendString appends s with its length first: uvarint(len) then the
// bytes.
func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// derivedID returns the session id derived from msg: the first 96 bits of
// its keyed HighwayHash-128, in unpadded base64url.
func derivedID(req *fingerprint.Request, msg []byte) string {
	sum := req.KeyedSum128(msg)
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// firstUserMessage returns the index of the first user message among
// req's items, or -1: a string item, or an object whose "role" is "user" and
// whose "type" is absent, null or "message".
func firstUserMessage(req *fingerprint.Request) int {
	for k := range req.Len() {
		raw := req.Item(k)
		if len(raw) == 0 {
			continue
		}
		if raw[0] == '"' {
			return k
		}
		if raw[0] != '{' {
			continue
		}
		role, typ := gjson.GetBytes(raw, "role"), gjson.GetBytes(raw, "type")
		if role.Type == gjson.String && role.Str == "user" &&
			(!typ.Exists() || typ.Type == gjson.Null || typ.Type == gjson.String && typ.Str == "message") {
			return k
		}
	}
	return -1
}

// lookup returns the value of the first source present, and that source.
// A present source must hold a non-empty string.
func lookup(sources []Source, h http.Header, req *fingerprint.Request) (string, Source, error) {
	for _, s := range sources {
		if s.Header != "" {
			vs := h.Values(s.Header)
			if len(vs) == 0 {
				continue
			}
			if len(vs) > 1 {
				return "", s, fmt.Errorf("%w: %s is sent %d times", errInvalidIdentity, s, len(vs))
			}
			if v := strings.TrimSpace(vs[0]); v != "" {
				return v, s, nil
			}
			return "", s, fmt.Errorf("%w: %s is empty", errInvalidIdentity, s)
		}
		v := member(req, s.Field)
		switch {
		case !v.Exists() || v.Type == gjson.Null:
			continue
		case v.Type != gjson.String:
			return "", s, fmt.Errorf("%w: %s is %s, not a string", errInvalidIdentity, s, jsonKind(v))
		case v.Str == "":
			return "", s, fmt.Errorf("%w: %s is empty", errInvalidIdentity, s)
		default:
			return v.Str, s, nil
		}
	}
	return "", Source{}, nil
}

// escapePath turns a dotted member path into a gjson path: every character
// gjson treats as syntax, other than the dots, is escaped.
func escapePath(field string) string {
	var b strings.Builder
	for _, r := range field {
		if strings.ContainsRune(`*?|#@!\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// jsonKind names a JSON value's type.
func jsonKind(v gjson.Result) string {
	switch v.Type {
	case gjson.Number:
		return "a number"
	case gjson.True, gjson.False:
		return "a boolean"
	}
	if v.IsArray() {
		return "an array"
	}
	return "an object"
}

// passthrough tells whether the client keeps its conversation upstream
// itself (previous_response_id or conversation set): the request then goes
// upstream as sent, outside the store.
func passthrough(req *fingerprint.Request) bool {
	for _, k := range []string{"previous_response_id", "conversation"} {
		if v := rawMember(req, k); v != "" && v != "null" {
			return true
		}
	}
	return false
}

// rawMember returns the body's top-level member name as received, "" when
// absent.
func rawMember(req *fingerprint.Request, name string) string {
	v, _ := req.Member(name)
	return string(v)
}

// member returns the value at the dotted path field of the body: its
// first part is a top-level member, read from the single parse, and the
// rest a path inside that member's value.
func member(req *fingerprint.Request, field string) gjson.Result {
	first, rest, nested := strings.Cut(field, ".")
	raw, ok := req.Member(first)
	if !ok {
		return gjson.Result{}
	}
	v := gjson.ParseBytes(raw)
	if nested {
		v = v.Get(escapePath(rest))
	}
	return v
}
