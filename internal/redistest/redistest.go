// Package redistest provides Redis clients and helpers for tests.
//
// The real-server helpers (Standalone, Replicated, Cluster, ServerBinary)
// read the addresses exported by scripts/redis-env.sh, which "make test"
// uses to start throwaway servers on loopback:
//
//	CONTSTORE_REDIS_ADDR             standalone primary without replicas
//	CONTSTORE_REDIS_REPLICATED_ADDR  standalone primary with one replica
//	CONTSTORE_CLUSTER_ADDRS          comma-separated seed nodes of a 3-master cluster
//	CONTSTORE_REDIS_SERVER           path of the redis-server binary
//
// When a variable is unset the test is skipped, so "go test ./..." works
// without Redis. With CI=true in the environment a missing variable fails
// the test instead, so a misconfigured CI run cannot pass silently.
//
// go test shows nothing of a passing package's output but its "ok" line,
// skip messages included, so a plain "go test ./..." cannot tell how many
// tests it skipped. When CONTSTORE_REDIS_SKIP_LOG names a file, every test
// skipped for want of Redis appends a line to it, the package, the test
// and the unset variable separated by tabs; "make test-short" and "make
// bench" set it and end with the count.
//
// Every test should work in its own key namespace:
//
//	c := redistest.Standalone(t)
//	ns := redistest.Namespace(t)
//	redistest.CleanupNamespace(t, c, ns)
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/internal/rediskeys"
)

// Names of the environment variables read by this package.
const (
	EnvAddr           = "CONTSTORE_REDIS_ADDR"
	EnvReplicatedAddr = "CONTSTORE_REDIS_REPLICATED_ADDR"
	EnvClusterAddrs   = "CONTSTORE_CLUSTER_ADDRS"
	EnvServer         = "CONTSTORE_REDIS_SERVER"

	// EnvSkipLog names the file the tests skipped for want of Redis are
	// listed in, one line each; unset, they are not listed.
	EnvSkipLog = "CONTSTORE_REDIS_SKIP_LOG"
)

// pingTimeout bounds the initial reachability check of a server.
const pingTimeout = 5 * time.Second

// PatientOpTimeout is the store OpTimeout of tests that check outcomes, not
// latency: on a loaded machine a call to Redis may take longer than the
// default 200 ms, which would turn it into ReasonStoreUnavailable (and a
// schema check cut short as a store opens refuses nothing).
const PatientOpTimeout = 30 * time.Second

// cleanupTimeout bounds the key deletion done by CleanupNamespace.
const cleanupTimeout = 30 * time.Second

// missing decides what to do when the environment variable env is unset:
// skip the test (the default) or fail it (when CI is true). msg explains how
// to provide the variable.
func missing(env string) (skip bool, msg string) {
	ci, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("CI")))
	if ci {
		return false, fmt.Sprintf("%s is not set but CI=true: Redis tests must not be skipped in CI; "+
			"run them with `make test`, which starts Redis (scripts/redis-env.sh)", env)
	}
	return true, fmt.Sprintf("%s is not set; run `make test`, which starts Redis (scripts/redis-env.sh), "+
		"to run this test", env)
}

// lookup returns the value of the environment variable env, skipping or
// failing the test as decided by missing when it is unset or empty.
func lookup(t testing.TB, env string) string {
	t.Helper()
	if v := strings.TrimSpace(os.Getenv(env)); v != "" {
		return v
	}
	skip, msg := missing(env)
	if skip {
		logSkip(t, env)
		t.Skip(msg)
	}
	t.Fatal(msg)
	return ""
}

// logSkip appends "package<TAB>test<TAB>env" to the file named by
// EnvSkipLog, when set, for a test about to be skipped because env is
// unset. A line is one write to a file opened for appending, so the lines
// of tests and test binaries running at once do not mix.
func logSkip(t testing.TB, env string) {
	path := os.Getenv(EnvSkipLog)
	if path == "" {
		return
	}
	line := testPackage() + "\t" + t.Name() + "\t" + env + "\n"
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err == nil {
		_, err = f.WriteString(line)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Logf("redistest: listing the skipped test in %s=%s: %v", EnvSkipLog, path, err)
	}
}

// testPackage returns the import path of the package under test, from the
// test binary's build information ("example.com/p.test"), or the binary's
// name without ".test" when that is missing.
func testPackage() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Path != "" {
		return strings.TrimSuffix(bi.Path, ".test")
	}
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	return strings.TrimSuffix(name, ".test")
}

// Standalone returns a client for the standalone primary at
// CONTSTORE_REDIS_ADDR. That server has no replicas, so WAIT returns 0 on it.
// The client is closed when the test ends.
func Standalone(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, EnvAddr)
}

// Replicated returns a client for the standalone primary at
// CONTSTORE_REDIS_REPLICATED_ADDR, which has one connected replica.
// The client is closed when the test ends.
func Replicated(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, EnvReplicatedAddr)
}

func newClient(t testing.TB, env string) *redis.Client {
	t.Helper()
	addr := lookup(t, env)
	c := redis.NewClient(&redis.Options{
		Addr:        addr,
		DialTimeout: pingTimeout,
	})
	t.Cleanup(func() { _ = c.Close() })
	ping(t, c, fmt.Sprintf("%s=%s", env, addr))
	return c
}

