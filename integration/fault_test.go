package integration

import (
	"context"
	"fmt"
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
		// open while faulted: 1 when no reply can arrive; a little less
		// when one might after a long stall of this process.
		minFailOpen float64
	}{
		{name: "latency", minFailOpen: 0.95, inject: func(t *testing.T, p *faultProxy) func() {
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
		{name: "bandwidth", minFailOpen: 0.95, inject: func(t *testing.T, p *faultProxy) func() {
			p.Add(t,
				faultToxic{Name: "thin-up", Type: "bandwidth", Stream: "upstream", Attributes: map[string]any{"rate": 1}},
				faultToxic{Name: "thin-down", Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 1}})
			return p.Reset
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startFaultProxy(t, upstream.Addr())
			clients := make([]redis.UniversalClient, 2)
			for i := range clients {
				c := redis.NewClient(faultClientOptions(p.Addr()))
				t.Cleanup(func() { _ = c.Close() })
				clients[i] = c
			}
			stores, observers := faultStores(t, faultOptions(redistest.Namespace(t)), clients...)
			l := newFaultLoad(t, stores, 32, nil)
			l.Phase("before")
			l.Start(faultWorkers)
			time.Sleep(faultBefore)
			heal := tc.inject(t, p)
			l.Phase("faulted")
			time.Sleep(faultDuring)
			heal()
			healed := time.Now()
			l.Phase("after")
			time.Sleep(faultAfter)
			l.Stop()
			l.Report()
			l.AssertSound()

			before, during, after := l.Tally("before", ""), l.Tally("faulted", ""), l.Tally("after", "")
			assert.Positive(t, before.Continued, "turns continue before the fault")
			assert.Positive(t, during.Turns, "the gateway kept serving during the fault")
			assert.Positive(t, during.FailOpen, "reservations fail open during the fault")
			assert.GreaterOrEqual(t, float64(during.FailOpen), tc.minFailOpen*float64(during.Turns),
				"share of reservations failing open during the fault")
			assert.Positive(t, after.Continued, "turns continue again once the fault is gone")
			faultAssertRecovered(t, stores, observers, healed)
		})
	}
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
// scripts are loaded again (EVALSHA answers NOSCRIPT, EVAL follows) and
// owners start over from missing state.
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
	time.Sleep(time.Second)
	srv.Kill()
	l.Phase("down")
	time.Sleep(time.Second)
	l.Phase("restarting")
	srv.Restart()
	healed := time.Now()
	l.Phase("restarted")
	time.Sleep(2 * time.Second)
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
	stats, err := c.Info(ctx, "commandstats", "errorstats").Result()
	require.NoError(t, err)
	calls := func(prefix string) int64 {
		for line := range strings.SplitSeq(stats, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
				v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				n, _ := strconv.ParseInt(strings.TrimPrefix(v, "count="), 10, 64)
				return n
			}
		}
		return 0
	}
	t.Logf("new server: evalsha=%d eval=%d NOSCRIPT errors=%d", calls("cmdstat_evalsha:"), calls("cmdstat_eval:"),
		calls("errorstat_NOSCRIPT:"))
	assert.Positive(t, calls("errorstat_NOSCRIPT:"), "the new server did not know the scripts")
	assert.Positive(t, calls("cmdstat_eval:"), "the scripts were sent again")
	assert.Positive(t, calls("cmdstat_evalsha:"))
	meta, err := c.Exists(ctx, ns+":{"+ns+"}:meta").Result()
	require.NoError(t, err)
	t.Logf("namespace schema recorded on the new server: %v", meta == 1)
}

// When one master of a cluster dies, the owners whose partitions it served
// fail open and every other owner keeps continuing.
func TestFaultClusterMasterKilled(t *testing.T) {
	nodes := startFaultCluster(t)
	addrs := make([]string, len(nodes))
	byAddr := map[string]*faultServer{}
	for i, n := range nodes {
		addrs[i] = n.Addr()
		byAddr[n.Addr()] = n
	}
	ctx := context.Background()
	ns := redistest.Namespace(t)
	const partitions = 16

	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer func() { _ = admin.Close() }()
	slots, err := admin.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	masterOf := make([]string, partitions)
	perMaster := map[string][]int{}
	for p := range partitions {
		slot, err := admin.ClusterKeySlot(ctx, fmt.Sprintf("{%s:%02d}", ns, p)).Result()
		require.NoError(t, err)
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				masterOf[p] = r.Nodes[0].Addr
			}
		}
		require.NotEmpty(t, masterOf[p], "partition %d (slot %d) is not served", p, slot)
		perMaster[masterOf[p]] = append(perMaster[masterOf[p]], p)
	}
	masters := make([]string, 0, len(perMaster))
	for a := range perMaster {
		masters = append(masters, a)
	}
	sort.Slice(masters, func(i, j int) bool { return len(perMaster[masters[i]]) > len(perMaster[masters[j]]) })
	victim := masters[0]
	t.Logf("partitions per master: %v; killing %s", perMaster, victim)
	group := func(o identity.Owner) string {
		if masterOf[o.Partition(partitions)] == victim {
			return "dead"
		}
		return "alive"
	}

	clients := make([]redis.UniversalClient, 2)
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
	time.Sleep(time.Second)
	byAddr[victim].Kill()
	l.Phase("killed")
	time.Sleep(2500 * time.Millisecond)
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
		for _, b := range s.Breakers() {
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
