// Package session keeps durable conversation sessions (messages, usage,
// cost) in Redis or in process, for gateway and agent replicas that must
// never publish an old head over a new one.
//
// A [Session] is the stored document. A [Store] publishes a session as the
// new head only if the stored head is the one the writer loaded or last
// saved ([ErrConflict] otherwise), and [Store.SaveDurable] also waits for
// replica acknowledgement. A durable save that fails after publication is
// ambiguous: [ContextHead] latches the session so nothing saves over it
// until the session is reloaded. A [Conversation] drives one session:
// it prices usage into it, saves it, publishes its head through the
// barrier and clears it.
package session

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/names"
)

// Errors of the package, to match with errors.Is.
var (
	// ErrInvalid: a session id, option or argument is invalid.
	ErrInvalid = errors.New("session: invalid input")
	// ErrNotFound: no session has that id.
	ErrNotFound = errors.New("session: not found")
	// ErrConflict: the stored head is not the one this session was loaded
	// or last saved at; nothing was written.
	ErrConflict = errors.New("session: head changed since it was loaded")
	// ErrNotDurable: the head was published but too few replicas
	// acknowledged it in time; it may not survive a failover.
	ErrNotDurable = errors.New("session: head published but not acknowledged by enough replicas")
	// ErrCorrupt: a stored session does not decode.
	ErrCorrupt = errors.New("session: stored session is corrupt")
	// ErrUnavailable: the backing store failed (Redis down, timeout,
	// circuit breaker open).
	ErrUnavailable = errors.New("session: store unavailable")
	// ErrHeadBlocked: an earlier publication of this session's head failed
	// or was interrupted, so its stored head is unverified; reload the
	// session before saving or continuing.
	ErrHeadBlocked = errors.New("session: context head is unverified; reload the session before continuing")
	// ErrIdentityMismatch: the checkpoint names another session than the
	// current one; nothing was written.
	ErrIdentityMismatch = fmt.Errorf("%w: context head checkpoint does not match the current session", ErrInvalid)
)

// Tokens counts tokens by kind.
type Tokens struct {
	Input         uint64 `json:"input"`
	Output        uint64 `json:"output"`
	CacheRead     uint64 `json:"cache_read"`
	CacheCreation uint64 `json:"cache_creation"`
}

// plus returns t and u added up, kind by kind.
func (t Tokens) plus(u Tokens) Tokens {
	return Tokens{
		Input:         t.Input + u.Input,
		Output:        t.Output + u.Output,
		CacheRead:     t.CacheRead + u.CacheRead,
		CacheCreation: t.CacheCreation + u.CacheCreation,
	}
}

// clampedUnder returns t with each count at most the matching one of max.
func (t Tokens) clampedUnder(max Tokens) Tokens {
	return Tokens{
		Input:         min(t.Input, max.Input),
		Output:        min(t.Output, max.Output),
		CacheRead:     min(t.CacheRead, max.CacheRead),
		CacheCreation: min(t.CacheCreation, max.CacheCreation),
	}
}

// Session is one conversation as stored: its settings, messages and usage.
type Session struct {
	ID            string            `json:"id"`
	Name          string            `json:"name,omitempty"`
	Title         string            `json:"title,omitempty"`
	ParentSession string            `json:"parent_session,omitempty"`
	Model         string            `json:"model"`
	ThinkingLevel string            `json:"thinking_level,omitempty"`
	SystemPrompt  string            `json:"system_prompt,omitempty"`
	Messages      []json.RawMessage `json:"messages"`
	// Tokens are the session's totals; KeepWarmTokens and KeepWarmCost are
	// the part of them spent keeping the prompt cache warm.
	Tokens         Tokens  `json:"tokens"`
	Cost           float64 `json:"cost"`
	KeepWarmCost   float64 `json:"keepwarm_cost"`
	KeepWarmTokens Tokens  `json:"keepwarm_tokens"`
	// AbortContext notes a turn that was interrupted; a Conversation moves
	// it into the messages as an InterruptionMarker message.
	AbortContext string    `json:"abort_context,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`

	// Version is the head version the store last confirmed for this
	// session: 0 until it is first saved or loaded.
	Version uint64 `json:"-"`

	// saved is the message list at Version, as this copy saved or loaded
	// it, so that a journal save can append only what is new. It is never
	// changed in place, only replaced.
	saved []json.RawMessage
}

// New returns an empty session with a fresh random id.
func New(model, thinkingLevel, systemPrompt string) *Session {
	var b [16]byte
	_, _ = rand.Read(b[:])
	now := time.Now().UTC()
	return &Session{
		ID:            hex.EncodeToString(b[:]),
		Model:         model,
		ThinkingLevel: thinkingLevel,
		SystemPrompt:  systemPrompt,
		CreatedAt:     now,
		UpdatedAt:     now,
	}
}

// Clone returns a deep copy of s (messages are shared: they are immutable
// JSON values).
func (s *Session) Clone() *Session {
	c := *s
	c.Messages = append([]json.RawMessage(nil), s.Messages...)
	return &c
}

// maxTitleRunes bounds an automatic title.
const maxTitleRunes = 60

// autoTitle sets the title from the first user message when none is set.
func (s *Session) autoTitle() {
	if s.Title != "" {
		return
	}
	for _, m := range s.Messages {
		var msg struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(m, &msg) != nil || msg.Role != "user" {
			continue
		}
		if text := strings.Join(strings.Fields(messageText(msg.Content)), " "); text != "" {
			if r := []rune(text); len(r) > maxTitleRunes {
				text = string(r[:maxTitleRunes-1]) + "…"
			}
			s.Title = text
			return
		}
	}
}

// messageText returns the text of a message's content: a string, or the
// text parts of an array of content parts.
func messageText(content json.RawMessage) string {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(content, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Text != "" {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// validID reports whether id can name a session: an id identity accepts
// (non-empty, at most identity.MaxIDBytes bytes of UTF-8 without control
// characters) without '{' or '}'; an error wraps ErrInvalid.
func validID(id string) error {
	return validName("session id", id, identity.MaxIDBytes, "{}")
}

// validName checks a name that ends up in a Redis key: what names.Check
// accepts, within max bytes, without any of the characters of forbidden.
func validName(what, s string, max int, forbidden string) error {
	if err := names.Check(s, max); err != nil {
		return fmt.Errorf("%w: %s %q %v", ErrInvalid, what, s, err)
	}
	if strings.ContainsAny(s, forbidden) {
		return fmt.Errorf("%w: %s %q holds one of %q", ErrInvalid, what, s, forbidden)
	}
	return nil
}

// validSession checks what a save needs before encoding; the encoders
// check the messages (invalidMessage names the first bad one).
func validSession(s *Session) error {
	if s == nil {
		return fmt.Errorf("%w: nil session", ErrInvalid)
	}
	return validID(s.ID)
}

// invalidMessage returns an error naming the first message of s from index
// from on that is not valid JSON, or cause when all are.
func invalidMessage(s *Session, from int, cause error) error {
	for i, m := range s.Messages[from:] {
		if !json.Valid(m) {
			return fmt.Errorf("%w: session %q: message %d is not valid JSON", ErrInvalid, s.ID, from+i)
		}
	}
	return fmt.Errorf("%w: session %q: %v", ErrInvalid, s.ID, cause)
}
