package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/identity"
)

// errInvalidIdentity is wrapped by the error a request gets when a source
// holds an empty or invalid session or agent id (answered 400).
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
// read. The first source present wins; a request present in no session
// source has no owner (the store answers missing_identity and the full
// context goes upstream). An agent id equal to the session id names the
// session's main thread, as Codex sends its own thread id on every request.
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
// prompt_cache_key, which clients set per conversation.
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

// owner returns the owner a request names, the zero owner when it names
// none, or an error wrapping errInvalidIdentity that names the source.
func (id Identity) owner(h http.Header, body []byte) (identity.Owner, error) {
	session, from, err := lookup(id.Session, h, body)
	if err != nil {
		return identity.Owner{}, err
	}
	agent, agentFrom, err := lookup(id.Agent, h, body)
	if err != nil {
		return identity.Owner{}, err
	}
	switch {
	case session == "" && agent != "":
		return identity.Owner{}, fmt.Errorf("%w: %s names an agent but no source names a session", errInvalidIdentity, agentFrom)
	case session == "":
		return identity.Owner{}, nil
	case agent == "" || agent == session:
		o, err := identity.Main(session)
		if err != nil {
			return identity.Owner{}, fmt.Errorf("%w: %s: %v", errInvalidIdentity, from, err)
		}
		return o, nil
	default:
		o, err := identity.Agent(session, agent)
		if err != nil {
			return identity.Owner{}, fmt.Errorf("%w: %s or %s: %v", errInvalidIdentity, from, agentFrom, err)
		}
		return o, nil
	}
}

// lookup returns the value of the first source present, and that source.
// A present source must hold a non-empty string.
func lookup(sources []Source, h http.Header, body []byte) (string, Source, error) {
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
		v := gjson.GetBytes(body, escapePath(s.Field))
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
func passthrough(top map[string]json.RawMessage) bool {
	for _, k := range []string{"previous_response_id", "conversation"} {
		if v, ok := top[k]; ok && string(v) != "null" {
			return true
		}
	}
	return false
}
