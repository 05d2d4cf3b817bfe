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
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
}

// drainWait bounds how long a relay waits, after a stream's terminal
// event, for the stream's end: a stream read to its end leaves its
// connection to the next turn, where one closed early is closed.
const drainWait = 250 * time.Millisecond

// drain reads the rest of an event stream after its terminal event, up to
// its end, so that the connection it came on serves another turn. A stream
// that does not end within drainWait, or goes on with events, is closed.
func (r *reply) drain() {
	if r.stream == nil || r.done == nil {
		return
	}
	t := time.AfterFunc(drainWait, r.done) // ends a read that waits
	defer t.Stop()
	for range 4 {
		if _, err := r.next(); err != nil {
			return
		}
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
// for idleConnTimeout, and uses HTTP/2 with a server that offers it over
// TLS.
func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost, tr.IdleConnTimeout = maxIdleConns, maxIdleConnsPerHost, idleConnTimeout
	tr.ForceAttemptHTTP2 = true
	return tr
}

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

func (c *httpConn) send(ctx context.Context, body []byte, stream bool) (*reply, error) {
	req, err := newPost(ctx, withQuery(c.up.url, c.tg.query), c.tg.header, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.up.client.Do(req)
	if err != nil {
		return nil, withoutQuery(err)
	}
	if stream && resp.StatusCode/100 == 2 && (isEventStream(resp.Header) || untypedEvents(resp)) {
		return eventReply(resp), nil
	}
	rep := &reply{status: resp.StatusCode, header: resp.Header, charged: c.tg.answers != nil}
	body, rest, err := readAnswer(ctx, io.LimitReader(resp.Body, maxUpstreamBody+1), c.tg.answers)
	switch {
	case err != nil:
		_ = resp.Body.Close()
		return nil, fmt.Errorf("reading the upstream's answer: %w", err)
	case rest:
		rep.body, rep.rest, rep.done = body, resp.Body, func() { _ = resp.Body.Close() }
		return rep, nil
	}
	_ = resp.Body.Close()
	if len(body) > maxUpstreamBody {
		return nil, fmt.Errorf("the upstream's answer is larger than %d bytes", maxUpstreamBody)
	}
	rep.body = body
	return rep, nil
}

// readAnswer reads a JSON answer from r, holding answerCopies times each
// step of it in h before it reads it, as a request body is held, and
// waiting for room as a request does. When no room comes it stops, rest
// true: what it read and the rest of r are relayed as they come, unkept.
// A nil h holds nothing.
func readAnswer(ctx context.Context, r io.Reader, h *hold) (body []byte, rest bool, err error) {
	if h == nil {
		h = &hold{}
	}
	for step := int64(readStep); ; step = min(2*step, maxUpstreamBody) {
		if err := h.grow(ctx, answerCopies*step); err != nil {
			if ctx.Err() != nil {
				return nil, false, err
			}
			return body, true, nil
		}
		n := len(body)
		body = slices.Grow(body, int(step))[:n+int(step)]
		m, err := io.ReadFull(r, body[n:])
		body = body[:n+m]
		h.trim(h.n - answerCopies*(step-int64(m))) // what was held and not read
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return body, false, nil
		case err != nil:
			return nil, false, err
		}
	}
}

// eventReply returns the reply that reads resp's event stream.
func eventReply(resp *http.Response) *reply {
	rep := &reply{status: resp.StatusCode, header: resp.Header, stream: &waitReader{r: resp.Body},
		done: func() { _ = resp.Body.Close() }}
	rep.next = sseReader(rep.stream, func(line []byte) {
		if rep.comments != nil {
			rep.comments(line)
		}
	})
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

// maxUpstreamBody bounds a JSON answer and one streamed event.
const maxUpstreamBody = 64 << 20

// sseReader reads Server-Sent Events: each event's "event:" name and its
// "data:" lines joined (newEvent); comment gets the comment lines. A line
// ends with CRLF, LF or CR; a byte order mark before the first is passed
// over.
func sseReader(r io.Reader, comment func(line []byte)) func() (event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxUpstreamBody)
	sc.Split(eventLines())
	first := true
	return func() (event, error) {
		var name string
		var data [][]byte
		for sc.Scan() {
			line := sc.Bytes()
			if first {
				line, first = bytes.TrimPrefix(line, byteOrderMark), false
			}
			switch {
			case len(line) == 0:
				if data == nil {
					continue // blank lines between events, or a comment-only block
				}
				d := data[0]
				if len(data) > 1 {
					d = bytes.Join(data, []byte("\n"))
				}
				return newEvent(name, d), nil
			case line[0] == ':':
				comment(line) // a keep-alive
			case bytes.HasPrefix(line, []byte("event:")):
				name = string(bytes.TrimSpace(line[len("event:"):]))
			case bytes.HasPrefix(line, []byte("data:")):
				d := line[len("data:"):]
				d = bytes.TrimPrefix(d, []byte(" "))
				data = append(data, bytes.Clone(d))
			}
		}
		if err := sc.Err(); err != nil {
			return event{}, err
		}
		if data != nil {
			return event{}, io.ErrUnexpectedEOF // the stream ended inside an event
		}
		return event{}, io.EOF
	}
}

// eventLines returns a split function for an event stream's lines, each
// ended by CRLF, LF or CR (bufio.ScanLines knows only the first two): a
// line ends at its CR at once, and an LF right after that CR is passed
// over with the next line, so that an event ended by a blank line is
// dispatched when that line arrives. (A split function that only passed
// over the LF would have the scanner read more before the next line, which
// may have arrived already.)
func eventLines() bufio.SplitFunc {
	afterCR := false
	return func(data []byte, atEOF bool) (int, []byte, error) {
		off := 0
		if afterCR && len(data) > 0 && data[0] == '\n' {
			off = 1
		}
		i := bytes.IndexAny(data[off:], "\r\n")
		switch {
		case i < 0 && atEOF && len(data) > off:
			afterCR = false
			return len(data), data[off:], nil
		case i < 0 && atEOF && off == 1:
			afterCR = false
			return 1, nil, nil // the stream ended with that LF
		case i < 0:
			return 0, nil, nil
		}
		afterCR = data[off+i] == '\r'
		return off + i + 1, data[off : off+i], nil
	}
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
