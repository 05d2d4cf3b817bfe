package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/contstore/contstore/internal/route"
	"github.com/contstore/contstore/store"
)

// Upstream carries turns to a Responses upstream: NewHTTPUpstream or
// NewWebSocketUpstream.
type Upstream interface {
	// acquire returns the connection one turn uses.
	acquire(ctx context.Context, tg *target) (conn, error)
	// close closes every connection the upstream keeps.
	close() error
	// passthroughTarget is where requests other than turns go
	// (passthrough.go).
	passthroughTarget() passTarget
}

// conn is an upstream connection held by one turn.
type conn interface {
	// continues tells whether the reservation's previous response can be
	// continued on this connection.
	continues(res *store.Reservation) bool
	// send sends one create-response body; stream says whether the
	// client asked for events.
	send(ctx context.Context, body []byte, stream bool) (*reply, error)
	// socket is where a response answered on this connection lives.
	socket() store.Socket
	// release returns the connection once the reply is read or dropped.
	release()
}

// offer is what tg continues from, for the route policy, as replica self
// sees it: forwarding tells whether self forwards turns, holds whether
// self's socket tg.want still holds tg.prev.
func (tg *target) offer(self string, forwarding, holds bool) route.Offer {
	return route.Offer{Continues: tg.prev != "", Origin: tg.want, Stores: tg.stores, Self: self,
		Forwarding: forwarding, Holds: holds}
}

// reply is an upstream's answer: a whole body, or a stream of events.
type reply struct {
	status int
	header http.Header
	// body is the whole answer (JSON) when next is nil.
	body []byte
	// next returns the next event; io.EOF after the last one.
	next func() (event, error)
	// stream is the answer's event stream when next reads one over HTTP:
	// the relay sets its wait, to flush what it wrote before next reads
	// more of the stream.
	stream *waitReader
	// comments, when set, gets the comment lines of the event stream read
	// over HTTP (keep-alives), as they are read: the relay passes them on.
	comments func(line []byte)
	// pass, when set, gets the bytes of an event that goes on to the
	// client as it arrives (eventReader), as Server-Sent Events.
	pass func(b []byte)
	// done releases what the reply holds; it may be nil.
	done func()
	// socket tells that the events are an upstream socket's (the
	// WebSocket mode, or a forward to the replica holding the socket),
	// where an error event with a status stands for the HTTP error the
	// HTTP API answers before any event.
	socket bool
	// held is the turn's hold in the budget, which what the relay keeps
	// of the answer joins (hold.force); nil for none. charged tells that
	// body's weight is in it already (readAnswer).
	held    *hold
	charged bool
	// rest, when not nil, is the part of a JSON answer not read, for
	// want of room in the budget: body and rest are relayed as they come,
	// unkept.
	rest io.Reader
	// cut, when not nil, tells why a JSON answer ended before its end:
	// body is what came of it.
	cut error
}

// drainWait bounds how long a relay waits, after a stream's terminal
// event, for the stream's end: a stream read to its end leaves its
// connection to the next turn, where one closed early is closed.
const drainWait = 250 * time.Millisecond

// drain reads the rest of an event stream after its terminal event, up to
// its end, so that the connection it came on serves another turn, and
// hands each event it reads to relay. A stream that does not end within
// drainWait, or goes on with more than a few events, is closed.
func (r *reply) drain(relay func(event)) {
	if r.stream == nil || r.done == nil {
		return
	}
	t := time.AfterFunc(drainWait, r.done) // ends a read that waits
	defer t.Stop()
	for range 4 {
		ev, err := r.next()
		if err != nil {
			return
		}
		relay(ev)
	}
}

// event is one streaming event: what it is, its name as sent and its
// JSON object.
type event struct {
	// typ is what the event is: its data's own "type" member, which
	// clients go by (the OpenAI SDKs read the data, not the event: line),
	// else its name.
	typ string
	// name is the type its "event:" line gave, relayed as it came; ""
	// when it had none.
	name string
	data []byte
	// passed tells that the event went on to the client as it arrived,
	// unread (eventReader): data is nil, and typ is its type when the
	// head of its data told it, else its name.
	passed bool
}

