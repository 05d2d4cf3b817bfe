package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// BenchmarkTurnInstructions counts the instructions redis-server executes
// for a store turn, under callgrind (valgrind), which counts them
// deterministically: 1,000 owners holding a continuation each take a turn
// that continues (a reserve, then a record), one after another, further
// apart than OpTimeout from the owner's last call (so no answer leaves a
// state). The floor is the bare commands such a turn needs, sent to the
// same keys: HGETALL, HSET of t and o, PEXPIRE, ZADD, ZADD, each in a
// round trip of its own ("bare"), and in the fewest round trips a client
// without scripts needs ("bare-pipelined": HGETALL; HSET, PEXPIRE and ZADD
// once the state is read; ZADD for the record), and from two scripts that
// do nothing else, in the store's two calls ("bare-scripted"), and from
// two such functions, as the store calls its scripts on Redis 7
// ("bare-functions"). Two more tell where the turn's instructions go: two
// functions making the commands the store's reserve and record make on
// this path (HMGET, TIME, GET, SET, HSET; HMGET, HSET), sent keys and
// arguments as the store sends them, and nothing else ("same-calls"), and
// two functions that do nothing, sent the same ("empty-calls"). It reports
// the counts per turn and the ratios (see BENCHMARKS.md). Run it with
// -benchtime 1x; it needs valgrind.
func BenchmarkTurnInstructions(b *testing.B) {
	valgrind, err := exec.LookPath("valgrind")
	if err != nil {
		b.Fatalf("this benchmark runs redis-server under valgrind (Debian: apt-get install valgrind): %v", err)
	}
	control, err := exec.LookPath("callgrind_control")
	require.NoError(b, err)
	ctx := context.Background()
	const n = 1000
	owners := storetest.Owners(b, n)
	for b.Loop() {
		out := filepath.Join(b.TempDir(), "callgrind.out")
		c, pid := startServerUnder(b, valgrind, "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file="+out)
		// A server under valgrind is slow, and slower on a busy machine:
		// calls get two seconds where the default gives them 200 ms.
		const opTimeout = 2 * time.Second
		s, err := store.NewRedis(c, store.Options{MaxOwners: 2 * n, MaxTotalBytes: 1 << 40, OpTimeout: opTimeout})
		require.NoError(b, err)
		turn := storetest.NewTurn(b, s, 32)
		fill(b, s, owners, turn)
		time.Sleep(2 * opTimeout) // the fill's calls are past their deadlines
		// instructions runs f with the server's instrumentation on and
		// returns what the server executed meanwhile.
		dumps := 0
		instructions := func(f func()) float64 {
			for _, cmd := range [][]string{{"-z"}, {"-i", "on"}} {
				require.NoError(b, exec.Command(control, append(cmd, strconv.Itoa(pid))...).Run())
			}
			f()
			for _, cmd := range [][]string{{"-d"}, {"-i", "off"}} {
				require.NoError(b, exec.Command(control, append(cmd, strconv.Itoa(pid))...).Run())
			}
			dumps++
			return callgrindTotal(b, out+"."+strconv.Itoa(dumps))
		}
		turns := instructions(func() {
			for _, o := range owners {
				res := s.Reserve(ctx, o, turn.Next)
				require.True(b, res.Continues(), "%s %v", res.Reason, res.Err)
				got, err := s.Record(ctx, res, store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{Replica: "replica-1", ID: 17}})
				require.NoError(b, err)
				require.Equal(b, store.OutcomePublished, got)
			}
		})
		states := ownerKeys(s.Options(), owners)
		continuations := make([]string, len(states))
		for i, k := range states {
			require.Equal(b, int64(1), c.Exists(ctx, k.state).Val(), "state %s", k.state)
			continuations[i] = c.HGet(ctx, k.state, "c").Val()
		}
		bare := instructions(func() {
			for i, k := range states {
				score := strconv.Itoa(1<<40 + i)
				require.NoError(b, c.HGetAll(ctx, k.state).Err())
				require.NoError(b, c.HSet(ctx, k.state, "t", score, "o", "0123456789abcdefghij").Err())
				require.NoError(b, c.PExpire(ctx, k.state, 30*time.Minute).Err())
				require.NoError(b, c.ZAdd(ctx, k.lru, redis.Z{Score: float64(1<<40 + i), Member: k.member}).Err())
				require.NoError(b, c.ZAdd(ctx, k.lru, redis.Z{Score: float64(1<<40 + i + 1), Member: k.member}).Err())
			}
		})
		const reserveBody = `redis.call('HGETALL', KEYS[1]); redis.call('HSET', KEYS[1], 't', ARGV[1], 'o', ARGV[2]); ` +
			`redis.call('PEXPIRE', KEYS[1], ARGV[3]); return redis.call('ZADD', KEYS[2], ARGV[1], ARGV[4])`
		const recordBody = `return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])`
		reserveLike, recordLike := redis.NewScript(reserveBody), redis.NewScript(recordBody)
		scripted := instructions(func() {
			for i, k := range states {
				score := strconv.Itoa(1<<40 + i)
				require.NoError(b, reserveLike.Run(ctx, c, []string{k.state, k.lru}, score, "0123456789abcdefghij", 1800000, k.member).Err())
				require.NoError(b, recordLike.Run(ctx, c, []string{k.lru}, score, k.member).Err())
			}
		})
		require.NoError(b, c.FunctionLoad(ctx, "#!lua name=floor\n"+
			"redis.register_function('floor_reserve', function(KEYS, ARGV) "+reserveBody+" end)\n"+
			"redis.register_function('floor_record', function(KEYS, ARGV) "+recordBody+" end)\n").Err())
		functions := instructions(func() {
			for i, k := range states {
				score := strconv.Itoa(1<<40 + i)
				require.NoError(b, c.FCall(ctx, "floor_reserve", []string{k.state, k.lru}, score, "0123456789abcdefghij", 1800000, k.member).Err())
				require.NoError(b, c.FCall(ctx, "floor_record", []string{k.lru}, score, k.member).Err())
			}
		})
		pipelined := instructions(func() {
			for i, k := range states {
				score := strconv.Itoa(1<<40 + i)
				require.NoError(b, c.HGetAll(ctx, k.state).Err())
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.HSet(ctx, k.state, "t", "-"+score, "o", "0123456789abcdefghij")
					p.PExpire(ctx, k.state, 30*time.Minute)
					p.ZAdd(ctx, k.lru, redis.Z{Score: float64(1<<40 + i), Member: k.member})
					return nil
				})
				require.NoError(b, err)
				require.NoError(b, c.ZAdd(ctx, k.lru, redis.Z{Score: float64(1<<40 + i + 1), Member: k.member}).Err())
			}
		})
		// The keys and arguments the store sends (reserve.lua, record.lua),
		// of the same lengths.
		const op, seq, ttl, size, limits = "0123\x00\x01\x02\x03\x04", "1234567890123456", "1800000", "123", "2000:1099511627776:16"
		callKeys := func(k ownerKey) (reserve, record []string) {
			answer := k.answers + "303132330001020304" // op's answer key
			return []string{k.state, answer}, []string{k.state, answer}
		}
		require.NoError(b, c.FunctionLoad(ctx, "#!lua name=floor_calls\n"+
			"redis.register_function('floor_reserve_calls', function(KEYS, ARGV) local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o'); "+
			"redis.call('TIME'); redis.call('GET', KEYS[2]); "+
			"redis.call('SET', string.sub(KEYS[1], 1, string.find(KEYS[1], '}:o:', 1, true) + 1) .. 'seq', ARGV[3], 'GET'); "+
			"redis.call('HSET', KEYS[1], 't', ARGV[3], 'o', ARGV[2]); return '1:1:0:' .. st[2] end)\n"+
			"redis.register_function('floor_record_calls', function(KEYS, ARGV) redis.call('HMGET', KEYS[1], 't', 'c', 'o'); "+
			"redis.call('HSET', KEYS[1], 't', ARGV[3], 'c', ARGV[4], 'o', ARGV[2]); return 'published:0' end)\n"+
			"redis.register_function('floor_empty', function(KEYS, ARGV) return 0 end)\n").Err())
		sent := func(reserveFn, recordFn string) float64 {
			return instructions(func() {
				for i, k := range states {
					reserveKeys, recordKeys := callKeys(k)
					require.NoError(b, c.FCall(ctx, reserveFn, reserveKeys, ttl, op, size, limits).Err())
					require.NoError(b, c.FCall(ctx, recordFn, recordKeys, ttl, op, seq, continuations[i], size, limits).Err())
				}
			})
		}
		sameCalls := sent("floor_reserve_calls", "floor_record_calls")
		emptyCalls := sent("floor_empty", "floor_empty")
		b.ReportMetric(turns/n, "instructions/turn")
		b.ReportMetric(bare/n, "instructions/bare")
		b.ReportMetric(pipelined/n, "instructions/bare-pipelined")
		b.ReportMetric(turns/bare, "turn/bare")
		b.ReportMetric(turns/pipelined, "turn/bare-pipelined")
		b.ReportMetric(scripted/n, "instructions/bare-scripted")
		b.ReportMetric(turns/scripted, "turn/bare-scripted")
		b.ReportMetric(functions/n, "instructions/bare-functions")
		b.ReportMetric(turns/functions, "turn/bare-functions")
		b.ReportMetric(sameCalls/n, "instructions/same-calls")
		b.ReportMetric(turns/sameCalls, "turn/same-calls")
		b.ReportMetric(emptyCalls/n, "instructions/empty-calls")
		b.ReportMetric(turns/emptyCalls, "turn/empty-calls")
	}
}

// ownerKey names an owner's state key, its partition's LRU and its member
// there, its answer keys up to the op, and its partition's clock
// (PROTOCOL.md 6.1).
type ownerKey struct{ state, lru, member, answers, seq string }

// ownerKeys returns the keys of owners in the namespace of opts.
func ownerKeys(opts store.Options, owners []identity.Owner) []ownerKey {
	ns := rediskeys.Namespace(opts.Namespace)
	out := make([]ownerKey, len(owners))
	for i, o := range owners {
		slot := ns.Slot(rediskeys.Partition(o.Partition(opts.Partitions)))
		out[i] = ownerKey{state: slot + rediskeys.StatePrefix + o.Key(), lru: slot + "lru", member: o.Key(),
			answers: slot + "q:" + o.Key() + ":", seq: slot + "seq"}
	}
	return out
}

// callgrindTotal reads the instruction count of a callgrind dump.
func callgrindTotal(b *testing.B, file string) float64 {
	data, err := os.ReadFile(file)
	require.NoError(b, err)
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "summary: "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatalf("%s: no summary line", file)
	return 0
}
