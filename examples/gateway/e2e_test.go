package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/contstore/contstore/examples/gateway/fakeupstream"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// testModel is the model every test conversation asks for.
const testModel = "gpt-test"

// testConnections is how many upstream connections each test gateway keeps:
// few, so that owners share connections and the gateway must check that a
// connection still holds the owner's response.
const testConnections = 2

// replica is one gateway under test.
type replica struct {
	name string
	gw   *Gateway
	url  string
}

// cluster is two gateway replicas sharing one Redis namespace and one fake
// upstream, behind a round-robin proxy.
type cluster struct {
	upstream *fakeupstream.Upstream
	replicas []replica
	proxyURL string
}

// newCluster starts the fake upstream, two gateways on the standalone Redis
// (each with its own client) and the round-robin proxy in front of them.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	ns := redistest.Namespace(t)
	up := fakeupstream.New()
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)

	c := &cluster{upstream: up}
	var targets []*url.URL
	for i, name := range []string{"gw-a", "gw-b"} {
		client := redistest.Standalone(t)
		if i == 0 {
			redistest.CleanupNamespace(t, client, ns)
		}
		st, err := store.NewRedis(client, store.Options{Namespace: ns, Replica: name})
		if err != nil {
			t.Fatalf("store for %s: %v", name, err)
		}
		gw, srv := startGateway(t, st, name, upSrv.URL+"/v1")
		c.replicas = append(c.replicas, replica{name: name, gw: gw, url: srv.URL})
		u, err := url.Parse(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, u)
	}
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
	}}
	proxySrv := httptest.NewServer(proxy)
	t.Cleanup(proxySrv.Close)
	c.proxyURL = proxySrv.URL
	return c
}

// startGateway serves a gateway for st in an httptest server.
func startGateway(t *testing.T, st *store.Store, name, upstream string) (*Gateway, *httptest.Server) {
	t.Helper()
	gw, err := New(Config{
		Store:       st,
		Replica:     name,
		Upstream:    upstream,
		Connections: testConnections,
		Client:      &http.Client{Timeout: 10 * time.Second},
		Logger:      testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	return gw, srv
}

// testLogger writes the gateway's log into the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// stats sums the counters of every replica.
func (c *cluster) stats() Stats {
	var s Stats
	for _, r := range c.replicas {
		g := r.gw.Stats()
		s.Turns += g.Turns
		s.Continued += g.Continued
		s.NotFoundRetries += g.NotFoundRetries
		s.ItemsReceived += g.ItemsReceived
		s.ItemsSent += g.ItemsSent
	}
	return s
}

// conversation is one client conversation, kept whole on the client side
// and sent in full every turn.
type conversation struct {
	session string
	items   responses.ResponseInputParam
}

// newClient returns an SDK client for a gateway (or the proxy) at baseURL.
func newClient(baseURL string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(baseURL+"/v1/"),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
	)
}

// turn appends a user message, sends the whole conversation through
// client, checks that the answer proves the upstream saw exactly that
// conversation, and appends the assistant's reply as the SDK returned it.
func (c *conversation) turn(ctx context.Context, client openai.Client, text string) error {
	c.items = append(c.items, responses.ResponseInputItemParamOfMessage(text, responses.EasyInputMessageRoleUser))
	resp, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: c.items},
	}, option.WithHeader(sessionHeader, c.session))
	if err != nil {
		return fmt.Errorf("%s: %q: %w", c.session, text, err)
	}
	sent := make([]json.RawMessage, len(c.items))
	for i, item := range c.items {
		if sent[i], err = json.Marshal(item); err != nil {
			return err
		}
	}
	want, err := fakeupstream.Reply(sent)
	if err != nil {
		return err
	}
	if got := resp.OutputText(); got != want {
		return fmt.Errorf("%s: %q: the upstream answered %q, want %q (the conversation the client sent)", c.session, text, got, want)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "message" {
		return fmt.Errorf("%s: output %s, want one message", c.session, resp.RawJSON())
	}
	reply := resp.Output[0].AsMessage().ToParam()
	c.items = append(c.items, responses.ResponseInputItemUnionParam{OfOutputMessage: &reply})
	return nil
}

