package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// Phase lengths of the fault tests.
const (
	faultBefore = 500 * time.Millisecond
	faultDuring = 1500 * time.Millisecond
	faultAfter  = 1500 * time.Millisecond
)

// A gateway keeps serving through network faults between the store and
// Redis: while faulted every reservation returns within OpTimeout plus
// slack and fails open (or, for faults that let some calls through,
// answers correctly); no continuation is ever wrong; and once the fault is
// gone the store continues turns again without a restart.
func TestFaultToxiproxy(t *testing.T) {
	upstream := startFaultServer(t, false)
	cases := []struct {
		name string
		// inject starts the fault and returns what ends it.
		inject func(t *testing.T, p *faultProxy) (heal func())
		// minFailOpen is the least share of reservations that must fail
		// open while faulted: 1 when no reply can arrive; less when one
		// can still arrive in time (a slow or thin link lets through a
		// reply that was on its way, and a loaded machine stretches the
		// moment the toxic takes hold): 0.9, where 0.95 failed once in
		// eight runs with another make test beside.
		minFailOpen float64
	}{
		{name: "latency", minFailOpen: 0.9, inject: func(t *testing.T, p *faultProxy) func() {
			p.Add(t, faultToxic{Name: "slow", Type: "latency", Stream: "downstream",
				Attributes: map[string]any{"latency": 300, "jitter": 50}})
			return p.Reset
		}},
		{name: "blackhole", minFailOpen: 1, inject: func(t *testing.T, p *faultProxy) func() {
			p.Add(t,
				faultToxic{Name: "hole-up", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}},
				faultToxic{Name: "hole-down", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
			return p.Reset
		}},
		// Commands reach Redis and their scripts run, but no reply comes
		// back: reservations consume continuations the gateway never
		// hears of.
		{name: "lost-replies", minFailOpen: 1, inject: func(t *testing.T, p *faultProxy) func() {
			p.Add(t, faultToxic{Name: "lost", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
			return p.Reset
		}},
		// For 60ms in every 200ms, each connection is reset as the reply
		// to its next command arrives, after the script ran.
		{name: "reset-peer", inject: func(t *testing.T, p *faultProxy) func() {
			return faultCycle(60*time.Millisecond, 140*time.Millisecond, func() {
				p.Add(t, faultToxic{Name: "reset", Type: "reset_peer", Stream: "downstream",
					Attributes: map[string]any{"timeout": 0}})
			}, p.Reset)
		}},
		// The proxy goes away for 200ms in every 400ms, dropping every
		// connection in whatever state it is.
		{name: "flapping", inject: func(t *testing.T, p *faultProxy) func() {
			return faultCycle(200*time.Millisecond, 200*time.Millisecond, p.Disable, func() { p.Enable(t) })
		}},
		{name: "bandwidth", minFailOpen: 0.9, inject: func(t *testing.T, p *faultProxy) func() {
			p.Add(t,
				faultToxic{Name: "thin-up", Type: "bandwidth", Stream: "upstream", Attributes: map[string]any{"rate": 1}},
				faultToxic{Name: "thin-down", Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 1}})
			return p.Reset
		}},
	}
	// Each client library the store runs on: a client of its own for each
	// store, through the proxy at addr.
	libraries := []struct {
		name   string
		client func(t *testing.T, addr string) faultOpener
	}{
		{"go-redis", func(t *testing.T, addr string) faultOpener {
			c := redis.NewClient(faultClientOptions(addr))
			t.Cleanup(func() { _ = c.Close() })
			return func(o store.Options) (*store.Store, error) { return store.NewRedis(c, o) }
		}},
		{"rueidis", func(t *testing.T, addr string) faultOpener {
			c := newRueidis(t, addr)
			return func(o store.Options) (*store.Store, error) { return store.NewRueidis(c, o) }
		}},
	}
	for _, lib := range libraries {
		t.Run(lib.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { faultToxiproxyCase(t, upstream, tc.inject, tc.minFailOpen, lib.client) })
			}
		})
	}
}

