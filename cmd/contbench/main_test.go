package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// bench is one finished run of the command.
type bench struct {
	code   int
	report report
	stdout string
	stderr string
}

// runBench runs contbench with args, quietly, and reads its JSON report.
// Store operations get a generous timeout, so that a loaded test machine
// does not make them fail open.
func runBench(t *testing.T, args ...string) bench {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	args = append([]string{"-op-timeout", "5s"}, args...)
	b := bench{code: run(context.Background(), append(args, "-quiet", "-json", path), &stdout, &stderr)}
	b.stdout, b.stderr = stdout.String(), stderr.String()
	if data, err := os.ReadFile(path); err == nil {
		require.NoError(t, json.Unmarshal(data, &b.report))
	}
	return b
}

// requireSound checks that a run of turns turns passed and that its
// figures are sane.
func requireSound(t *testing.T, b bench, turns int64) {
	t.Helper()
	require.Equal(t, exitOK, b.code, "stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
	r := b.report.Run
	assert.Zero(t, r.Violations, "violations: %+v", r.Examples)
	assert.Equal(t, turns, r.Turns)
	assert.Equal(t, turns, r.Ops["reserve"].Count)
	assert.Positive(t, r.Ops["record"].Count)
	for _, op := range []string{"reserve", "record"} {
		assert.Positive(t, r.Ops[op].P50, op)
		assert.GreaterOrEqual(t, r.Ops[op].Max, r.Ops[op].P99, op)
	}
	assert.Positive(t, r.TurnsPerSecond)
	assert.Positive(t, r.Input.ItemsSaved)
	assert.Positive(t, r.Input.BytesSaved)
	assert.Less(t, r.Input.ItemsSent, r.Input.ItemsFull)
	var misses int64
	for _, n := range r.Misses {
		misses += n
	}
	assert.Equal(t, r.Turns-r.Continued, misses, "misses by reason add up to the turns that did not continue")
	assert.Zero(t, r.Errors, r.FirstError)
	assert.Zero(t, r.FailOpen, r.FirstError)
	require.NotNil(t, r.State, r.StateError)
	assert.Positive(t, r.State.Owners)
	assert.Contains(t, b.stdout, "hit rate")
}

func TestEmbeddedRedisStickyRun(t *testing.T) {
	b := runBench(t, "-turns", "2000", "-conversations", "50", "-routing", "sticky", "-upstream", "any")
	requireSound(t, b, 2000)
	assert.Equal(t, "embedded miniredis", b.report.Target)
	assert.Greater(t, b.report.Run.HitRate, 0.5)
	assert.Contains(t, strings.Join(b.report.Notes, "\n"), "embedded Redis")
}

func TestDefaultWorkloadOnEmbeddedRedis(t *testing.T) {
	b := runBench(t, "-turns", "1000")
	requireSound(t, b, 1000)
	r := b.report.Run
	assert.Positive(t, r.Misses[missOriginElsewhere], "round-robin over socket-bound continuations")
	assert.Positive(t, r.Records[string(store.OutcomeStale)], "concurrent pairs leave a stale record")
	assert.Positive(t, r.Records[string(store.OutcomeDropped)], "lost response ids are dropped")
}

func TestMemoryBackend(t *testing.T) {
	b := runBench(t, "-backend", "memory", "-turns", "3000", "-routing", "sticky", "-upstream", "any")
	requireSound(t, b, 3000)
	assert.Equal(t, "in-process store shared by all replicas", b.report.Target)
	assert.Greater(t, b.report.Run.HitRate, 0.5)
	assert.Nil(t, b.report.Redis)
}

func TestMemoryBackendStopsAfterDuration(t *testing.T) {
	b := runBench(t, "-backend", "memory", "-duration", "300ms")
	require.Equal(t, exitOK, b.code, b.stderr)
	assert.Positive(t, b.report.Run.Turns)
	assert.Less(t, b.report.Run.Seconds, 5.0)
}

// namespaceKeys counts the keys of namespace ns on every server c reaches.
func namespaceKeys(t *testing.T, c redis.UniversalClient, ns string) int {
	t.Helper()
	var (
		mu sync.Mutex
		n  int
	)
	err := rediskeys.EachServer(context.Background(), c, func(ctx context.Context, s redis.Cmdable) error {
		keys, err := s.Keys(ctx, ns+":*").Result()
		mu.Lock()
		defer mu.Unlock()
		n += len(keys)
		return err
	})
	require.NoError(t, err)
	return n
}

func TestStandaloneRedis(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	target := "redis://" + c.Options().Addr

	b := runBench(t, "-redis", target, "-namespace", ns, "-turns", "3000", "-calibrate")
	requireSound(t, b, 3000)
	assert.Zero(t, namespaceKeys(t, c, ns), "the namespace is removed after the run")

	rs := b.report.Redis
	require.NotNil(t, rs, "notes: %v", b.report.Notes)
	assert.Positive(t, rs.UsedMemoryAfter)
	assert.Positive(t, rs.Scripts.Calls)
	assert.GreaterOrEqual(t, rs.Reserve.Calls, int64(probeCalls))
	assert.GreaterOrEqual(t, rs.Record.Calls, int64(probeCalls))
	assert.Positive(t, rs.Reserve.UsecPerCall)
	cal := b.report.Calibrate
	require.NotNil(t, cal)
	assert.Positive(t, cal.PingPerSecond)
	assert.Positive(t, cal.EvalshaPerSecond)
	assert.Positive(t, cal.FractionOfEvalsha)
}

func TestKeepLeavesTheNamespaceAndItCannotBeReused(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	target := "redis://" + c.Options().Addr

	b := runBench(t, "-redis", target, "-namespace", ns, "-turns", "300", "-keep")
	requireSound(t, b, 300)
	assert.Positive(t, namespaceKeys(t, c, ns), "-keep keeps the keys")

	again := runBench(t, "-redis", target, "-namespace", ns, "-turns", "300")
	assert.Equal(t, exitUsage, again.code)
	assert.Contains(t, again.stderr, "already holds continuation state")
	assert.Positive(t, namespaceKeys(t, c, ns), "a namespace contbench did not create is left alone")
}

func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)

	b := runBench(t, "-cluster", strings.Join(c.Options().Addrs, ","), "-namespace", ns, "-turns", "2000",
		"-forward")
	requireSound(t, b, 2000)
	assert.Positive(t, b.report.Run.Forwarded)
	require.NotNil(t, b.report.Redis, "notes: %v", b.report.Notes)
	assert.Positive(t, b.report.Redis.Scripts.Calls)
	assert.Zero(t, namespaceKeys(t, c, ns), "the namespace is removed from every master")
}

