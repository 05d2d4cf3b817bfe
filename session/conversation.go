package session

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/contstore/contstore/identity"
)

// InterruptionMarker is the text of the message that records a turn
// interrupted before it finished (Session.AbortContext).
const InterruptionMarker = "[The previous turn was interrupted before it finished.]"

// ContinuationClearer forgets an owner's continuation state;
// *store.Store satisfies it.
type ContinuationClearer interface {
	Clear(ctx context.Context, owner identity.Owner) error
}

// Deps are what a Conversation saves to, prices with and clears.
type Deps struct {
	Store  *Store
	Prices Prices
	// Continuations, when set, is told to forget the session's main owner
	// on Clear.
	Continuations ContinuationClearer
}

// Conversation drives one session: it adds each turn's usage and cost to
// the session's totals, saves it, publishes its durable head through the
// barrier, and clears it for a fresh one. It is not safe for concurrent
// use.
type Conversation struct {
	// Session is the conversation as it stands, messages and totals
	// included: what the next save publishes.
	Session *Session
	// Head is the barrier of the session's durable head.
	Head ContextHead

	deps Deps
}

// NewConversation continues s, a fresh or a loaded session. It takes s
// over: keep-warm tokens are clamped under the totals they are part of and
// keep-warm cost to [0, Cost], and an abort context becomes an
// InterruptionMarker message at the end of the messages, unless one is
// there already (continuing the session again changes nothing).
func NewConversation(s *Session, deps Deps) *Conversation {
	moveAbortContext(s)
	s.KeepWarmCost = max(0, min(s.KeepWarmCost, s.Cost))
	s.KeepWarmTokens = s.KeepWarmTokens.clampedUnder(s.Tokens)
	return &Conversation{Session: s, deps: deps}
}

// moveAbortContext turns an abort context into a marker message.
func moveAbortContext(s *Session) {
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

// AddUsage adds one model turn's usage to the session's totals and its cost
// (from Deps.Prices) to the session's cost. It returns the turn's cost and
// whether the model had a price; an unknown model costs 0.
func (c *Conversation) AddUsage(u Usage) (float64, bool) {
	c.Session.Tokens = c.Session.Tokens.plus(u.Tokens)
	cost, known := c.deps.Prices.Cost(u)
	c.Session.Cost += cost
	return cost, known
}

// stamp readies s for publication: an interrupted turn lives in its
// messages now, the update time is now, and the title is set when missing.
func stamp(s *Session) {
	s.AbortContext = ""
	s.UpdatedAt = time.Now().UTC()
	s.autoTitle()
}

// Save saves the session with Store.Save and reports whether it wrote;
// false with a nil error means there was nothing to save: no messages, or
// a latched head (whose stored state is unverified).
func (c *Conversation) Save(ctx context.Context) (bool, error) {
	if c.Head.IsBlocked(c.Session.ID) || len(c.Session.Messages) == 0 {
		return false, nil
	}
	stamp(c.Session)
	if err := c.deps.Store.Save(ctx, c.Session); err != nil {
		return false, err
	}
	return true, nil
}

// PersistContextHead publishes, as the session's durable head, a candidate
// that is the session with messages in place of its own, through the
// barrier (ContextHead.Persist with Store.SaveDurable). When the candidate
// is adopted it becomes the session.
func (c *Conversation) PersistContextHead(ctx context.Context, sessionID string, messages []json.RawMessage) error {
	candidate := c.Session.Clone()
	candidate.Messages = append([]json.RawMessage(nil), messages...)
	stamp(candidate)
	return c.Head.Persist(ctx, c.deps.Store.SaveDurable, c.Session, sessionID, candidate)
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
