package session

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/contstore/contstore/identity"
)

// InterruptionMarker is the text of the message that records a turn
// interrupted before it finished; it replaces the legacy AbortContext.
const InterruptionMarker = "[The previous turn was interrupted before it finished.]"

// ContinuationClearer forgets an owner's continuation state;
// *store.Store satisfies it.
type ContinuationClearer interface {
	Clear(ctx context.Context, owner identity.Owner) error
}

// Conversation is the live state of one conversation: its session, the
// messages and usage since, and the barrier of its head. It is not safe for
// concurrent use.
type Conversation struct {
	Session  *Session
	Head     ContextHead
	Messages []json.RawMessage
	// Tokens and Cost are the totals; KeepWarmTokens and KeepWarmCost are
	// the part of them spent keeping the prompt cache warm.
	Tokens         Tokens
	Cost           float64
	KeepWarmCost   float64
	KeepWarmTokens Tokens

	deps Deps
}

// Deps are what a Conversation saves to, prices with and clears.
type Deps struct {
	Store  Store
	Prices Prices
	// Continuations, when set, is told to forget the session's main owner
	// on Clear.
	Continuations ContinuationClearer
	// Now is the clock for UpdatedAt; default time.Now.
	Now func() time.Time
}

// NewConversation starts a conversation on a fresh session.
func NewConversation(s *Session, deps Deps) *Conversation {
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &Conversation{Session: s, deps: deps}
}

// Resume continues a loaded session: totals come back as saved, keep-warm
// buckets clamped under the totals they are part of and keep-warm cost to
// [0, cost], and a legacy abort context becomes an interruption marker
// message, once (resuming a migrated session changes nothing).
func Resume(s *Session, deps Deps) *Conversation {
	migrateAbortContext(s)
	c := NewConversation(s, deps)
	c.Messages = append([]json.RawMessage(nil), s.Messages...)
	c.Tokens = s.Tokens
	c.Cost = s.Cost
	c.KeepWarmCost = max(0, min(s.KeepWarmCost, s.Cost))
	c.KeepWarmTokens = s.KeepWarmTokens.clampedUnder(s.Tokens)
	return c
}

// migrateAbortContext turns a legacy abort context into a marker message.
func migrateAbortContext(s *Session) {
	if s.AbortContext == "" {
		return
	}
	s.AbortContext = ""
	marker := interruptionMessage()
	if n := len(s.Messages); n > 0 && string(s.Messages[n-1]) == string(marker) {
		return
	}
	s.Messages = append(s.Messages, marker)
}

func interruptionMessage() json.RawMessage {
	b, _ := json.Marshal(map[string]string{"role": "user", "content": InterruptionMarker})
	return b
}

// AddUsage adds one model turn's usage to the totals and its cost (from
// Deps.Prices) to the session cost. It returns the turn's cost and whether
// the model had a price; an unknown model costs 0.
func (c *Conversation) AddUsage(u Usage) (float64, bool) {
	c.Tokens.Input += u.Input
	c.Tokens.Output += u.Output
	c.Tokens.CacheRead += u.CacheRead
	c.Tokens.CacheCreation += u.CacheCreation
	cost, known := c.deps.Prices.Cost(u)
	c.Cost += cost
	return cost, known
}

// candidate returns the session as it would be saved with messages.
func (c *Conversation) candidate(messages []json.RawMessage) *Session {
	s := c.Session.Clone()
	s.Messages = append([]json.RawMessage(nil), messages...)
	s.Tokens = c.Tokens
	s.Cost = c.Cost
	s.KeepWarmCost = c.KeepWarmCost
	s.KeepWarmTokens = c.KeepWarmTokens
	s.AbortContext = "" // an interrupted turn lives in the messages now
	s.UpdatedAt = c.deps.Now().UTC()
	s.AutoTitle()
	return s
}

// PrepareSave folds the live state into the session and returns it for
// saving, or false when there is nothing to save: an empty history, or a
// latched head (whose stored state is unverified).
func (c *Conversation) PrepareSave() (*Session, bool) {
	if c.Head.IsBlocked(c.Session.ID) || len(c.Messages) == 0 {
		return nil, false
	}
	*c.Session = *c.candidate(c.Messages)
	return c.Session, true
}

// Save saves the conversation with Store.Save and reports whether it wrote;
// false with a nil error means there was nothing to save (PrepareSave).
func (c *Conversation) Save(ctx context.Context) (bool, error) {
	s, ok := c.PrepareSave()
	if !ok {
		return false, nil
	}
	if err := c.deps.Store.Save(ctx, s); err != nil {
		return false, err
	}
	return true, nil
}

// PersistContextHead publishes messages as the session's durable head
// through the barrier (ContextHead.Persist with Store.SaveDurable), using
// the session's own metadata and the latest usage. When the candidate is
// adopted the conversation's messages become its messages.
func (c *Conversation) PersistContextHead(ctx context.Context, sessionID string, messages []json.RawMessage) error {
	err := c.Head.Persist(ctx, c.deps.Store.SaveDurable, c.Session, sessionID, c.candidate(messages))
	if adopted(err) {
		c.Messages = append([]json.RawMessage(nil), c.Session.Messages...)
	}
	return err
}

// Clear saves the conversation, then starts a fresh session with the same
// model settings and forgets the continuation state of the old and the new
// session's main owners. It starts the fresh session even when the save
// fails, and returns that error.
func (c *Conversation) Clear(ctx context.Context) error {
	_, saveErr := c.Save(ctx)
	old := c.Session
	c.Session = New(old.Model, old.ThinkingLevel, old.SystemPrompt)
	c.Head.unlatch()
	c.Messages = nil
	c.Tokens, c.KeepWarmTokens = Tokens{}, Tokens{}
	c.Cost, c.KeepWarmCost = 0, 0
	if c.deps.Continuations == nil {
		return saveErr
	}
	errs := []error{saveErr}
	for _, id := range []string{old.ID, c.Session.ID} {
		owner, err := identity.Main(id)
		if err == nil {
			err = c.deps.Continuations.Clear(ctx, owner)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ConversationSnapshot is the serialisable mirror of a conversation, for
// clients.
type ConversationSnapshot struct {
	ID             string            `json:"id"`
	Name           string            `json:"name,omitempty"`
	Title          string            `json:"title,omitempty"`
	ParentSession  string            `json:"parent_session,omitempty"`
	Model          string            `json:"model"`
	ThinkingLevel  string            `json:"thinking_level,omitempty"`
	Messages       []json.RawMessage `json:"messages"`
	MessagesLen    int               `json:"messages_len"`
	Tokens         Tokens            `json:"tokens"`
	Cost           float64           `json:"cost"`
	KeepWarmCost   float64           `json:"keepwarm_cost"`
	KeepWarmTokens Tokens            `json:"keepwarm_tokens"`
	Blocked        bool              `json:"blocked"`
}

// Snapshot returns the conversation's mirror.
func (c *Conversation) Snapshot() ConversationSnapshot {
	s := c.Session
	return ConversationSnapshot{
		ID: s.ID, Name: s.Name, Title: s.Title, ParentSession: s.ParentSession,
		Model: s.Model, ThinkingLevel: s.ThinkingLevel,
		Messages:    append([]json.RawMessage(nil), c.Messages...),
		MessagesLen: len(c.Messages),
		Tokens:      c.Tokens, Cost: c.Cost,
		KeepWarmCost: c.KeepWarmCost, KeepWarmTokens: c.KeepWarmTokens,
		Blocked: c.Head.IsBlocked(s.ID),
	}
}
