package session

import (
	"context"
	"fmt"
	"sync"
)

// ContextHead is the durability barrier of one conversation: a publication
// latches the session before it starts, and only a publication that
// succeeds clears the latch. While latched, saves refuse: an old head must
// never be saved over a head whose publication may have happened. Reloading
// the session (a new Conversation from the store) starts unlatched. The zero
// value is ready to use; it is safe for concurrent use.
type ContextHead struct {
	mu      sync.Mutex
	blocked string // the latched session's id
}

// IsBlocked reports whether session id is latched.
func (h *ContextHead) IsBlocked(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.blocked != "" && h.blocked == id
}

// latch blocks id, or reports that it already is.
func (h *ContextHead) latch(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.blocked != "" && h.blocked == id {
		return fmt.Errorf("%w (session %q)", ErrHeadBlocked, id)
	}
	h.blocked = id
	return nil
}

func (h *ContextHead) unlatch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.blocked = ""
}

// Persist publishes candidate as the head of *current through save
// (normally a Store's SaveDurable), with the barrier's rules:
//
//   - if the session is latched, it refuses with ErrHeadBlocked;
//   - it latches the session before anything else, so a publication that
//     never returns leaves it latched;
//   - if sessionID or candidate.ID is not current's id, it returns
//     ErrIdentityMismatch without writing or adopting anything;
//   - otherwise it saves; whatever the result it adopts the candidate as
//     *current (on error, only as conservative recovery state: the write may
//     have happened), and it clears the latch only on success.
//
// So *current changes exactly when the error is neither ErrHeadBlocked nor
// ErrIdentityMismatch. Candidate metadata must come from the current
// session, never from message content.
func (h *ContextHead) Persist(ctx context.Context, save func(context.Context, *Session) error, current *Session, sessionID string, candidate *Session) error {
	if err := h.latch(current.ID); err != nil {
		return err
	}
	if sessionID != current.ID || candidate == nil || candidate.ID != current.ID {
		return ErrIdentityMismatch
	}
	err := save(ctx, candidate)
	*current = *candidate.Clone()
	if err == nil {
		h.unlatch()
	}
	return err
}
