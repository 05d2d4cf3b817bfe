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
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/directory"
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

// testOpTimeout is the -op-timeout of the tests that check outcomes: a
// store call that a loaded machine holds up must not fail open.
const testOpTimeout = "1m"

// runBench runs contbench with args, quietly, and reads its JSON report.
// Store operations get testOpTimeout unless args give one.
func runBench(t *testing.T, args ...string) bench {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	args = append([]string{"-op-timeout", testOpTimeout}, args...)
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
	b := runBench(t, "-turns", "2000", "-conversations", "50", "-routing", "sticky", "-upstream", "any", "-baselines=false")
	requireSound(t, b, 2000)
	assert.Equal(t, "embedded miniredis", b.report.Target)
	assert.Greater(t, b.report.Run.HitRate, 0.5)
	assert.Contains(t, strings.Join(b.report.Notes, "\n"), "embedded Redis")
	assert.Nil(t, b.report.OneReplica)
	assert.Nil(t, b.report.PerReplica)
}

// -quiet prints the report alone: nothing on stderr and no notes under
// the report, with or without -json, which keeps the notes.
func TestQuietPrintsTheReportOnly(t *testing.T) {
	args := []string{"-turns", "300", "-baselines=false", "-op-timeout", testOpTimeout}
	note := "note: figures from the embedded Redis"
	t.Run("loud", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		require.Equal(t, exitOK, run(context.Background(), args, &stdout, &stderr), stderr.String())
		assert.Contains(t, stderr.String(), "using an embedded Redis")
		assert.Contains(t, stdout.String(), note)
	})
	for _, withJSON := range []bool{false, true} {
		name := "quiet"
		a := append(append([]string(nil), args...), "-quiet")
		path := filepath.Join(t.TempDir(), "report.json")
		if withJSON {
			name += " json"
			a = append(a, "-json", path)
		}
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			require.Equal(t, exitOK, run(context.Background(), a, &stdout, &stderr), stderr.String())
			assert.Empty(t, stderr.String())
			assert.True(t, strings.HasPrefix(stdout.String(), "hit rate (a) deployment"), stdout.String())
			assert.NotContains(t, stdout.String(), "note:")
			if !withJSON {
				return
			}
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			var rep report
			require.NoError(t, json.Unmarshal(data, &rep))
			assert.Contains(t, strings.Join(rep.Notes, "\n"), "embedded Redis", "the JSON report keeps the notes")
		})
	}
}

// requireSameWorkload checks that runs played the same workload.
func requireSameWorkload(t *testing.T, want runResult, runs ...*runResult) {
	t.Helper()
	for _, r := range runs {
		require.NotNil(t, r)
		assert.Equal(t, want.Turns, r.Turns, r.Label)
		assert.Equal(t, want.Workload, r.Workload, r.Label)
	}
}

// The default run: the deployment forwards, the headline compares it with
// one replica and per-replica stores, on the same workload.
func TestDefaultRunOnEmbeddedRedis(t *testing.T) {
	b := runBench(t, "-turns", "1000")
	requireSound(t, b, 1000)
	rep := b.report
	r := rep.Run
	assert.Zero(t, r.Misses[missOriginElsewhere], "forwarding is on")
	assert.Positive(t, r.Forwarding.Forwarded, "round-robin over socket-bound continuations")
	assert.Zero(t, r.Forwarding.Fallbacks, r.Forwarding.FirstLookupError)
	assert.Zero(t, r.Forwarding.AnnounceErrors)
	assert.Equal(t, r.Forwarding.Forwarded, r.Forwarding.Lookup.Count, "one lookup per forwarded turn")
	assert.Positive(t, r.Records[string(store.OutcomeStale)], "concurrent pairs leave a stale record")
	assert.Positive(t, r.Records[string(store.OutcomeDropped)], "lost response ids are dropped")

	requireSameWorkload(t, r, rep.OneReplica, rep.PerReplica)
	assert.Zero(t, rep.OneReplica.Violations)
	assert.Zero(t, rep.OneReplica.Forwarding.Forwarded, "one replica holds every socket")
	assert.Positive(t, rep.PerReplica.WrongContinuations)
	assert.NotEqual(t, r.Namespace, rep.OneReplica.Namespace, "the one-replica run has state of its own")

	h := rep.Headline
	assert.True(t, h.Pass)
	assert.Equal(t, resultPass, h.Result)
	assert.Empty(t, h.Inconclusive)
	assert.Equal(t, r.HitRate, h.HitRate)
	require.NotNil(t, h.OneReplicaHitRate)
	require.NotNil(t, h.RatioToOneReplica)
	assert.InDelta(t, r.HitRate / *h.OneReplicaHitRate, *h.RatioToOneReplica, 1e-9)
	require.NotNil(t, h.PerReplicaWrongContinuations)
	assert.Equal(t, rep.PerReplica.WrongContinuations, *h.PerReplicaWrongContinuations)
	assert.Len(t, h.Definitions, 8)
	assert.True(t, strings.HasPrefix(b.stdout, "hit rate (a) deployment"), b.stdout)
	assert.Contains(t, b.stdout, "\nresult   ")
	assert.Contains(t, b.stdout, "PASS    0 violations in (a) and (b)")
	headline, _, _ := strings.Cut(b.stdout, "\n\n")
	_, figures, _ := strings.Cut(b.stdout, "\ncontbench: ")
	assert.NotContains(t, headline+figures, "%", "rates are fractions")
	assert.NotContains(t, headline, "not a measurement")
	assert.Contains(t, b.stdout, "contbench replay", "the report points to replaying real traffic")
}

