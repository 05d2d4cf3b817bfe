package proxy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/internal/route"
	"github.com/contstore/contstore/store"
)

// Forwarding hands a turn whose continuation lives on another replica's
// upstream socket (the WebSocket mode with store=false) to that replica,
// which sends it on that socket and streams the upstream's events back.
// The turn is reserved, recorded or aborted once, by the replica the
// client reached; the origin only carries it. One hop at most: a forwarded
// turn is never forwarded again.
//
// A forwarded turn runs on one replica only, however slow the replicas'
// network, by a three-way handshake. The origin accepts it by answering
// 200 with its event stream's headers once it holds the socket, before
// anything goes upstream, and only while at least acceptMargin (or half
// the time left when the forward arrived) is left of the acceptance
// deadline the forward carries (Timeout after it was sent); past that it
// refuses. The forwarding replica then sends the request body's last byte,
// the go, only if the acceptance reached it within Timeout; the origin
// runs the turn only once the go reaches it, within Timeout of accepting,
// and says which in the stream's first event. Refused, unknown to the
// directory, silent until the deadline or without the go, the origin runs
// nothing, and the turn is served here with the full context; told to go,
// the turn is the origin's, and this replica relays its events for as long
// as the upstream timeout allows. A forward whose first event never comes
// after the go may have run: the turn fails (502) rather than run twice.
// An origin that loses the upstream after it began cuts its stream, which
// reaches the client as a cut stream.
//
// Replicas authenticate forwarded turns with Secret: the Contproxy-Forward
// header carries a timestamp, the acceptance deadline, the socket, the
// previous response id and an HMAC-SHA256 over them and the body. A request whose header is missing a
// part, is older than MaxSkew, or whose HMAC is wrong is refused (403) and
// runs nothing; a client cannot make a replica send anything on a socket
// without the secret.
type Forwarding struct {
	// Directory tells where the replicas are; every replica announces
	// itself there (directory.Directory.Run). Required.
	Directory *directory.Directory
	// Secret is shared by the replicas: at least 32 bytes. Required.
	Secret []byte
	// Timeout bounds the origin's acceptance, its answer headers as they
	// reach the forwarding replica, and the origin's wait for the go.
	// Default 2s.
	Timeout time.Duration
	// MaxSkew is how old a forwarded request may be. Default 30s.
	MaxSkew time.Duration
	// Client sends forwarded turns. When nil, a client whose transport
	// has Timeout as its response header timeout and keeps up to 512 idle
	// connections to each replica (2,048 in all) for 90 seconds, so that
	// concurrent forwards reuse their connections rather than dial again
	// (Go's default keeps 2 a host).
	Client *http.Client
}

// defaultForwardTimeout is Forwarding.Timeout's default.
const defaultForwardTimeout = 2 * time.Second

// forwardHeader carries a forwarded turn's authentication.
const forwardHeader = "Contproxy-Forward"

// originHeader names the replica that ran a forwarded turn, in its answer
// to the replica that forwarded it, which names it to its client
// (Config.RoutingHeader): its store knows the origin only by a reference.
const originHeader = "Contproxy-Origin"

// acceptMargin is how much of a forward's acceptance deadline the origin
// must have left to accept it (at most half of what was left when the
// forward arrived): the time its answer headers may take to reach the
// replica that waits for them.
const acceptMargin = 250 * time.Millisecond

// defaultRoutingHeader names the replica holding a turn's socket in
// answers.
const defaultRoutingHeader = "Contproxy-Replica"

// check validates f and fills its defaults.
func (f *Forwarding) check() error {
	switch {
	case f.Directory == nil:
		return fmt.Errorf("%w: Forwarding.Directory is nil", ErrInvalidConfig)
	case len(f.Secret) < 32:
		return fmt.Errorf("%w: Forwarding.Secret has %d bytes, want at least 32", ErrInvalidConfig, len(f.Secret))
	case f.Timeout < 0 || f.MaxSkew < 0:
		return fmt.Errorf("%w: negative Forwarding.Timeout %v or MaxSkew %v", ErrInvalidConfig, f.Timeout, f.MaxSkew)
	}
	if f.Timeout == 0 {
		f.Timeout = defaultForwardTimeout
	}
	if f.MaxSkew == 0 {
		f.MaxSkew = 30 * time.Second
	}
	if f.Client == nil {
		tr := newTransport()
		tr.ResponseHeaderTimeout = f.Timeout
		f.Client = newClient(tr)
	}
	return nil
}

