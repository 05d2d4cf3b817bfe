// Command contproxy is a deployable Responses gateway over package proxy:
// it serves POST /v1/responses in front of a Responses upstream (HTTP, or
// the WebSocket mode) and, when the continuation store says a request only
// appends to the previous turn of its conversation, sends the upstream
// previous_response_id and the new input items instead of the whole
// history. Replicas that share a Redis (or a Redis Cluster) and a
// namespace share what they know; without Redis the state lives in the
// process.
//
//	contproxy -fake-upstream                                      # a first try, built-in fake upstream
//	contproxy -upstream https://api.openai.com/v1 -redis redis://127.0.0.1:6379/0 -replica gw-1
//	contproxy -upstream wss://api.openai.com/v1 -redis-cluster 10.0.0.1:7000,10.0.0.2:7000
//
// Every flag can also be set in the environment as CONTPROXY_<FLAG>, upper
// case with dashes as underscores (CONTPROXY_REDIS, CONTPROXY_UPSTREAM);
// a flag on the command line wins, and any other CONTPROXY_ variable is
// named in a warning at start. Every other request under /v1 (GET
// /v1/models, POST /v1/responses/compact, POST /v1/chat/completions, …)
// passes through to the upstream's HTTP base as the client sent it,
// streamed. Besides /v1 it serves GET /healthz (200 "ok"; 503 once
// shutting down), and on a private operations port (-ops-listen) GET
// /metrics (Prometheus) and GET /healthz. Flags bound what a client may
// hold: idle and slow connections, and connections open at once. SIGINT or
// SIGTERM stop it gracefully: it stops accepting requests and lets the
// turns in flight finish, streams included, for up to -shutdown-timeout.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/internal/fakeupstream"
	"github.com/contstore/contstore/proxy"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/prommetrics"
	"github.com/contstore/contstore/store/storelog"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stderr, nil)
	stop()
	if code := exitCode(err, os.Stderr); code != 0 {
		os.Exit(code)
	}
}

// usageError is a command line (or environment) contproxy refuses.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCode writes err to stderr and returns the exit status: 0 for no
// error and for -h, 2 otherwise. A refused command line gets one line
// pointing at -h, not the whole usage.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "contproxy:", err)
	if _, ok := errors.AsType[usageError](err); ok {
		fmt.Fprintln(stderr, "run contproxy -h for the flags")
	}
	return 2
}

// config is the command line.
type config struct {
	listen, opsListen, upstream, transport, redisURL        string
	redisCluster, redisClient, namespace, replica           string
	logLevel, advertise, forwardSecret, routingHeader       string
	profile                                                 fingerprint.Profile
	fakeUpstream, noContinuation, affinity                  bool
	sockets, maxConns, guessOwners                          int
	maxCredentials, maxOwners                               int
	maxStoredBytes, maxConversationBytes                    int64
	stateTTL                                                time.Duration
	socketIdleTimeout, socketDialTimeout                    time.Duration
	maxBody, maxPassthrough, maxBytesInFlight, maxKeptBytes int64
	upstreamTimeout, shutdownTimeout, opTimeout             time.Duration
	idleTimeout, readHeaderTimeout                          time.Duration
	bodyTimeout, writeTimeout                               time.Duration
	logLevelValue                                           slog.Level
	// unknownEnv holds the CONTPROXY_ variables no flag reads.
	unknownEnv []unknownVar
}

// unknownVar is a CONTPROXY_ environment variable no flag reads, and the
// one it probably meant ("" when none is close).
type unknownVar struct{ name, near string }

// envPrefix prefixes the environment variables that set flags.
const envPrefix = "CONTPROXY_"

// parse reads args, then the environment (os.Environ's form) for the
// flags args left unset. It writes the usage to stderr for -h (and
// returns flag.ErrHelp); any other error is a usageError.
func parse(args, environ []string, stderr io.Writer) (config, error) {
	c, err := parseFlags(args, environ, stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		err = usageError{err}
	}
	return c, err
}