func TestMemoryBackend(t *testing.T) {
	b := runBench(t, "-backend", "memory", "-turns", "3000", "-routing", "sticky", "-upstream", "any", "-baselines=false")
	requireSound(t, b, 3000)
	assert.Equal(t, "in-process store shared by all replicas", b.report.Target)
	assert.Greater(t, b.report.Run.HitRate, 0.5)
	assert.Nil(t, b.report.Redis)
}

// -alike plays conversations that open alike, with one main-thread owner
// per group, as a gateway derives it for clients that name no session:
// they cost each other continuations, never a wrong one.
func TestAlikeConversationsShareAnOwner(t *testing.T) {
	args := []string{"-backend", "memory", "-turns", "3000", "-conversations", "40", "-agents", "1", "-baselines=false"}
	apart := runBench(t, args...)
	requireSound(t, apart, 3000)
	alike := runBench(t, append(args, "-alike", "4")...)
	requireSound(t, alike, 3000)
	assert.Equal(t, 4, alike.report.Alike)
	assert.Equal(t, 80, alike.report.Threads)
	assert.Equal(t, 10+40, alike.report.Owners, "10 groups' main threads, 40 sub-agents")
	assert.LessOrEqual(t, alike.report.Run.State.Owners, int64(50))
	assert.Contains(t, alike.stdout, "opening alike in groups of 4")
	assert.Equal(t, 80, apart.report.Owners)
	assert.Less(t, alike.report.Run.HitRate, apart.report.Run.HitRate, "a shared owner costs continuations")
	assert.Positive(t, alike.report.Run.Misses[string(store.ReasonNotAppendOnly)])
}

// -duration stops the workers from starting turns: a run lasts the
// duration, and after it at most the slowest turn a worker had in flight,
// longer only by what the process stalled meanwhile.
func TestMemoryBackendStopsAfterDuration(t *testing.T) {
	const duration = 300 * time.Millisecond
	stalls := startStallMonitor(t)
	b := runBench(t, "-backend", "memory", "-duration", duration.String())
	stalled := stalls.stop()
	require.Equal(t, exitOK, b.code, b.stderr)
	r := b.report.Run
	assert.Positive(t, r.Turns)
	assert.GreaterOrEqual(t, r.Seconds, duration.Seconds())
	over := time.Duration((r.Seconds - duration.Seconds()) * float64(time.Second))
	assert.LessOrEqual(t, over, slowestTurn(r)+stalled+time.Second,
		"run went on %v after -duration; its slowest turn took at most %v and the process stalled %v", over, slowestTurn(r), stalled)
	require.NotNil(t, b.report.OneReplica)
	require.NotNil(t, b.report.PerReplica)
	assert.Equal(t, b.report.Run.Turns, b.report.OneReplica.Turns, "the baselines play the deployment's turns")
	assert.Equal(t, b.report.Run.Turns, b.report.PerReplica.Turns)
}