// sign returns the HMAC of a forwarded turn.
func (f *Forwarding) sign(ts, by int64, socket uint64, prev string, body []byte) string {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, f.Secret)
	fmt.Fprintf(m, "contproxy-forward-v3\n%d\n%d\n%d\n%s\n%x", ts, by, socket, prev, sum)
	return hex.EncodeToString(m.Sum(nil))
}

// header returns the Contproxy-Forward value of a turn sent now, to be
// accepted before by.
func (f *Forwarding) header(now, by time.Time, socket uint64, prev string, body []byte) string {
	ts, ms := now.Unix(), by.UnixMilli()
	return fmt.Sprintf("t=%d, by=%d, socket=%d, prev=%s, sig=%s", ts, ms, socket, prev, f.sign(ts, ms, socket, prev, body))
}

// forward is what a verified Contproxy-Forward value names.
type forward struct {
	socket uint64
	prev   string
	by     time.Time // the acceptance deadline
}

// verify checks a Contproxy-Forward value and returns what it names.
func (f *Forwarding) verify(now time.Time, value string, body []byte) (forward, error) {
	parts := map[string]string{}
	for _, kv := range strings.Split(value, ", ") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return forward{}, fmt.Errorf("malformed %s header", forwardHeader)
		}
		parts[k] = v
	}
	ts, err1 := strconv.ParseInt(parts["t"], 10, 64)
	by, err2 := strconv.ParseInt(parts["by"], 10, 64)
	socket, err3 := strconv.ParseUint(parts["socket"], 10, 64)
	prev, sig := parts["prev"], parts["sig"]
	if err1 != nil || err2 != nil || err3 != nil || socket == 0 || prev == "" || sig == "" || len(parts) != 5 {
		return forward{}, fmt.Errorf("malformed %s header", forwardHeader)
	}
	if age := now.Sub(time.Unix(ts, 0)); age > f.MaxSkew || age < -f.MaxSkew {
		return forward{}, fmt.Errorf("stale %s header (%v old)", forwardHeader, age.Round(time.Second))
	}
	if !hmac.Equal([]byte(sig), []byte(f.sign(ts, by, socket, prev, body))) {
		return forward{}, fmt.Errorf("wrong %s signature", forwardHeader)
	}
	return forward{socket: socket, prev: prev, by: time.UnixMilli(by)}, nil
}

// forwardConn carries a turn to the replica holding its socket.
type forwardConn struct {
	f      *Forwarding
	addr   string
	origin store.Socket
	prev   string
	tg     *target
	// name is the origin's name, as its answer gives it (originHeader).
	name string
}

// forwardTarget returns the connection that hands tg to its origin
// replica, when the route policy forwards it, or nil when the turn is
// served here.
func (p *Proxy) forwardTarget(ctx context.Context, tg *target) *forwardConn {
	f := p.cfg.Forwarding
	if f == nil || route.Decide(tg.offer(p.replica, true, false)) != route.Forward {
		return nil
	}
	addr, err := f.Directory.Lookup(ctx, tg.want.Replica)
	if err != nil {
		p.warns.warn(p.cfg.Logger, "directory lookup failed; serving here", "replica", tg.want.Replica, "err", err)
		return nil
	}
	if addr == "" {
		return nil // the origin is gone: its sockets with it
	}
	return &forwardConn{f: f, addr: addr, origin: tg.want, prev: tg.prev, tg: tg}
}

func (c *forwardConn) continues(res *store.Reservation) bool { return res.Continues() }

func (c *forwardConn) socket() store.Socket { return c.origin }

func (c *forwardConn) release() {}