// faultToxiproxyCase runs the load of TestFaultToxiproxy on two stores,
// each on a client of its own through a proxy to upstream, and injects a
// fault while it runs.
func faultToxiproxyCase(t *testing.T, upstream *faultServer, inject func(t *testing.T, p *faultProxy) (heal func()),
	minFailOpen float64, client func(t *testing.T, addr string) faultOpener) {
	p := startFaultProxy(t, upstream.Addr())
	stores, observers := faultStoresOf(t, faultOptions(redistest.Namespace(t)), client(t, p.Addr()), client(t, p.Addr()))
	l := newFaultLoad(t, stores, 32, nil)
	l.Phase("before")
	l.Start(faultWorkers)
	l.Await(faultBefore)
	heal := inject(t, p)
	l.Phase("faulted")
	time.Sleep(faultDuring)
	heal()
	healed := time.Now()
	l.Phase("after")
	l.Await(faultAfter)
	l.AwaitRecovered(observers, healed)
	l.Stop()
	l.Report()
	l.AssertSound()

	before, during, after := l.Tally("before", ""), l.Tally("faulted", ""), l.Tally("after", "")
	assert.Positive(t, before.Continued, "turns continue before the fault")
	assert.Positive(t, during.Turns, "the gateway kept serving during the fault")
	assert.Positive(t, during.FailOpen, "reservations fail open during the fault")
	assert.GreaterOrEqual(t, float64(during.FailOpen), minFailOpen*float64(during.Turns),
		"share of reservations failing open during the fault")
	assert.Positive(t, after.Continued, "turns continue again once the fault is gone")
	faultAssertRecovered(t, stores, observers, healed)
}

// faultCycle runs on, waits for up, runs off and waits for down, over and
// over until the returned function is called, which returns once off has
// run last.
func faultCycle(up, down time.Duration, on, off func()) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer off()
		for {
			on()
			select {
			case <-done:
				return
			case <-time.After(up):
			}
			off()
			select {
			case <-done:
				return
			case <-time.After(down):
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// When Redis dies and an empty one takes its port, reservations fail open
// while it is down, and afterwards the store works again on its own: the
// scripts' library is loaded again (FCALL answers Function not found,
// FUNCTION LOAD follows) and owners start over from missing state.
func TestFaultRedisRestart(t *testing.T) {
	srv := startFaultServer(t, false)
	clients := make([]redis.UniversalClient, 2)
	for i := range clients {
		c := redis.NewClient(faultClientOptions(srv.Addr()))
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	ns := redistest.Namespace(t)
	stores, observers := faultStores(t, faultOptions(ns), clients...)
	l := newFaultLoad(t, stores, 32, nil)
	l.Phase("before")
	l.Start(faultWorkers)
	l.Await(time.Second)
	srv.Kill()
	l.Phase("down")
	time.Sleep(time.Second)
	l.Phase("restarting")
	srv.Restart()
	healed := time.Now()
	l.Phase("restarted")
	l.Await(2 * time.Second)
	l.AwaitRecovered(observers, healed)
	l.Stop()
	l.Report()
	l.AssertSound()

	before, down, after := l.Tally("before", ""), l.Tally("down", ""), l.Tally("restarted", "")
	assert.Positive(t, before.Continued)
	assert.Positive(t, down.Turns, "the gateway kept serving while Redis was down")
	assert.Equal(t, down.Turns, down.FailOpen, "every reservation fails open while Redis is down")
	assert.Positive(t, after.Reasons[store.ReasonMissingState], "the new server knows no owner")
	assert.Positive(t, after.Continued, "turns continue on the new server")
	faultAssertRecovered(t, stores, observers, healed)

	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = c.Close() }()
	ctx := context.Background()
	calls := commandStats(t, c)
	t.Logf("new server: fcall=%d function load=%d", calls["fcall"].calls, calls["function|load"].calls)
	assert.Positive(t, calls["function|load"].calls, "the scripts' library was loaded again")
	assert.Positive(t, calls["fcall"].calls)
	meta, err := c.Exists(ctx, ns+":{"+ns+"}:meta").Result()
	require.NoError(t, err)
	t.Logf("namespace schema recorded on the new server: %v", meta == 1)
}

// The recovery check is no formality: with the fault left in place, the
// load waits its whole bound for the breakers and every breaker the fault
// opened is reported as never closed.
func TestFaultRecoveryCatchesABreakerThatNeverCloses(t *testing.T) {
	upstream := startFaultServer(t, false)
	p := startFaultProxy(t, upstream.Addr())
	c := redis.NewClient(faultClientOptions(p.Addr()))
	t.Cleanup(func() { _ = c.Close() })
	stores, observers := faultStores(t, faultOptions(redistest.Namespace(t)), c)
	l := newFaultLoad(t, stores, 8, nil)
	l.recoverBound = time.Second
	l.Phase("before")
	l.Start(faultWorkers)
	l.Await(200 * time.Millisecond)
	p.Add(t,
		faultToxic{Name: "hole-up", Type: "timeout", Stream: "upstream", Attributes: map[string]any{"timeout": 0}},
		faultToxic{Name: "hole-down", Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}})
	l.Phase("faulted")
	opened := func() bool {
		st, _ := stores[0].Stats(context.Background())
		return slices.ContainsFunc(st.Breakers, func(b store.BreakerStatus) bool { return b.State != store.BreakerClosed })
	}
	for deadline := time.Now().Add(faultAwaitMax); !opened() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	healed := time.Now() // as if the fault had ended; it goes on
	l.AwaitRecovered(observers, healed)
	l.Stop()
	l.Report()
	l.AssertSound()

	var open []int
	st, _ := stores[0].Stats(context.Background())
	for _, b := range st.Breakers {
		if b.State != store.BreakerClosed {
			open = append(open, b.Partition)
		}
	}
	require.NotEmpty(t, open, "the fault opened no breaker")
	rec := &faultRecorder{TB: t}
	faultAssertRecovered(rec, stores, observers, healed)
	assert.Len(t, rec.errors, len(open), "one error for each breaker left open (partitions %v): %q", open, rec.errors)
	for _, e := range rec.errors {
		assert.Contains(t, e, "never closed")
	}
}

// faultRecorder is a testing.TB that keeps the errors a checker reports
// instead of failing the test.
type faultRecorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *faultRecorder) Helper() {}