// The workload is each owner's own: its counts depend on the seed and the
// workload flags, never on how many workers play it.
func TestSeedReproducesTheWorkloadAtAnyConcurrency(t *testing.T) {
	args := []string{"-backend", "memory", "-baselines=false", "-conversations", "20", "-agents", "1", "-turns", "1500",
		"-prompt-change", "0.05", "-edit", "0.05", "-concurrent", "0.1", "-abort", "0.05", "-no-id", "0.05",
		"-socket-loss", "0.05", "-idle", "0.02"}
	one := runBench(t, append(args, "-concurrency", "1")...)
	requireSound(t, one, 1500)
	eight := runBench(t, append(args, "-concurrency", "8")...)
	requireSound(t, eight, 1500)
	for _, e := range eventOrder {
		assert.Positive(t, one.report.Run.Workload[e], e)
	}
	requireSameWorkload(t, one.report.Run, &eight.report.Run)

	other := runBench(t, append(args, "-concurrency", "8", "-seed", "2")...)
	requireSound(t, other, 1500)
	assert.NotEqual(t, one.report.Run.Workload, other.report.Run.Workload, "another seed, another workload")
}

// Owners come back from idle gaps longer than the TTL to find their state
// gone, on the embedded Redis's clock; the run is bounded by time, so no
// gap is cut short, and long enough, with gaps frequent enough, that
// owners come back from gaps at any throughput (a starved run plays 20
// turns: none drawn a gap at 0.05 one time in three, at 0.3 one in 1,000).
func TestIdleGapsOutliveTheTTL(t *testing.T) {
	b := runBench(t, "-ttl", "100ms", "-idle", "0.3", "-duration", "3s", "-conversations", "50", "-baselines=false")
	require.Equal(t, exitOK, b.code, "stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
	r := b.report.Run
	assert.Zero(t, r.Violations, "violations: %+v", r.Examples)
	assert.Positive(t, r.Workload[eventIdle])
	assert.Zero(t, r.IdleGapsCut)
	require.NotNil(t, r.State, r.StateError)
	assert.Positive(t, r.State.Evictions.TTL, "idle owners' state expired")
}

func TestForwardingOff(t *testing.T) {
	b := runBench(t, "-backend", "memory", "-turns", "2000", "-forward=false", "-baselines=false")
	requireSound(t, b, 2000)
	r := b.report.Run
	assert.False(t, b.report.Forward)
	assert.Zero(t, r.Forwarding.Forwarded)
	assert.Zero(t, r.Forwarding.Lookup.Count)
	assert.Greater(t, r.Misses[missOriginElsewhere], r.Turns/4)
	assert.Contains(t, strings.Join(b.report.Notes, "\n"), "forwarding (the default, -forward) or sticky routing lets them")
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

// -client rueidis runs the replicas' stores and the calibration on rueidis
// clients, with the same checks.
func TestStandaloneRedisThroughRueidis(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)

	b := runBench(t, "-redis", "redis://"+c.Options().Addr, "-client", "rueidis", "-namespace", ns,
		"-turns", "1500", "-baselines=false", "-calibrate")
	requireSound(t, b, 1500)
	assert.Zero(t, namespaceKeys(t, c, ns), "the namespace is removed after the run")
	require.NotNil(t, b.report.Redis, "notes: %v", b.report.Notes)
	assert.Positive(t, b.report.Redis.Reserve.Calls)
	require.NotNil(t, b.report.Calibrate)
	assert.Positive(t, b.report.Calibrate.EvalshaPerSecond)
	assert.Positive(t, b.report.Calibrate.FractionOfEvalsha)
	assert.Positive(t, b.report.Calibrate.AloneFractionOfEvalsha)
}

func TestStandaloneRedis(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	target := "redis://" + c.Options().Addr

	b := runBench(t, "-redis", target, "-namespace", ns, "-turns", "3000", "-calibrate")
	requireSound(t, b, 3000)
	assert.Zero(t, namespaceKeys(t, c, ns), "the namespace is removed after the run")
	one := b.report.OneReplica
	require.NotNil(t, one)
	requireSameWorkload(t, b.report.Run, one, b.report.PerReplica)
	assert.Zero(t, one.Violations)
	require.NotEmpty(t, one.Namespace)
	assert.Zero(t, namespaceKeys(t, c, one.Namespace), "so is the one-replica run's")

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
	assert.Positive(t, cal.StoreAlonePerSecond)
}

func TestKeepLeavesTheNamespaceAndItCannotBeReused(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	target := "redis://" + c.Options().Addr

	b := runBench(t, "-redis", target, "-namespace", ns, "-conversations", "50", "-turns", "300", "-keep")
	requireSound(t, b, 300)
	assert.Positive(t, namespaceKeys(t, c, ns), "-keep keeps the keys")
	require.NotNil(t, b.report.OneReplica)
	assert.Zero(t, namespaceKeys(t, c, b.report.OneReplica.Namespace), "but not the one-replica run's")

	again := runBench(t, "-redis", target, "-namespace", ns, "-turns", "300", "-baselines=false")
	assert.Equal(t, exitUsage, again.code)
	assert.Contains(t, again.stderr, "already holds continuation state")
	assert.Positive(t, namespaceKeys(t, c, ns), "a namespace contbench did not create is left alone")
}

func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)

	b := runBench(t, "-cluster", strings.Join(c.Options().Addrs, ","), "-namespace", ns, "-turns", "2000")
	requireSound(t, b, 2000)
	assert.Positive(t, b.report.Run.Forwarding.Forwarded)
	assert.Zero(t, b.report.Run.Forwarding.Fallbacks, b.report.Run.Forwarding.FirstLookupError)
	require.NotNil(t, b.report.OneReplica)
	assert.Zero(t, b.report.OneReplica.Violations)
	assert.Zero(t, namespaceKeys(t, c, b.report.OneReplica.Namespace))
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
	forged.UpstreamItems = len(forged.Delta)
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
	assert.Contains(t, stdout.String(), "\nresult   ")
	assert.Regexp(t, `\nresult +FAIL +\d+ violations in \(a\)`, stdout.String())
	assert.Contains(t, stdout.String(), "VIOLATIONS ((a) deployment)")
	assert.Contains(t, stdout.String(), "prompt changed: ")
	assert.Contains(t, stderr.String(), "oracle violations")
}

