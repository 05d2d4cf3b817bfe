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
// that keeps no responses does.
//
// It prints the address it listens on as the first line of its standard
// output, then serves until SIGINT or SIGTERM. Shutting down waits for the
// HTTP requests in progress, not for WebSocket connections.
package main

import (
	"context"
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

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: logRequests(up), ReadHeaderTimeout: 10 * time.Second}

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
}

// logRequests logs each request's method and path to standard error.
func logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Printf("%s %s", r.Method, r.URL.RequestURI())
		next.ServeHTTP(w, r)
	})
}