func (r *faultRecorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// When one master of a cluster without replicas dies, the owners whose
// partitions it served fail open and every other owner keeps continuing.
func TestFaultClusterMasterKilled(t *testing.T) {
	nodes := startFaultCluster(t, 0)
	addrs, byAddr := faultAddrs(nodes)
	ctx := context.Background()
	ns := redistest.Namespace(t)
	const partitions = 16

	masterOf, victim := faultPartitionMasters(t, addrs, ns, partitions)
	perMaster := map[string][]int{}
	for p, m := range masterOf {
		perMaster[m] = append(perMaster[m], p)
	}
	t.Logf("partitions per master: %v; killing %s", perMaster, victim)
	group := onMaster(masterOf, victim, partitions)
	clients := faultClusterClients(t, addrs, 2)
	opts := faultOptions(ns)
	opts.Partitions = partitions
	stores, _ := faultStores(t, opts, clients...)
	l := newFaultLoad(t, stores, 48, group)
	groups := map[string]int{}
	for _, o := range l.owners {
		groups[o.group]++
	}
	t.Logf("owners per group: %v", groups)
	require.Positive(t, groups["dead"])
	require.Positive(t, groups["alive"])

	l.Phase("before")
	l.Start(faultWorkers)
	l.Await(time.Second, "dead", "alive")
	byAddr[victim].Kill()
	l.Phase("killed")
	l.Await(2500*time.Millisecond, "alive")
	l.Stop()
	l.Report()
	l.AssertSound()

	for _, g := range []string{"dead", "alive"} {
		assert.Positive(t, l.Tally("before", g).Continued, "%s owners continue before the kill", g)
	}
	dead, alive := l.Tally("killed", "dead"), l.Tally("killed", "alive")
	assert.Positive(t, dead.Turns)
	assert.Equal(t, dead.Turns, dead.FailOpen, "owners on the dead master fail open")
	assert.Positive(t, alive.Continued, "owners on the other masters keep continuing")
	for i, s := range stores {
		st, _ := s.Stats(ctx) // fails with a master down, but holds the breakers
		for _, b := range st.Breakers {
			if b.Opens > 0 {
				t.Logf("store %d partition %d breaker: %s, opened %d times", i, b.Partition, b.State, b.Opens)
			}
		}
	}
	for _, a := range addrs {
		if a == victim {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.ClusterInfo(ctx).Result()
		_ = c.Close()
		if err == nil {
			for line := range strings.SplitSeq(info, "\n") {
				if strings.HasPrefix(line, "cluster_state:") {
					t.Logf("%s: %s", a, strings.TrimSpace(line))
				}
			}
		}
	}
}

// shardMaster returns the address of a cluster shard's master, "" when it
// has none.
func shardMaster(sh redis.ClusterShard) string {
	for _, n := range sh.Nodes {
		if n.Role == "master" {
			return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
		}
	}
	return ""
}

// faultPartitionMasters returns the address of the master serving each of
// a namespace's partitions, and the master serving the most of them.
func faultPartitionMasters(t testing.TB, addrs []string, ns string, partitions int) (masterOf []string, busiest string) {
	t.Helper()
	ctx := context.Background()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer func() { _ = admin.Close() }()
	shards, err := admin.ClusterShards(ctx).Result()
	require.NoError(t, err)
	masterOf = make([]string, partitions)
	count := map[string]int{}
	for p := range partitions {
		slot, err := admin.ClusterKeySlot(ctx, fmt.Sprintf("{%s:%02d}", ns, p)).Result()
		require.NoError(t, err)
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= slot && slot <= r.End {
					masterOf[p] = shardMaster(sh)
				}
			}
		}
		require.NotEmpty(t, masterOf[p], "partition %d (slot %d) is not served", p, slot)
		count[masterOf[p]]++
	}
	masters := make([]string, 0, len(count))
	for a := range count {
		masters = append(masters, a)
	}
	sort.Slice(masters, func(i, j int) bool {
		if count[masters[i]] != count[masters[j]] {
			return count[masters[i]] > count[masters[j]]
		}
		return masters[i] < masters[j]
	})
	return masterOf, masters[0]
}

