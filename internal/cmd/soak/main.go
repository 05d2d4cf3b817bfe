// Command soak drives a running contproxy for a fixed time with
// well-behaved clients playing conversations and hostile clients beside
// them (slow bodies, streams nobody reads, big bodies, a new API key every
// turn, idle keep-alive connections), all at once and bounded in number.
// Every -every it reads go_goroutines, process_open_fds and
// process_resident_memory_bytes from contproxy's operations port and
// prints a line; at the end it prints a summary and exits 1 if a
// well-behaved client saw any error (a status other than 200, a stream
// without response.completed, a transport error).
//
// It starts nothing but its clients: scripts/soak.sh builds and starts
// contproxy and runs it, as RELIABILITY.md's section "Soak: mixed turns
// and hostile clients" does:
//
//	SOAK_DURATION=11m scripts/redis-env.sh scripts/soak.sh
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// config is the command line.
type config struct {
	url, ops                        string
	duration, every, settle         time.Duration
	well, keys, slow, nonReading    int
	big, idle, instructionsKB       int
	bigMinMB, bigMaxMB              int
	think, keepAlive, trickle, hold time.Duration
	pause, bigPause                 time.Duration
	credRate, credBurst             float64
	credBurstFor, credBurstEvery    time.Duration
}

// main reads the flags and exits with run's code.
func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://127.0.0.1:8080", "contproxy's base URL")
	flag.StringVar(&c.ops, "ops", "http://127.0.0.1:9090", "contproxy's operations port URL (GET /metrics)")
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long the clients run")
	flag.DurationVar(&c.every, "every", 10*time.Second, "how often the operations port is read")
	flag.DurationVar(&c.settle, "settle", 40*time.Second, "wait after the clients stop before a last reading")
	flag.IntVar(&c.well, "well", 8, "well-behaved clients, half streaming, half JSON")
	flag.IntVar(&c.keys, "keys", 4, "API keys the well-behaved clients share (sk-good-N)")
	flag.DurationVar(&c.think, "think", 200*time.Millisecond, "mean pause of a well-behaved client between turns")
	flag.DurationVar(&c.keepAlive, "keep-alive", 5*time.Second, "how long well-behaved clients keep idle connections (keep it under contproxy's -idle-timeout)")
	flag.IntVar(&c.slow, "slow", 50, "clients that send part of a body, then stall (half trickle first)")
	flag.DurationVar(&c.trickle, "trickle", 2*time.Second, "gap between the bytes a slow client trickles (under contproxy's -body-timeout)")
	flag.IntVar(&c.nonReading, "non-reading", 20, "clients that ask for a stream and never read it")
	flag.IntVar(&c.instructionsKB, "instructions-kb", 2048, "instructions of a non-reading client's request, in KiB, which the stream echoes three times")
	flag.DurationVar(&c.hold, "hold", 12*time.Second, "how long a non-reading client waits before it reads what came")
	flag.IntVar(&c.big, "big", 2, "clients that send big bodies of many small items")
	flag.IntVar(&c.bigMinMB, "big-min-mb", 20, "smallest big body, in MB")
	flag.IntVar(&c.bigMaxMB, "big-max-mb", 30, "largest big body, in MB")
	flag.DurationVar(&c.bigPause, "big-pause", 5*time.Second, "pause of a big-body client between bodies")
	flag.Float64Var(&c.credRate, "cred-rate", 2, "turns a second with a fresh API key each (sk-cred-<random>)")
	flag.Float64Var(&c.credBurst, "cred-burst", 20, "the same during bursts")
	flag.DurationVar(&c.credBurstFor, "cred-burst-for", 10*time.Second, "length of a burst")
	flag.DurationVar(&c.credBurstEvery, "cred-burst-every", time.Minute, "how often a burst starts")
	flag.IntVar(&c.idle, "idle", 200, "keep-alive connections opened and left idle")
	flag.DurationVar(&c.pause, "pause", 500*time.Millisecond, "pause of a hostile client before it reconnects")
	flag.Parse()
	os.Exit(run(c))
}