// parseFlags is parse, its errors not yet marked as usage errors.
func parseFlags(args, environ []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("contproxy", flag.ContinueOnError)
	// The flag package writes its errors and the usage to the output while
	// parsing; parse's caller reports errors, and the usage is for -h only.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	usage := func() {
		fmt.Fprint(stderr, `Usage: contproxy [flags]

A Responses gateway that continues conversations with previous_response_id
and only the new input items when the shared continuation store allows it.
Serves POST /v1/responses, passes every other /v1 request through to the
upstream, and serves GET /healthz; the operations port (-ops-listen)
serves GET /metrics and GET /healthz.

  contproxy -fake-upstream
  contproxy -upstream https://api.openai.com/v1 -redis redis://127.0.0.1:6379/0 -replica gw-1
  contproxy -upstream wss://api.openai.com/v1 -redis-cluster 10.0.0.1:7000,10.0.0.2:7000

Every flag may be set as CONTPROXY_<FLAG> in the environment
(CONTPROXY_UPSTREAM, CONTPROXY_REDIS_CLUSTER, ...); the command line wins.
Any other CONTPROXY_ variable is named in a warning at start.

Flags:
`)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` to serve clients on")
	fs.StringVar(&c.opsListen, "ops-listen", "127.0.0.1:9090", "`address` of the operations port, GET /metrics (Prometheus) and GET /healthz, to keep off the clients' network; empty for none")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 2*time.Minute, "how long a client's keep-alive connection may sit idle before it is closed")
	fs.DurationVar(&c.readHeaderTimeout, "read-header-timeout", 10*time.Second, "bound on reading a request's headers; a slower client's connection is closed")
	fs.DurationVar(&c.bodyTimeout, "body-timeout", 30*time.Second, "longest wait for the next bytes of a request body, or of a WebSocket message once it has begun; a client that sends none for this long has its connection closed (this bounds each gap, not the whole body)")
	fs.DurationVar(&c.writeTimeout, "write-timeout", time.Minute, "longest a write to a client may take; a client that stops reading for this long has its connection closed (quiet gaps in a stream do not count)")
	fs.IntVar(&c.maxConns, "max-conns", 4096, "most client connections open at once, WebSocket ones included; more wait to be accepted")
	fs.StringVar(&c.upstream, "upstream", "", "upstream base `URL`: http(s)://host/v1 for HTTP, ws(s)://host/v1 for the WebSocket mode; turns go to <URL>/responses, with its query and the client's (required unless -fake-upstream)")
	fs.BoolVar(&c.fakeUpstream, "fake-upstream", false, "serve the built-in fake Responses upstream on a loopback port and use it (over -transport)")
	fs.BoolVar(&c.noContinuation, "no-continuation", false, "never continue: send every turn upstream as the client sent it, outside the store, for an upstream that keeps no responses (without it, continuing pauses by itself for a model and account after 3 refused continuations in a row)")
	fs.StringVar(&c.transport, "transport", "", "upstream transport, http or websocket (default: from the -upstream URL's scheme; http for -fake-upstream); only websocket continues store:false turns, which Codex sends")
	fs.StringVar(&c.redisURL, "redis", "", "Redis `URL` (redis://[user:password@]host:port/db, rediss:// for TLS) shared by the replicas")
	fs.StringVar(&c.redisCluster, "redis-cluster", "", "Redis Cluster seed `nodes`, host:port,host:port,... (instead of -redis)")
	fs.StringVar(&c.redisClient, "redis-client", "go-redis", "client library of the store on Redis: go-redis, or rueidis, faster at many turns in flight but connecting at start, so contproxy does not start while Redis is unreachable (the forwarding directory uses go-redis either way)")
	fs.StringVar(&c.namespace, "namespace", "cont", "key namespace in Redis; replicas sharing it share continuations")
	fs.Func("profile", "fingerprint `profile`, fixed per namespace: v2, v3 or v4, which the namespace must record (default: the namespace's own; v4 for a new one)", func(v string) (err error) {
		c.profile, err = fingerprint.Named(v)
		return err
	})
	fs.StringVar(&c.replica, "replica", "", "this replica's `id`, unique among the replicas (default <hostname>-<pid>)")
	// The flags whose usage ends in proxyDefault leave their default to
	// package proxy: their 0 takes the default of the field it names.
	proxyDefault := func(field string) string { return "; 0, the default, takes proxy." + field + "'s own default" }
	fs.IntVar(&c.sockets, "sockets", 0, "WebSocket transport: upstream sockets kept per client credential"+proxyDefault("WebSocketOptions.Sockets"))
	fs.IntVar(&c.maxCredentials, "max-credentials", 0, "WebSocket transport: most client credentials whose upstream sockets are kept; a new one replaces the least recently used with no turn in flight, or waits while all have one"+proxyDefault("WebSocketOptions.MaxCredentials"))
	fs.DurationVar(&c.socketDialTimeout, "socket-dial-timeout", 0, "WebSocket transport: longest wait to open an upstream socket (its handshake); a turn that waited that long gets 504"+proxyDefault("WebSocketOptions.DialTimeout"))
	fs.DurationVar(&c.socketIdleTimeout, "socket-idle-timeout", 0, "WebSocket transport: an upstream socket idle this long is closed, and a credential with none left forgotten"+proxyDefault("WebSocketOptions.IdleTimeout"))
	fs.Var((*byteSize)(&c.maxBody), "max-body", "largest turn body in `bytes` (413 above)"+proxyDefault("Config.MaxBodyBytes"))
	fs.Var((*byteSize)(&c.maxPassthrough), "max-passthrough-body", "largest body in `bytes` of a request to another endpoint (a file upload), which goes upstream as it comes and is never held (413 above)"+proxyDefault("Config.MaxPassthroughBytes"))
	fs.Var((*byteSize)(&c.maxBytesInFlight), "max-bytes-in-flight", "memory in `bytes` the request bodies read in full may hold at once, each weighing twice its size plus 80 bytes an input item; a turn finding no room within 1 s gets 503 with Retry-After: 1, one that could never fit 413"+proxyDefault("Config.MaxBytesInFlight"))
	fs.Var((*byteSize)(&c.maxKeptBytes), "max-kept-bytes", "memory in `bytes` the client WebSocket connections may keep of their latest responses together, for their next turns to continue; past it the responses kept the longest ago are dropped"+proxyDefault("Config.MaxKeptBytes"))
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", 0, "bound on one turn upstream, streaming included"+proxyDefault("Config.UpstreamTimeout"))
	fs.DurationVar(&c.opTimeout, "op-timeout", 200*time.Millisecond, "bound on one store operation; past it the turn fails open to full context")
	storeDefault := func(field string) string { return "; 0, the default, takes store.Options." + field + "'s own default" }
	fs.IntVar(&c.maxOwners, "max-owners", 0, "how many conversations (owners) the store keeps a state for, in Redis or in process; past it the least recently used ones are evicted"+storeDefault("MaxOwners"))
	fs.Var((*byteSize)(&c.maxStoredBytes), "max-stored-bytes", "the `bytes` the store keeps in all (about 400 an owner); past it the least recently used owners are evicted"+storeDefault("MaxTotalBytes"))
	fs.Var((*byteSize)(&c.maxConversationBytes), "max-conversation-bytes", "the largest transcript in `bytes` (canonical input and output) a continuation may cover; a longer conversation goes with its full context"+storeDefault("MaxOwnerBytes"))
	fs.DurationVar(&c.stateTTL, "state-ttl", 0, "how long a conversation's state lives without a turn"+storeDefault("TTL"))
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long turns in flight may take to finish on SIGTERM")
	fs.StringVar(&c.advertise, "advertise", "", "`address` (host:port) the other replicas reach this one at, for forwarding (default: -listen, when it names a host)")
	fs.StringVar(&c.forwardSecret, "forward-secret", "", "secret shared by the replicas, at least 32 bytes, that turns on forwarding: a WebSocket turn landing on a replica that does not hold its socket goes to the one that does (set it as CONTPROXY_FORWARD_SECRET: flags show in ps)")
	fs.StringVar(&c.routingHeader, "routing-header", "Contproxy-Replica", "answer `header` naming the replica holding the turn's socket, for load balancer affinity; - for none")
	fs.BoolVar(&c.affinity, "affinity", false, "the load balancer sends an owner's turns to the replica that served its last one: the client gets a response's end without waiting for its record in Redis (a next turn sent at once to another replica may then go with the full context)")
	fs.IntVar(&c.guessOwners, "guess-owners", 10_000, "HTTP transport with Redis: how many owners' last records the replica remembers, to send the next turn of an owner whose turns keep coming to it upstream while Redis reserves it, and give that turn's end without waiting for its record (unless Redis reserved it from another response); 0 for none")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug (a line per turn), info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
		}
		return c, err
	}
	unknown, err := applyEnv(fs, environ)
	if err != nil {
		return c, err
	}
	c.unknownEnv = unknown
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return c, c.check()
}

// check validates the command line and fills what it leaves to be
// derived: the transport, the advertised address and the replica id.
func (c *config) check() error {
	switch {
	case c.fakeUpstream && c.upstream != "":
		return errors.New("-upstream and -fake-upstream exclude each other")
	case !c.fakeUpstream && c.upstream == "":
		return errors.New("-upstream is required (or -fake-upstream for a first try)")
	case c.redisURL != "" && c.redisCluster != "":
		return errors.New("-redis and -redis-cluster exclude each other")
	case c.redisClient != "go-redis" && c.redisClient != "rueidis":
		return fmt.Errorf("-redis-client %q: want go-redis or rueidis", c.redisClient)
	case c.redisClient != "go-redis" && c.redisURL == "" && c.redisCluster == "":
		return errors.New("-redis-client needs -redis or -redis-cluster")
	case c.transport != "" && c.transport != "http" && c.transport != "websocket":
		return fmt.Errorf("-transport %q: want http or websocket", c.transport)
	case c.sockets < 0:
		return fmt.Errorf("-sockets %d: need 0 (the default) or more", c.sockets)
	case c.maxConns < 1:
		return fmt.Errorf("-max-conns %d: need at least 1", c.maxConns)
	case c.guessOwners < 0:
		return fmt.Errorf("-guess-owners %d: need 0 or more", c.guessOwners)
	case c.maxBody < 0:
		return fmt.Errorf("-max-body %d: need 0 (the default) or more", c.maxBody)
	case c.forwardSecret != "" && len(c.forwardSecret) < 32:
		return fmt.Errorf("-forward-secret has %d bytes, need at least 32", len(c.forwardSecret))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"idle-timeout", c.idleTimeout}, {"read-header-timeout", c.readHeaderTimeout},
		{"body-timeout", c.bodyTimeout}, {"write-timeout", c.writeTimeout}} {
		if d.value <= 0 {
			return fmt.Errorf("-%s %v: need more than 0", d.name, d.value)
		}
	}
	if c.redisURL != "" {
		if err := checkRedisURL(c.redisURL); err != nil {
			return err
		}
	}
	if err := c.logLevelValue.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("-log-level %q: want debug, info, warn or error", c.logLevel)
	}
	if c.upstream != "" {
		u, err := url.Parse(c.upstream)
		if err != nil || !slices.Contains([]string{"http", "https", "ws", "wss"}, u.Scheme) || u.Host == "" {
			return fmt.Errorf("-upstream %q: want http(s)://host[:port]/v1 for HTTP, or ws(s)://host[:port]/v1 for the WebSocket mode", shownURL(c.upstream))
		}
	}
	for addr := range strings.SplitSeq(c.redisCluster, ",") {
		if _, _, err := net.SplitHostPort(addr); c.redisCluster != "" && err != nil {
			return fmt.Errorf("-redis-cluster: %q: want host:port, with no scheme (host:port,host:port,…)", addr)
		}
	}
	ws := strings.HasPrefix(c.upstream, "ws://") || strings.HasPrefix(c.upstream, "wss://")
	switch {
	case c.transport == "" && ws:
		c.transport = "websocket"
	case c.transport == "":
		c.transport = "http"
	case c.upstream != "" && ws != (c.transport == "websocket"):
		want := "an http:// or https://"
		if c.transport == "websocket" {
			want = "a ws:// or wss://"
		}
		return fmt.Errorf("-transport %s needs %s -upstream URL", c.transport, want)
	}
	if c.forwardSecret != "" {
		switch {
		case c.redisURL == "" && c.redisCluster == "":
			return errors.New("-forward-secret needs -redis or -redis-cluster: the replicas find each other there")
		case c.transport != "websocket":
			return errors.New("-forward-secret needs the WebSocket transport: over HTTP any replica continues")
		}
		if c.advertise == "" {
			host, _, err := net.SplitHostPort(c.listen)
			if err != nil || host == "" || net.ParseIP(host).IsUnspecified() {
				return fmt.Errorf("-advertise is required with -forward-secret when -listen %q names no host", c.listen)
			}
			c.advertise = c.listen
		}
	}
	if c.replica == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "contproxy"
		}
		c.replica = host + "-" + strconv.Itoa(os.Getpid())
	}
	return nil
}

// applyEnv sets each flag not given on the command line from its
// CONTPROXY_ variable in environ, and returns the CONTPROXY_ variables no
// flag reads, sorted.
func applyEnv(fs *flag.FlagSet, environ []string) (unknown []unknownVar, _ error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if _, seen := env[k]; !seen && strings.HasPrefix(k, envPrefix) { // the first wins, as in os.LookupEnv
			env[k] = v
		}
	}
	var envErr error
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		name := envVar(f.Name)
		known[name] = true
		if v, ok := env[name]; ok && !set[f.Name] && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	for name := range env {
		if !known[name] {
			unknown = append(unknown, unknownVar{name, nearest(name, known)})
		}
	}
	slices.SortFunc(unknown, func(a, b unknownVar) int { return strings.Compare(a.name, b.name) })
	return unknown, nil
}

// envVar is the environment variable that sets a flag: -redis-cluster is
// CONTPROXY_REDIS_CLUSTER.
func envVar(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// nearest returns the variable of known closest to name, by edit distance
// over what follows the prefix, or "" when none is within half of name's
// length: CONTPROXY_REDIS for CONTPROXY_REDIS_URL.
func nearest(name string, known map[string]bool) string {
	n := strings.TrimPrefix(name, envPrefix)
	best, bestDist := "", len(n)/2+1
	for k := range known {
		d := editDistance(n, strings.TrimPrefix(k, envPrefix))
		if d < bestDist || d == bestDist && best != "" && k < best {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		diag := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			diag, row[j] = row[j], min(row[j]+1, row[j-1]+1, diag+cost)
		}
	}
	return row[len(b)]
}

// checkRedisURL tells whether go-redis reads s as a Redis URL. The error
// never repeats s, which may hold a password.
func checkRedisURL(s string) error {
	const want = "-redis wants a URL such as redis://127.0.0.1:6379"
	_, err := redis.ParseURL(s)
	switch {
	case err == nil:
		return nil
	case !strings.Contains(s, "://"): // host:port, or a bare host
		return errors.New(want)
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // url.Error quotes the URL
	}
	return fmt.Errorf("%s: %w", want, err)
}

// run serves until ctx ends, then shuts down gracefully. ready, when not
// nil, gets the addresses it listens on: the clients' and the operations
// port's ("" without one).
func run(ctx context.Context, args, environ []string, stderr io.Writer, ready func(addr, opsAddr string)) error {
	c, err := parse(args, environ, stderr)
	if err != nil {
		return err
	}
	logger := newLogger(c, stderr)
	redisLogOnce.Do(func() { redis.SetLogger(redisLog{logger}) }) // go-redis keeps one, for the process
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := prommetrics.New(prommetrics.Options{})
	if err := metrics.Register(reg); err != nil {
		return err
	}
	st, rdb, closeStore, err := openStore(c, store.MultiObserver(metrics, storelog.New(logger, storelog.Options{})))
	if err != nil {
		return err
	}
	defer closeStore()
	if rdb != nil {
		if err := checkRedis(ctx, rdb, c.redisCluster != "", c.opTimeout+time.Second); err != nil {
			if errors.Is(err, errRedisUnreachable) {
				logger.Warn("Redis cannot be reached yet; turns go with their full context until it can", "err", err)
			} else {
				return err
			}
		}
	}
	reg.MustRegister(metrics.StatsCollector(st, time.Second))

	upstream, stopFake, err := upstreamURL(c, logger)
	if err != nil {
		return err
	}
	defer stopFake()
	up, err := openUpstream(c, upstream)
	if err != nil {
		return err
	}
	cfg := proxy.Config{Store: st, Upstream: up, MaxBodyBytes: c.maxBody, MaxPassthroughBytes: c.maxPassthrough, MaxBytesInFlight: c.maxBytesInFlight,
		MaxKeptBytes: c.maxKeptBytes, UpstreamTimeout: c.upstreamTimeout, MessageTimeout: c.bodyTimeout, Logger: logger, RoutingHeader: c.routingHeader,
		NoContinuation: c.noContinuation, Affinity: c.affinity, Observer: newStepCounter(reg)}
	// The replica is announced until the signal, or until serving ends
	// otherwise (its port taken): then run returns once it is withdrawn.
	actx, withdraw := context.WithCancel(ctx)
	defer withdraw()
	announced, err := forward(actx, c, rdb, logger, &cfg)
	if err != nil {
		return err
	}
	defer func() { withdraw(); <-announced }()
	p, err := proxy.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	reg.MustRegister(newStatsCollector(p))

	go sweep(ctx, st, logger)
	logger = logger.With("replica", c.replica)
	if u, err := url.Parse(upstream); err == nil && !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") {
		logger.Warn("the -upstream URL's path does not end with /v1 (https://api.openai.com/v1): turns go to its path + /responses",
			"upstream", shownURL(upstream))
	}
	return serve(ctx, c, logger, p, reg, func(addr, opsAddr string) {
		logger.Info("contproxy listening", "addr", addr, "ops", opsAddr, "upstream", shownURL(upstream), "transport", c.transport,
			"redis", c.redisURL != "" || c.redisCluster != "", "namespace", c.namespace, "profile", profileName(st.ProfileID()))
		if ready != nil {
			ready(addr, opsAddr)
		}
	})
}

// newLogger returns the logger the flags ask for, after warning about
// the CONTPROXY_ variables no flag reads.
func newLogger(c config, stderr io.Writer) *slog.Logger {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevelValue}))
	for _, v := range c.unknownEnv {
		if v.near != "" {
			logger.Warn("ignoring an environment variable no flag reads", "var", v.name, "did_you_mean", v.near)
		} else {
			logger.Warn("ignoring an environment variable no flag reads", "var", v.name)
		}
	}
	return logger
}

// upstreamURL returns the upstream's base URL: -upstream, or, with
// -fake-upstream, that of a fake it starts on a loopback port, which stop
// stops.
func upstreamURL(c config, logger *slog.Logger) (url string, stop func(), _ error) {
	if !c.fakeUpstream {
		return c.upstream, func() {}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("fake upstream: %w", err)
	}
	// Ids of this process's own: replicas sharing a Redis, each with its
	// fake, or one restarted, must not answer with ids another fake gave
	// out, which the store would take for the same responses.
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	fake := &http.Server{Handler: fakeupstream.New(fakeupstream.Options{Script: fakeupstream.Script{ToolCalls: 2}, IDSeed: hex.EncodeToString(seed[:])}),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = fake.Serve(ln) }()
	scheme := "http"
	if c.transport == "websocket" {
		scheme = "ws"
	}
	url = scheme + "://" + ln.Addr().String() + "/v1"
	logger.Info("fake upstream listening", "upstream", url)
	return url, func() { _ = fake.Close() }, nil
}

// openUpstream returns the upstream at url over the -transport. No client
// given: the upstream builds one that keeps connections for the turns to
// reuse. Its sockets, of every credential, are as many as the client
// connections at most (-max-conns within the open-file limit), which
// leaves them room.
func openUpstream(c config, url string) (proxy.Upstream, error) {
	if c.transport == "websocket" {
		return proxy.NewWebSocketUpstream(url, proxy.WebSocketOptions{Replica: c.replica, Sockets: c.sockets,
			MaxCredentials: c.maxCredentials, IdleTimeout: c.socketIdleTimeout, DialTimeout: c.socketDialTimeout, MaxSockets: connsWithin(c.maxConns, fileLimit())})
	}
	return proxy.NewHTTPUpstream(url, nil)
}

// forward turns forwarding on in cfg when -forward-secret is set, and
// announces this replica in the directory until ctx ends; announced is
// closed once the announcement is withdrawn (at once without forwarding).
func forward(ctx context.Context, c config, rdb redis.UniversalClient, logger *slog.Logger, cfg *proxy.Config) (announced chan struct{}, _ error) {
	announced = make(chan struct{})
	if c.forwardSecret == "" {
		close(announced)
		return announced, nil
	}
	dir, err := directory.NewRedis(rdb, c.namespace, directory.Options{OpTimeout: c.opTimeout})
	if err != nil {
		return nil, err
	}
	cfg.Forwarding = &proxy.Forwarding{Directory: dir, Secret: []byte(c.forwardSecret)}
	go func() {
		defer close(announced)
		// Withdrawn when ctx ends: peers stop forwarding here while the
		// turns in flight finish.
		_ = dir.Run(ctx, c.replica, c.advertise, func(err error) {
			logger.Warn("announcing this replica failed; peers serve its turns with full context", "err", err)
		})
	}()
	return announced, nil
}

// serve serves p on -listen and the metrics of reg on -ops-listen until
// ctx ends, then lets the turns in flight finish for up to
// -shutdown-timeout. listening gets the addresses once both listen.
func serve(ctx context.Context, c config, logger *slog.Logger, p *proxy.Proxy, reg *prometheus.Registry,
	listening func(addr, opsAddr string)) error {
	var stopping atomic.Bool
	healthz := func(w http.ResponseWriter, _ *http.Request) {
		if stopping.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}
	// Routed by hand, not by http.ServeMux, which answers a path it would
	// clean (/v1//responses, /v1/x/../models) with a redirect: every
	// request but the health check goes to p as the client wrote it, as
	// through any reverse proxy, and p answers 404 outside /v1.
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			healthz(w, r)
			return
		}
		p.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: progress(route, c.bodyTimeout, c.writeTimeout), ConnContext: connContext,
		ReadHeaderTimeout: c.readHeaderTimeout, IdleTimeout: c.idleTimeout, MaxHeaderBytes: maxHeaderBytes}
	// The operations port: metrics, and health for a prober, off the
	// clients' network.
	opsMux := http.NewServeMux()
	opsMux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	opsMux.HandleFunc("GET /healthz", healthz)
	ops := &http.Server{Handler: opsMux, ReadHeaderTimeout: c.readHeaderTimeout, IdleTimeout: c.idleTimeout}

	ln, opsLn, err := listen(c, logger)
	if err != nil {
		return err
	}
	if ll, ok := ln.(*limitListener); ok {
		// Room for a new connection: a WebSocket connection never used,
		// else the keep-alive connections sitting idle between requests
		// (which would hold their slots for -idle-timeout) and those
		// sending their headers for 5 s or more, else the
		// request whose body arrives the slowest (a byte now and then
		// keeps a body within -body-timeout), else the WebSocket
		// connection idle the longest between turns.
		srv.ConnState = ll.track
		ll.full = func() {
			switch {
			case p.CloseUnusedSocket():
			case ll.hasIdle():
				closeIdleConns(srv)
			case ll.stopSlowestBody():
			default:
				p.CloseIdleSocket()
			}
		}
	}
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	opsAddr := ""
	if opsLn != nil {
		opsAddr = opsLn.Addr().String()
		go func() { served <- ops.Serve(opsLn) }()
	}
	listening(ln.Addr().String(), opsAddr)
	select {
	case err := <-served:
		_ = srv.Close()
		_ = ops.Close()
		return err
	case <-ctx.Done():
	}
	stopping.Store(true)
	logger.Info("shutting down; letting turns in flight finish", "timeout", c.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	sockets := make(chan error, 1) // the clients' WebSocket connections, which srv no longer manages
	go func() { sockets <- p.Shutdown(sctx) }()
	err = errors.Join(srv.Shutdown(sctx), <-sockets)
	_ = ops.Shutdown(sctx) // after the turns, so that metrics show the drain
	if err != nil {
		logger.Warn("stopped, cutting the turns still in flight", "shutdown_timeout", c.shutdownTimeout, "err", err)
		return fmt.Errorf("shutdown: turns still in flight after -shutdown-timeout %v were cut: %w", c.shutdownTimeout, err)
	}
	logger.Info("stopped")
	return nil
}

// listen opens the clients' listener, at most -max-conns connections at
// once (within the open-file limit), and the operations port's (nil
// without -ops-listen).
func listen(c config, logger *slog.Logger) (client, ops net.Listener, _ error) {
	addr, err := net.ResolveTCPAddr("tcp", c.listen)
	if err != nil {
		return nil, nil, fmt.Errorf("-listen: %w", err)
	}
	tcp, err := net.ListenTCP("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	nofile := fileLimit()
	maxConns := connsWithin(c.maxConns, nofile)
	if maxConns < c.maxConns {
		logger.Warn("-max-conns lowered to what the open-file limit leaves room for: each client connection may need an upstream one",
			"max_conns", maxConns, "flag", c.maxConns, "nofile", nofile)
	}
	if c.opsListen != "" {
		if ops, err = net.Listen("tcp", c.opsListen); err != nil {
			_ = tcp.Close()
			return nil, nil, fmt.Errorf("-ops-listen: %w", err)
		}
	}
	return newLimitListener(tcp, maxConns), ops, nil
}

// maxHeaderBytes bounds a request's headers (431 past it): a client
// WebSocket connection keeps its handshake's for as long as it lives, out
// of the budget. Go's default is 1 MiB; clients send a few KiB.
const maxHeaderBytes = 64 << 10

// redisPoolSize is the most connections the go-redis client keeps to
// each Redis server: enough that a busy replica's turns do not queue for
// a connection (go-redis's default is 10 a CPU), opened only as needed.
const redisPoolSize = 128

// openStore opens the store the flags name and a go-redis client of its
// Redis (nil for the in-process store), which the forwarding directory
// uses; closeStore closes what it opened.
func openStore(c config, obs store.Observer) (_ *store.Store, _ redis.UniversalClient, closeStore func(), _ error) {
	opts := store.Options{Namespace: c.namespace, Replica: c.replica, OpTimeout: c.opTimeout, Observer: obs, Profile: c.profile,
		MaxOwners: c.maxOwners, MaxTotalBytes: c.maxStoredBytes, MaxOwnerBytes: c.maxConversationBytes, TTL: c.stateTTL}
	if c.transport == "http" && (c.redisURL != "" || c.redisCluster != "") {
		// A turn goes upstream on this replica's last record of its
		// owner while Redis reserves it (HTTP upstream only).
		opts.GuessOwners = c.guessOwners
	}
	// The client settings docs/operating.md recommends: the client honours the
	// store's deadline, and a re-sent script answers as its first run. A
	// dial that fails is not tried again after a backoff (go-redis: 5
	// tries 100 ms apart): a Redis that refuses connections fails turns
	// open at once, not at -op-timeout, and their breakers open sooner.
	timeout := c.opTimeout + 300*time.Millisecond
	var client redis.UniversalClient
	// rueidisOptions reads the same target for -redis-client rueidis.
	var rueidisOptions func() (rueidis.ClientOption, error)
	switch {
	case c.redisURL != "":
		ro, err := redis.ParseURL(c.redisURL)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("-redis: %w", err)
		}
		ro.ContextTimeoutEnabled, ro.MaxRetries, ro.DialerRetries = true, 1, 1
		ro.ReadTimeout, ro.WriteTimeout, ro.DialTimeout, ro.PoolTimeout = timeout, timeout, time.Second, c.opTimeout
		if ro.PoolSize == 0 { // no pool_size in the URL
			ro.PoolSize = redisPoolSize
		}
		client = redis.NewClient(ro)
		rueidisOptions = func() (rueidis.ClientOption, error) { return rueidis.ParseURL(c.redisURL) }
	case c.redisCluster != "":
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: strings.Split(c.redisCluster, ","), ContextTimeoutEnabled: true, MaxRetries: 1, DialerRetries: 1,
			ReadTimeout: timeout, WriteTimeout: timeout, DialTimeout: time.Second, PoolTimeout: c.opTimeout,
			PoolSize: redisPoolSize,
		})
		rueidisOptions = func() (rueidis.ClientOption, error) {
			return rueidis.ClientOption{InitAddress: strings.Split(c.redisCluster, ",")}, nil
		}
	default:
		st, err := store.NewMemory(opts)
		return st, nil, func() {}, err
	}
	closeStore = func() { _ = client.Close() }
	var st *store.Store
	var err error
	if c.redisClient == "rueidis" {
		var ropts rueidis.ClientOption
		if ropts, err = rueidisOptions(); err != nil {
			closeStore()
			return nil, nil, nil, fmt.Errorf("-redis for -redis-client rueidis: %w", err)
		}
		// The settings docs/operating.md recommends for rueidis.
		ropts.DisableCache, ropts.ConnWriteTimeout, ropts.Dialer.Timeout = true, timeout, time.Second
		ropts.ClusterOption.ShardsRefreshInterval = time.Second
		var rc rueidis.Client
		if rc, err = rueidis.NewClient(ropts); err != nil {
			closeStore()
			return nil, nil, nil, fmt.Errorf("-redis-client rueidis: %w", err)
		}
		closeStore = func() { rc.Close(); _ = client.Close() }
		st, err = store.NewRueidis(rc, opts)
	} else {
		st, err = store.NewRedis(client, opts)
	}
	if errors.Is(err, store.ErrSchemaMismatch) {
		err = fmt.Errorf("%w (leave -profile out to take the namespace's, or name another -namespace)", err)
	}
	if err != nil {
		closeStore()
		return nil, nil, nil, err
	}
	return st, client, closeStore, nil
}

// redisLogOnce sets go-redis's logger once: it is the process's, which
// go-redis reads without a lock.
var redisLogOnce sync.Once

// redisLog takes go-redis's own log lines (a dial that failed, a pool
// that could not refill) into contproxy's log, at debug level: the store
// tells what Redis failing costs the turns, once a second at most
// (store/storelog).
type redisLog struct{ lg *slog.Logger }

// Printf implements go-redis's logger.
func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.lg.DebugContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}

// errRedisUnreachable wraps checkRedis's error for a Redis it cannot
// reach: contproxy starts all the same, its turns failing open until Redis
// comes.
var errRedisUnreachable = errors.New("cannot reach Redis")

// checkRedis tells a Redis target that cannot serve the store whatever
// happens from one that is down for now (errRedisUnreachable): an address
// that is not one, a server that answers the connection with an error (a
// database index out of range, a password refused), a TLS handshake
// answered in plain text, a standalone server for -redis-cluster, or a
// cluster node for -redis, which answers every owner's call MOVED. (A
// plain-text Redis that waits for the rest of a TLS handshake, or a TLS
// one that closes a plain connection, looks down for now.)
func checkRedis(ctx context.Context, rdb redis.UniversalClient, cluster bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := "-redis"
	if cluster {
		target = "-redis-cluster"
	}
	err := rdb.Ping(ctx).Err()
	var answered redis.Error
	var addr *net.AddrError
	var tlsRecord tls.RecordHeaderError
	switch {
	case errors.As(err, &answered) && !passing(answered), errors.As(err, &addr), errors.As(err, &tlsRecord):
		return fmt.Errorf("%s: %w", target, err)
	case err != nil:
		return fmt.Errorf("%w: %v", errRedisUnreachable, err)
	case cluster:
		return nil
	}
	info, err := rdb.Info(ctx, "cluster").Result()
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		return fmt.Errorf("-redis: the server is a node of a Redis Cluster: name its nodes with -redis-cluster")
	}
	return nil
}

// passing tells whether a Redis error is one a server that can serve
// gives while it starts, fails over, loads its data or has all the
// connections it takes.
func passing(err redis.Error) bool {
	for _, prefix := range []string{"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "ERR max number of clients reached"} {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}

// sweepEvery is how often idle state is pruned.
const sweepEvery = time.Minute

// sweep prunes idle owners every sweepEvery until ctx ends, so that idle
// partitions give memory back.
func sweep(ctx context.Context, st *store.Store, logger *slog.Logger) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := st.Sweep(ctx); err != nil {
				logger.Warn("sweep failed", "err", err)
			}
		}
	}
}

// statsCollector exports a proxy's counters (proxy.Proxy.Counters) under
// contproxy_<name>, and its paused models as a gauge.
type statsCollector struct {
	p     *proxy.Proxy
	descs []*prometheus.Desc // one per counter, in Counters' order
}

func newStatsCollector(p *proxy.Proxy) statsCollector {
	s := statsCollector{p: p}
	for _, c := range p.Counters() {
		s.descs = append(s.descs, prometheus.NewDesc("contproxy_"+c.Name, c.Help, nil, nil))
	}
	return s
}

// stepCounter counts the steps of the proxy's turns (proxy.Event) as
// contproxy_turn_steps_total{step, result}: where turns went, how each
// attempt went, why the full context went instead (a fallback's result is
// its cause), and how turns ended.
type stepCounter struct{ vec *prometheus.CounterVec }

func newStepCounter(reg prometheus.Registerer) stepCounter {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contproxy_turn_steps_total",
		Help: "Steps of the turns: route (where it went), attempt (how a send went), fallback (why the full context went), end (how it ended)."},
		[]string{"step", "result"})
	reg.MustRegister(vec)
	return stepCounter{vec}
}

// Observe implements proxy.Observer.
func (s stepCounter) Observe(ev proxy.Event) {
	result := ev.Result
	if ev.Step == proxy.StepFallback {
		result = ev.Cause
	}
	s.vec.WithLabelValues(string(ev.Step), result).Inc()
}

// pausedDesc is 1 for each model whose continuations are paused because
// the upstream refuses them; a model that continues has no series.
var pausedDesc = prometheus.NewDesc("contproxy_continuation_paused",
	"1 while continuing is paused for the model because the upstream refuses its continuations.", []string{"model"}, nil)

// Describe implements prometheus.Collector.
func (s statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range s.descs {
		ch <- d
	}
	ch <- pausedDesc
}

// Collect implements prometheus.Collector.
func (s statsCollector) Collect(ch chan<- prometheus.Metric) {
	for i, c := range s.p.Counters() {
		ch <- prometheus.MustNewConstMetric(s.descs[i], prometheus.CounterValue, float64(c.Value))
	}
	for _, model := range s.p.PausedModels() {
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, 1, model)
	}
}

// byteSize is a flag of a number of bytes, written plain (67108864) or
// with a unit: B, KB, MB, GB (powers of 1,000), KiB, MiB, GiB (of 1,024),
// as the docs write the defaults (64 MiB).
type byteSize int64

// byteUnits are the units byteSize takes, by their lower-case names.
var byteUnits = map[string]int64{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '-' })
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	unit, ok := byteUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if err != nil || !ok || n > math.MaxInt64/unit || n < math.MinInt64/unit {
		return errors.New("want a number of bytes, plain or with a unit: 67108864, 64MiB, 512 MB")
	}
	*b = byteSize(n * unit)
	return nil
}

// profileName returns the name of the profile whose identity is id.
func profileName(id string) string {
	name, _, _ := strings.Cut(id, ";")
	return name
}

// shownURL returns raw as the log shows it: its password and the values
// of its query hidden, as either may carry a credential (?api-key=).
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an invalid URL)"
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"redacted"}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
