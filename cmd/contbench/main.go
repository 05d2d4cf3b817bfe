// Command contbench load-tests a continuation store deployment and checks
// every decision it makes.
//
// It simulates gateway replicas serving many conversations, each with a main
// thread and sub-agents, drives the store exactly as a gateway does (reserve,
// send upstream or forward to the replica holding the upstream socket,
// record or abort), and checks every reservation and record against the
// simulator's ground truth. The report gives throughput, latency
// percentiles, the continuation hit rate, the input saved upstream, Redis
// memory and server time per script, and the correctness violations found,
// which must be zero: any violation makes the exit status 1.
//
// By default it plays one workload three ways and puts the comparison
// first: (a) the deployment, 4 replicas behind a round-robin balancer
// sharing the store, with an upstream that keeps each response only on
// the socket that produced it (store=false) and forwarding on; (b) the
// same workload on one replica, the best one process can do; (c) the same
// workload with one in-process store per replica, as single-process
// gateways do today, whose wrong continuations are counted. The workload
// (every prompt change, edit, failure and idle gap) depends only on -seed
// and the workload flags, not on -concurrency or timing. -alike N makes
// groups of N conversations open alike and name no session, so that their
// main threads share the one owner a gateway derives from that opening:
// the report then shows what such clients cost each other.
//
// With no target, contbench runs against an embedded Redis (miniredis), whose
// figures say nothing about a real server. Point it at a deployment with
// -redis redis://host:6379/0 or -cluster host:port,host:port, or use
// -backend memory for the in-process store. Every key it writes lives in a
// fresh namespace, removed at the end unless -keep is given.
//
// contbench replay TRACE.jsonl... replays recorded client traffic through
// the store instead and explains every turn that does not continue (see
// contbench replay -h).
//
// The report's headline gives the result: PASS when the shared-store
// runs, (a) and (b), found no violation; FAIL when they found some;
// INCONCLUSIVE when a run is not a measurement of the store, because the
// store failed open on more than 5% of its reservations or failed more
// than 5% of its records and aborts (see -op-timeout), or because a Redis
// server's clock fell behind this machine's during the runs (calls could
// then run after their deadline). FAIL wins over INCONCLUSIVE, except over
// a clock that fell behind. The violations of (c) are expected and do not
// change the result.
//
// Exit status: 0 PASS, 1 FAIL, 2 bad flags or a target that cannot be
// used, 3 INCONCLUSIVE, 130 interrupted.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/store"
)

// Exit statuses.
const (
	exitOK           = 0
	exitViolations   = 1
	exitUsage        = 2
	exitInconclusive = 3
	exitInterrupted  = 130
)

// defaultTurns bounds each run when neither -turns nor -duration is
// given.
const defaultTurns = 10000

// interruption says how far an interrupted report's runs went: (a)
// played played turns.
func interruption(cfg *config, played int64) string {
	of := ""
	if cfg.turns > 0 {
		of = fmt.Sprintf(" of its %d", cfg.turns)
	}
	s := fmt.Sprintf("the run was interrupted: (a) played %d%s turns", played, of)
	if cfg.baselines {
		s += ", and (b) and (c) were cut short or not played"
	}
	return s
}

// main runs the command until it ends or is interrupted.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: it parses args, runs the benchmark and returns
// the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "replay" {
		return runReplay(ctx, args[1:], stdout, stderr)
	}
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return usageStatus(err, "contbench", stderr)
	}
	return execute(ctx, cfg, stdout, stderr)
}

// usageStatus returns the exit status of err, an error of the command
// line of command: 0 for -h, whose usage is printed already; otherwise
// the status of bad flags, after printing err and where the flags are
// described.
func usageStatus(err error, command string, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "contbench: %v\nrun %s -h for the flags\n", err, command)
	return exitUsage
}

// parseFlags parses args with fs, printing nothing on an error: it
// returns the flag package's one-line message as a usageError. On -h it
// prints usage, the whole help, to stderr and returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, usage func(io.Writer), stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		usage(stderr)
		return err
	case err != nil:
		return &usageError{"", err.Error()}
	}
	return nil
}