// newEvent returns the event named name (from its "event:" line, "" for
// none) that carries data.
func newEvent(name string, data []byte) event {
	typ := eventType(data)
	if typ == "" {
		typ = name
	}
	return event{typ: typ, name: name, data: data}
}

// wireName is the name the event goes on with: its own, else what it is.
func (ev event) wireName() string {
	if ev.name != "" {
		return ev.name
	}
	return ev.typ
}

// countClientItems makes the input paths the reply's errors name (a
// param such as "input[0].content", and the same in their message) count
// the items of the client's request when the turn sent only its items
// from index from on, a continuation's: the client gets the error it
// would get for the request it sent. from may be negative (a WebSocket
// message holds fewer items than the turn continued from): an item the
// client's request does not hold keeps its path.
func (r *reply) countClientItems(from int) {
	if from == 0 {
		return
	}
	if r.status >= 400 && r.body != nil {
		r.body = shiftInputPaths(r.body, from)
	}
	if next := r.next; next != nil {
		r.next = func() (event, error) {
			ev, err := next()
			if err == nil && (ev.typ == "error" || ev.typ == "response.failed") {
				ev.data = shiftInputPaths(ev.data, from)
			}
			return ev, err
		}
	}
}

// inputPath is an input item's path in an error.
var inputPath = regexp.MustCompile(`\binput\[(\d+)\]`)

// shiftInputPaths returns data with the index of each input item's path
// moved on by n.
func shiftInputPaths(data []byte, n int) []byte {
	if !bytes.Contains(data, []byte("input[")) {
		return data
	}
	return inputPath.ReplaceAllFunc(data, func(m []byte) []byte {
		i, err := strconv.Atoi(string(m[len("input[") : len(m)-1]))
		if err != nil || i+n < 0 {
			return m
		}
		return fmt.Appendf(nil, "input[%d]", i+n)
	})
}

// close releases the reply.
func (r *reply) close() {
	if r != nil && r.done != nil {
		r.done()
	}
}

// responsesURL returns base with "/responses" added to its path, its
// query kept (Azure's ?api-version=), after checking base's scheme.
func responsesURL(base string, schemes ...string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		// url.Parse's error holds the URL, which may hold a credential.
		return "", fmt.Errorf("%w: upstream URL: not a URL", ErrInvalidConfig)
	}
	if u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%w: upstream URL %q: no fragment or user information, please", ErrInvalidConfig, bareURL(u))
	}
	for _, s := range schemes {
		if u.Scheme == s && u.Host != "" {
			u = u.JoinPath("responses")
			return u.String(), nil
		}
	}
	return "", fmt.Errorf("%w: upstream URL %q: want %s://host[:port][/path][?query]", ErrInvalidConfig, bareURL(u),
		strings.Join(schemes, "/"))
}

// withQuery returns rawURL with query added to its own: the base's
// parameters first, but those query names again, then query's.
func withQuery(rawURL, query string) string {
	if query == "" {
		return rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err) // responsesURL made it
	}
	u.RawQuery = mergeQuery(u.RawQuery, query)
	return u.String()
}

// mergeQuery returns the parameters of base that query does not name,
// then query, each as written.
func mergeQuery(base, query string) string {
	if base == "" || query == "" {
		return base + query
	}
	named := map[string]bool{}
	for kv := range strings.SplitSeq(query, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err == nil {
			named[k] = true
		}
	}
	var kept []string
	for kv := range strings.SplitSeq(base, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err != nil || !named[k] {
			kept = append(kept, kv)
		}
	}
	return strings.Join(append(kept, query), "&")
}

// httpUpstream is the Responses HTTP API: any replica can continue a
// response stored upstream (store true), none can continue one that is not.
type httpUpstream struct {
	url    string
	client *http.Client
}

// NewHTTPUpstream returns the Responses HTTP API at baseURL (such as
// "https://api.openai.com/v1"; turns go to its path + "/responses", with
// its query and the client's), called
// with client. When client is nil the upstream gets a client of its own
// whose transport keeps up to 512 idle connections to the upstream for 90
// seconds and negotiates HTTP/2 over TLS when the upstream offers it
// (newTransport): Go's default keeps 2 idle connections a host, so under
// concurrent turns most would dial, and shake hands, again. That client
// follows no redirect: the client gets it as the upstream sent it. A client
// passed in is used as it is. Over HTTP a response is continued only when
// the request stores it upstream ("store" true or absent): then any
// replica may continue it. A turn with "store": false goes with its full
// context, and, unless forwarding is on, nothing is reserved for it.
func NewHTTPUpstream(baseURL string, client *http.Client) (Upstream, error) {
	u, err := responsesURL(baseURL, "http", "https")
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = newClient(newTransport())
	}
	return &httpUpstream{url: u, client: client}, nil
}

