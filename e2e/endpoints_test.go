//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/contstore/contstore/internal/fakeupstream"
)

// endpointsTimeout bounds one run of jssdk-endpoints.mjs.
const endpointsTimeout = 30 * time.Second

// logTimeout bounds the wait for the fake upstream's request log to list
// the requests a client run sent.
const logTimeout = 5 * time.Second

// fetchHeaders are the request headers node's fetch adds on its own to
// those the SDK gives it; any other header the upstream gets must be one
// the SDK sent.
var fetchHeaders = []string{"Accept-Encoding", "Accept-Language", "Content-Length", "Sec-Fetch-Mode"}

// sdkStep is one step of jssdk-endpoints.mjs: the requests the SDK handed
// to fetch and what it returned.
type sdkStep struct {
	Step   string          `json:"step"`
	Sent   []sdkRequest    `json:"sent"`
	Result json.RawMessage `json:"result"`
}

// sdkRequest is a request as the SDK handed it to fetch.
type sdkRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	// Body is the body, nil for none.
	Body *string `json:"body"`
}

// TestJSSDKOtherEndpoints runs the OpenAI JS SDK's calls to endpoints other
// than creating a response through two contproxy replicas sharing Redis,
// over each upstream transport (the other endpoints go to the upstream's
// HTTP base either way): client.models.list() and
// client.responses.inputTokens.count(), then a response created with
// store true and client.responses.retrieve() of it. From the fake
// upstream's request log, each passthrough call must have reached the
// upstream once, with the method, path, query, headers (the API key among
// them) and body the SDK sent, and the SDK must have returned the
// upstream's answer; contproxy's counters must not move for them (but
// the count of such requests), and do for the response created.
func TestJSSDKOtherEndpoints(t *testing.T) {
	tools := nodeClients(t)
	addr := redisAddr(t)
	for _, transport := range []string{"http", "ws"} {
		t.Run(transport, func(t *testing.T) {
			began := time.Now()
			requestLog := filepath.Join(t.TempDir(), "requests.jsonl")
			st := startStack(t, "endpoints-"+transport, stackConfig{
				transport:     transport,
				replicas:      2,
				redis:         addr,
				upstreamFlags: []string{"-requests", requestLog},
			})
			started := time.Since(began)
			key := "sk-e2e-" + randomSecret(t)[:32]
			env := clientEnv("FAKE_BASE_URL="+st.rr.baseURL(), "FAKE_API_KEY="+key, "FAKE_STORE=true")
			e := endpointsRun{t: t, st: st, tools: tools, env: env, key: key, requestLog: requestLog}
			ctx, cancel := context.WithTimeout(t.Context(), 2*endpointsTimeout)
			defer cancel()

			// models.list() and inputTokens.count(): passthrough.
			steps := e.passthrough(ctx, "models", "count")
			e.checkModels(steps[0])
			e.checkCount(steps[1])

			// A response created with store true: a turn.
			created := e.create(ctx, transport)

			// retrieve() of it: passthrough.
			steps = e.passthrough(ctx, "retrieve", created.ResponseID)
			e.checkRetrieve(steps[0], created)
			t.Logf("%s upstream: servers up in %v (building the binaries, the first time), the three client runs in %v",
				transport, started.Round(time.Millisecond), (time.Since(began) - started).Round(time.Millisecond))
		})
	}
}

// endpointsRun is one transport's run of TestJSSDKOtherEndpoints.
type endpointsRun struct {
	t          *testing.T
	st         *stack
	tools      nodeTools
	env        []string
	key        string // the API key the SDK sends
	requestLog string // the fake upstream's request log
	runs       int
	logged     int // the lines of the request log read so far
}

// run runs jssdk-endpoints.mjs with args and returns its steps, one per
// step named in args.
func (e *endpointsRun) run(args ...string) []sdkStep {
	t := e.t
	t.Helper()
	e.runs++
	out, err := runClientFor(endpointsTimeout, fmt.Sprintf("jssdk-endpoints-%d", e.runs), e.st.dir, e.tools.dir, e.env,
		e.tools.node, append([]string{"jssdk-endpoints.mjs"}, args...)...)
	if err != nil {
		t.Fatalf("the client failed: %v", err)
	}
	var steps []sdkStep
	for line := range strings.Lines(out) {
		var s sdkStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("jssdk-endpoints.mjs printed %q: %v", line, err)
		}
		steps = append(steps, s)
	}
	want := 0
	for _, a := range args {
		if slices.Contains([]string{"models", "count", "create", "retrieve"}, a) {
			want++
		}
	}
	if len(steps) != want {
		t.Fatalf("jssdk-endpoints.mjs %s printed %d steps, want %d:\n%s", strings.Join(args, " "), len(steps), want, out)
	}
	return steps
}

