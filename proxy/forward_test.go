package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// testSecret is the replicas' shared forwarding secret.
var testSecret = []byte(strings.Repeat("s", 32))

// replicaSet is several proxies sharing one store and one directory over
// the WebSocket upstream, and a round-robin balancer in front of them.
type replicaSet struct {
	proxies []*Proxy
	servers []*httptest.Server
	dir     *directory.Directory
	url     string // the balancer's /v1/responses
}

func newReplicaSet(t testing.TB, n int) *replicaSet {
	t.Helper()
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}}))
	t.Cleanup(up.Close)
	base, err := store.NewMemory(store.Options{Replica: "r0"})
	require.NoError(t, err)
	dir, err := directory.NewMemory(directory.Options{CacheTTL: time.Nanosecond})
	require.NoError(t, err)
	rs := &replicaSet{dir: dir}
	for i := range n {
		st := base.WithReplica("r" + string(rune('1'+i)))
		ws, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1",
			WebSocketOptions{Replica: st.Options().Replica, Sockets: 2})
		require.NoError(t, err)
		p, err := New(Config{Store: st, Upstream: ws, Forwarding: &Forwarding{Directory: dir, Secret: testSecret}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		require.NoError(t, dir.Announce(context.Background(), st.Options().Replica, strings.TrimPrefix(srv.URL, "http://")))
		rs.proxies, rs.servers = append(rs.proxies, p), append(rs.servers, srv)
	}
	next := 0
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := rs.proxies[next%n]
		next++
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(lb.Close)
	rs.url = lb.URL + "/v1/responses"
	return rs
}

// total sums the replicas' stats.
func (rs *replicaSet) total() Stats {
	var s Stats
	for _, p := range rs.proxies {
		st := p.Stats()
		s.Turns += st.Turns
		s.Continued += st.Continued
		s.Forwarded += st.Forwarded
		s.ForwardFailures += st.ForwardFailures
		s.ForwardedIn += st.ForwardedIn
		s.FullContextRetries += st.FullContextRetries
	}
	return s
}

func TestRoundRobinTurnsAreForwardedToTheirSocket(t *testing.T) {
	rs := newReplicaSet(t, 3)
	for _, stream := range []bool{true, false} {
		c := newConversation(t, rs.url, "s-"+map[bool]string{true: "stream", false: "json"}[stream], stream, false)
		c.say("hello")
		c.say("again")
	}
	s := rs.total()
	assert.Equal(t, s.Turns-2, s.Continued, "every later turn continues, wherever it lands")
	assert.Positive(t, s.Forwarded)
	assert.Equal(t, s.Forwarded, s.ForwardedIn-s.ForwardFailures)
	assert.Zero(t, s.ForwardFailures)
	assert.Zero(t, s.FullContextRetries)
}

func TestAnswersNameTheReplicaHoldingTheSocket(t *testing.T) {
	rs := newReplicaSet(t, 2)
	body := `{"model":"m","store":false,"input":"hi"}`
	req, _ := http.NewRequest(http.MethodPost, rs.servers[1].URL+"/v1/responses", strings.NewReader(body))
	req.Header.Set("X-Session-Id", "s1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "r2", resp.Header.Get("Contproxy-Replica"))
}

func TestForgedForwardsAreRefused(t *testing.T) {
	rs := newReplicaSet(t, 1)
	f := rs.proxies[0].cfg.Forwarding
	body := []byte(`{"model":"m","store":false,"input":"hi"}`)
	for name, value := range map[string]string{
		"no signature":  "t=1, socket=1, prev=resp_1",
		"wrong secret":  (&Forwarding{Secret: []byte(strings.Repeat("x", 32))}).header(time.Now(), 1, "resp_1", body),
		"stale":         f.header(time.Now().Add(-time.Hour), 1, "resp_1", body),
		"other body":    f.header(time.Now(), 1, "resp_1", []byte(`{}`)),
		"garbage":       "hello",
		"extra members": f.header(time.Now(), 1, "resp_1", body) + ", x=1",
	} {
		req, _ := http.NewRequest(http.MethodPost, rs.servers[0].URL+"/v1/responses", strings.NewReader(string(body)))
		req.Header.Set(forwardHeader, value)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, name)
	}
	assert.Zero(t, rs.proxies[0].Stats().ForwardedIn, "nothing ran")
}