func (u *httpUpstream) acquire(_ context.Context, tg *target) (conn, error) {
	return &httpConn{up: u, tg: tg}, nil
}

func (u *httpUpstream) close() error {
	u.client.CloseIdleConnections()
	return nil
}

// The idle connections of the transports the proxy builds itself
// (newTransport).
const (
	// maxIdleConnsPerHost is the idle connections kept to one host: as
	// many as a busy replica has turns in flight to it (hundreds), so
	// that a turn finds one idle rather than dialing; those a quieter
	// replica no longer needs close after idleConnTimeout.
	maxIdleConnsPerHost = 512
	// maxIdleConns is the idle connections kept in all: a few hosts' worth
	// (the upstream, or the peer replicas a turn is forwarded to).
	maxIdleConns = 4 * maxIdleConnsPerHost
	// idleConnTimeout is how long an idle connection is kept.
	idleConnTimeout = 90 * time.Second
)

// newTransport returns a transport with http.DefaultTransport's settings
// (proxy from the environment, dial and TLS handshake timeouts) that keeps
// maxIdleConnsPerHost idle connections a host, maxIdleConns in all, each
// for idleConnTimeout, reads maxResponseHeaderBytes of an answer's headers
// at most, and uses HTTP/2 with a server that offers it over TLS.
func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost, tr.IdleConnTimeout = maxIdleConns, maxIdleConnsPerHost, idleConnTimeout
	tr.ForceAttemptHTTP2 = true
	tr.MaxResponseHeaderBytes = maxResponseHeaderBytes
	return tr
}

// maxResponseHeaderBytes bounds an answer's headers, as contproxy bounds a
// request's: past it the answer is not passed on (a client, Node's among
// them, could not read it) and the turn fails, 502 upstream_disconnected.
const maxResponseHeaderBytes = 64 << 10

// newClient returns a client over tr that follows no redirect: a turn is
// not sent again elsewhere, as a GET at that, and the client gets the
// redirect as the upstream answered it, as a reverse proxy passes it.
func newClient(tr http.RoundTripper) *http.Client {
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// isEventStream tells whether headers h type their body as Server-Sent
// Events (media types are case-insensitive).
func isEventStream(h http.Header) bool {
	t, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(t), "text/event-stream")
}

// withoutQuery returns err with the URL it names (a *url.Error's) shown
// without its query and user information, which may carry a credential
// (?api-key=): errors go to the log. The errors wrapping the URL's have
// their messages written already: the message is rewritten.
func withoutQuery(err error) error {
	ue, ok := errors.AsType[*url.Error](err)
	if !ok {
		return err
	}
	u, perr := url.Parse(ue.URL)
	if perr != nil {
		return err
	}
	raw, shown := ue.URL, bareURL(u)
	ue.URL = shown
	return &shownError{msg: strings.ReplaceAll(err.Error(), raw, shown), err: err}
}

// bareURL returns u's scheme, host and path only: what the proxy shows of
// an upstream URL, whose user information, query or fragment may carry a
// credential.
func bareURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
}

// shownError is an error whose message is written anew (withoutQuery).
type shownError struct {
	msg string
	err error
}

func (e *shownError) Error() string { return e.msg }
func (e *shownError) Unwrap() error { return e.err }

// untypedEvents tells whether resp, a 2xx answer to a turn that asked for
// a stream, whose Content-Type names no type of its own (none,
// application/octet-stream or text/plain), begins as an event stream does;
// resp.Body then reads on from what was looked at.
func untypedEvents(resp *http.Response) bool {
	t, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	switch strings.ToLower(strings.TrimSpace(t)) {
	case "", "application/octet-stream", "text/plain":
	default:
		return false
	}
	br := bufio.NewReader(resp.Body)
	resp.Body = struct {
		io.Reader
		io.Closer
	}{br, resp.Body}
	head, _ := br.Peek(len(byteOrderMark) + len("retry:"))
	head = bytes.TrimPrefix(head, byteOrderMark)
	for _, field := range []string{":", "event:", "data:", "id:", "retry:"} {
		if bytes.HasPrefix(head, []byte(field)) {
			return true
		}
	}
	return false
}

