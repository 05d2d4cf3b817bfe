package proxy

import (
	"log/slog"
	"sync"
	"time"
)

// warnEvery is the least time between two warnings of one cause.
const warnEvery = time.Second

// warnings logs the proxy's warnings at most once a second per cause
// (its message), so that an outage of Redis, the directory or the
// upstream writes a line a second, not one per turn. A line carries
// "suppressed": how many warnings of its cause were left out since the
// previous one.
type warnings struct {
	mu     sync.Mutex
	causes map[string]*warnCause
	now    func() time.Time
}

// warnCause is the state of one cause.
type warnCause struct {
	last       time.Time
	suppressed int
}

// maxWarnCauses bounds the causes remembered; the messages are the
// proxy's own, so this is never reached in practice.
const maxWarnCauses = 256

// warn logs msg with args on lg at Warn, unless a warning with msg was
// logged less than warnEvery ago.
func (w *warnings) warn(lg *slog.Logger, msg string, args ...any) {
	w.mu.Lock()
	now := time.Now
	if w.now != nil {
		now = w.now
	}
	t := now()
	c := w.causes[msg]
	if c == nil {
		if w.causes == nil || len(w.causes) >= maxWarnCauses {
			w.causes = map[string]*warnCause{}
		}
		c = &warnCause{}
		w.causes[msg] = c
	} else if t.Sub(c.last) < warnEvery {
		c.suppressed++
		w.mu.Unlock()
		return
	}
	suppressed := c.suppressed
	c.last, c.suppressed = t, 0
	w.mu.Unlock()
	lg.Warn(msg, append(args, "suppressed", suppressed)...)
}