// skipsPromptCheck is a broken store: when the real store refuses a
// continuation because the prompt changed, it offers one anyway, from the
// last response it saw recorded for the owner.
type skipsPromptCheck struct {
	gatewayStore
	mu   *sync.Mutex
	last map[identity.Owner]published
}

// published is a response skipsPromptCheck saw recorded.
type published struct {
	id     string
	items  int
	origin store.Socket
}

// Reserve forges a continuation where the store says the prompt changed.
func (s skipsPromptCheck) Reserve(ctx context.Context, owner identity.Owner, req *fingerprint.Request) *store.Reservation {
	res := s.gatewayStore.Reserve(ctx, owner, req)
	s.mu.Lock()
	last, ok := s.last[owner]
	s.mu.Unlock()
	if res.Reason != store.ReasonPromptChanged || !ok || last.items >= req.Len() {
		return res
	}
	forged := *res
	forged.Reason = store.ReasonNone
	forged.PreviousResponseID = last.id
	forged.Origin = last.origin
	forged.Delta = req.Items()[last.items:]
	forged.DeltaCount = len(forged.Delta)
	return &forged
}

// Record remembers what it publishes.
func (s skipsPromptCheck) Record(ctx context.Context, res *store.Reservation, out store.Result) (store.Outcome, error) {
	outcome, err := s.gatewayStore.Record(ctx, res, out)
	if outcome == store.OutcomePublished {
		s.mu.Lock()
		s.last[res.Owner] = published{id: out.ResponseID, items: res.Request().Len() + len(out.Output), origin: out.Socket}
		s.mu.Unlock()
	}
	return outcome, err
}

func TestBrokenStoreFailsTheRun(t *testing.T) {
	cfg, err := parseConfig([]string{"-backend", "memory", "-turns", "1000", "-prompt-change", "0.3",
		"-upstream", "any", "-quiet"}, io.Discard)
	require.NoError(t, err)
	broken := skipsPromptCheck{mu: &sync.Mutex{}, last: map[identity.Owner]published{}}
	cfg.wrapStore = func(s gatewayStore) gatewayStore {
		broken := broken
		broken.gatewayStore = s
		return broken
	}
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), cfg, &stdout, &stderr)

	assert.Equal(t, exitViolations, code)
	assert.Contains(t, stdout.String(), "VIOLATIONS (shared store)")
	assert.Contains(t, stdout.String(), "prompt changed: ")
	assert.Contains(t, stderr.String(), "oracle violations")
}