// requireHeadline runs the default comparison with upstream flags mode:
// the shared store keeps the single replica's hit rate, per-replica
// stores lose most of it and offer wrong continuations, which do not fail
// the run.
func requireHeadline(t *testing.T, mode ...string) {
	t.Helper()
	b := runBench(t, append([]string{"-backend", "memory", "-conversations", "50", "-turns", "2000"}, mode...)...)
	requireSound(t, b, 2000)
	rep := b.report
	requireSameWorkload(t, rep.Run, rep.OneReplica, rep.PerReplica)
	h := rep.Headline
	require.NotNil(t, h.OneReplicaHitRate)
	require.NotNil(t, h.RatioToOneReplica)
	require.NotNil(t, h.PerReplicaHitRate)
	t.Logf("hit rates: deployment %.3f, one replica %.3f (ratio %.3f), per-replica stores %.3f",
		h.HitRate, *h.OneReplicaHitRate, *h.RatioToOneReplica, *h.PerReplicaHitRate)
	assert.GreaterOrEqual(t, *h.RatioToOneReplica, 0.9)
	assert.Less(t, *h.PerReplicaHitRate, 0.5*h.HitRate)
	assert.Positive(t, *h.PerReplicaWrongContinuations, "per-replica stores offer stale continuations")
	assert.True(t, h.Pass)
	assert.Contains(t, b.stdout, "(c) per-replica stores")
}

func TestHeadlineUnderAnySocketUpstream(t *testing.T) {
	requireHeadline(t, "-upstream", "any")
}

func TestHeadlineUnderSameSocketUpstreamWithForwarding(t *testing.T) {
	requireHeadline(t, "-upstream", "same-socket")
}

// newTestWorker returns a worker of a two-replica memory simulation that
// finds replicas in dir.
func newTestWorker(t *testing.T, dir *directory.Directory, args ...string) *worker {
	t.Helper()
	cfg, err := parseConfig(append([]string{"-backend", "memory", "-replicas", "2", "-quiet"}, args...), io.Discard)
	require.NoError(t, err)
	stores, err := memoryStores(cfg)
	require.NoError(t, err)
	gs := []gatewayStore{stores[0], stores[1]}
	return newWorker(newSim(cfg, gs, dir), 0)
}

