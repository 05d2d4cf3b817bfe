// Package identity names the owners of conversation-continuation state.
//
// An owner is one conversation thread: the main thread of a session
// ([Main]) or one sub-agent inside a session ([Agent]). Siblings never share
// state. Every owner has a canonical key ([Owner.Key]) that is injective,
// stable across releases and part of the Redis schema, and a partition
// ([Owner.Partition]) chosen by hashing that key.
//
// # Valid ids
//
// A session id, and an agent id, is valid when it is:
//   - not empty;
//   - at most [MaxIDBytes] (256) bytes long, counted in bytes of its UTF-8
//     encoding, not in characters;
//   - valid UTF-8;
//   - free of control characters, the Unicode category Cc: U+0000 to U+001F
//     (NUL, tab, newline, carriage return...), U+007F (DEL) and U+0080 to
//     U+009F.
//
// Any other character is accepted as is, including spaces, ':', '%', '{',
// '}', '/' and non-ASCII letters ([Owner.Key] escapes the ':' and '%' it
// needs), and ids are compared byte for byte: nothing is trimmed, folded or
// normalized. [Main] and [Agent] refuse an invalid id with an error wrapping
// [ErrInvalid] that names the field and the first rule broken.
package identity

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/contstore/contstore/internal/names"
)

// MaxIDBytes is the longest session or agent id accepted, in bytes.
const MaxIDBytes = 256

// ErrInvalid is wrapped by every error about an invalid id or key.
var ErrInvalid = errors.New("identity: invalid owner")

// Owner identifies one conversation thread. The zero Owner means "no
// identity". Owners are comparable and can be used as map keys.
type Owner struct {
	session string
	agent   string
	key     string // Key, built once: every store operation names the owner by it
}

// Key prefixes. A main owner's key is "m:" + escape(session); an agent's is
// "a:" + escape(session) + ":" + escape(agent). escape replaces '%' with
// "%25" and ':' with "%3A" and nothing else, so an escaped id never holds a
// ':' and the key splits back unambiguously.
const (
	mainPrefix  = "m:"
	agentPrefix = "a:"
)

// Main returns the owner of a session's main thread.
//
// session must be a valid id (see the package documentation): non-empty,
// at most [MaxIDBytes] (256) bytes, valid UTF-8, with no control character
// (U+0000 to U+001F, U+007F to U+009F). Any other string is
// accepted as is, spaces and ':' included. Otherwise Main returns an error
// wrapping [ErrInvalid], such as "identity: invalid owner: session id is
// empty".
func Main(session string) (Owner, error) {
	if err := validate("session", session); err != nil {
		return Owner{}, err
	}
	return Owner{session: session, key: mainPrefix + escape(session)}, nil
}

// Agent returns the owner of one sub-agent thread inside a session.
//
// Both session and agent must be valid ids, by the rules of [Main]: each
// non-empty, at most [MaxIDBytes] (256) bytes, valid UTF-8 and free of
// control characters (U+0000 to U+001F, U+007F to U+009F). An agent id
// is therefore never empty: a session's main thread is [Main], not Agent
// with "". Agent ids need only be unique within their session: Agent(s, a)
// is a different owner from Main(s) and from Agent(t, a) for another
// session t. Otherwise Agent returns an error wrapping [ErrInvalid] naming
// the field, the session checked first, such as "identity: invalid owner:
// agent id is 300 bytes, more than 256".
func Agent(session, agent string) (Owner, error) {
	if err := validate("session", session); err != nil {
		return Owner{}, err
	}
	if err := validate("agent", agent); err != nil {
		return Owner{}, err
	}
	return Owner{session: session, agent: agent, key: agentPrefix + escape(session) + ":" + escape(agent)}, nil
}

// ParseKey is the inverse of [Owner.Key]: it accepts exactly the keys that
// Key produces and returns an error wrapping [ErrInvalid] for anything else.
func ParseKey(key string) (Owner, error) {
	switch {
	case strings.HasPrefix(key, mainPrefix):
		session, err := unescape("session", key[len(mainPrefix):])
		if err != nil {
			return Owner{}, err
		}
		return Main(session)
	case strings.HasPrefix(key, agentPrefix):
		rest := key[len(agentPrefix):]
		i := strings.IndexByte(rest, ':')
		if i < 0 {
			return Owner{}, fmt.Errorf("%w: key %q: agent key has no agent part", ErrInvalid, key)
		}
		session, err := unescape("session", rest[:i])
		if err != nil {
			return Owner{}, err
		}
		agent, err := unescape("agent", rest[i+1:])
		if err != nil {
			return Owner{}, err
		}
		return Agent(session, agent)
	default:
		return Owner{}, fmt.Errorf("%w: key %q: must start with %q or %q", ErrInvalid, key, mainPrefix, agentPrefix)
	}
}

// Key returns the owner's canonical key: injective over all valid owners and
// stable across releases (it names the owner's state in Redis). The zero
// Owner's key is "".
func (o Owner) Key() string { return o.key }

// Session returns the session id.
func (o Owner) Session() string { return o.session }

// AgentID returns the agent id, or "" for a main owner.
func (o Owner) AgentID() string { return o.agent }

// IsAgent reports whether the owner is a sub-agent thread.
func (o Owner) IsAgent() bool { return o.agent != "" }

// IsZero reports whether o is the zero Owner ("no identity").
func (o Owner) IsZero() bool { return o.session == "" }

// Partition returns the owner's partition among n: the xxhash64 of its key
// modulo n. It returns 0 when n < 1.
func (o Owner) Partition(n int) int {
	if n < 1 {
		return 0
	}
	return int(xxhash.Sum64String(o.key) % uint64(n))
}

// String returns a readable form for logs: "main(s)" or "agent(s/a)".
func (o Owner) String() string {
	switch {
	case o.IsZero():
		return "none"
	case o.agent == "":
		return fmt.Sprintf("main(%q)", o.session)
	default:
		return fmt.Sprintf("agent(%q/%q)", o.session, o.agent)
	}
}

func validate(field, id string) error {
	if err := names.Check(id, MaxIDBytes); err != nil {
		return fmt.Errorf("%w: %s id %v", ErrInvalid, field, err)
	}
	return nil
}

var escaper = strings.NewReplacer("%", "%25", ":", "%3A")

func escape(id string) string { return escaper.Replace(id) }

// unescape reverses escape and refuses every other spelling ("%3a", "%41",
// a bare ':'), so that a key that parses is the key of what it parses to.
func unescape(field, s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		if strings.IndexByte(s, ':') >= 0 {
			return "", fmt.Errorf("%w: %s part %q has an unescaped ':'", ErrInvalid, field, s)
		}
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ':':
			return "", fmt.Errorf("%w: %s part %q has an unescaped ':'", ErrInvalid, field, s)
		case c != '%':
			b.WriteByte(c)
		case strings.HasPrefix(s[i:], "%25"):
			b.WriteByte('%')
			i += 2
		case strings.HasPrefix(s[i:], "%3A"):
			b.WriteByte(':')
			i += 2
		default:
			return "", fmt.Errorf("%w: %s part %q has an escape other than %%25 or %%3A", ErrInvalid, field, s)
		}
	}
	return b.String(), nil
}
