package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/store"
)

// The budget bounds the memory that requests read in full hold at once
// (Config.MaxBytesInFlight): a turn's body from the moment it is read
// until the turn ends, since the body and its parse live until then, and
// a WebSocket message from the moment it is read until it is answered. A
// turn's answer joins its hold (a WebSocket turn's, its message's): a JSON
// answer as it is read (readAnswer), relayed unkept when no room comes for
// it; a stream's event as it is read (eventReader, or an upstream socket's
// message, socketMessages) and its output as the
// relay keeps it (collector), while the room has them; when it does not,
// an event goes on as it arrives, unread, and the turn is relayed unkept
// when the event held output or the end (collector.see);
// to a WebSocket client, in the frames of the event's message
// (socketWriter).
//
// A body holds its weight: twice its bytes, for the body and one full
// copy of it (the message a WebSocket upstream is sent), and 80 bytes an
// input item, a bound on what the parse keeps for each whatever its size
// (76 measured when a request also kept a slice of each item). A
// multiple of the bytes alone would not do: the parse keeps several times
// a body of 30-byte items, and many times one of {} items. The bytes are
// held as the body arrives, a read step ahead, so that a body that claims
// a large length and sends little holds little; its items, counted at
// most (itemsIn: by its commas, or those outside its strings when its
// strings hold many), once it is in, before the parse makes them. After
// the parse the weight is exact. A 31 MB body of 1 M small items
// weighs 142 MB; one that is a single 30 MB string, 60 MB.
//
// A WebSocket message weighs twice the body it stands for, once it is in:
// the message, its items and that body live beside the body its turn
// reads and parses, which the message's hold covers. While it arrives it
// holds its bytes as a body does. One the connection expands into the
// whole conversation (it continues its latest response) then holds the
// expanded body's weight too, as a request's.
const (
	defaultMaxBytesInFlight = 256 << 20
	// bodyCopies is how many times a body's bytes count.
	bodyCopies = 2
	// itemBytes is what an input item counts for.
	itemBytes = 80
	// budgetWait bounds how long a request waits for room, each time.
	budgetWait = time.Second
	// readStep is the first step a body is read by, each step held before
	// it is read (stepReader); messageStep, a WebSocket message's, which
	// tells no length before it arrives: a small one needs little room.
	readStep    = 64 << 10
	messageStep = 4 << 10
)

// weight is what a body of n bytes with items input items holds.
func weight(n, items int64) int64 { return bodyCopies*n + itemBytes*items }

// itemsAtMost bounds the input items of a body of n bytes with commas
// commas before it is parsed: each item but the first follows a comma,
// and an item and its comma take two bytes at least.
func itemsAtMost(n, commas int64) int64 { return min(commas+1, (n+1)/2) }

// itemsIn bounds the input items of body, whose commas are counted, for a
// hold h that grows by more(items) to hold them: by its commas when that
// fits the room now, else by its commas outside strings, a pass over the
// body that only a body whose strings hold many commas (CSV, code) needs.
func itemsIn(h *hold, body []byte, commas int64, more func(items int64) int64) int64 {
	n := int64(len(body))
	items := itemsAtMost(n, commas)
	if h.b != nil && !h.b.room(h.n, more(items)) {
		items = itemsAtMost(n, commasOutsideStrings(body))
	}
	return items
}

// commasOutsideStrings counts the commas of JSON text b that are not
// inside a string.
func commasOutsideStrings(b []byte) int64 {
	var n int64
	for {
		q := bytes.IndexByte(b, '"')
		if q < 0 {
			return n + int64(bytes.Count(b, []byte{','}))
		}
		n += int64(bytes.Count(b[:q], []byte{','}))
		b = b[q+1:]
		for { // to the string's closing quote: one after an even run of backslashes
			e := bytes.IndexByte(b, '"')
			if e < 0 {
				return n
			}
			k := e
			for k > 0 && b[k-1] == '\\' {
				k--
			}
			b = b[e+1:]
			if (e-k)%2 == 0 {
				break
			}
		}
	}
}

var (
	// errOverBudget refuses a request that weighs more than the whole
	// budget: it could never be served.
	errOverBudget = errors.New("proxy: the request weighs more than the whole budget")
	// errBusy refuses a request that found no room within budgetWait.
	errBusy = errors.New("proxy: no room in the budget")
	// errPreempted stops a body that was still arriving when a request
	// found no room (budget.preempt); it is answered as errBusy is.
	errPreempted = fmt.Errorf("%w: the body was still arriving", errBusy)
)