func TestAGoneOriginCostsOnlyItsContinuations(t *testing.T) {
	rs := newReplicaSet(t, 2)
	c := newConversation(t, rs.url, "s1", true, false)
	c.say("hello")
	// r2's server dies while its announcement lives on; r1 withdraws. The
	// balancer still reaches both proxies' handlers.
	rs.servers[1].CloseClientConnections()
	rs.servers[1].Close()
	require.NoError(t, rs.dir.Withdraw(context.Background(), "r1"))
	before := rs.total()
	c.say("again") // every answer is the upstream's: say checks the status
	after := rs.total()
	assert.Positive(t, after.ForwardFailures, "turns for r2's sockets are served here")
	assert.Less(t, after.Continued-before.Continued, after.Turns-before.Turns, "and send their full context")
	assert.Zero(t, after.FullContextRetries)
}

func TestForwardingConfigIsChecked(t *testing.T) {
	st, err := store.NewMemory(store.Options{})
	require.NoError(t, err)
	up, err := NewHTTPUpstream("http://127.0.0.1:1/v1", nil)
	require.NoError(t, err)
	dir, err := directory.NewMemory(directory.Options{})
	require.NoError(t, err)
	for name, f := range map[string]*Forwarding{
		"no directory": {Secret: testSecret},
		"short secret": {Directory: dir, Secret: []byte("short")},
		"negative":     {Directory: dir, Secret: testSecret, Timeout: -1},
	} {
		_, err := New(Config{Store: st, Upstream: up, Forwarding: f})
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
}

func TestForwardSignatureIsThePublishedOne(t *testing.T) {
	// PROTOCOL.md 6.7, computed here from the text, not from sign.
	body := []byte(`{"model":"m","input":[]}`)
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, testSecret)
	m.Write([]byte("contproxy-forward-v1\n1800000000\n7\nresp_abc\n" + hex.EncodeToString(sum[:])))
	want := "t=1800000000, socket=7, prev=resp_abc, sig=" + hex.EncodeToString(m.Sum(nil))
	f := &Forwarding{Secret: testSecret, MaxSkew: 30 * time.Second}
	assert.Equal(t, want, f.header(time.Unix(1_800_000_000, 0), 7, "resp_abc", body))
	socket, prev, err := f.verify(time.Unix(1_800_000_029, 0), want, body)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), socket)
	assert.Equal(t, "resp_abc", prev)
	_, _, err = f.verify(time.Unix(1_800_000_031, 0), want, body)
	assert.ErrorContains(t, err, "stale")
}

func TestAnUnreachableDirectoryServesTurnsHere(t *testing.T) {
	up := httptest.NewServer(fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}}))
	t.Cleanup(up.Close)
	base, err := store.NewMemory(store.Options{Replica: "r1"})
	require.NoError(t, err)
	dir, err := directory.NewRedis(redistest.Failing(t), "ns", directory.Options{OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	var proxies []*Proxy
	for _, id := range []string{"r1", "r2"} {
		ws, err := NewWebSocketUpstream("ws"+strings.TrimPrefix(up.URL, "http")+"/v1", WebSocketOptions{Replica: id})
		require.NoError(t, err)
		p, err := New(Config{Store: base.WithReplica(id), Upstream: ws, Forwarding: &Forwarding{Directory: dir, Secret: testSecret}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		proxies = append(proxies, p)
	}
	next := 0
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxies[next%2].ServeHTTP(w, r)
		next++
	}))
	t.Cleanup(lb.Close)
	c := newConversation(t, lb.URL+"/v1/responses", "s1", true, false)
	c.say("hello") // every answer is the upstream's: say checks the status
	for _, p := range proxies {
		assert.Zero(t, p.Stats().Forwarded)
		assert.Zero(t, p.Stats().Continued, "each turn lands on the replica without the socket")
	}
}