// upstreamMode says which upstream connections can continue a response.
type upstreamMode string

// Upstream modes.
const (
	// sameSocket: store=false, only the socket that produced a response
	// can continue it, and only while it is that socket's latest.
	sameSocket upstreamMode = "same-socket"
	// anySocket: store=true, any socket can continue any response.
	anySocket upstreamMode = "any"
)

// routing says how the load balancer spreads turns over replicas.
type routing string

// Routing policies.
const (
	roundRobin routing = "round-robin"
	random     routing = "random"
	sticky     routing = "sticky"
)

// maxSockets bounds the upstream sockets of a replica.
const maxSockets = 1_000_000

// backendMemory selects the in-process store shared by all replicas.
const backendMemory = "memory"

// The client libraries a replica's store can run on (-client).
const (
	clientGoRedis = "go-redis"
	clientRueidis = "rueidis"
)

// rates are the workload's per-turn probabilities.
type rates struct {
	promptChange, edit, concurrent, abort, noID, socketLoss, idle float64
}

// config is a parsed and validated command line.
type config struct {
	redisURL      string
	cluster       []string
	backend       string
	client        string
	partitions    int
	ttl           time.Duration
	maxOwners     int
	maxTotalBytes int64
	opTimeout     time.Duration
	namespace     string
	keep          bool

	replicas      int
	conversations int
	agents        int
	alike         int // conversations a group that opens alike holds; its main threads share one owner
	concurrency   int
	sockets       int
	duration      time.Duration
	turns         int64
	upstream      upstreamMode
	routing       routing
	forward       bool
	rates         rates
	seed          uint64

	baselines bool
	calibrate bool
	jsonPath  string
	quiet     bool

	// wrapStore, when set, wraps each replica's store; tests use it to put
	// a faulty store in front of the real one.
	wrapStore func(gatewayStore) gatewayStore
}

// usageError is a flag whose value is out of range.
type usageError struct {
	flag, msg string
}

// Error names the flag and what is wrong with it.
func (e *usageError) Error() string {
	if e.flag == "" {
		return e.msg
	}
	return "-" + e.flag + ": " + e.msg
}