// budget is the memory the requests in flight may hold. A request that
// fits the room gets in at once, whoever waits: a waiter gives up after
// budgetWait anyway, so no order among waiters is kept. A request that
// finds no room stops the bodies that arrive slowly (arrival.slow), as it
// begins to wait and while it waits (await): clients that send part of a
// body and then a byte now and then may not keep the room from the
// others.
type budget struct {
	size     int64
	mu       sync.Mutex
	cur      int64
	changed  chan struct{} // closed and replaced at each release
	arriving map[*arrival]struct{}
	claimed  int64 // see claim
}

// claimShare bounds the memory taken at once for bodies still arriving
// (claim): a share of the budget's size.
const claimShare = 4

// claim takes n bytes, a body's declared length, from the room for the
// bodies allocated at once, before their bytes arrive; false when it is
// used up (the body then grows as it arrives). A body holds its bytes as
// they arrive, claimed or not: the claims bound the memory allocated
// beyond, which a client that claims much and sends little would take.
func (b *budget) claim(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.claimed+n > b.size/claimShare {
		return false
	}
	b.claimed += n
	return true
}

func (b *budget) unclaim(n int64) {
	b.mu.Lock()
	b.claimed -= n
	b.mu.Unlock()
}

func newBudget(size int64) *budget {
	return &budget{size: size, changed: make(chan struct{}), arriving: map[*arrival]struct{}{}}
}

// A request that finds no room stops the bodies that have been arriving
// for preemptAfter or more and now arrive slowly: no byte for
// preemptAfter, or less than slowRate bytes a second over the last
// preemptAfter, the waits for room left out. Those are clients that send
// part of a body and then a byte now and then, not uploads that move.
const (
	preemptAfter = budgetWait
	slowRate     = 64 << 10
)

// An arrival is a body or a WebSocket message still arriving.
type arrival struct {
	since   time.Time
	stop    func() // ends the read in progress, if any
	stopped atomic.Bool
	waiting atomic.Bool // for room: its slowness is the budget's
	// The times are Unix nanoseconds: of the last read that got bytes,
	// and of the start of the window whose bytes are counted; rate is the
	// last whole window's bytes a second, -1 before one.
	last, from, bytes, rate atomic.Int64
}

func newArrival(stop func()) *arrival {
	a := &arrival{since: time.Now(), stop: stop}
	a.restart()
	a.rate.Store(-1)
	return a
}

// got counts n bytes arrived.
func (a *arrival) got(n int64) {
	if n <= 0 {
		return
	}
	now := time.Now().UnixNano()
	a.last.Store(now)
	b := a.bytes.Add(n)
	if took := now - a.from.Load(); took >= int64(preemptAfter) {
		a.rate.Store(b * int64(time.Second) / took)
		a.from.Store(now)
		a.bytes.Store(0)
	}
}

// restart starts the counts afresh: after a wait for room, during which
// nothing was read.
func (a *arrival) restart() {
	now := time.Now().UnixNano()
	a.last.Store(now)
	a.from.Store(now)
	a.bytes.Store(0)
}

// slow reports whether a may be stopped for a request that finds no room.
func (a *arrival) slow(now time.Time) bool {
	if a.waiting.Load() || now.Sub(a.since) < preemptAfter {
		return false
	}
	if now.UnixNano()-a.last.Load() >= int64(preemptAfter) {
		return true // no byte for that long
	}
	r := a.rate.Load()
	return r >= 0 && r < slowRate
}

// arrive registers a body that begins to arrive, which stop ends the reads
// of; arrived unregisters it.
func (b *budget) arrive(stop func()) *arrival {
	a := newArrival(stop)
	b.mu.Lock()
	b.arriving[a] = struct{}{}
	b.mu.Unlock()
	return a
}

func (b *budget) arrived(a *arrival) {
	b.mu.Lock()
	delete(b.arriving, a)
	b.mu.Unlock()
}

