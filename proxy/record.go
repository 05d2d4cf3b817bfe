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

// continuesNothing reports whether no continuation could serve t, nor
// t's response continue a later turn: a response the upstream does not
// keep ("store": false) continues only on the socket that produced it,
// and this replica's upstream is HTTP, with no forwarding to a replica
// whose socket might hold one.
func (p *Proxy) continuesNothing(t *turn) bool {
	_, overHTTP := p.cfg.Upstream.(*httpUpstream)
	return !t.stores && overHTTP && p.cfg.Forwarding == nil
}

// reasonStoreless is the reason the log line of a storeless turn
// (Proxy.reserve) gives.
const reasonStoreless = "not_kept_upstream"

// A recording is a completed response's record (store.Store.Record). On a
// store that is not in process, for a turn that ran on this replica's
// upstream (not forwarded), with Config.Affinity or when the turn went on
// its guess (the owner stays here), it runs on a goroutine of its own and
// the response's end reaches the client while it is in flight; otherwise
// it is in before the end, on the turn's goroutine. The
// owner's next turn on this replica reserves after it (Proxy.reserve).
// The turn's handler tells it, once the end is written, whether the client
// got it (recording.end); once both that and the record are in, the one
// that came second settles the turn (recording.meet): a turn whose client
// never got the end is aborted after its record.
type recording struct {
	p   *Proxy
	ctx context.Context
	lg  *slog.Logger
	res *store.Reservation
	mu  sync.Mutex
	in  bool   // the record or the ending is in
	e   ending // the ending, once in
	// result is how the turn ended once it is recorded and delivered
	// (StepEnd): "recorded", "not_recorded" or "record_failed".
	result string
}

// ending is what a recording is told once the response's end is written.
type ending struct {
	delivered bool
	// finish logs and reports how the turn ended; nil: not at all.
	finish func(lg *slog.Logger, end string)
}

// record records a's completed response out, or starts to (recording). A
// record on a goroutine of its own keeps the turn's body, and so h, its
// weight in the budget, until it is in.
func (p *Proxy) record(ctx context.Context, lg *slog.Logger, h *hold, a *sent, out outcome) *recording {
	rec := &recording{p: p, ctx: ctx, lg: lg, res: a.res}
	result := store.Result{ResponseID: out.id, Socket: a.c.socket(), Output: out.output}
	// Registered before the client can get the end, on this goroutine: the
	// owner's next turn here finds it in flight (Proxy.reserve).
	key := p.records.add(a.res.Owner)
	_, forwarded := a.c.(*forwardConn)
	if !(p.cfg.Affinity || a.stays) || p.cfg.Store.InProcess() || forwarded {
		rec.run(key, result)
		return rec
	}
	p.records.started()
	kept := h.pass()
	go func() {
		defer p.records.stopped()
		rec.run(key, result)
		kept.release()
	}()
	return rec
}

// run makes the record registered under key, and ends its registration.
func (rec *recording) run(key string, result store.Result) {
	outcome, err := rec.p.cfg.Store.Record(rec.ctx, rec.res, result)
	rec.p.records.done(key)
	switch {
	case err != nil:
		rec.p.warns.warn(rec.lg, "record failed; the next turn sends full context", "err", err)
		rec.result, outcome = "record_failed", "failed"
	case outcome == store.OutcomePublished:
		rec.result = "recorded"
	default:
		rec.result = "not_recorded" // another turn of the owner's came first, or nothing to continue
	}
	rec.lg = rec.lg.With("response_id", result.ResponseID, "outcome", outcome)
	rec.meet(nil)
}

// end tells the recording whether the client got the response's end, and
// how to report the turn once it is over. It is called once.
func (rec *recording) end(delivered bool, finish func(lg *slog.Logger, end string)) {
	rec.meet(&ending{delivered: delivered, finish: finish})
}

// meet is called once the record is in (e nil) and once the ending is
// (end); the second call settles the turn.
func (rec *recording) meet(e *ending) {
	rec.mu.Lock()
	if e != nil {
		rec.e = *e
	}
	second := rec.in
	rec.in = true
	rec.mu.Unlock()
	if !second {
		return
	}
	end := rec.result
	if !rec.e.delivered {
		end = rec.p.giveBack(rec.ctx, rec.lg, rec.res) // recorded, but the client never got the end
	}
	if rec.e.finish != nil {
		rec.e.finish(rec.lg, end)
	}
}

// records are the records in flight on a replica, by owner key, and how
// many of them run on goroutines of their own (for Close).
type records struct {
	mu      sync.Mutex
	owners  map[string]*ownerRecords
	running int
	idle    chan struct{} // closed when running falls to 0, while waitAll waits
}

// ownerRecords are one owner's records in flight: done is closed when the
// last of them ends.
type ownerRecords struct {
	n    int
	done chan struct{}
}

// add registers a record of owner's and returns the key to end it by.
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

// done ends a record add registered.
func (rs *records) done(key string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	o := rs.owners[key]
	if o.n--; o.n == 0 {
		close(o.done)
		delete(rs.owners, key)
	}
}

// pending returns the channel closed when owner's records in flight end;
// nil when there are none.
func (rs *records) pending(owner identity.Owner) <-chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if o := rs.owners[owner.Key()]; o != nil {
		return o.done
	}
	return nil
}

// started and stopped count a record's goroutine.
func (rs *records) started() {
	rs.mu.Lock()
	rs.running++
	rs.mu.Unlock()
}

func (rs *records) stopped() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.running--; rs.running == 0 && rs.idle != nil {
		close(rs.idle)
		rs.idle = nil
	}
}

// waitAll waits until no record runs on a goroutine of its own.
func (rs *records) waitAll() {
	rs.mu.Lock()
	if rs.running == 0 {
		rs.mu.Unlock()
		return
	}
	if rs.idle == nil {
		rs.idle = make(chan struct{})
	}
	idle := rs.idle
	rs.mu.Unlock()
	<-idle
}

// reserve reserves turn t for who (store.Store.Reserve) once who's records
// in flight on this replica are in, so that a turn sent the moment the
// previous one's end arrived continues it. The wait ends with the client's
// request, and after one of the store's operations at most. On a store
// that guesses, t goes upstream on the guess while the store reserves it
// (early.go). A turn of who's that nothing could continue
// (continuesNothing) reserves nothing: it is storeless.
func (p *Proxy) reserve(r *http.Request, t *turn, who identity.Owner, req *fingerprint.Request) *store.Reservation {
	if !who.IsZero() && p.continuesNothing(t) {
		t.storeless = true
		who = identity.Owner{} // the store answers without a round trip
		p.stats.add(cNotKept, 1)
		p.notKept.Do(func() {
			p.cfg.Logger.Info(`turns with "store": false go with their full context: the HTTP upstream keeps none of their responses (the WebSocket transport continues them); counted in turns_not_kept_upstream_total`)
		})
	}
	if !who.IsZero() {
		if done := p.records.pending(who); done != nil {
			wait := time.NewTimer(p.cfg.Store.Options().OpTimeout)
			select {
			case <-done:
			case <-r.Context().Done():
			case <-wait.C:
			}
			wait.Stop()
		}
	}
	t.early = p.sendEarly(r, t, who, req)
	// Store operations outlive a client that hangs up: the turn must be
	// recorded or aborted whatever the client does.
	return p.cfg.Store.Reserve(context.WithoutCancel(r.Context()), who, req)
}