// byteOrderMark may begin an event stream (UTF-8's).
var byteOrderMark = []byte("\uFEFF")

// httpConn is one HTTP request.
type httpConn struct {
	up *httpUpstream
	tg *target
}

// continues: an HTTP connection holds no socket of its own, so it
// continues only a response the upstream keeps.
func (c *httpConn) continues(res *store.Reservation) bool {
	o := route.Offer{Continues: res.Continues(), Origin: res.Origin, Stores: c.tg.stores}
	return route.Decide(o) == route.Stored
}

func (c *httpConn) socket() store.Socket {
	if c.tg.stores {
		return store.Socket{Any: true}
	}
	return store.Socket{} // not kept upstream: nothing to continue
}

func (c *httpConn) release() {}

// errNoAnswer wraps the error of a request a connection to the upstream
// carried whole, and that it closed or broke off without an answer.
var errNoAnswer = errors.New("proxy: the upstream took the request and gave no answer")

// traceWritten returns ctx traced for whether a connection carried a
// request made under it whole, on the transport's last try: the upstream
// may run it. A request written in part, or not at all (a reused
// connection the upstream had closed, which the transport may try again
// on a new one), it cannot run. Its function wraps the error of such a
// request in errNoAnswer once it was written: not a request that went
// nowhere, which a client may send again at no cost.
func traceWritten(ctx context.Context) (context.Context, func(error) error) {
	var written atomic.Bool
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:      func(string) { written.Store(false) },
		WroteRequest: func(i httptrace.WroteRequestInfo) { written.Store(i.Err == nil) },
	})
	return traced, func(err error) error {
		if err != nil && written.Load() {
			return fmt.Errorf("%w: %w", errNoAnswer, err)
		}
		return err
	}
}