// soak is one run: its settings, and what the clients saw.
type soak struct {
	cfg    config
	addr   string // contproxy's host:port
	start  time.Time
	items  []byte // big bodies' input items, each itemLen bytes with its comma
	client *http.Client

	mu        sync.Mutex
	latencies []time.Duration // well-behaved turns answered
	errs      int64           // well-behaved turns failed
	outcomes  map[string]int64
	creds     atomic.Int64
}

// sample is one reading of the operations port.
type sample struct {
	at                    time.Duration
	goroutines, fds, rssB float64
}

// itemLen is the length of one big-body item and its comma.
var itemLen = len(bigItem(0))

// bigItem is the i-th input item of a big body, with its comma.
func bigItem(i int) string {
	return fmt.Sprintf(`{"role":"user","content":"item %07d of a big body"},`, i)
}

// run soaks contproxy as c says and returns the exit code: 0, 1 when a
// well-behaved client saw an error (or none was answered), 2 when the
// flags are refused or the operations port does not answer at the start.
func run(c config) int {
	u, err := url.Parse(c.url)
	if c.keys < 1 || c.credRate <= 0 || c.credBurst <= 0 || c.bigMinMB < 1 || c.bigMaxMB < c.bigMinMB {
		err = errors.New("-keys, -cred-rate, -cred-burst and -big-min-mb must be positive, -big-max-mb at least -big-min-mb")
	}
	if err == nil {
		_, err = scrape(c.ops)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	s := &soak{cfg: c, addr: u.Host, start: time.Now(), outcomes: map[string]int64{},
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: c.keepAlive}}}
	var b strings.Builder
	for i := 0; c.big > 0 && b.Len() < c.bigMaxMB*1_000_000; i++ {
		b.WriteString(bigItem(i))
	}
	s.items = []byte(b.String())

	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range c.well {
		wg.Go(func() { s.wellBehaved(ctx, i) })
	}
	kinds := []struct {
		n       int
		pause   time.Duration
		attempt func(context.Context, int) string
	}{{c.slow, c.pause, s.slowBody}, {c.nonReading, c.pause, s.nonReadingStream},
		{c.big, c.bigPause, s.bigBody}, {c.idle, c.pause, s.idleConn}}
	for _, k := range kinds {
		for i := range k.n {
			wg.Go(func() { s.repeat(ctx, i, k.pause, k.attempt) })
		}
	}
	wg.Go(func() { s.credentials(ctx) })

	samples := []sample{s.sample()}
	tick := time.NewTicker(c.every)
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			if ctx.Err() == nil { // not while the clients stop
				samples = append(samples, s.sample())
			}
		case <-ctx.Done():
		}
	}
	tick.Stop()
	wg.Wait()
	time.Sleep(c.settle)
	fmt.Print("after the clients stopped: ")
	settled := s.sample()
	return s.summary(samples, settled)
}

// repeat runs a hostile client's attempts one after another until ctx
// ends, pausing between them, and counts their outcomes.
func (s *soak) repeat(ctx context.Context, i int, pause time.Duration, attempt func(context.Context, int) string) {
	sleep(ctx, rand.N(5*time.Second)) // spread the first connections out
	for ctx.Err() == nil {
		if out := attempt(ctx, i); ctx.Err() == nil {
			s.count(out)
		}
		sleep(ctx, pause)
	}
}

// count adds one to an outcome.
func (s *soak) count(outcome string) {
	s.mu.Lock()
	s.outcomes[outcome]++
	s.mu.Unlock()
}

