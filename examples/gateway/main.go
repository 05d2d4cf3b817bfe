// Command gateway is a small OpenAI Responses gateway built on the
// continuation store: it forwards POST /v1/responses requests upstream and,
// when the store says the request only appends to the previous turn of the
// same conversation, sends previous_response_id and the new input items
// instead of the whole history.
//
// # Turns
//
// For each request the gateway parses the body (store.ParseRequest; 400 on
// error), reserves a turn for the request's owner (store.Store.Reserve) and
// continues only when the reservation offers a continuation whose origin
// socket is one of this replica's connections and that connection still
// holds the previous response; otherwise it sends the full context on the
// same turn (store.Reservation.FullContextRetry). An upstream answer of
// previous_response_not_found makes it resend the full context once. A
// successful answer is recorded (store.Store.Record) with the connection it
// came from; a failure aborts the turn (store.Store.Abort). The client gets
// the upstream's status and JSON body unchanged. Streaming (stream=true) is
// not supported.
//
// # Owners
//
// The conversation owner is taken from the X-Session-Id header, with
// X-Agent-Id for a sub-agent thread of that session. Without X-Session-Id it
// is taken from the body's metadata.session_id and metadata.agent_id
// (strings). A request with neither has no owner: the store answers
// missing_identity and the full context is sent. So is a request that carries
// its own previous_response_id or conversation, which is forwarded as is.
// An invalid id (empty agent, too long, control characters) is answered 400.
//
// # Upstream connections
//
// The upstream facts this gateway is built for come from the Responses
// WebSocket mode: with store=false the upstream keeps only the latest
// response of each socket, so a response can be continued only on the socket
// that produced it, by the replica that holds that socket. A real deployment
// keeps a pool of such sockets and records the socket id with each response.
// This example speaks plain HTTP instead and models a socket as a logical
// connection: each replica has connections 1..N (-connections), an owner's
// turns use the connection chosen by a hash of the owner, one request at a
// time per connection, and every upstream request carries the header
// "X-Upstream-Connection: <replica>/<id>" so that an upstream keeping
// per-connection state (such as the built-in fake, -fake-upstream) can honour
// it. Against an upstream that ignores the header, such as the OpenAI HTTP
// API, continuations work when responses are stored upstream (store=true, the
// API's default); with store=false every continuation is refused with
// previous_response_not_found and resent with the full context.
//
// # Replicas
//
// With -redis, replicas that share the Redis server and -namespace share
// continuation state: a turn that lands on the replica holding the previous
// response continues, one that lands elsewhere sends the full context, and
// neither ever continues from a response that is not the conversation's
// latest. Without -redis the state lives in the process and is not shared.
//
// GET /stats returns the gateway's counters as JSON: turns, continued turns,
// previous_response_not_found retries, input items received and sent.
//
// The gateway does not authenticate clients; it forwards their Authorization
// and OpenAI-* headers upstream. Every address defaults to loopback.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/examples/gateway/fakeupstream"
	"github.com/contstore/contstore/store"
)

// shutdownTimeout bounds the graceful shutdown of the servers.
const shutdownTimeout = 5 * time.Second

// main runs the gateway until it is interrupted.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(2)
	}
}

// flags are the command-line options.
type flags struct {
	listen, upstream, redisURL, replica, namespace, logLevel string
	fakeUpstream                                             bool
	fakeListen                                               string
	connections                                              int
	upstreamTimeout                                          time.Duration
}

// parseFlags parses args, printing usage to stderr on error or -h.
func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: gateway [flags]

A Responses gateway that continues conversations with previous_response_id
and only the new input items when the continuation store allows it.
It serves POST /v1/responses and GET /stats.

Examples:
  gateway -fake-upstream                                  # one replica, built-in fake upstream
  gateway -upstream https://api.openai.com/v1 -redis redis://127.0.0.1:6379/0

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to serve clients on")
	fs.StringVar(&f.upstream, "upstream", "", "upstream base URL; requests go to <upstream>/responses (required unless -fake-upstream)")
	fs.BoolVar(&f.fakeUpstream, "fake-upstream", false, "serve the built-in fake upstream on -fake-upstream-listen and use it")
	fs.StringVar(&f.fakeListen, "fake-upstream-listen", "127.0.0.1:0", "address of the fake upstream (port 0: any free port)")
	fs.StringVar(&f.redisURL, "redis", "", "Redis URL (redis://host:port/db) shared by the replicas; empty: in-process state, not shared")
	fs.StringVar(&f.replica, "replica", "", "this replica's id, unique among the replicas (default <hostname>-<pid>)")
	fs.StringVar(&f.namespace, "namespace", store.DefaultNamespace, "key namespace in Redis")
	fs.IntVar(&f.connections, "connections", 8, "logical upstream connections of this replica")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", 10*time.Minute, "bound on one upstream request")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug (one line per turn), info, warn or error")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	case f.fakeUpstream && f.upstream != "":
		return f, errors.New("-upstream and -fake-upstream exclude each other")
	case !f.fakeUpstream && f.upstream == "":
		return f, errors.New("-upstream is required (or -fake-upstream)")
	case f.connections < 1:
		return f, fmt.Errorf("-connections %d: need at least 1", f.connections)
	}
	if f.replica == "" {
		f.replica = defaultReplica()
	}
	return f, nil
}

// defaultReplica returns "<hostname>-<pid>".
func defaultReplica() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// run serves the gateway until ctx ends. ready, when not nil, is called
// with the gateway's address once it listens.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(addr string)) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	opts := store.Options{Namespace: f.namespace, Replica: f.replica}
	var st *store.Store
	if f.redisURL == "" {
		st, err = store.NewMemory(opts)
		logger.Info("no -redis: continuation state lives in this process and is not shared with other replicas")
	} else {
		var ro *redis.Options
		if ro, err = redis.ParseURL(f.redisURL); err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
		client := redis.NewClient(ro)
		defer client.Close()
		st, err = store.NewRedis(client, opts)
	}
	if err != nil {
		return err
	}

	var servers []*http.Server
	serve := func(ln net.Listener, h http.Handler) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				logger.Error("server stopped", "addr", ln.Addr(), "err", err)
			}
		}()
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		for _, srv := range servers {
			_ = srv.Shutdown(sctx)
		}
	}()

	upstream := f.upstream
	if f.fakeUpstream {
		ln, err := net.Listen("tcp", f.fakeListen)
		if err != nil {
			return fmt.Errorf("fake upstream: %w", err)
		}
		upstream = "http://" + ln.Addr().String() + "/v1"
		serve(ln, fakeupstream.New())
		logger.Info("fake upstream listening", "upstream", upstream)
	}

	gw, err := New(Config{
		Store:       st,
		Replica:     f.replica,
		Upstream:    upstream,
		Connections: f.connections,
		Client:      &http.Client{Timeout: f.upstreamTimeout},
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	serve(ln, gw.Handler())
	logger.Info("gateway listening", "addr", ln.Addr().String(), "replica", f.replica,
		"upstream", upstream, "redis", f.redisURL != "", "namespace", f.namespace, "connections", f.connections)
	if ready != nil {
		ready(ln.Addr().String())
	}
	<-ctx.Done()
	logger.Info("shutting down")
	return nil
}