func (c *httpConn) send(ctx context.Context, body []byte, stream bool) (*reply, error) {
	traced, unanswered := traceWritten(ctx)
	req, err := newPost(traced, withQuery(c.up.url, c.tg.query), c.tg.header, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.up.client.Do(req)
	if err != nil {
		return nil, withoutQuery(unanswered(err))
	}
	if stream && resp.StatusCode/100 == 2 && (isEventStream(resp.Header) || untypedEvents(resp)) {
		return eventReply(resp), nil
	}
	rep := &reply{status: resp.StatusCode, header: resp.Header, charged: c.tg.answers != nil}
	body, rest, err := readAnswer(ctx, io.LimitReader(resp.Body, maxUpstreamBody+1), resp.ContentLength, c.tg.answers)
	switch {
	case err != nil && ctx.Err() != nil:
		_ = resp.Body.Close()
		return nil, fmt.Errorf("reading the upstream's answer: %w", err)
	case err != nil:
		// Cut short: relayed as far as it came, then cut, as a reverse
		// proxy relays it, never as an answer that ended whole.
		_ = resp.Body.Close()
		rep.body, rep.cut = body, fmt.Errorf("reading the upstream's answer: %w", err)
		return rep, nil
	case rest:
		rep.body, rep.rest, rep.done = body, resp.Body, func() { _ = resp.Body.Close() }
		return rep, nil
	}
	_ = resp.Body.Close()
	if len(body) > maxUpstreamBody {
		// It ran the turn: a client that sends it again pays for it twice.
		return nil, fmt.Errorf("%w: its answer is larger than %d bytes", errNoAnswer, maxUpstreamBody)
	}
	rep.body = body
	if closeDelimited(resp) && resp.StatusCode/100 == 2 && !gjson.ValidBytes(body) {
		// Its end, the connection's, tells nothing of whether it came
		// whole; its JSON tells it did not.
		rep.cut = errors.New("reading the upstream's answer: its connection ended before its JSON did")
	}
	return rep, nil
}

// closeDelimited tells whether resp's body ends with its connection
// (HTTP/1 without a length or chunks), where a cut looks like an end.
func closeDelimited(resp *http.Response) bool {
	return resp.ProtoMajor == 1 && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && !resp.Uncompressed
}

// readAnswer reads a JSON answer from r, holding answerCopies times each
// step of it in h before it reads it, as a request body is held, and
// waiting for room as a request does. When no room comes it stops, rest
// true: what it read and the rest of r are relayed as they come, unkept.
// An answer cut short (an error other than io.EOF, io.ErrUnexpectedEOF
// included, from a body shorter than its length) returns what came with
// the error. A nil h holds nothing. size is the answer's length, or -1
// when it is unknown: the first step is one more byte than a known length
// under readStep (so that the end comes in it), else answerStep.
func readAnswer(ctx context.Context, r io.Reader, size int64, h *hold) (body []byte, rest bool, err error) {
	if h == nil {
		h = &hold{}
	}
	first := int64(answerStep)
	if size >= 0 && size < readStep {
		first = size + 1
	}
	for step := first; ; step = min(2*step, maxUpstreamBody) {
		if err := h.grow(ctx, answerCopies*step); err != nil {
			if ctx.Err() != nil {
				return nil, false, err
			}
			return body, true, nil
		}
		n := len(body)
		body = slices.Grow(body, int(step))[:n+int(step)]
		m := 0
		var err error
		for m < int(step) && err == nil {
			var k int
			k, err = r.Read(body[n+m:])
			m += k
		}
		body = body[:n+m]
		h.trim(h.n - answerCopies*(step-int64(m))) // what was held and not read
		switch {
		case err == io.EOF:
			return body, false, nil
		case err != nil:
			return body, false, err // cut short: what came, and why it ended
		}
	}
}

// eventReply returns the reply that reads resp's event stream.
func eventReply(resp *http.Response) *reply {
	rep := &reply{status: resp.StatusCode, header: resp.Header, stream: &waitReader{r: resp.Body},
		done: func() { _ = resp.Body.Close() }}
	rep.next = newEventReader(rep.stream, rep).next
	return rep
}

// newPost returns a POST of a create-response body to url carrying the
// client's end-to-end headers.
func newPost(ctx context.Context, url string, client http.Header, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyHeader(req.Header, client)
	req.Header.Del("Accept-Encoding") // let the transport negotiate, and decode, compression
	req.Header.Set("Content-Type", "application/json")
	if _, ok := req.Header["Idempotency-Key"]; ok || len(req.Header["X-Idempotency-Key"]) > 0 {
		// A turn reaches the upstream once, as through a plain reverse
		// proxy: with such a key the transport would send it again when
		// a connection it reused closed after taking it (the upstream may
		// have run it); without its body's copy it does not.
		req.GetBody = nil
	}
	return req, nil
}

// answerStep is the first step a JSON answer of unknown length is read
// by. Most answers are a few kilobytes: a step of readStep would allocate
// (and clear) 64 KiB for each.
const answerStep = 8 << 10

// maxUpstreamBody bounds a JSON answer and one streamed event.
const maxUpstreamBody = 64 << 20

// eventReader reads Server-Sent Events: each event's "event:" name and
// its "data:" lines joined (newEvent); the reply's comments get the
// comment lines. A line ends with CRLF, LF or CR; a byte order mark
// before the first is passed over.
//
// The event being read is held in the reply's hold as it grows, until the
// next is read. When the room does not have it, or it would pass
// maxUpstreamBody, an event goes on through the reply's pass as it
// arrives, unread, when the relay set one (an event passed), and is held
// past the budget when it did not.
type eventReader struct {
	br    *bufio.Reader
	rep   *reply
	first bool
	// afterCR tells that the last line ended with a CR: an LF right after
	// it is passed over with the next line, so that an event ended by a
	// blank line is dispatched when that line arrives, without waiting
	// for the byte after it.
	afterCR bool
	eventHold
}

// eventHold holds an event being read in its reply's hold as it grows,
// until the next is read (release).
type eventHold struct {
	rep *reply
	// on and held are the hold the event being read holds in (the
	// reply's, when it has one with a budget) and what it holds there.
	on   *hold
	held int64
}

// eventBuffer is what an event stream is read by.
const eventBuffer = 64 << 10

// passedHead is how much of a passed event's data its event keeps: enough
// to tell its type, which an upstream sends first.
const passedHead = 256

// newEventReader returns the reader of rep's event stream r.
func newEventReader(r io.Reader, rep *reply) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, eventBuffer), rep: rep, first: true, eventHold: eventHold{rep: rep}}
}