// wellBehaved plays conversations one after another, as the OpenAI SDKs
// do: every turn sends the whole conversation, which grows by the answer's
// output items, then by the outputs of the function calls it made or, when
// it made none, a new user message. Odd conversations offer a tool and ask
// for reasoning (the fake upstream calls the tool twice per user message);
// the session is named by the session-id header or by prompt_cache_key.
func (s *soak) wellBehaved(ctx context.Context, i int) {
	key, stream := fmt.Sprintf("sk-good-%d", i%s.cfg.keys), i%2 == 0
	for conv := 0; ctx.Err() == nil; conv++ {
		session := fmt.Sprintf("soak-%d-%d-%08x", i, conv, rand.Uint32())
		header := http.Header{"Authorization": {"Bearer " + key}, "Content-Type": {"application/json"}}
		body := map[string]any{"model": "gpt-soak", "store": true, "stream": stream}
		if (i/2+conv)%2 == 0 {
			header.Set("session-id", session)
		} else {
			body["prompt_cache_key"] = session
		}
		if conv%2 == 1 {
			body["tools"] = json.RawMessage(`[{"type":"function","name":"exec_command","description":"Runs a command.",` +
				`"parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}]`)
			body["reasoning"] = map[string]string{"summary": "auto"}
			body["include"] = []string{"reasoning.encrypted_content"}
		}
		input := []json.RawMessage{userMessage(session, 0)}
		for t, turns := 0, 10+rand.IntN(11); t < turns && ctx.Err() == nil; t++ {
			body["input"] = input
			began := time.Now()
			output, err := s.turn(header, body, stream)
			s.mu.Lock()
			if err != nil {
				s.errs++
			} else {
				s.latencies = append(s.latencies, time.Since(began))
			}
			s.mu.Unlock()
			if err != nil {
				fmt.Fprintf(os.Stderr, "soak: %s well-behaved client %d, turn %d of %s: %v\n",
					time.Since(s.start).Round(time.Second), i, t, session, err)
				break // a new conversation
			}
			input = append(input, output...)
			calls := 0
			for _, it := range output {
				var item struct {
					Type   string `json:"type"`
					CallID string `json:"call_id"`
				}
				if json.Unmarshal(it, &item) == nil && item.Type == "function_call" {
					input = append(input, json.RawMessage(fmt.Sprintf(
						`{"type":"function_call_output","call_id":%q,"output":"ok\n"}`, item.CallID)))
					calls++
				}
			}
			if calls == 0 {
				input = append(input, userMessage(session, t+1))
			}
			sleep(ctx, rand.N(2*s.cfg.think+1))
		}
	}
}