// requireComparison runs the workload with upstream flags mode on one
// sticky replica, then on four round-robin replicas with -compare: the
// shared store keeps the single replica's hit rate, per-replica stores
// lose most of it and offer stale continuations.
func requireComparison(t *testing.T, mode ...string) {
	t.Helper()
	base := append([]string{"-backend", "memory", "-conversations", "50", "-turns", "2000"}, mode...)
	single := runBench(t, append(base, "-replicas", "1", "-routing", "sticky")...)
	requireSound(t, single, 2000)

	b := runBench(t, append(base, "-replicas", "4", "-routing", "round-robin", "-compare")...)
	requireSound(t, b, 2000)
	require.NotNil(t, b.report.Compare)
	shared, perReplica := b.report.Run.HitRate, b.report.Compare.HitRate
	t.Logf("hit rates: one sticky replica %.3f, shared store %.3f, per-replica stores %.3f",
		single.report.Run.HitRate, shared, perReplica)
	assert.GreaterOrEqual(t, shared, 0.9*single.report.Run.HitRate)
	assert.Less(t, perReplica, 0.5*shared)
	assert.Positive(t, b.report.Compare.Violations, "per-replica stores offer stale continuations")
	assert.Contains(t, b.stdout, "per-replica memory")
}

func TestCompareUnderAnySocketUpstream(t *testing.T) {
	requireComparison(t, "-upstream", "any")
}

func TestCompareUnderSameSocketUpstreamWithForwarding(t *testing.T) {
	requireComparison(t, "-upstream", "same-socket", "-forward")
}

func TestBadFlagsExitWithUsageStatus(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-partitions", "0"}, "-partitions"},
		{[]string{"-partitions", "2000"}, "-partitions"},
		{[]string{"-ttl", "0s"}, "-ttl"},
		{[]string{"-max-owners", "3"}, "-max-owners"},
		{[]string{"-max-total-bytes", "-1"}, "-max-total-bytes"},
		{[]string{"-op-timeout", "0s"}, "-op-timeout"},
		{[]string{"-namespace", "a{b}"}, "-namespace"},
		{[]string{"-namespace", "a b"}, "-namespace"},
		{[]string{"-namespace", ""}, "-namespace"},
		{[]string{"-replicas", "0"}, "-replicas"},
		{[]string{"-conversations", "0"}, "-conversations"},
		{[]string{"-agents", "-1"}, "-agents"},
		{[]string{"-concurrency", "0"}, "-concurrency"},
		{[]string{"-sockets", "0"}, "-sockets"},
		{[]string{"-duration", "-1s"}, "-duration"},
		{[]string{"-turns", "-5"}, "-turns"},
		{[]string{"-turns", "0"}, "-turns"},
		{[]string{"-turns", "many"}, "-turns"},
		{[]string{"-upstream", "all"}, "-upstream"},
		{[]string{"-routing", "hash"}, "-routing"},
		{[]string{"-prompt-change", "1.5"}, "-prompt-change"},
		{[]string{"-edit", "-0.1"}, "-edit"},
		{[]string{"-concurrent", "NaN"}, "-concurrent"},
		{[]string{"-abort", "2"}, "-abort"},
		{[]string{"-no-id", "2"}, "-no-id"},
		{[]string{"-socket-loss", "2"}, "-socket-loss"},
		{[]string{"-idle", "2"}, "-idle"},
		{[]string{"-backend", "disk"}, "-backend"},
		{[]string{"-backend", "memory", "-redis", "redis://127.0.0.1:1"}, "-backend"},
		{[]string{"-redis", "http://127.0.0.1"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1", "-cluster", "127.0.0.1:2"}, "-cluster"},
		{[]string{"-cluster", "127.0.0.1"}, "-cluster"},
		{[]string{"-no-such-flag"}, "-no-such-flag"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stdout, &stderr)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr.String(), tc.flag)
			assert.Empty(t, stdout.String())
		})
	}
}

func TestUnreachableRedisIsASetupError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-redis", "redis://127.0.0.1:1", "-quiet"}, &stdout, &stderr)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr.String(), "cannot reach redis redis://127.0.0.1:1")
}

func TestHelpExitsZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, exitOK, run(context.Background(), []string{"-h"}, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "-conversations")
}