// Cluster returns a cluster client seeded with the nodes listed in
// CONTSTORE_CLUSTER_ADDRS. The client is closed when the test ends.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	v := lookup(t, EnvClusterAddrs)
	var addrs []string
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		t.Fatalf("%s=%q lists no addresses", EnvClusterAddrs, v)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:       addrs,
		DialTimeout: pingTimeout,
	})
	t.Cleanup(func() { _ = c.Close() })
	ping(t, c, fmt.Sprintf("%s=%s", EnvClusterAddrs, v))
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Ping(ctx).Err()
	})
	if err != nil {
		t.Fatalf("redis cluster at %s=%s: not every master is reachable: %v", EnvClusterAddrs, v, err)
	}
	return c
}

func ping(t testing.TB, c redis.UniversalClient, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s is not reachable: %v (is the server from `make test` still running?)", what, err)
	}
}

// ServerBinary returns the path of the redis-server binary given by
// CONTSTORE_REDIS_SERVER, for tests that run their own server processes.
// It skips or fails the test like the client helpers when the variable is
// unset.
func ServerBinary(t testing.TB) string {
	t.Helper()
	p := lookup(t, EnvServer)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatalf("%s=%s: %v", EnvServer, p, err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s=%s is not an executable file", EnvServer, p)
	}
	return p
}

// Miniredis starts an in-process miniredis server and returns it with a
// client connected to it. Both are closed when the test ends. Use it for
// fast tests that do not depend on exact Redis semantics (replication,
// cluster, Lua edge cases).
func Miniredis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m, err := miniredis.Run()
	if err != nil {
		t.Fatalf("starting miniredis: %v", err)
	}
	t.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	// Registered after m.Close, so it runs first.
	t.Cleanup(func() { _ = c.Close() })
	return m, c
}

// maxNamePart is the number of characters of the sanitized test name kept
// in a namespace; the random suffix adds 9 more ("-" and 8 hex digits).
const maxNamePart = 14

// Namespace returns a key namespace unique to this call: a short form of the
// test name followed by a random suffix, such as "TestSaveLoad-3fa94c1e".
// It contains only ASCII letters, digits and '-', is at most 23 characters
// long and never contains '{', '}', ':' or glob characters, so callers can
// embed it in keys and hash tags freely.
func Namespace(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("reading random bytes: %v", err)
	}
	return sanitizeName(t.Name()) + "-" + hex.EncodeToString(b[:])
}

// sanitizeName maps a test name to at most maxNamePart characters from
// [A-Za-z0-9-]. It drops a leading "Test", turns runs of other characters
// into a single '-' and never returns an empty string.
func sanitizeName(name string) string {
	if trimmed := strings.TrimPrefix(name, "Test"); trimmed != "" && trimmed != name {
		name = trimmed
	}
	var sb strings.Builder
	dash := false
	for _, r := range name {
		if sb.Len() >= maxNamePart {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			sb.WriteRune(r)
			dash = false
		default:
			if !dash && sb.Len() > 0 {
				sb.WriteByte('-')
				dash = true
			}
		}
	}
	s := strings.TrimRight(sb.String(), "-")
	if s == "" {
		s = "t"
	}
	return s
}

// CleanupNamespace registers a cleanup that deletes every key whose name
// starts with ns, on every master when c is a *redis.ClusterClient and on
// every shard when c is a *redis.Ring. Keys are found with SCAN and removed
// with UNLINK; the database is never flushed, so tests sharing a server do not
// disturb each other.
//
// Call it after creating c (cleanups run last-in first-out, so c is still
// open when the keys are deleted). An empty ns fails the test.
func CleanupNamespace(t testing.TB, c redis.UniversalClient, ns string) {
	t.Helper()
	if ns == "" {
		t.Fatal("redistest.CleanupNamespace: empty namespace would match every key")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := rediskeys.DeletePrefix(ctx, c, ns); err != nil {
			t.Errorf("deleting keys of namespace %q: %v", ns, err)
		}
	})
}

// errDown is what every command of a Failing client answers.
var errDown = errors.New("redistest: redis down")

// Failing returns a client whose every command fails at once with an
// error, without a network, as a client of an unreachable Redis does; it is
// closed when the test ends.
func Failing(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	c.AddHook(failHook{})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type failHook struct{}

func (failHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (failHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		cmd.SetErr(errDown)
		return errDown
	}
}

func (failHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cmd.SetErr(errDown)
		}
		return errDown
	}
}

// Clock is a clock tests move by hand; safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
	// server, when set, is a miniredis the clock moves with (ServerClock).
	server *miniredis.Miniredis
}

// NewClock returns a Clock reading now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// ServerClock returns a Clock reading now that is also mr's: TIME answers
// the clock's time, and keys expire as the clock moves past their TTL.
// Scripts on mr then see time move as a server's does.
func ServerClock(mr *miniredis.Miniredis, now time.Time) *Clock {
	mr.SetTime(now)
	return &Clock{now: now, server: mr}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock forward by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.move(c.now.Add(d))
}

// Set moves the clock to t, which must not be before its time when it
// moves a server.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.move(t)
}

func (c *Clock) move(t time.Time) {
	if c.server != nil {
		c.server.SetTime(t)
		c.server.FastForward(t.Sub(c.now))
	}
	c.now = t
}

// Burn keeps n goroutines busy, starving the rest of the process of CPU,
// until the returned function is called.
func Burn(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for x := 0; ; x++ {
				select {
				case <-done:
					return
				default:
				}
				for range 1 << 16 {
					x ^= x << 1
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}