// parseConfig parses and validates args.
func parseConfig(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{}
	var cluster, upstream, route string
	fs := flag.NewFlagSet("contbench", flag.ContinueOnError)
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: contbench [flags]\n\n"+
			"Simulates gateway replicas driving a continuation store, checks every\n"+
			"decision against ground truth and reports what the deployment delivers.\n"+
			"With no -redis, -cluster or -backend it uses an embedded Redis.\n\n"+
			"By default it plays one workload (-seed, -conversations, -turns) three\n"+
			"ways, %d turns each unless -turns or -duration is given, and reports\n"+
			"the comparison first:\n"+
			"  (a) the deployment: -replicas replicas (4) behind a -routing balancer\n"+
			"      (round-robin) sharing the store, upstream same-socket, -forward on;\n"+
			"  (b) one replica with as many upstream sockets as (a)'s replicas have:\n"+
			"      the best one process can do;\n"+
			"  (c) one in-process store per replica, as single-process gateways do\n"+
			"      today; its wrong continuations are counted, not failures.\n"+
			"-baselines=false plays (a) alone, for load tests and calibration.\n\n"+
			"The report's headline gives the result: PASS, no decision of the shared\n"+
			"store in (a) and (b) that ground truth forbids; FAIL, some; INCONCLUSIVE,\n"+
			"a run is not a measurement of the store, because more than %.0f%% of its\n"+
			"reservations failed open or more than %.0f%% of its records and aborts\n"+
			"failed (see -op-timeout), or a Redis server's clock fell behind this\n"+
			"machine's during the runs. FAIL wins over INCONCLUSIVE, except over a\n"+
			"clock that fell behind: calls could then run after their deadline.\n\n"+
			"Exit status: %d PASS, %d FAIL, %d bad flags or a target that cannot be used,\n"+
			"%d INCONCLUSIVE, %d interrupted.\n\n"+
			"Subcommand:\n  contbench replay [flags] TRACE.jsonl...\n"+
			"    \treplay recorded client traffic through the store and explain every miss\n"+
			"    \t(contbench replay -h)\n\nFlags:\n", defaultTurns, 100*maxFailedShare, 100*maxFailedShare,
			exitOK, exitViolations, exitUsage, exitInconclusive, exitInterrupted)
		fs.PrintDefaults()
	}

	fs.StringVar(&cfg.redisURL, "redis", "", "standalone Redis `URL` to test, e.g. redis://127.0.0.1:6379/0")
	fs.StringVar(&cluster, "cluster", "", "Redis Cluster seed `nodes` to test, host:port,host:port,...")
	fs.StringVar(&cfg.backend, "backend", "redis", "store backend: redis (the -redis or -cluster target, else an embedded Redis) or memory (one in-process store shared by all replicas)")
	fs.StringVar(&cfg.client, "client", clientGoRedis, "Redis client library of the replicas' stores and of -calibrate: go-redis (store.NewRedis) or rueidis (store.NewRueidis)")
	fs.IntVar(&cfg.partitions, "partitions", 16, "store partitions (1..1024)")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "idle TTL of an owner's state")
	fs.IntVar(&cfg.maxOwners, "max-owners", 100000, "most owners the store keeps")
	fs.Int64Var(&cfg.maxTotalBytes, "max-total-bytes", 1<<30, "most bytes the store keeps")
	fs.DurationVar(&cfg.opTimeout, "op-timeout", 200*time.Millisecond, "bound on each store operation of the measured turns (set-up and clean-up calls get "+adminTimeout.String()+")")
	fs.StringVar(&cfg.namespace, "namespace", "", "Redis key namespace; it must hold no continuation state yet (default: a fresh contbench-<random> one)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the namespace's keys after the run (those of (a); (b)'s namespace of its own is removed)")

	fs.IntVar(&cfg.replicas, "replicas", 4, "gateway replicas, each with its own Redis client and store")
	fs.IntVar(&cfg.conversations, "conversations", 200, "conversations (sessions)")
	fs.IntVar(&cfg.agents, "agents", 1, "sub-agent owners per conversation besides the main thread")
	fs.IntVar(&cfg.alike, "alike", 1, "conversations that open alike (one credential, prompt and first message, no session id) in groups of `N`, played concurrently: each group's main threads share the one owner a gateway derives for them (1: every conversation its own)")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "concurrent turns (workers)")
	fs.IntVar(&cfg.sockets, "sockets", 64, "upstream sockets per replica")
	fs.DurationVar(&cfg.duration, "duration", 0, "stop after this long (0: no time limit)")
	fs.Int64Var(&cfg.turns, "turns", defaultTurns, "turns of each run, split evenly over the owners (0: no limit; the default applies only without -duration)")
	fs.StringVar(&upstream, "upstream", string(sameSocket), "upstream continuation rule: same-socket (store=false: only the socket holding the latest response) or any (store=true)")
	fs.StringVar(&route, "routing", string(roundRobin), "how turns reach replicas: round-robin, random or sticky")
	fs.BoolVar(&cfg.forward, "forward", true, "forward a turn whose continuation lives on another replica's upstream socket to that replica, found in the directory (-forward=false: send the full context)")

	fs.Float64Var(&cfg.rates.promptChange, "prompt-change", 0.02, "probability per turn that the owner's prompt fields change")
	fs.Float64Var(&cfg.rates.edit, "edit", 0.02, "probability per turn that the client edits an earlier item")
	fs.Float64Var(&cfg.rates.concurrent, "concurrent", 0.02, "probability per turn of two concurrent requests for the owner")
	fs.Float64Var(&cfg.rates.abort, "abort", 0.02, "probability per turn that the upstream fails and the turn is aborted")
	fs.Float64Var(&cfg.rates.noID, "no-id", 0.01, "probability per turn that the response id is lost")
	fs.Float64Var(&cfg.rates.socketLoss, "socket-loss", 0.02, "probability per turn that the upstream socket reconnects and forgets its response")
	fs.Float64Var(&cfg.rates.idle, "idle", 0.002, "probability per turn of an idle gap longer than the TTL after it")
	fs.Uint64Var(&cfg.seed, "seed", 1, "random seed of the workload: with the workload flags and -turns it decides every event, whatever -concurrency")

	fs.BoolVar(&cfg.baselines, "baselines", true, "also play the workload on one replica (b) and with one in-process store per replica (c); with -duration alone they play as many turns as (a) did")
	fs.BoolVar(&cfg.calibrate, "calibrate", false, "measure the Redis PING and no-op script ceilings with the same clients and concurrency")
	fs.StringVar(&cfg.jsonPath, "json", "", "also write the report as JSON to `file`")
	fs.BoolVar(&cfg.quiet, "quiet", false, "print the report only: no progress or notes on stderr, no notes under the report (the -json report keeps them)")

	if err := parseFlags(fs, args, usage, stderr); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, &usageError{"", fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["duration"] && !set["turns"] {
		cfg.turns = 0
	}
	cfg.upstream = upstreamMode(upstream)
	cfg.routing = routing(route)
	if cluster != "" {
		cfg.cluster = strings.Split(cluster, ",")
	}
	if cfg.namespace == "" && !set["namespace"] {
		cfg.namespace = freshNamespace()
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkOutputPath(cfg.jsonPath); err != nil {
		return nil, &usageError{"json", err.Error()}
	}
	return cfg, nil
}

// validate checks every value, naming the first flag out of range.
func (c *config) validate() error {
	bad := func(name, format string, args ...any) error {
		return &usageError{name, fmt.Sprintf(format, args...)}
	}
	switch {
	case c.redisURL != "" && len(c.cluster) > 0:
		return bad("cluster", "give -redis or -cluster, not both")
	case c.backend != "redis" && c.backend != backendMemory:
		return bad("backend", "is %q, want redis or memory", c.backend)
	case c.backend == backendMemory && (c.redisURL != "" || len(c.cluster) > 0):
		return bad("backend", "memory takes no -redis or -cluster target")
	case c.client != clientGoRedis && c.client != clientRueidis:
		return bad("client", "is %q, want %s or %s", c.client, clientGoRedis, clientRueidis)
	case c.backend == backendMemory && c.client != clientGoRedis:
		return bad("client", "the memory backend uses no Redis client")
	case c.partitions < 1 || c.partitions > store.MaxPartitions:
		return bad("partitions", "is %d, want 1..%d", c.partitions, store.MaxPartitions)
	case c.ttl < time.Millisecond:
		return bad("ttl", "is %v, want at least 1ms", c.ttl)
	case c.maxOwners < c.partitions:
		return bad("max-owners", "is %d, want at least -partitions (%d)", c.maxOwners, c.partitions)
	case c.maxTotalBytes < int64(c.partitions):
		return bad("max-total-bytes", "is %d, want at least -partitions (%d)", c.maxTotalBytes, c.partitions)
	case c.opTimeout <= 0:
		return bad("op-timeout", "is %v, want more than 0", c.opTimeout)
	case c.replicas < 1 || c.replicas > 1000:
		return bad("replicas", "is %d, want 1..1000", c.replicas)
	case c.conversations < 1 || c.conversations > 10_000_000:
		return bad("conversations", "is %d, want 1..10000000", c.conversations)
	case c.agents < 0 || c.agents > 1000:
		return bad("agents", "is %d, want 0..1000", c.agents)
	case c.alike < 1 || c.alike > c.conversations:
		return bad("alike", "is %d, want 1..-conversations (%d)", c.alike, c.conversations)
	case c.concurrency < 1 || c.concurrency > 10000:
		return bad("concurrency", "is %d, want 1..10000", c.concurrency)
	case c.sockets < 1 || c.sockets > maxSockets:
		return bad("sockets", "is %d, want 1..%d", c.sockets, maxSockets)
	case c.duration < 0:
		return bad("duration", "is %v, want 0 (no limit) or more", c.duration)
	case c.turns < 0:
		return bad("turns", "is %d, want 0 (no limit) or more", c.turns)
	case c.duration == 0 && c.turns == 0:
		return bad("turns", "and -duration are both 0: the run would never end")
	case c.upstream != sameSocket && c.upstream != anySocket:
		return bad("upstream", "is %q, want same-socket or any", c.upstream)
	case c.routing != roundRobin && c.routing != random && c.routing != sticky:
		return bad("routing", "is %q, want round-robin, random or sticky", c.routing)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"prompt-change", c.rates.promptChange}, {"edit", c.rates.edit}, {"concurrent", c.rates.concurrent},
		{"abort", c.rates.abort}, {"no-id", c.rates.noID}, {"socket-loss", c.rates.socketLoss}, {"idle", c.rates.idle},
	} {
		if !(r.v >= 0 && r.v <= 1) {
			return bad(r.name, "is %v, want a probability in 0..1", r.v)
		}
	}
	if c.redisURL != "" {
		if err := checkRedisURL(c.redisURL); err != nil {
			return err
		}
	}
	for _, addr := range c.cluster {
		if _, _, err := net.SplitHostPort(addr); err != nil || strings.TrimSpace(addr) != addr {
			return bad("cluster", "%q is not host:port", addr)
		}
	}
	if c.namespace == "" {
		return bad("namespace", "is empty")
	}
	// The store knows what a namespace may hold.
	if _, err := store.NewMemory(store.Options{Namespace: c.namespace}); err != nil {
		return bad("namespace", "%v", err)
	}
	return nil
}