// passedStep is a step of calls to the other endpoints and the upstream's
// answer to its one request.
type passedStep struct {
	sdkStep
	answer string
}

// passthrough runs the steps of calls to the other endpoints and checks
// that the SDK sent one request a step, that each reached the fake
// upstream once, as the SDK sent it, answered 200, and that no counter of
// the replicas moved but the one of such requests, by one a request.
func (e *endpointsRun) passthrough(ctx context.Context, args ...string) []passedStep {
	t := e.t
	t.Helper()
	before := e.counters(ctx)
	steps := e.run(args...)
	var sent []sdkRequest
	for _, s := range steps {
		if len(s.Sent) != 1 {
			t.Fatalf("%s: the SDK sent %d requests, want 1", s.Step, len(s.Sent))
		}
		sent = append(sent, s.Sent[0])
	}
	got := e.newRequests(len(sent))
	if len(got) != len(sent) {
		t.FailNow()
	}
	var passed []passedStep
	for i, s := range sent {
		e.checkRequest(s, got[i])
		passed = append(passed, passedStep{sdkStep: steps[i], answer: got[i].Answer})
	}
	if err := e.st.rr.waitIdle(countersTimeout); err != nil {
		t.Fatal(err)
	}
	after := e.counters(ctx)
	if n := sum(after, endpointRequests) - sum(before, endpointRequests); n != float64(len(sent)) {
		t.Errorf("%s: %s moved by %v, want %d", strings.Join(args, " "), endpointRequests, n, len(sent))
	}
	for k := range after {
		if strings.HasSuffix(k, " "+endpointRequests) {
			delete(after, k)
			delete(before, k)
		}
	}
	if d := changed(before, after); len(d) > 0 {
		t.Errorf("counters moved for %s, which contproxy passes through: %s", strings.Join(args, " "), strings.Join(d, "; "))
	}
	return passed
}

// endpointRequests is the counter of the requests to other endpoints: the
// one that moves for them.
const endpointRequests = "contproxy_endpoint_requests_total"

// checkRequest checks that the upstream got request s as the SDK handed it
// to fetch, and answered it 200.
func (e *endpointsRun) checkRequest(s sdkRequest, got fakeupstream.LoggedRequest) {
	t := e.t
	t.Helper()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatalf("the SDK's URL %q: %v", s.URL, err)
	}
	what := s.Method + " " + u.RequestURI()
	if got.Method != s.Method || got.Path != u.Path || got.Query != u.RawQuery {
		t.Errorf("the SDK sent %s, the upstream got %s %s?%s", what, got.Method, got.Path, got.Query)
	}
	if got.Status != http.StatusOK {
		t.Errorf("%s: the upstream answered %d: %s", what, got.Status, got.Answer)
	}
	if auth := got.Header.Get("Authorization"); auth != "Bearer "+e.key {
		t.Errorf("%s: the upstream got Authorization %q, want the SDK's Bearer and its API key", what, auth)
	}
	sentNames := map[string]bool{}
	for name, value := range s.Headers {
		sentNames[http.CanonicalHeaderKey(name)] = true
		if v := strings.Join(got.Header.Values(name), ", "); v != value {
			t.Errorf("%s: the SDK sent %s: %q, the upstream got %q", what, name, value, v)
		}
	}
	for name := range got.Header {
		if !sentNames[name] && !slices.Contains(fetchHeaders, name) {
			t.Errorf("%s: the upstream got %s: %q, which the SDK did not send", what, name, got.Header.Values(name))
		}
	}
	switch {
	case s.Body == nil && got.Body != "":
		t.Errorf("%s: the SDK sent no body, the upstream got %q", what, got.Body)
	case s.Body != nil && got.Body != *s.Body:
		t.Errorf("%s: the SDK sent the body %q, the upstream got %q", what, *s.Body, got.Body)
	}
}