// faultFailoverBound is how soon after a replica's promotion the dead
// master's partitions must work again.
const faultFailoverBound = 2 * time.Second

// When a master of a cluster with replicas dies, its replica takes over
// within a few seconds and the store follows it: owners on the dead
// master's partitions fail open until the promotion, and every one of those
// partitions works again within faultFailoverBound of it (go-redis alone
// would keep sending them to the dead address until its next periodic
// reload of the slot map, 60 s later); owners on the other masters never
// see a store failure, before, during or after.
func TestFaultClusterFailover(t *testing.T) {
	libraries := []struct {
		name   string
		client func(t *testing.T, addrs []string) faultOpener
	}{
		{"go-redis", func(t *testing.T, addrs []string) faultOpener {
			c := faultClusterClients(t, addrs, 1)[0]
			return func(o store.Options) (*store.Store, error) { return store.NewRedis(c, o) }
		}},
		{"rueidis", func(t *testing.T, addrs []string) faultOpener {
			c := newRueidis(t, addrs...)
			return func(o store.Options) (*store.Store, error) { return store.NewRueidis(c, o) }
		}},
	}
	for _, lib := range libraries {
		t.Run(lib.name, func(t *testing.T) { faultClusterFailover(t, lib.client) })
	}
}

// faultClusterFailover runs TestFaultClusterFailover with two stores, each
// on a client of its own that client makes.
func faultClusterFailover(t *testing.T, client func(t *testing.T, addrs []string) faultOpener) {
	nodes := startFaultCluster(t, 1)
	addrs, byAddr := faultAddrs(nodes)
	ctx := context.Background()
	ns := redistest.Namespace(t)
	const partitions = 16

	masterOf, victim := faultPartitionMasters(t, addrs, ns, partitions)
	topology, err := faultClusterNodes(ctx, victim)
	require.NoError(t, err)
	var victimID, heir string
	for _, n := range topology {
		if n.Is("myself") {
			victimID = n.ID
		}
	}
	for _, n := range topology {
		if n.Is("slave") && n.Master == victimID {
			heir = n.Addr
		}
	}
	require.NotEmpty(t, heir, "no replica of %s in %+v", victim, topology)
	group := onMaster(masterOf, victim, partitions)
	// A second rather than the other fault tests' 100 ms: this test counts
	// every timeout on the healthy masters as a failure, and a loaded
	// machine may keep a server from running for a few hundred
	// milliseconds (on a quiet one, no call to a healthy master takes 15 ms).
	opts := faultOptions(ns)
	opts.Partitions = partitions
	opts.OpTimeout = 10 * faultOpTimeout
	calls := &faultCallLog{}
	stores := make([]*store.Store, 2)
	observers := make([]*faultObserver, len(stores))
	for i := range stores {
		o := opts
		o.Replica = fmt.Sprintf("gw-%c", 'a'+i)
		observers[i] = &faultObserver{}
		o.Observer = store.MultiObserver(calls, observers[i]) // calls first: it reads the clock
		stores[i], err = client(t, addrs)(o)
		require.NoError(t, err)
	}
	l := newFaultLoad(t, stores, 48, group)
	deadParts := map[int]bool{}
	groups := map[string]int{}
	for _, o := range l.owners {
		groups[o.group]++
		if o.group == "dead" {
			deadParts[o.id.Partition(partitions)] = true
		}
	}
	t.Logf("killing %s (%d partitions with owners: %v), its replica %s; owners per group: %v",
		victim, len(deadParts), faultSortedKeys(deadParts), heir, groups)
	require.Positive(t, groups["dead"])
	require.Positive(t, groups["alive"])

	l.Phase("before")
	l.Start(faultWorkers)
	l.Await(time.Second, "dead", "alive")
	byAddr[victim].Kill() // returns once the process is gone
	killed := time.Now()
	l.Phase("killed")

	// The promotion: the replica says it is a master serving slots. Until
	// the start of the last look that found it a replica (stillReplica), no
	// server held the dead master's partitions.
	var promoted time.Time
	stillReplica := killed
	for promoted.IsZero() {
		if time.Since(killed) > 15*time.Second {
			l.Stop()
			l.Report()
			t.Fatalf("%s was not promoted within 15s of its master's death", heir)
		}
		looked := time.Now()
		if nodes, err := faultClusterNodes(ctx, heir); err == nil {
			for _, n := range nodes {
				if n.Is("myself") && n.Is("master") && n.Slots {
					promoted = time.Now()
				}
			}
			if promoted.IsZero() {
				stillReplica = looked
			}
		}
		if promoted.IsZero() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	l.Phase("promoted")
	l.Await(faultFailoverBound, "alive")
	l.Phase("after")
	l.Await(time.Second, "dead", "alive")
	l.AwaitRecovered(observers, promoted)
	l.Stop()
	l.Report()
	l.AssertSound()
	t.Logf("%s promoted %v after the kill", heir, promoted.Sub(killed).Round(time.Millisecond))

	// The dead master's partitions: failing between the kill and the
	// promotion, each working again (a reservation that did not fail open,
	// or a Record that succeeded) soon after the promotion. The promotion
	// happened between stillReplica and promoted, so only reservations
	// that ended before stillReplica must all have failed.
	var whileDown, servedWhileDown int
	for _, c := range calls.all() {
		if c.op == store.OpReserve && group(c.owner) == "dead" && c.start.After(killed) && c.end.Before(stillReplica) {
			whileDown++
			if !c.failed {
				servedWhileDown++
			}
		}
	}
	assert.Positive(t, whileDown, "reservations on the dead master's partitions while no server held them")
	assert.Zero(t, servedWhileDown, "of %d reservations on the dead master's partitions while no server held them, %d did not fail open",
		whileDown, servedWhileDown)
	back := map[int]time.Duration{}
	var lastBack time.Duration
	for _, c := range calls.all() {
		p := c.owner.Partition(partitions)
		if group(c.owner) != "dead" || c.failed || !c.end.After(promoted) {
			continue
		}
		if _, ok := back[p]; !ok {
			back[p] = c.end.Sub(promoted)
			lastBack = max(lastBack, back[p])
		}
	}
	for p := range deadParts {
		d, ok := back[p]
		switch {
		case !ok:
			t.Errorf("partition %d of the dead master never worked again in the %v after the promotion",
				p, time.Since(promoted).Round(time.Millisecond))
		default:
			stall := l.lag.Stall(promoted, promoted.Add(d))
			t.Logf("partition %d worked again %v after the promotion (process stalled %v meanwhile)",
				p, d.Round(time.Millisecond), stall.Round(time.Millisecond))
			if d-stall > faultFailoverBound {
				t.Errorf("partition %d of the dead master worked again %v after the promotion; want within %v",
					p, d.Round(time.Millisecond), faultFailoverBound)
			}
		}
	}
	if len(back) == len(deadParts) {
		t.Logf("every partition of the dead master worked again within %v of the promotion", lastBack.Round(time.Millisecond))
	}
	if first := l.Tally("promoted", "dead").FirstContinued; first >= 0 {
		t.Logf("first continuation on the dead master's partitions %v after the promotion", first.Round(time.Millisecond))
	}
	assert.Positive(t, l.Tally("promoted", "dead").Continued+l.Tally("after", "dead").Continued,
		"owners on the dead master continue from what the replica holds")

	// Everything else: no store failure at all, on the other masters
	// throughout, and on the dead master's partitions once back. A call
	// that timed out while this whole process was kept from running for a
	// quarter of the OpTimeout or more is only logged: it says nothing of
	// Redis or of the store. So are the refusals of a breaker that such
	// timeouts may have opened: on the same partition, within a cooldown and
	// an OpTimeout of the last of them.
	failures := map[string]int{}
	excused := map[int]time.Time{} // partition → end of its last timeout a stall explains
	for _, c := range calls.all() {
		if !c.failed {
			continue
		}
		p, g := c.owner.Partition(partitions), group(c.owner)
		if stall := l.lag.Stall(c.start, c.end); errors.Is(c.err, context.DeadlineExceeded) && stall >= opts.OpTimeout/4 {
			excused[p] = c.end
			t.Logf("%s owner %s, partition %d: %s timed out %v after the kill while the process stalled %v of its %v: not counted",
				g, c.owner.Key(), p, c.op, c.end.Sub(killed).Round(time.Millisecond), stall.Round(time.Millisecond),
				c.end.Sub(c.start).Round(time.Millisecond))
			continue
		}
		if g == "dead" && !c.start.After(promoted.Add(faultFailoverBound)) {
			continue
		}
		if last, ok := excused[p]; ok && errors.Is(c.err, store.ErrBreakerOpen) && c.start.Sub(last) <= opts.BreakerCooldown+opts.OpTimeout {
			t.Logf("%s owner %s, partition %d: %s refused by a breaker %v after a timeout a stall explains: not counted",
				g, c.owner.Key(), p, c.op, c.start.Sub(last).Round(time.Millisecond))
			continue
		}
		failures[g]++
		if failures[g] <= 5 {
			t.Errorf("%s owner %s, partition %d: %s failed %v after the kill (%v after the promotion), took %v (process stalled %v): %v",
				g, c.owner.Key(), p, c.op, c.end.Sub(killed).Round(time.Millisecond),
				c.end.Sub(promoted).Round(time.Millisecond), c.end.Sub(c.start).Round(time.Millisecond),
				l.lag.Stall(c.start, c.end).Round(time.Millisecond), c.err)
		}
	}
	assert.Zero(t, failures["alive"], "store failures of owners on the other masters")
	assert.Zero(t, failures["dead"], "store failures on the dead master's partitions more than %v after the promotion",
		faultFailoverBound)
	for _, g := range []string{"before", "killed", "promoted", "after"} {
		assert.Positive(t, l.Tally(g, "alive").Continued, "owners on the other masters continue (%s)", g)
	}
	faultAssertRecovered(t, stores, observers, promoted)
}

// faultCallLog is an Observer that keeps every Reserve and Record: when it
// ended, how long it took and whether it failed (a reservation that failed
// open, a Record that returned an error).
type faultCallLog struct {
	mu    sync.Mutex
	calls []faultCall
}

type faultCall struct {
	owner      identity.Owner
	op         store.Op
	start, end time.Time
	failed     bool
	err        error
}

func (l *faultCallLog) Observe(ev store.Event) {
	var failed bool
	switch ev.Op {
	case store.OpReserve:
		failed = ev.Reason == store.ReasonStoreUnavailable
	case store.OpRecord:
		failed = ev.Err != nil
	default:
		return
	}
	end := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, faultCall{owner: ev.Owner, op: ev.Op, start: end.Add(-ev.Latency), end: end, failed: failed, err: ev.Err})
}