// freshNamespace returns a namespace no earlier run used.
func freshNamespace() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "contbench-" + hex.EncodeToString(b[:])
}

// storeOptions returns the options of the store of the named replica.
func (c *config) storeOptions(replica string) store.Options {
	return store.Options{
		Namespace:     c.namespace,
		Partitions:    c.partitions,
		TTL:           c.ttl,
		MaxOwners:     c.maxOwners,
		MaxTotalBytes: c.maxTotalBytes,
		OpTimeout:     c.opTimeout,
		Replica:       replica,
	}
}

// replicaName names the i-th replica, counting from 0.
func replicaName(i int) string { return fmt.Sprintf("replica-%d", i+1) }

// execute runs the benchmark described by cfg and returns the exit status.
func execute(ctx context.Context, cfg *config, stdout, stderr io.Writer) int {
	notes := io.Writer(stderr)
	if cfg.quiet {
		notes = io.Discard
	}
	tgt, err := openTarget(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "contbench: %v\n", err)
		return exitUsage
	}
	defer func() {
		if err := tgt.close(ctx, cfg.keep); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
		}
	}()
	if tgt.embedded {
		fmt.Fprintln(notes, "contbench: no -redis or -cluster given: using an embedded Redis (miniredis), whose figures are not representative of a real server")
	}

	rep := newReport(cfg, tgt)
	clocks := watchClocks(ctx, tgt.admin) // none for the memory backend
	defer clocks.finish()
	before, sampleErr := tgt.sample(ctx)
	if err := tgt.connect(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "contbench: %v\n", err)
		return exitUsage
	}
	dir, err := tgt.directory(cfg, cfg.namespace)
	if err != nil {
		fmt.Fprintf(stderr, "contbench: %v\n", err)
		return exitUsage
	}
	rep.Run = simulate(ctx, cfg, deployment{stores: tgt.stores, dir: dir, state: tgt.state}, labelDeployment, notes)
	rep.Run.Namespace = tgt.ns
	switch {
	case ctx.Err() != nil:
	case tgt.embedded:
		rep.note("figures from the embedded Redis (miniredis) are not representative of a real server; " +
			"Redis memory and server time per script are not measured on it")
	case sampleErr != nil:
		rep.note("Redis figures unavailable: %v", sampleErr)
	case tgt.hasServerInfo():
		measureServer(ctx, cfg, tgt, before, rep)
	}
	if cfg.calibrate && ctx.Err() == nil {
		rep.Calibrate = calibrate(ctx, cfg, tgt, rep)
	}
	if cfg.baselines && ctx.Err() == nil {
		if err := playBaselines(ctx, cfg, tgt, rep, notes); err != nil {
			rep.note("the baselines were not played: %v", err)
		}
	}
	for _, n := range tgt.notes {
		if !slices.Contains(rep.Notes, n) { // the replicas may have connected twice
			rep.note("%s", n)
		}
	}
	lag, server := clocks.finish()
	rep.ClockLagMillis, rep.ClockLagServer = float64(lag)/float64(time.Millisecond), server
	if ctx.Err() != nil {
		rep.interrupted = interruption(cfg, rep.Run.Turns)
	}
	rep.finish(cfg)

	rep.write(stdout, !cfg.quiet)
	if cfg.jsonPath != "" {
		if err := writeJSON(cfg.jsonPath, rep); err != nil {
			fmt.Fprintf(stderr, "contbench: %v\n", err)
			return exitUsage
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "contbench: interrupted")
		return exitInterrupted
	}
	return resultStatus(&rep.Headline, stderr)
}

