package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// fill gives n owners a published continuation, from 16 clients.
func fill(b *testing.B, s *store.Store, owners []identity.Owner, turn storetest.Turn) {
	fillWith(b, s, owners, turn, store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{Replica: "replica-1", ID: 17}})
}

// fillWith is fill with each owner's response id and socket from out.
func fillWith(b *testing.B, s *store.Store, owners []identity.Owner, turn storetest.Turn, out store.Result) {
	ctx := context.Background()
	parallelFor(len(owners), 16, func(i int) {
		res := s.Reserve(ctx, owners[i], turn.Recorded)
		out, err := s.Record(ctx, res, out)
		if err != nil || out != store.OutcomePublished {
			b.Errorf("owner %d: %v %v", i, out, err)
		}
	})
}

func usedMemory(b *testing.B, c *redis.Client) int64 {
	return int64(infoField(b, c, "memory", "used_memory"))
}

// serverCPU returns the CPU time the server has used, in seconds.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	return infoField(b, c, "cpu", "used_cpu_user") + infoField(b, c, "cpu", "used_cpu_sys")
}

// infoField reads a numeric field of a section of INFO.
func infoField(b *testing.B, c *redis.Client, section, field string) float64 {
	info, err := c.Info(context.Background(), section).Result()
	require.NoError(b, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseFloat(v, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// BenchmarkMemoryPerOwner reports Redis used_memory per owner holding a
// published continuation, on a private server: at 100,000 owners over the
// default 16 partitions with the default namespace, and for 20,000 owners
// with namespaces and owner ids from short to the longest the store takes;
// and at 100,000 owners with response ids as OpenAI gives them ("resp_" and
// 48 hex digits) on a socket of a replica named by default ("replica-" and
// 12 hex digits), "gw-1", or 64 bytes, and on any socket (an upstream that
// keeps responses) with a reference to each of two output items. Each reports the store's stored-bytes estimate too
// (estimated-bytes/owner): MaxTotalBytes bounds that estimate, so it must
// follow the real figure. The answers of the fill's calls stay in the
// owners' states (internal/lua/oplog.lua): the benchmark checks that Redis holds
// nothing else. Run with -benchtime 1x.
func BenchmarkMemoryPerOwner(b *testing.B) {
	short := store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{Replica: "replica-1", ID: 17}}
	openAI := func(replica string) store.Result {
		return store.Result{ResponseID: "resp_67cb71b351908190a308f3859487620d06981a8637e6bc44", Socket: store.Socket{Replica: replica, ID: 17}}
	}
	// An upstream that keeps responses: any socket, and a reference for
	// each of the two output items.
	stored := openAI("")
	stored.Socket = store.Socket{Any: true}
	stored.Output = []json.RawMessage{
		json.RawMessage(`{"id":"rs_67cb71b351908190a308f3859487620d06981a8637e6bc44","type":"reasoning","summary":[]}`),
		json.RawMessage(`{"id":"msg_67cb71b351908190a308f3859487620d06981a8637e6bc45","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Done.","annotations":[]}]}`),
	}
	cases := []struct {
		name      string
		owners    int
		namespace string
		idBytes   int // 0: the benchmark's own short ids
		out       store.Result
	}{
		{"owners=100000", 100_000, "", 0, short},
		{"ns=1/id=short", 20_000, "c", 0, short},
		{"ns=64/id=short", 20_000, strings.Repeat("n", 64), 0, short},
		{"ns=1/id=256", 20_000, "c", 256, short},
		{"ns=64/id=256", 20_000, strings.Repeat("n", 64), 256, short},
		{"owners=100000/resp=openai/replica=default", 100_000, "", 0, openAI("")},
		{"owners=100000/resp=openai/replica=gw-1", 100_000, "", 0, openAI("gw-1")},
		{"owners=100000/resp=openai/replica=64B", 100_000, "", 0, openAI(strings.Repeat("r", 64))},
		{"owners=100000/resp=openai/stored/references=2", 100_000, "", 0, stored},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			owners := storetest.Owners(b, c.owners)
			if c.idBytes > 0 {
				for i := range owners {
					id := fmt.Sprintf("%d-", i)
					o, err := identity.Main(id + strings.Repeat("x", c.idBytes-len(id)))
					require.NoError(b, err)
					owners[i] = o
				}
			}
			for b.Loop() {
				memoryPerOwner(b, c.namespace, owners, c.out)
			}
		})
	}
}

// memoryPerOwner fills owners and reports the memory they take.
func memoryPerOwner(b *testing.B, ns string, owners []identity.Owner, out store.Result) {
	ctx := context.Background()
	n := int64(len(owners))
	c := privateServer(b)
	s, err := store.NewRedis(c, store.Options{Namespace: ns, MaxOwners: 2 * len(owners), MaxTotalBytes: 1 << 40})
	require.NoError(b, err)
	turn := storetest.NewTurn(b, s, 32)
	// Open the connections fill uses first: each holds buffers that are no
	// owner's.
	conns := make([]*redis.Conn, 16)
	for i := range conns {
		conns[i] = c.Conn()
		require.NoError(b, conns[i].Ping(ctx).Err())
	}
	for _, cn := range conns {
		require.NoError(b, cn.Close())
	}
	before := usedMemory(b, c)
	fillWith(b, s, owners, turn, out)
	after := usedMemory(b, c)
	st, err := s.Stats(ctx)
	require.NoError(b, err)
	require.Equal(b, n, st.Total.Published)
	// Only the states, 3 keys a partition (LRU, accounting, clock) and the
	// namespace's meta: no answer key.
	require.Equal(b, n+3*16+1, c.DBSize(ctx).Val())
	b.ReportMetric(float64(after-before)/float64(n), "bytes/owner")
	b.ReportMetric(float64(st.Total.StoredBytes)/float64(n), "estimated-bytes/owner")
}

