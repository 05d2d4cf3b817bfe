package redisconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
)

// fakeRedis is a TCP server speaking just enough RESP for a go-redis
// client: it reads commands and writes what answer returns for each,
// nothing when answer returns "". It lets the tests get the errors go-redis
// produces for replies and connection failures a real cluster only gives
// during faults.
type fakeRedis struct {
	l      net.Listener
	answer func(cmd []string) string

	mu    sync.Mutex
	cmds  [][]string
	conns []net.Conn
}

func startFakeRedis(t *testing.T, answer func(cmd []string) string) *fakeRedis {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{l: l, answer: answer}
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *fakeRedis) addr() string { return f.l.Addr().String() }

func (f *fakeRedis) close() {
	_ = f.l.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
}

// received returns the names of the commands received so far, lowercase,
// with their first argument for CLUSTER and CLIENT.
func (f *fakeRedis) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.cmds {
		name := strings.ToLower(c[0])
		if (name == "cluster" || name == "client") && len(c) > 1 {
			name += " " + strings.ToLower(c[1])
		}
		out = append(out, name)
	}
	return out
}

func (f *fakeRedis) serve() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		go f.handle(c)
	}
}

func (f *fakeRedis) handle(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, cmd)
		f.mu.Unlock()
		var reply string
		switch strings.ToLower(cmd[0]) {
		case "hello":
			reply = "-ERR unknown command 'HELLO'\r\n" // stay on RESP2
		case "client", "select":
			reply = "+OK\r\n"
		default:
			reply = f.answer(cmd)
		}
		if reply == "" {
			continue
		}
		if reply == "close" {
			_ = c.Close()
			return
		}
		if reply == "reset" {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST
			}
			_ = c.Close()
			return
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// readCommand reads one command sent as an array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad array header %q", line)
	}
	cmd := make([]string, n)
	for i := range cmd {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || size < 0 {
			return nil, fmt.Errorf("bad bulk header %q", line)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		cmd[i] = string(buf[:size])
	}
	return cmd, nil
}

// errorFrom returns the error a go-redis client (no retries, short
// timeouts) gets from one GET against a server answering every command
// with reply ("" for no answer, "close" and "reset" to drop the connection).
func errorFrom(t *testing.T, reply string) error {
	t.Helper()
	f := startFakeRedis(t, func([]string) string { return reply })
	return errorAt(t, f.addr(), false)
}

func errorAt(t *testing.T, addr string, contextTimeout bool) error {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
		ContextTimeoutEnabled: contextTimeout, DisableIdentity: true})
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if contextTimeout {
		ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	}
	defer cancel()
	err := c.Get(ctx, "{ns:00}:k").Err()
	require.Error(t, err)
	return err
}