// resultStatus returns the exit status of the result h gives, saying on
// stderr why it is not PASS.
func resultStatus(h *headline, stderr io.Writer) int {
	switch h.Result {
	case resultFail:
		fmt.Fprintf(stderr, "contbench: FAIL: %d oracle violations in the shared-store runs: the store answered what ground truth does not allow (see the report)\n",
			h.Violations)
		return exitViolations
	case resultInconclusive:
		fmt.Fprintf(stderr, "contbench: INCONCLUSIVE: %s\n", reasonsSentence(h.Inconclusive))
		return exitInconclusive
	}
	return exitOK
}

// Deployments, as the report's columns name them.
const (
	labelDeployment = "(a) deployment"
	labelOneReplica = "(b) one replica"
	labelPerReplica = "(c) per-replica stores"
)

// playBaselines plays the workload of the deployment's run again on one
// replica of the same backend, then with one in-process store per
// replica, and adds both to rep. A deployment run bounded by -duration
// alone gives them its turn count, so that all three play the same turns.
func playBaselines(ctx context.Context, cfg *config, tgt *target, rep *report, notes io.Writer) error {
	same := *cfg
	if same.turns == 0 {
		same.turns, same.duration = rep.Run.Turns, 0
	}
	if same.turns == 0 {
		return nil // the deployment played nothing to compare
	}
	one := same
	one.replicas, one.sockets = 1, min(cfg.replicas*cfg.sockets, maxSockets)
	if err := playOneReplica(ctx, &one, tgt, rep, notes); err != nil || ctx.Err() != nil {
		return err
	}
	perReplica, err := memoryStores(&same)
	if err != nil {
		return err
	}
	dir, err := directory.NewMemory(directory.Options{OpTimeout: cfg.opTimeout})
	if err != nil {
		return err
	}
	c := simulate(ctx, &same, deployment{stores: perReplica, dir: dir, own: perReplica}, labelPerReplica, notes)
	rep.PerReplica = &c
	return nil
}

// playOneReplica plays the one-replica baseline, one, on the target's
// backend and adds it to rep.
func playOneReplica(ctx context.Context, one *config, tgt *target, rep *report, notes io.Writer) error {
	d, remove, err := tgt.oneReplica(ctx, one)
	defer func() {
		if remove == nil {
			return
		}
		if err := remove(); err != nil {
			rep.note("removing the one-replica baseline's namespace: %v", err)
		}
	}()
	if err != nil {
		return fmt.Errorf("setting up the one-replica baseline: %w", err)
	}
	single := simulate(ctx, one, d, labelOneReplica, notes)
	if tgt.newClient != nil {
		single.Namespace = d.stores[0].Options().Namespace
	}
	rep.OneReplica = &single
	return nil
}
