// Command fakeupstream serves the scripted fake OpenAI Responses upstream of
// internal/fakeupstream, for real clients to run against: over HTTP (POST
// /v1/responses, JSON or Server-Sent Events) and in WebSocket mode (a
// WebSocket upgrade of GET /v1/responses), both on the one listener.
//
//	fakeupstream -listen 127.0.0.1:0 -trace calls.jsonl -tool-calls 3
//
// -connection-lifetime bounds each WebSocket connection (60 minutes, as
// the real API's), -event-delay slows every streamed event down, and
// -keeps-no-responses refuses every previous_response_id, as an upstream
// that keeps no responses does. -requests appends one JSON line per request
// to the other endpoints (GET /v1/models, GET /v1/responses/{id}, …: every
// request but POST …/responses and the WebSocket mode), with every header
// as received, credentials included, and its answer (see requestLog).
//
// It prints the address it listens on as the first line of its standard
// output, then serves until SIGINT or SIGTERM. Shutting down waits for the
// HTTP requests in progress, not for WebSocket connections.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/contstore/contstore/internal/fakeupstream"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	tracePath := flag.String("trace", "", "append one JSON line per answered call to this file")
	allHeaders := flag.Bool("trace-all-headers", false, "record every request header but credentials, not only the identifying ones")
	toolCalls := flag.Int("tool-calls", 2, "function calls the model makes after each user message before it answers")
	commands := flag.String("commands", strings.Join(fakeupstream.DefaultCommands, ","), "comma-separated shell commands the model runs, in turn")
	chunks := flag.Int("chunks", 3, "deltas per streamed text")
	seed := flag.String("seed", "", "seed of the response and item ids (default: the trace file's name)")
	lifetime := flag.Duration("connection-lifetime", fakeupstream.DefaultConnectionLifetime, "how long a WebSocket connection lasts before websocket_connection_limit_reached")
	eventDelay := flag.Duration("event-delay", 0, "wait before each event sent, over HTTP and WebSocket")
	keepsNone := flag.Bool("keeps-no-responses", false, "keep no responses: refuse every previous_response_id with previous_response_not_found, over HTTP and WebSocket")
	requestsPath := flag.String("requests", "", "append one JSON line per request to an endpoint other than creating a response, headers and credentials included, with its answer, to this file")
	flag.Parse()
	log.SetPrefix("fakeupstream: ")
	log.SetFlags(0)

	var trace io.Writer
	if *tracePath != "" {
		f, err := os.OpenFile(*tracePath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		trace = f
	}
	if *seed == "" {
		*seed = filepath.Base(*tracePath)
	}
	opts := fakeupstream.Options{IDSeed: *seed, ConnectionLifetime: *lifetime, EventDelay: *eventDelay,
		KeepsNoResponses: *keepsNone,
		Script: fakeupstream.Script{
			ToolCalls: *toolCalls,
			Commands:  strings.Split(*commands, ","),
			Chunks:    *chunks,
		}}
	if trace != nil {
		opts.Recorder = fakeupstream.NewRecorder(trace)
		opts.Recorder.AllHeaders = *allHeaders
	}
	up := fakeupstream.New(opts)
	var handler http.Handler = up
	var requests *requestLog
	if *requestsPath != "" {
		f, err := os.OpenFile(*requestsPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		requests = &requestLog{next: up, w: f}
		handler = requests
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: logRequests(handler), ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}
	if opts.Recorder != nil {
		if err := opts.Recorder.Err(); err != nil {
			log.Fatalf("writing the trace: %v", err)
		}
	}
	if requests != nil {
		if err := requests.Err(); err != nil {
			log.Fatalf("writing the request log: %v", err)
		}
	}
}

// logRequests logs each request's method and path to standard error.
func logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Printf("%s %s", r.Method, r.URL.RequestURI())
		next.ServeHTTP(w, r)
	})
}

// requestLog appends one JSON line per request to an endpoint other than
// creating a response (those Upstream.Requests lists) to w, once its
// handler has returned:
//
//	{"method":"GET","path":"/v1/models","query":"","header":{…},"body":"","status":200,"answer":"{…}"}
//
// header holds every request header as received, credentials included;
// body is the request body as the handler read it, answer the answer's
// body as written, both as text; status is the answer's status.
type requestLog struct {
	next http.Handler

	mu  sync.Mutex
	w   io.Writer
	err error
}

func (l *requestLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/responses") {
		l.next.ServeHTTP(w, r) // a create-response request or the WebSocket mode
		return
	}
	line := fakeupstream.LoggedRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone()}
	var body bytes.Buffer
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(r.Body, &body), r.Body}
	rec := &answerRecorder{ResponseWriter: w}
	l.next.ServeHTTP(rec, r)
	line.Body, line.Status, line.Answer = body.String(), rec.status, rec.body.String()
	raw, err := json.Marshal(line)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		if err == nil {
			_, err = l.w.Write(append(raw, '\n'))
		}
		l.err = err
	}
}

// Err returns the first error writing the log, if any.
func (l *requestLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// answerRecorder passes an answer on and keeps its status and body.
type answerRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (a *answerRecorder) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	a.body.Write(p)
	return a.ResponseWriter.Write(p)
}

// Flush flushes the answer, for streamed answers.
func (a *answerRecorder) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the writer passed on to, for http.ResponseController.
func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.ResponseWriter }