// TestTwoReplicas runs conversations through the round-robin proxy in an
// order fixed by a seed and checks, request by request, what went upstream:
// a turn that lands on the replica whose connection still holds the
// conversation's previous response sends previous_response_id and the one
// new item; any other turn sends the full conversation. Every answer must
// prove that the upstream saw the whole conversation.
func TestTwoReplicas(t *testing.T) {
	const conversations, turns = 3, 8
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := newCluster(t)
	client := newClient(c.proxyURL)

	var order []int
	for i := range conversations {
		for range turns {
			order = append(order, i)
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	// The expected upstream request of each turn, from the routing rules:
	// request i goes to replica i%2, an owner's connection is fixed by its
	// hash, and a connection holds only its latest response.
	type where struct {
		replica int
		conn    uint64
	}
	type expect struct {
		connection string
		continues  bool
		items      int
	}
	convs := make([]*conversation, conversations)
	done := make([]int, conversations)    // turns done per conversation
	prev := make([]*where, conversations) // where each conversation's latest response lives
	holder := make(map[where]int)         // which conversation's response each connection holds
	var want []expect
	for i, ci := range order {
		if convs[ci] == nil {
			convs[ci] = &conversation{session: fmt.Sprintf("conv-%d", ci)}
		}
		owner, err := identity.Main(convs[ci].session)
		if err != nil {
			t.Fatal(err)
		}
		r := i % 2
		at := where{r, c.replicas[r].gw.connectionFor(owner).id}
		full := 2*done[ci] + 1
		e := expect{connection: fmt.Sprintf("%s/%d", c.replicas[r].name, at.conn), items: full}
		if p := prev[ci]; p != nil && *p == at && holder[at] == ci {
			e.continues, e.items = true, 1
		}
		want = append(want, e)
		done[ci]++
		prev[ci] = &at
		holder[at] = ci
	}

	done = make([]int, conversations)
	for _, ci := range order {
		done[ci]++
		if err := convs[ci].turn(ctx, client, fmt.Sprintf("conversation %d, user turn %d", ci, done[ci])); err != nil {
			t.Fatal(err)
		}
	}

	calls := c.upstream.Calls()
	if len(calls) != len(want) {
		t.Fatalf("upstream got %d requests, want %d (one per turn)", len(calls), len(want))
	}
	var sent, fullTotal, continued, crossReplica int
	for i, call := range calls {
		w := want[i]
		if call.Connection != w.connection || (call.PreviousResponseID != "") != w.continues || call.Items != w.items || call.Status != http.StatusOK {
			t.Errorf("request %d (conversation %d): connection %q, previous %q, %d items, status %d; want connection %q, continuation %v, %d items, status 200",
				i, order[i], call.Connection, call.PreviousResponseID, call.Items, call.Status, w.connection, w.continues, w.items)
		}
		sent += call.Items
		if w.continues {
			continued++
		}
	}
	done = make([]int, conversations)
	for i, ci := range order {
		done[ci]++
		fullTotal += 2*done[ci] - 1
		if done[ci] > 1 && !want[i].continues {
			crossReplica++
		}
	}
	t.Logf("%d turns: %d continued, %d later turns sent in full; %d input items sent upstream, %d with full context every turn",
		len(order), continued, crossReplica, sent, fullTotal)
	if continued == 0 || crossReplica == 0 {
		t.Fatalf("the schedule gives %d continuations and %d later full-context turns; it must give both", continued, crossReplica)
	}
	if sent >= fullTotal {
		t.Errorf("%d items sent upstream, not fewer than the %d of full context", sent, fullTotal)
	}
	s := c.stats()
	if s.Turns != int64(len(order)) || s.Continued != int64(continued) || s.ItemsSent != int64(sent) ||
		s.ItemsReceived != int64(fullTotal) || s.NotFoundRetries != 0 {
		t.Errorf("gateway counters %+v; want %d turns, %d continued, %d items sent, %d received, no retries",
			s, len(order), continued, sent, fullTotal)
	}
}

// TestTwoReplicasConcurrent runs conversations at once through the proxy:
// whatever the interleaving, every answer must prove that the upstream saw
// the whole conversation, and no continuation may be refused upstream.
func TestTwoReplicasConcurrent(t *testing.T) {
	const conversations, turns = 6, 6
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := newCluster(t)
	client := newClient(c.proxyURL)

	var wg sync.WaitGroup
	errs := make(chan error, conversations)
	for i := range conversations {
		wg.Go(func() {
			conv := &conversation{session: fmt.Sprintf("concurrent-%d", i)}
			for turn := 1; turn <= turns; turn++ {
				if err := conv.turn(ctx, client, fmt.Sprintf("conversation %d, user turn %d", i, turn)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	sent := 0
	for _, call := range c.upstream.Calls() {
		if call.Status != http.StatusOK {
			t.Errorf("upstream answered %d to %+v", call.Status, call)
		}
		sent += call.Items
	}
	s := c.stats()
	t.Logf("concurrent: %+v", s)
	if s.Turns != conversations*turns || s.ItemsSent != int64(sent) || s.NotFoundRetries != 0 {
		t.Errorf("gateway counters %+v; want %d turns, %d items sent (the upstream's count), no retries",
			s, conversations*turns, sent)
	}
}

// TestPreviousResponseNotFound makes the upstream forget a connection's
// response before a turn that continues it: the gateway must resend the
// full context on the same turn, and the conversation must go on.
func TestPreviousResponseNotFound(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := newCluster(t)
	gw := c.replicas[0]
	client := newClient(gw.url) // no proxy: every turn on the same replica
	conv := &conversation{session: "forgotten"}
	owner, err := identity.Main(conv.session)
	if err != nil {
		t.Fatal(err)
	}
	connection := fmt.Sprintf("%s/%d", gw.name, gw.gw.connectionFor(owner).id)

	for turn := 1; turn <= 4; turn++ {
		if turn == 3 {
			c.upstream.Forget(connection)
		}
		if err := conv.turn(ctx, client, fmt.Sprintf("user turn %d", turn)); err != nil {
			t.Fatal(err)
		}
	}

	type shape struct {
		continues bool
		items     int
		status    int
	}
	want := []shape{
		{false, 1, http.StatusOK},        // turn 1: nothing to continue
		{true, 1, http.StatusOK},         // turn 2: continues
		{true, 1, http.StatusBadRequest}, // turn 3: the upstream forgot resp of turn 2
		{false, 5, http.StatusOK},        // turn 3 again, full context
		{true, 1, http.StatusOK},         // turn 4: continues the retried turn
	}
	calls := c.upstream.Calls()
	if len(calls) != len(want) {
		t.Fatalf("upstream got %d requests, want %d: %+v", len(calls), len(want), calls)
	}
	for i, call := range calls {
		got := shape{call.PreviousResponseID != "", call.Items, call.Status}
		if got != want[i] || call.Connection != connection {
			t.Errorf("request %d: %+v on %q, want %+v on %q", i, got, call.Connection, want[i], connection)
		}
	}
	if s := gw.gw.Stats(); s.NotFoundRetries != 1 || s.Continued != 2 || s.ItemsSent != 9 {
		t.Errorf("gateway counters %+v; want 1 retry, 2 continued turns, 9 items sent", s)
	}
}
