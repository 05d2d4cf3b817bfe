package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// A recording is a completed response's record (store.Store.Record). With
// Config.Affinity and a store that is not in process, it runs on a
// goroutine of its own and the response's end reaches the client while it
// is in flight; otherwise it is in before the end, on the turn's
// goroutine. The turn's handler tells it, once the end is written, whether
// the client got it (recording.end); a turn whose client did not is
// aborted after its record. It is registered under its owner until it and
// that abort are over, so that the owner's next turn on this replica
// reserves after it (Proxy.reserve).
type recording struct {
	p    *Proxy
	ctx  context.Context
	lg   *slog.Logger
	res  *store.Reservation
	key  string      // the owner's, in Proxy.records
	ends chan ending // to the goroutine; nil when there is none
}

// ending is what a recording is told once the response's end is written.
type ending struct {
	delivered bool
	// finish logs and reports how the turn ended.
	finish func(lg *slog.Logger, end string)
}

// record records a's completed response out, or starts to (recording).
func (p *Proxy) record(ctx context.Context, lg *slog.Logger, a *sent, out outcome) *recording {
	rec := &recording{p: p, ctx: ctx, lg: lg.With("response_id", out.id), res: a.res, key: p.records.add(a.res.Owner)}
	result := store.Result{ResponseID: out.id, Socket: a.c.socket(), Output: out.output}
	if !p.cfg.Affinity || p.cfg.Store.InProcess() {
		rec.run(result)
		return rec
	}
	rec.ends = make(chan ending, 1)
	go func() {
		rec.run(result)
		rec.settle(<-rec.ends)
	}()
	return rec
}

// run makes the record.
func (rec *recording) run(result store.Result) {
	outcome, err := rec.p.cfg.Store.Record(rec.ctx, rec.res, result)
	if err != nil {
		rec.p.warns.warn(rec.lg, "record failed; the next turn sends full context", "err", err)
	}
	rec.lg = rec.lg.With("outcome", outcome)
}

// settle ends the turn once its record is in: it aborts the turn when the
// client never got the end, and reports how it ended.
func (rec *recording) settle(e ending) {
	defer rec.p.records.done(rec.key)
	end := "recorded"
	if !e.delivered {
		rec.p.abort(rec.ctx, rec.lg, rec.res) // recorded, but the client never got the end
		end = "aborted"
	}
	if e.finish != nil {
		e.finish(rec.lg, end)
	}
}

// end tells the recording whether the client got the response's end, and
// how to report the turn once it is over (nil: not at all).
func (rec *recording) end(delivered bool, finish func(lg *slog.Logger, end string)) {
	e := ending{delivered: delivered, finish: finish}
	if rec.ends == nil {
		rec.settle(e)
		return
	}
	rec.ends <- e
}

// records are the recordings in flight on a replica, by owner key.
type records struct {
	mu     sync.Mutex
	owners map[string]*ownerRecords
}

// ownerRecords are one owner's recordings in flight: done is closed when
// the last of them ends.
type ownerRecords struct {
	n    int
	done chan struct{}
}

// add registers a recording of owner's and returns the key to end it by.
func (rs *records) add(owner identity.Owner) string {
	key := owner.Key()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.owners == nil {
		rs.owners = map[string]*ownerRecords{}
	}
	o := rs.owners[key]
	if o == nil {
		o = &ownerRecords{done: make(chan struct{})}
		rs.owners[key] = o
	}
	o.n++
	return key
}

// done ends a recording add registered.
func (rs *records) done(key string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	o := rs.owners[key]
	if o.n--; o.n == 0 {
		close(o.done)
		delete(rs.owners, key)
	}
}

// pending returns the channel closed when owner's recordings in flight
// end; nil when there are none.
func (rs *records) pending(owner identity.Owner) <-chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if o := rs.owners[owner.Key()]; o != nil {
		return o.done
	}
	return nil
}

// waitAll waits until no recording is in flight.
func (rs *records) waitAll() {
	for {
		rs.mu.Lock()
		var done chan struct{}
		for _, o := range rs.owners {
			done = o.done
			break
		}
		rs.mu.Unlock()
		if done == nil {
			return
		}
		<-done
	}
}

// reserve reserves a turn for who (store.Store.Reserve) once who's
// recordings in flight on this replica have ended, so that a turn sent the
// moment the previous one's end arrived continues it. The wait ends with
// the client's request, and after two of the store's operations at most:
// the record and the abort that may follow it.
func (p *Proxy) reserve(r *http.Request, who identity.Owner, req *fingerprint.Request) *store.Reservation {
	if !who.IsZero() {
		if done := p.records.pending(who); done != nil {
			t := time.NewTimer(2 * p.cfg.Store.Options().OpTimeout)
			select {
			case <-done:
			case <-r.Context().Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	// Store operations outlive a client that hangs up: the turn must be
	// recorded or aborted whatever the client does.
	return p.cfg.Store.Reserve(context.WithoutCancel(r.Context()), who, req)
}