// checkModels checks that models.list() returned the upstream's models.
func (e *endpointsRun) checkModels(s passedStep) {
	t := e.t
	t.Helper()
	answer := s.answer
	var list struct {
		Object string          `json:"object"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(answer), &list); err != nil || list.Object != "list" {
		t.Fatalf("the upstream answered GET /v1/models with %s (%v)", answer, err)
	}
	if !jsonEqual(s.Result, list.Data) {
		t.Errorf("models.list() returned %s, the upstream answered %s", s.Result, list.Data)
	}
	var models []struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(s.Result, &models)
	var ids []string
	for _, m := range models {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, fakeupstream.Models) {
		t.Errorf("models.list() returned the models %v, want the fake upstream's %v", ids, fakeupstream.Models)
	}
}

// checkCount checks that inputTokens.count() returned the upstream's count.
func (e *endpointsRun) checkCount(s passedStep) {
	t := e.t
	t.Helper()
	answer := s.answer
	if !jsonEqual(s.Result, []byte(answer)) {
		t.Errorf("inputTokens.count() returned %s, the upstream answered %s", s.Result, answer)
	}
	var count struct {
		Object      string `json:"object"`
		InputTokens int    `json:"input_tokens"`
	}
	if err := json.Unmarshal(s.Result, &count); err != nil || count.Object != "response.input_tokens" || count.InputTokens <= 0 {
		t.Errorf("inputTokens.count() returned %s (%v)", s.Result, err)
	}
}

// create creates a response with store true: it must reach the upstream
// over transport once, as a turn that the replicas count, and none of the
// other endpoints. It returns the upstream's trace of the call.
func (e *endpointsRun) create(ctx context.Context, transport string) fakeupstream.TraceLine {
	t := e.t
	t.Helper()
	before := e.counters(ctx)
	traced := len(e.trace())
	s := e.run("create")[0]
	var res struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(s.Result, &res); err != nil || res.Status != "completed" {
		t.Fatalf("responses.create() returned %s (%v)", s.Result, err)
	}
	calls := e.trace()[traced:]
	if len(calls) != 1 || calls[0].ResponseID != res.ID {
		t.Fatalf("the upstream answered %d create-response calls (%v), want one, with %s", len(calls), calls, res.ID)
	}
	wantTransport := map[string]string{"http": fakeupstream.TransportHTTP, "ws": fakeupstream.TransportWebSocket}[transport]
	if calls[0].Transport != wantTransport {
		t.Errorf("the create-response call went upstream over %s, want %s", calls[0].Transport, wantTransport)
	}
	if got := e.newRequests(0); len(got) != 0 {
		t.Errorf("the create-response call reached the upstream's other endpoints: %v", got)
	}
	// The turn is counted, and its counters settle.
	deadline := time.Now().Add(countersTimeout)
	last := before
	for {
		now := e.counters(ctx)
		turns := sum(now, "contproxy_turns_total") - sum(before, "contproxy_turns_total")
		if turns == 1 && len(changed(last, now)) == 0 {
			break
		}
		if turns > 1 || time.Now().After(deadline) {
			t.Fatalf("contproxy counts %v turns for one response created (counters: %s)", turns,
				strings.Join(changed(before, now), "; "))
		}
		last = now
		time.Sleep(10 * pollInterval)
	}
	return calls[0]
}

// checkRetrieve checks that retrieve() returned the response object the
// upstream answered with, that of the response created.
func (e *endpointsRun) checkRetrieve(s passedStep, created fakeupstream.TraceLine) {
	t := e.t
	t.Helper()
	answer := s.answer
	var want map[string]json.RawMessage
	if err := json.Unmarshal([]byte(answer), &want); err != nil {
		t.Fatalf("the upstream answered the retrieve with %s: %v", answer, err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(s.Result, &got); err != nil {
		t.Fatalf("responses.retrieve() returned %s: %v", s.Result, err)
	}
	// The SDK adds output_text to the response object.
	for name, value := range want {
		if !jsonEqual(got[name], value) {
			t.Errorf("responses.retrieve() returned %s: %s, the upstream answered %s", name, got[name], value)
		}
	}
	var id string
	_ = json.Unmarshal(got["id"], &id)
	if id != created.ResponseID {
		t.Errorf("responses.retrieve(%s) returned the response %q", created.ResponseID, id)
	}
	output, err := json.Marshal(created.Output)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(got["output"], output) {
		t.Errorf("responses.retrieve() returned the output %s, the upstream created %s", got["output"], output)
	}
}

// queryOf returns the request's query with its "?", "" without one.
func queryOf(r fakeupstream.LoggedRequest) string {
	if r.Query == "" {
		return ""
	}
	return "?" + r.Query
}

// newRequests waits up to logTimeout for n requests after those read so
// far in the upstream's request log, and returns every request after them.
func (e *endpointsRun) newRequests(n int) []fakeupstream.LoggedRequest {
	t := e.t
	t.Helper()
	deadline := time.Now().Add(logTimeout)
	for {
		logged := e.readLog()
		fresh := logged[e.logged:]
		if len(fresh) >= n || time.Now().After(deadline) {
			e.logged = len(logged)
			if len(fresh) != n {
				var lines []string
				for _, r := range fresh {
					lines = append(lines, r.Method+" "+r.Path+queryOf(r))
				}
				t.Errorf("the upstream got %d requests to its other endpoints, want %d: %v", len(fresh), n, lines)
			}
			return fresh
		}
		time.Sleep(pollInterval)
	}
}

// readLog reads the upstream's request log.
func (e *endpointsRun) readLog() []fakeupstream.LoggedRequest {
	t := e.t
	t.Helper()
	raw, err := os.ReadFile(e.requestLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []fakeupstream.LoggedRequest
	for line := range strings.Lines(string(raw)) {
		var r fakeupstream.LoggedRequest
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%s:%d: %v", e.requestLog, len(out)+1, err)
		}
		out = append(out, r)
	}
	return out
}

// trace reads the upstream's trace of create-response calls.
func (e *endpointsRun) trace() []fakeupstream.TraceLine {
	t := e.t
	t.Helper()
	raw, err := os.ReadFile(e.st.up.trace)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []fakeupstream.TraceLine
	for line := range strings.Lines(string(raw)) {
		var l fakeupstream.TraceLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("%s:%d: %v", e.st.up.trace, len(out)+1, err)
		}
		out = append(out, l)
	}
	return out
}

// counters reads every counter series of the replicas' /metrics whose name
// starts with contproxy_ or contstore_, but those of reading /metrics,
// keyed by the replica's name and the series.
func (e *endpointsRun) counters(ctx context.Context) map[string]float64 {
	t := e.t
	t.Helper()
	all := map[string]float64{}
	for _, r := range e.st.replicas {
		series, err := counterSeries(ctx, r.ops)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		for name, v := range series {
			all[r.name+" "+name] = v
		}
	}
	if sum(all, "contproxy_turns_total") < 0 {
		t.Fatal("no contproxy_turns_total in /metrics")
	}
	return all
}

// scrape returns the /metrics page of the contproxy at base.
func scrape(ctx context.Context, base string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// counterSeries reads the counter series of the contproxy at base whose
// names start with contproxy_ or contstore_, but those of reading /metrics
// (scrapeSeries).
func counterSeries(ctx context.Context, base string) (map[string]float64, error) {
	body, err := scrape(ctx, base)
	if err != nil {
		return nil, err
	}
	isCounter := map[string]bool{}
	series := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && f[3] == "counter" {
			isCounter[f[2]] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name := line[:i]
		family, _, _ := strings.Cut(name, "{")
		if !isCounter[family] || !strings.HasPrefix(family, "contproxy_") && !strings.HasPrefix(family, "contstore_") ||
			scrapeSeries(name) {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s/metrics: %q: %v", base, line, err)
		}
		series[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return series, nil
}

// scrapeSeries tells whether the counter series name counts what reading
// /metrics does itself: it runs the store's Stats.
func scrapeSeries(name string) bool {
	return strings.Contains(name, `op="stats"`) || strings.HasPrefix(name, "contstore_stats_scrape_errors_total")
}

// sum returns the sum of the series of the metric name over the replicas,
// -1 when there is none.
func sum(c map[string]float64, name string) float64 {
	total, found := 0.0, false
	for k, v := range c {
		if _, series, _ := strings.Cut(k, " "); series == name {
			total += v
			found = true
		}
	}
	if !found {
		return -1
	}
	return total
}

// changed lists the series whose values differ between before and after.
func changed(before, after map[string]float64) []string {
	var out []string
	for k, v := range after {
		if before[k] != v {
			out = append(out, fmt.Sprintf("%s %v → %v", k, before[k], v))
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok {
			out = append(out, fmt.Sprintf("%s %v → gone", k, v))
		}
	}
	slices.Sort(out)
	return out
}

// jsonEqual tells whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}