// next reads the next event; io.EOF after the last one.
func (e *eventReader) next() (event, error) {
	e.release()
	var name string
	var data []byte // the data lines read, joined, then the line being read
	lines, mark := 0, 0
	for {
		b, end, err := e.chunk()
		if err == io.EOF && len(data) > mark {
			b, end, err = nil, true, nil // the stream's last line, unended
		}
		if err != nil {
			if err == io.EOF && lines > 0 {
				err = io.ErrUnexpectedEOF // the stream ended inside an event
			}
			return event{}, err
		}
		grown, ok := e.grow(data, b, true)
		switch {
		case !ok && e.rep.pass == nil:
			return event{}, fmt.Errorf("an event of the upstream's is larger than %d bytes", maxUpstreamBody)
		case !ok:
			return e.passOn(name, data[:mark], lines, data[mark:], b, end)
		}
		if data = grown; !end {
			continue
		}
		line := data[mark:]
		if e.first {
			e.first = false
			if bytes.HasPrefix(line, byteOrderMark) {
				data = data[:mark+copy(line, line[len(byteOrderMark):])]
				line = data[mark:]
			}
		}
		switch {
		case len(line) == 0:
			if lines > 0 {
				return newEvent(name, data), nil
			}
			continue // blank lines between events, or a comment-only block
		case line[0] == ':':
			if e.rep.comments != nil {
				e.rep.comments(line) // a keep-alive
			}
			data = data[:mark]
		case bytes.HasPrefix(line, []byte("event:")):
			name = string(bytes.TrimSpace(line[len("event:"):]))
			data = data[:mark]
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if lines > 0 {
				data[mark] = '\n'
				mark++
			}
			data = data[:mark+copy(data[mark:], d)]
			lines++
		default:
			data = data[:mark] // id:, retry: and fields unknown
		}
		mark = len(data)
	}
}

// chunk returns the next bytes of the line being read: up to its end,
// which it tells (end) and passes over, or all that is buffered. They
// are valid until the next read.
func (e *eventReader) chunk() (b []byte, end bool, err error) {
	if e.afterCR {
		if c, err := e.br.Peek(1); err == nil && c[0] == '\n' {
			_, _ = e.br.Discard(1)
		}
		e.afterCR = false
	}
	if _, err := e.br.Peek(1); err != nil {
		return nil, false, err
	}
	b, _ = e.br.Peek(e.br.Buffered())
	if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
		e.afterCR = b[i] == '\r'
		_, _ = e.br.Discard(i + 1)
		return b[:i], true, nil
	}
	_, _ = e.br.Discard(len(b))
	return b, false, nil
}

// grow appends b to data, holding what data grows by; false, data
// unchanged, when the event goes on unread (the room does not have it,
// the relay passes events and passes is true), or is too large to read
// (eventReader). Else it is held past the budget.
func (e *eventHold) grow(data, b []byte, passes bool) ([]byte, bool) {
	n := len(data) + len(b)
	if n <= cap(data) {
		return append(data, b...), true
	}
	size := max(2*cap(data), n, 512)
	more, h := int64(size-cap(data)), e.rep.held
	passes = passes && e.rep.pass != nil
	switch {
	case n > maxUpstreamBody || passes && !h.take(more):
		return data, false
	case !passes:
		h.force(more)
	}
	if h != nil && h.b != nil {
		e.on, e.held = h, e.held+more
	}
	return append(append(make([]byte, 0, size), data...), b...), true
}

// release gives back what the last event held.
func (e *eventHold) release() {
	e.on.giveBack(e.held)
	e.on, e.held = nil, 0
}