// preempt stops the bodies, but self, that arrive slowly (arrival.slow).
func (b *budget) preempt(self *arrival) {
	var stop []*arrival
	now := time.Now()
	b.mu.Lock()
	for a := range b.arriving {
		if a != self && a.slow(now) {
			delete(b.arriving, a)
			stop = append(stop, a)
		}
	}
	b.mu.Unlock()
	for _, a := range stop {
		a.stopped.Store(true)
		a.stop()
	}
}

// room tells whether a hold of held could grow by n now: within the
// whole budget, and the room left.
func (b *budget) room(held, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return held+n <= b.size && b.size-b.cur >= n
}

// tryAcquire takes n if it fits the room.
func (b *budget) tryAcquire(n int64) (bool, chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.size-b.cur >= n {
		b.cur += n
		return true, nil
	}
	return false, b.changed
}

// acquire takes n once it fits, or fails when ctx ends.
func (b *budget) acquire(ctx context.Context, n int64) error {
	for {
		ok, changed := b.tryAcquire(n)
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives n back and wakes the waiters.
func (b *budget) release(n int64) {
	b.mu.Lock()
	b.cur -= n
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// hold is what one request holds of a budget; one without a budget holds
// nothing (a WebSocket turn, whose message holds its weight). It is not
// safe for concurrent use.
type hold struct {
	b *budget
	n int64
	// arrival is the request's body while it arrives, which its own waits
	// do not stop; nil when none.
	arrival *arrival
}

// grow adds n to the hold, waiting for room for budgetWait at most. It
// returns errOverBudget when the hold would exceed the whole budget,
// errBusy when no room came in time, and ctx's error when ctx ended
// first.
func (h *hold) grow(ctx context.Context, n int64) error {
	switch {
	case h.b == nil || n <= 0:
		return nil
	case h.n+n > h.b.size:
		return errOverBudget
	}
	if ok, _ := h.b.tryAcquire(n); !ok {
		if a := h.arrival; a != nil {
			a.waiting.Store(true)
			defer func() { a.restart(); a.waiting.Store(false) }()
		}
		if err := h.b.await(ctx, h.arrival, n); err != nil {
			return err
		}
	}
	h.n += n
	return nil
}

// await takes n once it fits, for budgetWait at most, stopping the bodies
// but self that arrive slowly (preempt) as it begins and every
// preemptEvery meanwhile: a body may become slow while a request waits.
// It returns errBusy when no room came in time, and ctx's error when ctx
// ended first.
func (b *budget) await(ctx context.Context, self *arrival, n int64) error {
	wctx, cancel := context.WithTimeout(ctx, budgetWait)
	defer cancel()
	for {
		b.preempt(self)
		pctx, pcancel := context.WithTimeout(wctx, preemptEvery)
		err := b.acquire(pctx, n)
		pcancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return errBusy
		}
	}
}

// preemptEvery is how often a request waiting for room looks again for
// bodies that arrive slowly.
const preemptEvery = 100 * time.Millisecond

// force adds n to the hold whether it fits or not: memory already taken,
// such as an upstream's answer kept for a client that reads it slowly,
// which the requests after it find the budget short of (a nil hold, or
// one without a budget, holds nothing).
func (h *hold) force(n int64) {
	if h == nil || h.b == nil || n <= 0 {
		return
	}
	h.b.mu.Lock()
	h.b.cur += n
	h.b.mu.Unlock()
	h.n += n
}

// take adds n to the hold if the room has it now, within the whole
// budget; false when it does not (a nil hold, or one without a budget,
// takes anything and holds nothing).
func (h *hold) take(n int64) bool {
	if h == nil || h.b == nil || n <= 0 {
		return true
	}
	if h.n+n > h.b.size {
		return false
	}
	if ok, _ := h.b.tryAcquire(n); !ok {
		return false
	}
	h.n += n
	return true
}

// trim gives back what the hold has beyond n; a nil hold, or one without
// a budget, holds nothing.
func (h *hold) trim(n int64) {
	if h != nil && h.b != nil && h.n > n {
		h.b.release(h.n - n)
		h.n = n
	}
}

// giveBack gives back n of the hold, or what it has when that is less: a
// part of it that went on with the rest (pass). A nil hold holds nothing.
func (h *hold) giveBack(n int64) {
	if h != nil {
		h.trim(max(0, h.n-n))
	}
}

// release gives back the whole hold.
func (h *hold) release() { h.trim(0) }

// join moves what o holds into h, a hold on the same budget; nil holds
// hold nothing.
func (h *hold) join(o *hold) {
	if h != nil && o != nil {
		h.n += o.n
		o.n = 0
	}
}

// pass returns a hold of what h holds, which h then no longer does: for
// whoever keeps the request's memory after its handler.
func (h *hold) pass() *hold {
	k := *h
	h.n = 0
	return &k
}

// stepReader reads a body, holding each step of it before it reads it;
// the steps grow with the body.
type stepReader struct {
	ctx   context.Context
	r     io.Reader
	h     *hold
	limit int64 // the most the body may hold: its declared length, or MaxBodyBytes
	first int64 // the first step: readStep when 0
	free  int64 // bytes held and not yet read
	read  int64
}

func (s *stepReader) Read(p []byte) (int, error) {
	a := s.h.arrival
	if a != nil && a.stopped.Load() {
		return 0, errPreempted
	}
	if s.free == 0 {
		// A step as long as what has arrived, the first step at least:
		// few reads for a large body, and what is held ahead stays
		// within what came; no further than the limit, nor than the
		// whole budget could hold.
		step := min(max(cmp.Or(s.first, readStep), s.read), s.limit-s.read)
		if s.h.b != nil {
			step = min(step, (s.h.b.size-s.h.n)/bodyCopies)
		}
		if step <= 0 {
			// Nothing more could be held: the body must end here. A
			// byte read unheld tells, and is dropped.
			n, err := s.r.Read(p[:min(len(p), 1)])
			if n > 0 {
				return 0, errOverBudget
			}
			return 0, err
		}
		if err := s.h.grow(s.ctx, weight(step, 0)); err != nil {
			return 0, err
		}
		s.free = step
	}
	n, err := s.r.Read(p[:min(int64(len(p)), s.free)])
	s.free -= int64(n)
	s.read += int64(n)
	if a != nil {
		a.got(int64(n))
		if err != nil && err != io.EOF && a.stopped.Load() {
			err = errPreempted
		}
	}
	return n, err
}

// socketTurn keys the context of a WebSocket turn's request: its
// message's hold covers it. Its value is a socketTurnOf.
type socketTurn struct{}

// socketTurnOf is what a WebSocket turn's request carries of its message.
type socketTurnOf struct {
	// prepended is the number of items the connection put before the
	// message's own (its latest response's input and output), 0 when it
	// put none.
	prepended int
	// held is the message's hold, which what the relay keeps of the
	// turn's answer joins.
	held *hold
}

// readTurn reads and parses a turn's body, bounded by MaxBodyBytes, and
// holds its weight, its bytes as they arrive and its items counted at
// most once it is in, until the caller releases it. Under NoContinuation
// the input is not read (Store.SkimRequest). An invalid body gives an
// error wrapping fingerprint.ErrInvalidRequest; the others are the
// budget's and the read's.
func (p *Proxy) readTurn(w http.ResponseWriter, r *http.Request) (*fingerprint.Request, *hold, error) {
	n := r.ContentLength
	if n == 0 && r.Body != nil && r.Body != http.NoBody {
		n = -1 // a request made in the process without its length
	}
	ctx := r.Context()
	h := &hold{b: p.budget}
	if ctx.Value(socketTurn{}) != nil {
		h.b = nil
	}
	var in io.Reader = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
	if codings, _ := bodyCodings(r.Header); len(codings) > 0 {
		// Read decoded, within MaxBodyBytes, and sent upstream so
		// (encoding.go); its decoded length is unknown.
		d := &decoder{body: in, codings: codings, hold: func(n int64) error { return h.grow(ctx, n) }}
		defer d.Close()
		in, n = http.MaxBytesReader(w, d, p.cfg.MaxBodyBytes), -1
		r.Header.Del("Content-Encoding")
	}
	// alloc is what ReadRequest allocates at once (-1: it grows as the body
	// arrives); settle runs once the body is in, or its reading has failed.
	alloc := n
	settle := func(in bool) {}
	if h.b != nil {
		poke := &poker{rc: http.NewResponseController(w), stop: make(chan struct{}), exited: make(chan struct{})}
		h.arrival = h.b.arrive(poke.start)
		claimed := int64(0)
		if n > readStep {
			if h.b.claim(n) {
				claimed = n
			} else {
				alloc = -1
			}
		}
		settled := false
		settle = func(in bool) {
			if !settled {
				settled = true
				h.b.arrived(h.arrival)
				poke.end(in)
				h.b.unclaim(claimed)
			}
		}
		defer settle(false)
	}
	err := h.grow(ctx, itemBytes) // the first item, which follows no comma
	switch {
	case err != nil:
	case h.b != nil && weight(n, 0) > h.b.size:
		err = errOverBudget // it could never fit: refused unread
	default:
		// Held as it arrives: a body that claims many bytes and sends few
		// holds few.
		limit := n
		if limit < 0 {
			limit = p.cfg.MaxBodyBytes
		}
		in = &stepReader{ctx: ctx, r: in, h: h, limit: limit}
	}
	var req *fingerprint.Request
	if err == nil {
		cr := &commaReader{ctx: ctx, r: in, h: h, size: n, in: func() { settle(true) }}
		if p.cfg.NoContinuation {
			req, err = skimRequest(p.cfg.Store, cr, int(n))
		} else {
			req, err = p.cfg.Store.ReadRequest(cr, int(alloc))
		}
		if errors.Is(err, fingerprint.ErrInvalidRequest) && cr.body != nil {
			return nil, nil, &unparsed{body: cr.body, hold: h, err: err}
		}
	}
	if err != nil {
		h.release()
		return nil, nil, err
	}
	return req, h, nil
}

// unparsed is readTurn's error for a body that is in but the fingerprint
// refused (fingerprint.ErrInvalidRequest): the body, still held in the
// budget until its hold is released.
type unparsed struct {
	body []byte
	hold *hold
	err  error
}

func (u *unparsed) Error() string { return u.err.Error() }
func (u *unparsed) Unwrap() error { return u.err }

// A poker ends the reads of a request's body, one in progress or to come,
// once the budget stops the body (start), until the body is in or its
// reading has failed (end): it sets the connection's read deadline to
// now, again and again, since whoever reads the body may move the
// deadline on at each read.
type poker struct {
	rc           *http.ResponseController
	mu           sync.Mutex
	started      bool
	ended        bool
	stop, exited chan struct{}
}

// pokeEvery is how often a poker ends a body's reads.
const pokeEvery = 20 * time.Millisecond

func (p *poker) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended || p.started {
		return
	}
	p.started = true
	go func() {
		defer close(p.exited)
		t := time.NewTicker(pokeEvery)
		defer t.Stop()
		for {
			if p.rc.SetReadDeadline(time.Now()) != nil {
				return
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// end stops the pokes; once the body is in, the connection then has no
// read deadline, as it has after a body read to its end.
func (p *poker) end(in bool) {
	p.mu.Lock()
	started := p.started && !p.ended
	p.ended = true
	p.mu.Unlock()
	if started {
		close(p.stop)
		<-p.exited
		if in {
			_ = p.rc.SetReadDeadline(time.Time{})
		}
	}
}

// skimRequest reads a body of n bytes (-1 when unknown) from r and skims
// it (Store.SkimRequest). Its memory grows as it arrives.
func skimRequest(st *store.Store, cr *commaReader, n int) (*fingerprint.Request, error) {
	var r io.Reader = cr
	if n >= 0 {
		r = io.LimitReader(r, int64(n))
	}
	body, err := io.ReadAll(r)
	if err == nil && len(body) < n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, err
	}
	cr.body = body
	return st.SkimRequest(body)
}

// commaReader counts a body's bytes and commas as it is read and, once
// the body is in (fingerprint.BodyChecker), holds its items counted at
// most (itemsIn), the first held already: before the parse makes them,
// and not while a body that sends little arrives.
type commaReader struct {
	ctx          context.Context
	r            io.Reader
	h            *hold
	size         int64 // the body's length, -1 when unknown
	read, commas int64
	held         bool
	in           func() // called once the body is in, before its items are held
	body         []byte // the body, once it is in
}

func (c *commaReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	c.commas += int64(bytes.Count(p[:n], []byte{','}))
	if !c.held && (err == io.EOF || (c.size >= 0 && c.read >= c.size)) {
		c.held = true
		c.in()
		c.h.trim(weight(c.read, 1)) // the read step held ahead and not read
	}
	return n, err
}

// CheckBody holds the items of body, which is in, and keeps it for a
// parse that refuses it (unparsed).
func (c *commaReader) CheckBody(body []byte) error {
	c.body = body
	more := func(items int64) int64 { return itemBytes * (items - 1) }
	return c.h.grow(c.ctx, more(itemsIn(c.h, body, c.commas, more)))
}

// readMessage reads a client's WebSocket message that has begun, from
// r, whose reads stall ends (the connection is then closed): its bytes
// held as they arrive, as a body's are, each read waiting at most
// MessageTimeout for bytes, and once it is in, its weight, twice its
// body's, its items counted at most. A message the budget refuses is read
// to its end and dropped, so that the connection goes on; the refusal is
// hold.grow's error, with a nil message.
func (p *Proxy) readMessage(ctx context.Context, stall context.CancelFunc, r io.Reader) ([]byte, *hold, error) {
	gap := time.AfterFunc(p.cfg.MessageTimeout, stall)
	defer gap.Stop()
	in := &gapReader{r: r, gap: gap, timeout: p.cfg.MessageTimeout}
	h := &hold{b: p.budget, arrival: p.budget.arrive(stall)}
	defer p.budget.arrived(h.arrival)
	data, err := io.ReadAll(&stepReader{ctx: ctx, r: in, h: h, limit: p.cfg.MaxBodyBytes, first: messageStep})
	if err == nil {
		p.budget.arrived(h.arrival) // in: no longer stopped
		n := int64(len(data))
		more := func(items int64) int64 { return 2*weight(n, items) - h.n }
		w := 2 * weight(n, itemsIn(h, data, int64(bytes.Count(data, []byte{','})), more))
		if err = h.grow(ctx, w-h.n); err == nil {
			h.trim(w) // what was held ahead and not read
		}
	}
	if errors.Is(err, errBusy) || errors.Is(err, errOverBudget) {
		h.release()
		if _, derr := io.Copy(io.Discard, in); derr != nil {
			return nil, nil, derr
		}
		return nil, nil, err
	}
	if err != nil {
		h.release()
		return nil, nil, err
	}
	return data, h, nil
}

// gapRead is the most a gapReader asks for in one read: a message must
// move that much within each MessageTimeout.
const gapRead = 64 << 10

// gapReader reads r, giving gap, which ends the reads when it fires,
// timeout more each time gapRead bytes came since it last did: a message
// fed a byte a frame moves no faster for its many frames.
type gapReader struct {
	r       io.Reader
	gap     *time.Timer
	timeout time.Duration
	came    int // bytes since the gap was last given more time
}

func (g *gapReader) Read(p []byte) (int, error) {
	n, err := g.r.Read(p[:min(len(p), gapRead)])
	if g.came += n; g.came >= gapRead {
		g.gap.Reset(g.timeout)
		g.came = 0
	}
	return n, err
}

// refusal is the answer to a request the budget refused (errBusy or
// errOverBudget): an error's status, type, code and message.
type refusal struct {
	status             int
	typ, code, message string
}

// refusal returns the answer to a request refused with err, counting a
// refusal for want of room.
func (p *Proxy) refusal(err error) refusal {
	if !errors.Is(err, errBusy) {
		return refusal{http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
			fmt.Sprintf("The request is larger than this gateway serves: it would hold more than %d bytes of memory.", p.budget.size)}
	}
	p.stats.add(cRefusedBusy, 1)
	// 503, as OpenAI's API answers when it is overloaded ("The engine is
	// currently overloaded", "Slow Down"): the gateway as a whole is full,
	// which a retry after a moment passes; 429 would tell the client that
	// it went over its own rate or quota. The SDKs retry both.
	return refusal{http.StatusServiceUnavailable, "server_error", "server_busy",
		"The gateway holds as many large requests as it can at once. Retry after a moment."}
}

// refuseBody answers a turn whose body could not be read and held.
func (p *Proxy) refuseBody(w http.ResponseWriter, err error) {
	over, isOver := errors.AsType[*http.MaxBytesError](err)
	switch {
	case isOver:
		p.tooLarge(w, over.Limit)
	case errors.Is(err, errBusy), errors.Is(err, errOverBudget):
		rf := p.refusal(err)
		if rf.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, rf.status, rf.typ, "", rf.code, rf.message)
	default:
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "Reading the request body: "+err.Error())
	}
}