func TestForwardTargetFallsBackWhenTheDirectoryCannotTell(t *testing.T) {
	ctx := context.Background()
	dir, err := directory.NewMemory(directory.Options{})
	require.NoError(t, err)

	w := newTestWorker(t, dir)
	assert.Nil(t, w.forwardTarget(ctx, "replica-2"), "replica-2 never announced itself")
	assert.Equal(t, int64(1), w.tally.unknownOrigin)
	assert.Equal(t, int64(1), w.tally.misses[missForwardFallback])

	require.NoError(t, dir.Announce(ctx, "replica-1", "replica-1"))
	w = newTestWorker(t, dir)
	got := w.forwardTarget(ctx, "replica-1")
	require.NotNil(t, got)
	assert.Equal(t, "replica-1", got.name)
	assert.Equal(t, int64(1), w.lookup.TotalCount())
	assert.Zero(t, w.tally.misses[missForwardFallback])

	w = newTestWorker(t, dir, "-forward=false")
	assert.Nil(t, w.forwardTarget(ctx, "replica-1"))
	assert.Equal(t, int64(1), w.tally.misses[missOriginElsewhere])
	assert.Zero(t, w.lookup.TotalCount(), "no lookup when forwarding is off")

	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	down, err := directory.NewRedis(client, "contbench-test", directory.Options{})
	require.NoError(t, err)
	mr.Close()
	w = newTestWorker(t, down)
	assert.Nil(t, w.forwardTarget(ctx, "replica-2"), "the directory is down")
	assert.Equal(t, int64(1), w.tally.lookupErrors)
	assert.NotEmpty(t, w.tally.firstLookupError)
	assert.Equal(t, int64(1), w.tally.misses[missForwardFallback])
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
		{[]string{"-alike", "0"}, "-alike"},
		{[]string{"-conversations", "3", "-alike", "4"}, "-alike"},
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
		{[]string{"-client", "redigo"}, "-client"},
		{[]string{"-backend", "memory", "-client", "rueidis"}, "-client"},
		{[]string{"-backend", "memory", "-redis", "redis://127.0.0.1:1"}, "-backend"},
		{[]string{"-redis", "http://127.0.0.1"}, "-redis"},
		{[]string{"-redis", "redis://127.0.0.1:1", "-cluster", "127.0.0.1:2"}, "-cluster"},
		{[]string{"-cluster", "127.0.0.1"}, "-cluster"},
		{[]string{"-no-such-flag"}, "-no-such-flag"},
		{[]string{"-compare"}, "-compare"},
		{[]string{"-baselines=maybe"}, "-baselines"},
		{[]string{"-forward=maybe"}, "-forward"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, &stdout, &stderr)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr.String(), tc.flag)
			assert.True(t, strings.HasSuffix(stderr.String(), "\nrun contbench -h for the flags\n"), stderr.String())
			assert.Equal(t, 2, strings.Count(stderr.String(), "\n"), "the error and where the flags are, not the whole help")
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
	help := stderr.String()
	assert.Contains(t, help, "-conversations")
	assert.Contains(t, help, "-baselines=false plays (a) alone")
	assert.Contains(t, help, "Exit status: 0 PASS, 1 FAIL, 2 bad flags or a target that cannot be used,\n3 INCONCLUSIVE, 130 interrupted.")
	assert.NotContains(t, help, "-compare", "the help describes the command as it is")
	assert.NotContains(t, help, "is gone")
}

// stallMonitor measures how long the process was kept from running: it
// sleeps in short ticks and sums how late it wakes.
type stallMonitor struct {
	done    chan struct{}
	stopped chan time.Duration
}

// startStallMonitor starts measuring stalls until stop is called.
func startStallMonitor(t *testing.T) *stallMonitor {
	t.Helper()
	m := &stallMonitor{done: make(chan struct{}), stopped: make(chan time.Duration, 1)}
	const tick = 2 * time.Millisecond
	go func() {
		var late time.Duration
		for {
			select {
			case <-m.done:
				m.stopped <- late
				return
			default:
			}
			start := time.Now()
			time.Sleep(tick)
			late += max(time.Since(start)-tick, 0)
		}
	}()
	t.Cleanup(func() { _ = m.stop() })
	return m
}

// stop ends the measurement and returns how long the process stalled.
func (m *stallMonitor) stop() time.Duration {
	select {
	case <-m.done:
		return 0
	default:
		close(m.done)
	}
	return <-m.stopped
}

// slowestTurn bounds the time of one turn of run r by its slowest store
// calls: a concurrent pair's two reservations, records and aborts, and a
// directory lookup each.
func slowestTurn(r runResult) time.Duration {
	var micros int64
	for _, op := range opNames {
		micros += 2 * r.Ops[op].Max
	}
	micros += 2 * r.Forwarding.Lookup.Max
	return time.Duration(micros) * time.Microsecond
}