func (c *forwardConn) send(ctx context.Context, body []byte, _ bool) (*reply, error) {
	// The client's query goes with it: the socket's handshake carried it.
	req, err := newPost(ctx, withQuery("http://"+c.addr+"/v1/responses", c.tg.query), c.tg.header, nil)
	if err != nil {
		return nil, err
	}
	// The body, then the go once the origin accepted in time. The
	// transport closes the body when it is done with it, even on an
	// error, which ends a write of the go that nothing will read.
	gate, gated := io.Pipe()
	req.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), gate), gate}
	req.ContentLength = int64(len(body)) + 1
	now := time.Now()
	req.Header.Set(forwardHeader, c.f.header(now, now.Add(c.f.Timeout), c.origin.ID, c.prev, body))
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := c.f.Client.Do(req)
		answered <- answer{resp, err}
	}()
	late := time.NewTimer(c.f.Timeout)
	defer late.Stop()
	var a answer
	got := false // the answer, or Do's error
	select {
	case a = <-answered:
		got = true
	case <-late.C:
		a.err = fmt.Errorf("no acceptance within %v", c.f.Timeout)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err == nil && (a.resp.StatusCode != http.StatusOK || !isEventStream(a.resp.Header)) {
		b, _ := io.ReadAll(io.LimitReader(a.resp.Body, 4096))
		_ = a.resp.Body.Close()
		a.err = fmt.Errorf("refused the turn: %d %s", a.resp.StatusCode, gjson.GetBytes(b, "error.message").String())
	}
	if a.err != nil {
		// No go: the origin runs nothing.
		gated.CloseWithError(errNoGo)
		if !got {
			go func() {
				if a := <-answered; a.resp != nil {
					_ = a.resp.Body.Close()
				}
			}()
		}
		return nil, fmt.Errorf("forwarding to %s at %s: %w", c.origin.Replica, c.addr, a.err)
	}
	_, err = gated.Write([]byte{forwardGo})
	_ = gated.Close()
	rep := eventReply(a.resp)
	rep.socket = true // the holder's socket's events
	if err != nil {
		rep.close()
		return nil, fmt.Errorf("%w: sending the go to %s: %v", errForwardLost, c.origin.Replica, err)
	}
	// The first event says whether the go arrived in time.
	ev, err := rep.next()
	switch {
	case err != nil:
		rep.close()
		return nil, fmt.Errorf("%w: %s: %v", errForwardLost, c.origin.Replica, err)
	case ev.typ != forwardEvent:
		rep.close()
		return nil, fmt.Errorf("%w: %s began with %q", errForwardLost, c.origin.Replica, ev.typ)
	case !gjson.GetBytes(ev.data, "carried").Bool():
		rep.close()
		return nil, fmt.Errorf("replica %s had no go in time", c.origin.Replica)
	}
	c.name = a.resp.Header.Get(originHeader)
	a.resp.Header.Del(originHeader)
	return rep, nil
}

// The handshake's last steps: the go, the forwarded request body's last
// byte, and the origin's first event, which says whether it carries the
// turn (data {"type":"contproxy.forward","carried":true|false}).
const (
	forwardGo    = 'g'
	forwardEvent = "contproxy.forward"
)

var (
	// errNoGo ends a forwarded request's body without the go.
	errNoGo = errors.New("proxy: the forward was not accepted in time")
	// errForwardLost is wrapped by the error of a forward that was told
	// to go and whose answer broke off before it said whether it ran: the
	// turn may have run there, so it is not run here.
	errForwardLost = errors.New("proxy: a forwarded turn's outcome was lost")
)