// userMessage is the n-th user message of a conversation.
func userMessage(session string, n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"role":"user","content":[{"type":"input_text","text":"Message %d of %s: please look at the next file."}]}`, n, session))
}

// turn sends one turn and returns the answer's output items; an error for
// any status but 200, a JSON answer not completed, or a stream without
// response.completed. It is not cancelled when the run ends, so that the
// turns in flight then finish.
func (s *soak) turn(header http.Header, body map[string]any, stream bool) ([]json.RawMessage, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, s.cfg.url+"/v1/responses", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header = header.Clone()
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	type answer struct {
		Status string            `json:"status"`
		Output []json.RawMessage `json:"output"`
	}
	if !stream {
		var a answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			return nil, err
		} else if a.Status != "completed" {
			return nil, fmt.Errorf("response %s", a.Status)
		}
		return a.Output, nil
	}
	var done *answer
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok || !bytes.Contains(data, []byte(`"response.completed"`)) {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Response answer `json:"response"`
		}
		if json.Unmarshal(data, &ev) == nil && ev.Type == "response.completed" {
			done = &ev.Response
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	} else if done == nil {
		return nil, errors.New("stream ended without response.completed")
	}
	return done.Output, nil
}

// dial opens a connection to contproxy that closes when ctx ends.
func (s *soak) dial(ctx context.Context) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", s.addr)
	if err == nil {
		context.AfterFunc(ctx, func() { _ = conn.Close() })
	}
	return conn, err
}

// post writes the head of a POST /v1/responses with a JSON body of n bytes.
func post(w io.Writer, key string, n int) {
	fmt.Fprintf(w, "POST /v1/responses HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", key, n)
}

// ending waits up to d for what contproxy does with a connection it
// should drop: "answered <status>, closed", "closed" or "still open".
func ending(conn net.Conn, br *bufio.Reader, d time.Duration) string {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	out := ""
	if resp, err := http.ReadResponse(br, nil); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		out = fmt.Sprintf("answered %d, ", resp.StatusCode)
	}
	if _, err := io.Copy(io.Discard, br); errors.Is(err, os.ErrDeadlineExceeded) {
		return out + "still open"
	}
	return out + "closed"
}

// slowBody sends the headers and 100 bytes of a 1 KB body; odd clients
// then trickle 5 bytes, each within -body-timeout, before they stall.
func (s *soak) slowBody(ctx context.Context, i int) string {
	conn, err := s.dial(ctx)
	if err != nil {
		return "slow: dial failed"
	}
	defer conn.Close()
	body := fmt.Sprintf(`{"model":"gpt-soak","store":false,"input":%q}`, strings.Repeat("slow ", 190))
	post(conn, fmt.Sprintf("sk-slow-%d", i), len(body))
	_, _ = io.WriteString(conn, body[:100])
	for k := 0; i%2 == 1 && k < 5 && sleep(ctx, s.cfg.trickle); k++ {
		_, _ = io.WriteString(conn, body[100+k:101+k])
	}
	return "slow: " + ending(conn, bufio.NewReader(conn), 2*time.Minute)
}

// nonReadingStream asks for a stream that echoes its instructions three
// times, more than the socket buffers hold, reads nothing for -hold, then
// reads what came: a stream cut short means contproxy dropped the client.
func (s *soak) nonReadingStream(ctx context.Context, i int) string {
	conn, err := s.dial(ctx)
	if err != nil {
		return "non-reading: dial failed"
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(16 << 10)
	body := fmt.Sprintf(`{"model":"gpt-soak","store":false,"stream":true,"input":"Say something.","instructions":%q}`,
		strings.Repeat("Be brief. ", s.cfg.instructionsKB*1024/10))
	post(conn, fmt.Sprintf("sk-nonread-%d", i), len(body))
	_, _ = io.WriteString(conn, body)
	if !sleep(ctx, s.cfg.hold) {
		return ""
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	data, err := io.ReadAll(conn)
	status, _, _ := bytes.Cut(data, []byte("\r\n"))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "non-reading: still open"
	case !bytes.Equal(status, []byte("HTTP/1.1 200 OK")):
		return fmt.Sprintf("non-reading: answered %q", status)
	case bytes.Contains(data, []byte("event: response.completed")):
		return "non-reading: stream completed (it fit the buffers)"
	}
	return "non-reading: dropped mid-stream"
}

// bigBody sends a valid body of -big-min-mb to -big-max-mb of small input
// items, and waits out a 503's Retry-After.
func (s *soak) bigBody(ctx context.Context, i int) string {
	n := (s.cfg.bigMinMB*1_000_000 + rand.IntN((s.cfg.bigMaxMB-s.cfg.bigMinMB)*1_000_000+1)) / itemLen
	head := fmt.Sprintf(`{"model":"gpt-soak","store":false,"prompt_cache_key":"big-%d-%016x","input":[`, i, rand.Uint64())
	body := io.MultiReader(strings.NewReader(head), bytes.NewReader(s.items[:n*itemLen-1]), strings.NewReader("]}"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.url+"/v1/responses", body)
	if err != nil {
		return "big: " + err.Error()
	}
	req.ContentLength = int64(len(head) + n*itemLen - 1 + 2)
	req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-big-%d", i))
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return "big: transport error"
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if after, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		sleep(ctx, time.Duration(after)*time.Second)
	}
	return fmt.Sprintf("big: %d", resp.StatusCode)
}

// idleConn asks for /healthz on a keep-alive connection, then leaves it
// idle until contproxy closes it.
func (s *soak) idleConn(ctx context.Context, _ int) string {
	conn, err := s.dial(ctx)
	if err != nil {
		return "idle: dial failed"
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: soak\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "idle: no answer"
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return "idle: " + ending(conn, br, 2*time.Minute)
}

// credentials sends one-turn conversations, each with a new API key, at
// -cred-rate a second, and at -cred-burst during the first -cred-burst-for
// of every -cred-burst-every.
func (s *soak) credentials(ctx context.Context) {
	for ctx.Err() == nil {
		rate := s.cfg.credRate
		if time.Since(s.start)%s.cfg.credBurstEvery < s.cfg.credBurstFor {
			rate = s.cfg.credBurst
		}
		key := fmt.Sprintf("sk-cred-%016x", rand.Uint64())
		header := http.Header{"Authorization": {"Bearer " + key}, "Content-Type": {"application/json"}}
		_, err := s.turn(header, map[string]any{"model": "gpt-soak", "store": true,
			"input": []json.RawMessage{userMessage(key, 0)}}, false)
		s.creds.Add(1)
		if err != nil {
			msg, _, _ := strings.Cut(err.Error(), ": {") // the status, without the error object
			s.count("credentials: " + msg[:min(len(msg), 60)])
		} else {
			s.count("credentials: 200")
		}
		sleep(ctx, time.Duration(float64(time.Second)/rate))
	}
}

// sample reads the operations port and prints a line.
func (s *soak) sample() sample {
	m, err := scrape(s.cfg.ops)
	at := time.Since(s.start).Round(time.Second)
	if err != nil {
		fmt.Printf("%8s  reading the operations port: %v\n", at, err)
		return sample{at: at, goroutines: -1, fds: -1, rssB: -1}
	}
	s.mu.Lock()
	turns, errs := int64(len(s.latencies))+s.errs, s.errs
	s.mu.Unlock()
	x := sample{at, m["go_goroutines"], m["process_open_fds"], m["process_resident_memory_bytes"]}
	fmt.Printf("%8s  goroutines %5.0f  fds %5.0f  rss %6.1f MiB  heap in use %6.1f MiB  turns %6d  errors %d  503s %.0f\n",
		at, x.goroutines, x.fds, x.rssB/(1<<20), m["go_memstats_heap_inuse_bytes"]/(1<<20), turns, errs,
		m["contproxy_requests_refused_busy_total"])
	return x
}

// opsClient reads the operations port.
var opsClient = &http.Client{Timeout: 10 * time.Second}

// scrape reads the unlabelled series of the operations port's metrics.
func scrape(ops string) (map[string]float64, error) {
	resp, err := opsClient.Get(ops + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", ops, resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m, sc.Err()
}

// summary prints the figures of the run and returns the exit code.
func (s *soak) summary(samples []sample, settled sample) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	lat := slices.Clone(s.latencies)
	slices.Sort(lat)
	pct := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(q*float64(len(lat)-1)+0.5)].Round(10 * time.Microsecond)
	}
	fmt.Printf("\nwell-behaved: %d clients, %d turns, %d errors; latency p50 %v, p99 %v, max %v\n",
		s.cfg.well, int64(len(lat))+s.errs, s.errs, pct(0.5), pct(0.99), pct(1))
	span := func(pick func(sample) float64, from, to time.Duration) string {
		lo, hi := -1.0, -1.0
		for _, x := range samples {
			if v := pick(x); x.at >= from && x.at <= to && v >= 0 {
				if lo < 0 || v < lo {
					lo = v
				}
				hi = max(hi, v)
			}
		}
		return fmt.Sprintf("%.0f–%.0f", lo, hi)
	}
	figures := []struct {
		name string
		pick func(sample) float64
	}{{"goroutines", func(x sample) float64 { return x.goroutines }},
		{"open fds", func(x sample) float64 { return x.fds }},
		{"rss MiB", func(x sample) float64 { return x.rssB / (1 << 20) }}}
	fmt.Printf("%-11s %-14s %-14s %s\n", "", "first minute", "second half", "after the clients stopped")
	for _, f := range figures {
		fmt.Printf("%-11s %-14s %-14s %.0f\n", f.name, span(f.pick, s.cfg.every, time.Minute),
			span(f.pick, s.cfg.duration/2, s.cfg.duration+time.Minute), f.pick(settled))
	}
	fmt.Println("hostile clients:")
	for _, k := range slices.Sorted(maps.Keys(s.outcomes)) {
		fmt.Printf("  %-60s %d\n", k, s.outcomes[k])
	}
	fmt.Printf("  fresh API keys (sk-cred-…): %d\n", s.creds.Load())
	if m, err := scrape(s.cfg.ops); err == nil {
		fmt.Println("contproxy:")
		for _, name := range []string{"turns_total", "turns_continued_total", "full_context_retries_total",
			"upstream_errors_total", "requests_refused_busy_total"} {
			fmt.Printf("  contproxy_%-32s %.0f\n", name, m["contproxy_"+name])
		}
	}
	if s.errs > 0 || len(lat) == 0 {
		return 1
	}
	return 0
}

// sleep waits d, or until ctx ends; it tells whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