func (l *faultCallLog) BreakerChanged(store.BreakerStatus) {}

// all returns the calls so far, in the order they ended.
func (l *faultCallLog) all() []faultCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]faultCall(nil), l.calls...)
}

func faultSortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// onMaster groups owners by whether the victim master serves their
// partition: "dead" or "alive".
func onMaster(masterOf []string, victim string, partitions int) func(identity.Owner) string {
	return func(o identity.Owner) string {
		if masterOf[o.Partition(partitions)] == victim {
			return "dead"
		}
		return "alive"
	}
}

// faultClusterClients returns n cluster clients configured against the
// recommendations (no context deadlines, long timeouts, retries), with
// go-redis's own periodic reload of the slot map left at its default
// (60 s), as a careless gateway would configure them.
func faultClusterClients(t *testing.T, addrs []string, n int) []redis.UniversalClient {
	clients := make([]redis.UniversalClient, n)
	for i := range clients {
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			ContextTimeoutEnabled: false,
			DialTimeout:           5 * time.Second,
			ReadTimeout:           5 * time.Second,
			WriteTimeout:          5 * time.Second,
			MaxRetries:            3,
		})
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	return clients
}

// faultAddrs returns the addresses of a fault cluster's nodes, and the node
// at each address.
func faultAddrs(nodes []*faultServer) ([]string, map[string]*faultServer) {
	addrs := make([]string, len(nodes))
	byAddr := map[string]*faultServer{}
	for i, n := range nodes {
		addrs[i] = n.Addr()
		byAddr[n.Addr()] = n
	}
	return addrs, byAddr
}
