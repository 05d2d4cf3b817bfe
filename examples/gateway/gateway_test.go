package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/examples/gateway/fakeupstream"
	"github.com/contstore/contstore/store"
)

// single is one gateway on an in-process store in front of the fake
// upstream.
type single struct {
	upstream *fakeupstream.Upstream
	gw       *Gateway
	url      string
}

// newSingle starts a fake upstream and a gateway on st (an in-process
// store when nil).
func newSingle(t *testing.T, st *store.Store) *single {
	t.Helper()
	if st == nil {
		var err error
		if st, err = store.NewMemory(store.Options{Replica: "solo"}); err != nil {
			t.Fatal(err)
		}
	}
	up := fakeupstream.New()
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	gw, srv := startGateway(t, st, st.Options().Replica, upSrv.URL+"/v1")
	return &single{upstream: up, gw: gw, url: srv.URL}
}

// post sends body to the gateway with headers (name, value, name, value…)
// and returns the status and body of the answer.
func (s *single) post(t *testing.T, body string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/v1/responses", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

// followUp returns the body of the turn after body was answered with
// answer: body's input, the answer's output items and one user message.
func followUp(t *testing.T, body, answer, text string) string {
	t.Helper()
	var req map[string]any
	var resp struct {
		Output []any `json:"output"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(answer), &resp); err != nil {
		t.Fatal(err)
	}
	input := append(req["input"].([]any), resp.Output...)
	req["input"] = append(input, map[string]any{"role": "user", "content": text})
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// twoTurns sends a first turn and its follow-up with headers and returns
// the number of input items each upstream request carried.
func (s *single) twoTurns(t *testing.T, first string, headers ...string) []int {
	t.Helper()
	status, answer := s.post(t, first, headers...)
	if status != http.StatusOK {
		t.Fatalf("first turn: %d %s", status, answer)
	}
	if status, answer := s.post(t, followUp(t, first, answer, "again"), headers...); status != http.StatusOK {
		t.Fatalf("second turn: %d %s", status, answer)
	}
	var items []int
	for _, c := range s.upstream.Calls() {
		items = append(items, c.Items)
	}
	return items
}

// TestOwnerRule checks where the owner comes from: the headers first, then
// the body's metadata; without either nothing is continued.
func TestOwnerRule(t *testing.T) {
	const plain = `{"model":"m","input":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name    string
		body    string
		headers []string
		want    []int // input items sent upstream per turn
	}{
		{"header", plain, []string{sessionHeader, "s1"}, []int{1, 1}},
		{"agent header", plain, []string{sessionHeader, "s1", agentHeader, "a1"}, []int{1, 1}},
		{"metadata", `{"model":"m","metadata":{"session_id":"s2"},"input":[{"role":"user","content":"hi"}]}`, nil, []int{1, 1}},
		{"no owner", plain, nil, []int{1, 3}},
		{"client chains itself", `{"model":"m","previous_response_id":null,"conversation":"conv_1","input":[{"role":"user","content":"hi"}]}`,
			[]string{sessionHeader, "s3"}, []int{1, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSingle(t, nil)
			got := s.twoTurns(t, tc.body, tc.headers...)
			if len(got) != len(tc.want) || got[0] != tc.want[0] || got[1] != tc.want[1] {
				t.Errorf("items sent upstream %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBadRequests checks the answers to requests the gateway refuses.
func TestBadRequests(t *testing.T) {
	s := newSingle(t, nil)
	cases := []struct {
		name, method, body string
		headers            []string
		status             int
		message            string
	}{
		{"not JSON", http.MethodPost, `{"input":`, nil, http.StatusBadRequest, "invalid request"},
		{"bad input", http.MethodPost, `{"input":3}`, nil, http.StatusBadRequest, "input"},
		{"stream", http.MethodPost, `{"stream":true,"input":"hi"}`, nil, http.StatusBadRequest, "stream"},
		{"agent without session", http.MethodPost, `{"input":"hi"}`, []string{agentHeader, "a"}, http.StatusBadRequest, sessionHeader},
		{"bad session id", http.MethodPost, `{"input":"hi"}`, []string{sessionHeader, strings.Repeat("x", 300)}, http.StatusBadRequest, "session id"},
		{"GET", http.MethodGet, "", nil, http.StatusMethodNotAllowed, "POST"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, s.url+"/v1/responses", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(tc.headers); i += 2 {
				req.Header.Set(tc.headers[i], tc.headers[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			if resp.StatusCode != tc.status || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("answer %d %s; want %d with an error naming %q", resp.StatusCode, body, tc.status, tc.message)
			}
		})
	}
	if n := len(s.upstream.Calls()); n != 0 {
		t.Errorf("%d refused requests reached the upstream", n)
	}
}

// TestUpstreamErrorRelayed checks that an upstream error reaches the client
// unchanged and aborts the turn.
func TestUpstreamErrorRelayed(t *testing.T) {
	s := newSingle(t, nil)
	status, body := s.post(t, `{"model":"m","previous_response_id":"resp_9","input":"hi"}`, sessionHeader, "s")
	if status != http.StatusBadRequest || !strings.Contains(body, `"code":"previous_response_not_found"`) {
		t.Errorf("answer %d %s; want the upstream's 400 previous_response_not_found", status, body)
	}
	if r := s.gw.Stats().NotFoundRetries; r != 0 {
		t.Errorf("%d retries of a request the client chained itself", r)
	}
}

// TestStoreUnavailable checks that the gateway fails open: with Redis
// unreachable every turn is sent with the full context, and answered.
func TestStoreUnavailable(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	st, err := store.NewRedis(client, store.Options{Replica: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	s := newSingle(t, st)
	got := s.twoTurns(t, `{"model":"m","input":[{"role":"user","content":"hi"}]}`, sessionHeader, "s")
	if len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("items sent upstream %v, want [1 3]", got)
	}
}

// TestRun starts the command with the built-in fake upstream, continues a
// conversation through it and stops it.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	addr := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-listen", "127.0.0.1:0", "-fake-upstream", "-replica", "r1", "-log-level", "debug"},
			t.Output(), func(a string) { addr <- a })
	}()
	var s single
	select {
	case a := <-addr:
		s.url = "http://" + a
	case err := <-errc:
		t.Fatalf("run: %v", err)
	}
	first := `{"model":"m","input":[{"role":"user","content":"hi"}]}`
	status, answer := s.post(t, first, sessionHeader, "s")
	if status != http.StatusOK {
		t.Fatalf("first turn: %d %s", status, answer)
	}
	if status, answer := s.post(t, followUp(t, first, answer, "again"), sessionHeader, "s"); status != http.StatusOK ||
		!strings.Contains(answer, `"previous_response_id":"resp_1"`) {
		t.Fatalf("second turn: %d %s; want a continuation of resp_1", status, answer)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestFlags checks the flag rules.
func TestFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string // part of the error; "" for none
	}{
		{[]string{"-fake-upstream"}, ""},
		{[]string{"-upstream", "http://127.0.0.1:1/v1"}, ""},
		{nil, "-upstream is required"},
		{[]string{"-upstream", "http://x", "-fake-upstream"}, "exclude"},
		{[]string{"-fake-upstream", "-connections", "0"}, "-connections"},
		{[]string{"-fake-upstream", "extra"}, "unexpected"},
	}
	for _, tc := range cases {
		var out bytes.Buffer
		f, err := parseFlags(tc.args, &out)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want == "" && f.replica == "":
			t.Errorf("%q: no default replica", tc.args)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one about %q", tc.args, err, tc.want)
		}
	}
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-fake-upstream") {
		t.Errorf("-h: %v, usage %q", err, out.String())
	}
}

// readAll reads and closes an HTTP response body.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