// splitGo makes r, a forwarded turn, a request whose body is the turn's,
// and returns the rest of the body, which holds the go, and drain, to run
// once the request is served. The answer goes before the go is read (full
// duplex): a refusal at once, not once the go, which will not come, would
// have been read. Then Go's server reads no more of the body, so drain
// does: it reads what is left, the go of a turn refused or not carried,
// once the answer is out, for as long as the forwarding replica may take
// to end the request; a connection is kept for the next request only once
// its body was read to its end.
func (p *Proxy) splitGo(w http.ResponseWriter, r *http.Request) (goes io.Reader, drain func()) {
	goes = r.Body
	if r.ContentLength > 0 {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(r.Body, r.ContentLength-1), r.Body}
		r.ContentLength--
	}
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	return goes, func() {
		_ = rc.Flush()
		wait := defaultForwardTimeout
		if f := p.cfg.Forwarding; f != nil {
			wait = f.Timeout
		}
		_ = rc.SetReadDeadline(time.Now().Add(wait))
		_, _ = io.Copy(io.Discard, io.LimitReader(goes, maxForwardDrain))
		_ = rc.SetReadDeadline(time.Time{})
	}
}

// maxForwardDrain bounds what splitGo's drain reads: past it the connection
// is closed, as Go's server does with a large body its handler left.
const maxForwardDrain = 256 << 10

// serveForwarded runs a turn another replica handed over: on the socket it
// names, only while that socket holds the response it continues, its
// events streamed back as they come, held in h, the body's hold, as they
// are read.
func (p *Proxy) serveForwarded(w http.ResponseWriter, r *http.Request, req *fingerprint.Request, h *hold, goes io.Reader) {
	body := req.Body()
	f := p.cfg.Forwarding
	fw, err := f.verify(time.Now(), r.Header.Get(forwardHeader), body)
	if err != nil {
		writeError(w, http.StatusForbidden, "invalid_request_error", "", "forward_refused", err.Error())
		return
	}
	tg := &target{header: r.Header, query: r.URL.RawQuery, stores: rawMember(req, "store") != "false",
		want: store.Socket{Replica: p.replica, ID: fw.socket}, prev: fw.prev, forwarded: true}
	arrived := time.Now()
	accept := fw.by.Add(-min(acceptMargin, fw.by.Sub(arrived)/2))
	actx, cancel := context.WithDeadline(r.Context(), accept)
	c, err := p.cfg.Upstream.acquire(actx, tg)
	cancel()
	if err == nil && !time.Now().Before(accept) {
		c.release()
		err = fmt.Errorf("too late to accept: the deadline is %v", fw.by.Format(time.RFC3339Nano))
	}
	if err != nil {
		writeError(w, http.StatusConflict, "invalid_request_error", "", "forward_refused", err.Error())
		return
	}
	defer c.release()
	// Accepted: the turn runs here once the go comes, and its outcome
	// travels in the stream.
	rc := http.NewResponseController(w) // full duplex (splitGo): the go is read after the answer's headers
	w.Header().Set(originHeader, p.replica)
	startEvents(w, http.StatusOK)
	_ = rc.Flush()
	_ = rc.SetReadDeadline(time.Now().Add(f.Timeout))
	var got [1]byte
	_, err = io.ReadFull(goes, got[:])
	_ = rc.SetReadDeadline(time.Time{})
	carried := err == nil && got[0] == forwardGo
	writeEvent(w, forwardEvent, fmt.Appendf(nil, `{"type":%q,"carried":%t}`, forwardEvent, carried))
	_ = rc.Flush()
	if !carried {
		p.cfg.Logger.Debug("forwarded turn: no go; ran nothing", "err", err)
		return
	}
	p.stats.add(cForwardedIn, 1)
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	defer cancel()
	rep, err := c.send(ctx, body, true)
	if err != nil {
		if r.Context().Err() != nil {
			p.cfg.Logger.Debug("forwarded turn: the forwarding replica went away", "err", err)
		} else {
			p.warns.warn(p.cfg.Logger, "forwarded turn: upstream request failed; cutting the stream", "err", err)
		}
		cutStream(w)
		return
	}
	defer rep.close()
	rep.held = h // the answer joins the body's hold, as a turn's does
	ev, err := rep.next()
	out := writeEvents(w, rep, "", ev, err, nil)
	p.cfg.Logger.Debug("forwarded turn", "from", r.RemoteAddr, "socket", fw.socket, "continued", fw.prev != "",
		"model", modelName(member(req, "model").String()), "response_id", out.id, "err", out.err)
	if out.err != nil {
		cutStream(w)
	}
}