// refusedAddr returns a loopback address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// The errors that may mean the slot map is stale, as go-redis returns them,
// ask for a reload; the others do not.
func TestStaleSlotMapClassifiesGoRedisErrors(t *testing.T) {
	stale := map[string]func(t *testing.T) error{
		"CLUSTERDOWN":   func(t *testing.T) error { return errorFrom(t, "-CLUSTERDOWN Hash slot not served\r\n") },
		"CLUSTERDOWN 2": func(t *testing.T) error { return errorFrom(t, "-CLUSTERDOWN The cluster is down\r\n") },
		"TRYAGAIN": func(t *testing.T) error {
			return errorFrom(t, "-TRYAGAIN Multiple keys request during rehashing of slot\r\n")
		},
		"LOADING": func(t *testing.T) error {
			return errorFrom(t, "-LOADING Redis is loading the dataset in memory\r\n")
		},
		"READONLY": func(t *testing.T) error {
			return errorFrom(t, "-READONLY You can't write against a read only replica.\r\n")
		},
		"MASTERDOWN": func(t *testing.T) error {
			return errorFrom(t, "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n")
		},
		"connection closed (EOF)":     func(t *testing.T) error { return errorFrom(t, "close") },
		"connection dropped with RST": func(t *testing.T) error { return errorFrom(t, "reset") },
		"connection reset": func(*testing.T) error {
			return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		},
		"broken pipe": func(*testing.T) error {
			return fmt.Errorf("write: %w", os.NewSyscallError("write", syscall.EPIPE))
		},
		"read timeout": func(t *testing.T) error { return errorFrom(t, "") },
		"context deadline on socket": func(t *testing.T) error {
			return errorAt(t, startFakeRedis(t, func([]string) string { return "" }).addr(), true)
		},
		"connection refused": func(t *testing.T) error { return errorAt(t, refusedAddr(t), false) },
		"wrapped connection refused": func(t *testing.T) error {
			return fmt.Errorf("reserve: %w", errorAt(t, refusedAddr(t), false))
		},
		"wrapped CLUSTERDOWN": func(t *testing.T) error {
			return fmt.Errorf("reserve: %w", errorFrom(t, "-CLUSTERDOWN Hash slot not served\r\n"))
		},
		"deadline":       func(*testing.T) error { return context.DeadlineExceeded },
		"unexpected EOF": func(*testing.T) error { return io.ErrUnexpectedEOF },
	}
	fresh := map[string]func(t *testing.T) error{
		"nil reply": func(t *testing.T) error { return errorFrom(t, "$-1\r\n") },
		"MOVED":     func(t *testing.T) error { return errorFrom(t, "-MOVED 3999 127.0.0.1:6381\r\n") },
		"ASK":       func(t *testing.T) error { return errorFrom(t, "-ASK 3999 127.0.0.1:6381\r\n") },
		"script error": func(t *testing.T) error {
			return errorFrom(t, "-ERR user_script:1: Script attempted to access nonexistent global variable 'x'\r\n")
		},
		"NOSCRIPT": func(t *testing.T) error { return errorFrom(t, "-NOSCRIPT No matching script. Please use EVAL.\r\n") },
		"WRONGTYPE": func(t *testing.T) error {
			return errorFrom(t, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n")
		},
		"OOM": func(t *testing.T) error {
			return errorFrom(t, "-OOM command not allowed when used memory > 'maxmemory'.\r\n")
		},
		"BUSY": func(t *testing.T) error {
			return errorFrom(t, "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.\r\n")
		},
		"CROSSSLOT": func(t *testing.T) error {
			return errorFrom(t, "-CROSSSLOT Keys in request don't hash to the same slot\r\n")
		},
		"NOAUTH":   func(t *testing.T) error { return errorFrom(t, "-NOAUTH Authentication required.\r\n") },
		"canceled": func(*testing.T) error { return context.Canceled },
		"wrapped canceled": func(*testing.T) error {
			return fmt.Errorf("no answer: %w", context.Canceled)
		},
		"closed client":   func(*testing.T) error { return redis.ErrClosed },
		"pool timeout":    func(*testing.T) error { return redis.ErrPoolTimeout },
		"schema mismatch": func(*testing.T) error { return errors.New("store: namespace schema mismatch: other partitions") },
		"bad reply":       func(*testing.T) error { return errors.New("store: malformed reply: reserve: 3 elements") },
		"past deadline":   func(*testing.T) error { return fmt.Errorf("%w (the server's clock read …)", ErrPastDeadline) },
		"other":           func(*testing.T) error { return errors.New("lua: reserve takes 3 keys") },
	}
	for name, get := range stale {
		t.Run("stale/"+name, func(t *testing.T) {
			err := get(t)
			t.Logf("%T: %v", err, err)
			assert.True(t, staleSlotMap(err), "%T %v", err, err)
		})
	}
	for name, get := range fresh {
		t.Run("fresh/"+name, func(t *testing.T) {
			err := get(t)
			t.Logf("%T: %v", err, err)
			assert.False(t, staleSlotMap(err), "%T %v", err, err)
		})
	}
	assert.False(t, staleSlotMap(nil))
}

// countingRefresher returns a refresher on a clock the test moves, and its
// count of reloads.
func countingRefresher(interval time.Duration) (*clusterRefresher, *atomic.Int64, func(time.Duration)) {
	var reloads atomic.Int64
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	return newRefresher(func() { reloads.Add(1) }, clock, interval), &reloads, advance
}

// One reload per interval at most, whatever the error rate; errors that
// say nothing about the slot map never reload.
func TestClusterRefresherBoundsReloads(t *testing.T) {
	r, reloads, advance := countingRefresher(200 * time.Millisecond)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

	r.observe(nil)
	r.observe(redis.Nil)
	r.observe(context.Canceled)
	assert.Zero(t, reloads.Load(), "no stale-map error yet")

	r.observe(refused)
	assert.EqualValues(t, 1, reloads.Load(), "the first stale-map error reloads at once")
	for range 1000 {
		r.observe(refused)
	}
	assert.EqualValues(t, 1, reloads.Load(), "errors within the interval do not reload again")

	advance(199 * time.Millisecond)
	r.observe(io.EOF)
	assert.EqualValues(t, 1, reloads.Load(), "199ms later: still within the interval")
	advance(time.Millisecond)
	r.observe(io.EOF)
	assert.EqualValues(t, 2, reloads.Load(), "200ms later: a new interval")

	// A steady stream of errors every 10ms for 10s: one reload per 200ms.
	for range 1000 {
		advance(10 * time.Millisecond)
		r.observe(refused)
	}
	assert.EqualValues(t, 2+50, reloads.Load())
	assert.Equal(t, reloads.Load(), r.reloads.Load())

	// A quiet spell, then one error: it reloads at once.
	advance(time.Hour)
	r.observe(context.DeadlineExceeded)
	assert.EqualValues(t, 53, reloads.Load())
}

// Concurrent errors at one instant reload once; over real time, the
// reloads never exceed one per interval.
func TestClusterRefresherBoundsConcurrentReloads(t *testing.T) {
	r, reloads, _ := countingRefresher(200 * time.Millisecond)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 1000 {
				r.observe(io.EOF)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, reloads.Load(), "32,000 errors at one instant")

	var n atomic.Int64
	interval := 20 * time.Millisecond
	rt := newRefresher(func() { n.Add(1) }, time.Now, interval)
	start := time.Now()
	deadline := start.Add(300 * time.Millisecond)
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				rt.observe(io.EOF)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := int64(elapsed/interval) + 1
	t.Logf("%d reloads in %v (at most %d)", n.Load(), elapsed.Round(time.Millisecond), limit)
	assert.LessOrEqual(t, n.Load(), limit)
	assert.GreaterOrEqual(t, n.Load(), int64(2), "errors kept coming for several intervals")
}

// A refresher exists only for cluster clients; a nil one does nothing.
func TestClusterRefresherOnlyForClusterClients(t *testing.T) {
	_, standalone := redistest.Miniredis(t)
	assert.Nil(t, newClusterRefresher(standalone))
	assert.Nil(t, newClusterRefresher(nil))
	assert.Nil(t, newClusterRefresher((*redis.ClusterClient)(nil)))
	var r *clusterRefresher
	assert.NotPanics(t, func() { r.observe(io.EOF) })
}

// On a real cluster client, observe makes the client ask a node for the
// slot map (CLUSTER SLOTS), and returns at once even when that node never
// answers.
func TestClusterRefresherReloadsWithoutBlocking(t *testing.T) {
	var answered atomic.Bool
	var port atomic.Int64
	node := startFakeRedis(t, func(cmd []string) string {
		if strings.EqualFold(cmd[0], "cluster") && answered.CompareAndSwap(false, true) {
			// The first CLUSTER SLOTS: this node is the master of every slot.
			return fmt.Sprintf("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", port.Load())
		}
		return "" // every later command: no answer
	})
	port.Store(int64(node.l.Addr().(*net.TCPAddr).Port))
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{node.addr()}, DisableIdentity: true,
		ReadTimeout: 5 * time.Second, ClusterStateReloadInterval: time.Hour})
	t.Cleanup(func() { _ = c.Close() })
	require.NotNil(t, newClusterRefresher(c))
	clk := redistest.NewClock(time.Now())
	r := newRefresher(func() { c.ReloadState(context.Background()) }, clk.Now, clusterReloadInterval)

	slots := func() int {
		n := 0
		for _, name := range node.received() {
			if name == "cluster slots" {
				n++
			}
		}
		return n
	}
	r.observe(redis.Nil)
	assert.Zero(t, r.reloads.Load(), "a nil reply asks for no reload") // observe decides before it returns

	r.observe(io.EOF)
	require.Eventually(t, func() bool { return slots() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the client asked for the slot map; commands seen: %v", node.received())

	// The next reload hangs in the client (no answer for 5s): observe must
	// not wait for it. go-redis drops a reload asked for while its last
	// one is still being applied (it clears its pending flag when that one
	// completes), after the node has seen that one's CLUSTER SLOTS: on a
	// loaded machine the second request can fall there, so it is asked
	// again until the node sees it.
	for try := 0; slots() < 2; try++ {
		require.Less(t, try, 10, "the client never asked for the slot map again; commands seen: %v", node.received())
		clk.Add(clusterReloadInterval)
		start := time.Now()
		r.observe(io.EOF)
		took := time.Since(start)
		assert.Less(t, took, 2500*time.Millisecond, "observe waited for the reload (5 s)") // a loaded machine stalls up to ~1 s
		for wait := time.Now().Add(2 * time.Second); slots() < 2 && time.Now().Before(wait); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	assert.GreaterOrEqual(t, r.reloads.Load(), int64(2))
}