// BenchmarkTurnServerTime reports the server's own time per script call
// (INFO commandstats usec_per_call of EVALSHA, after CONFIG RESETSTAT) for
// reserve and for record, with 10,000 and 1,000,000 owners holding a
// continuation over the default 16 partitions, on a private redis-server
// pinned to a CPU of its own. Each phase takes 10,000 owners (of
// 1,000,000: 20,000, others each round) once from 8 clients: every reserve
// consumes a continuation and continues, every record publishes, nothing
// is evicted. A turn comes within a sixteenth of the TTL of the owner's
// last refresh, so it writes no LRU entry; in the refreshing case (10,000
// owners, TTL 16 s) each reserve phase starts a second after the fill, so
// every reserve refreshes its owner's entry and TTL. An owner's calls come
// further apart than OpTimeout (the default), so no answer leaves its
// state: each phase checks that its only SETs are the reserves' clock's. A
// script that does nothing, run the same way, gives the floor. The figures are the medians of 5 rounds on one server, which a
// noisy machine moves less than one round. Run it under taskset with
// -benchtime 1x (see BENCHMARKS.md).
func BenchmarkTurnServerTime(b *testing.B) {
	ctx := context.Background()
	for _, bc := range []struct {
		n   int
		ttl time.Duration // 0: the default, 30 minutes
	}{{10_000, 0}, {10_000, 16 * time.Second}, {1_000_000, 0}} {
		n := bc.n
		name := fmt.Sprintf("owners=%d", n)
		if bc.ttl > 0 {
			name += "/refreshing"
		}
		b.Run(name, func(b *testing.B) {
			owners := storetest.Owners(b, n)
			calls := min(n, 20_000)
			for b.Loop() {
				c := pinnedServer(b)
				s, err := store.NewRedis(c, store.Options{MaxOwners: 2 * n, MaxTotalBytes: 1 << 40, TTL: bc.ttl})
				require.NoError(b, err)
				turn := storetest.NewTurn(b, s, 32)
				fill(b, s, owners, turn)
				reservations := make([]*store.Reservation, calls)
				// phase runs op for every owner of the round and returns the
				// script's server time; sets is how many SETs the phase
				// makes: the clock's of each reserve, and no answer key
				// (no two calls on an owner come within OpTimeout).
				phase := func(op func(i int), sets int) float64 {
					require.NoError(b, c.ConfigResetStat(ctx).Err())
					parallelFor(calls, 8, op)
					all := commandStats(b, c)
					st := all["fcall"]
					// The store may recheck the namespace's schema (one
					// script) in a phase.
					require.True(b, st.calls >= int64(calls) && st.calls <= int64(calls)+2, "%d script calls, want %d", st.calls, calls)
					require.Equal(b, int64(sets), all["set"].calls, "SET calls")
					if testing.Verbose() {
						for name, cs := range all {
							b.Logf("%s: %d calls, %.2f us/call, %.2f us per script", name, cs.calls, cs.usecPerCall, float64(cs.calls)*cs.usecPerCall/float64(calls))
						}
					}
					return st.usecPerCall
				}
				const rounds = 5
				var reserves, records, floors []float64
				noop := redis.NewScript("return 1")
				require.NoError(b, noop.Load(ctx, c).Err())
				for r := range rounds {
					if r > 0 && n == calls {
						// The same owners again: back to the turn before.
						fill(b, s, owners, turn)
					}
					// The fill's calls are past their deadlines (OpTimeout,
					// the default) before the owners' next, as the turns of
					// a conversation are.
					wait := 400 * time.Millisecond // twice the default OpTimeout
					if bc.ttl > 0 {
						wait = bc.ttl/16 + 100*time.Millisecond // every entry is due
					}
					time.Sleep(wait)
					reserves = append(reserves, phase(func(i int) {
						reservations[i] = s.Reserve(ctx, owners[i*(n/calls)+r%(n/calls)], turn.Next)
						if !reservations[i].Continues() {
							b.Errorf("owner %d: %s %v", i, reservations[i].Reason, reservations[i].Err)
						}
					}, calls))
					records = append(records, phase(func(i int) {
						out, err := s.Record(ctx, reservations[i], store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{Replica: "replica-1", ID: 17}})
						if err != nil || out != store.OutcomePublished {
							b.Errorf("owner %d: %s %v", i, out, err)
						}
					}, 0))
					// The floor on the same server: a script that does nothing.
					floors = append(floors, phase(func(int) {
						if err := noop.EvalSha(ctx, c, nil).Err(); err != nil {
							b.Error(err)
						}
					}, 0))
				}
				reserve, record, floor := median(reserves), median(records), median(floors)
				st, err := s.Stats(ctx)
				require.NoError(b, err)
				require.Zero(b, st.Total.Evictions.Total())
				b.ReportMetric(floor, "server-us/noop-script")
				b.ReportMetric(reserve, "server-us/reserve")
				b.ReportMetric(record, "server-us/record")
				b.ReportMetric(reserve+record, "server-us/turn")
			}
		})
	}
}