// passOn sends an event that goes on unread through the reply's pass: its
// name, the data lines read (lines of them, joined), the line being read
// (line, then b, which ends it when end), then the rest of the event as
// it arrives. It returns the event passed, which tells its type when its
// data's head does.
func (e *eventReader) passOn(name string, joined []byte, lines int, line, b []byte, end bool) (event, error) {
	pass := e.rep.pass
	if e.first { // the stream's first line: its byte order mark goes no further
		e.first = false
		if len(line) > 0 {
			line = bytes.TrimPrefix(line, byteOrderMark)
		} else {
			b = bytes.TrimPrefix(b, byteOrderMark)
		}
	}
	if name != "" {
		pass([]byte("event: " + name + "\n"))
	}
	if lines > 0 {
		pass([]byte("data: "))
		writeLines(writeFunc(pass), joined)
		pass([]byte("\n"))
	}
	head := joined
	if lines == 0 {
		// The data line being read, when it is one.
		first := append(bytes.Clone(line[:min(len(line), passedHead)]), b[:min(len(b), passedHead)]...)
		head, _ = bytes.CutPrefix(first, []byte("data:"))
		if len(head) == len(first) {
			head = nil
		}
		head = bytes.TrimPrefix(head, []byte(" "))
	}
	head = bytes.Clone(head[:min(len(head), passedHead)])
	ev := newEvent(name, head)
	ev.passed, ev.data = true, nil
	pass(line)
	var last tail
	last.keep(joined)
	last.keep(line)
	e.release()
	start := false // whether b begins a line
	for {
		pass(b)
		last.keep(b)
		if end {
			pass([]byte("\n"))
			if start && len(b) == 0 {
				return ev.endingWith(head, last), nil // the blank line that ends it
			}
		}
		start = end
		var err error
		if b, end, err = e.chunk(); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // the stream ended inside an event
			}
			return event{}, err
		}
	}
}

// tail is the last passedHead bytes of what it was given.
type tail []byte

// keep adds b to what t keeps.
func (t *tail) keep(b []byte) {
	if len(b) >= passedHead {
		*t = append((*t)[:0], b[len(b)-passedHead:]...)
		return
	}
	*t = append(*t, b...)
	if n := len(*t) - passedHead; n > 0 {
		*t = append((*t)[:0], (*t)[n:]...)
	}
}

// lastType matches the end of an object whose last member is its type,
// as an upstream that writes the members in the order of their names
// (response, sequence_number, type) ends its events.
var lastType = regexp.MustCompile(`"type"\s*:\s*"([^"\\]*)"\s*}\s*$`)

// endingWith returns ev, an event passed on whose data began with head
// and ended with last, of the type its end tells when its head did not
// tell one.
func (ev event) endingWith(head []byte, last tail) event {
	if eventType(head) == "" {
		if m := lastType.FindSubmatch(last); m != nil {
			ev.typ = string(m[1])
		}
	}
	return ev
}

// waitReader reads r, calling wait, when set, before each read: the point
// where its reader may wait for more of r.
type waitReader struct {
	r    io.Reader
	wait func()
}

func (w *waitReader) Read(p []byte) (int, error) {
	if w.wait != nil {
		w.wait()
	}
	return w.r.Read(p)
}

// hopHeaders are the hop-by-hop headers a proxy does not forward (RFC 9110
// section 7.6.1), and Content-Length, which the proxy sets itself.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Host",
}

// copyHeader adds src's end-to-end headers to dst.
func copyHeader(dst, src http.Header) {
	skip := map[string]bool{}
	for _, k := range hopHeaders {
		skip[k] = true
	}
	for k := range headerList(src, "Connection") {
		skip[http.CanonicalHeaderKey(k)] = true
	}
	for k, vs := range src {
		if !skip[k] {
			dst[k] = append(dst[k], vs...)
		}
	}
}

// headerList yields the elements of the comma-separated lists that header
// name of h holds, every value's in turn, each without its surrounding
// white space, none empty (RFC 9110 5.6.1).
func headerList(h http.Header, name string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, v := range h.Values(name) {
			for e := range strings.SplitSeq(v, ",") {
				if e = strings.TrimSpace(e); e != "" && !yield(e) {
					return
				}
			}
		}
	}
}

// Errors of acquire.
var (
	// errClosed is returned for turns sent after Close.
	errClosed = errors.New("proxy: upstream closed")
	// errMovedOn is returned for a forwarded turn whose socket no longer
	// holds its previous response.
	errMovedOn = errors.New("proxy: the socket holds another response now")
)

// eventType is the "type" member of an event's data: a string, "" for
// none (a number, an object…).
func eventType(data []byte) string {
	if t := gjson.GetBytes(data, "type"); t.Type == gjson.String {
		return t.Str
	}
	return ""
}
