package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	zlog "github.com/rs/zerolog/log"

	"github.com/contstore/contstore/internal/redistest"
)

// faultServerStart bounds how long a redis-server may take to answer PING.
const faultServerStart = 10 * time.Second

// faultServer is a redis-server process owned by one test, on a loopback
// port that stays the same when the test kills and restarts it. It keeps
// nothing on disk, so a restarted server is empty.
type faultServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// startFaultServer starts a server with extra arguments on a free port
// (whose cluster bus port, port+10000, is free too when cluster is set) and
// kills it when the test ends.
func startFaultServer(t testing.TB, cluster bool, args ...string) *faultServer {
	t.Helper()
	bin := redistest.ServerBinary(t)
	var last error
	for range 5 {
		s := &faultServer{t: t, bin: bin, dir: t.TempDir(), port: freeFaultPort(t, cluster), args: args}
		if last = s.launch(); last == nil {
			t.Cleanup(s.Kill)
			return s
		}
		t.Logf("redis-server on port %d: %v; retrying on another port", s.port, last)
	}
	t.Fatalf("could not start redis-server: %v", last)
	return nil
}

// freeFaultPort returns a loopback port nothing listens on, with its bus
// port free too when bus is set.
func freeFaultPort(t testing.TB, bus bool) int {
	t.Helper()
	free := func(p int) bool {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	}
	for range 200 {
		// Below the usual ephemeral range, so that no client connection
		// takes the port while the server is down.
		p := 22000 + rand.IntN(8000)
		if free(p) && (!bus || free(p+10000)) {
			return p
		}
	}
	t.Fatal("no free loopback port found")
	return 0
}

// Addr returns the server's address.
func (s *faultServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// launch starts the process and waits until it answers PING.
func (s *faultServer) launch() error {
	logfile := filepath.Join(s.dir, "redis.log")
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", logfile}, s.args...)
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(faultServerStart)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited during startup: %s", faultLogTail(logfile))
		default:
		}
		if faultPing(s.Addr()) {
			return nil
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("no answer to PING within %v: %s", faultServerStart, faultLogTail(logfile))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultPing reports whether a server answers PING on a new connection.
// (A go-redis client would back off between failed dials.)
func faultPing(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 7)
	n, _ := io.ReadFull(c, buf)
	return string(buf[:n]) == "+PONG\r\n"
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (s *faultServer) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts a new, empty server on the same port.
func (s *faultServer) Restart() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatalf("restarting redis-server on port %d: %v", s.port, err)
	}
}

func faultLogTail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// faultCLI returns the redis-cli next to the redis-server binary or on
// PATH. Without one the test is skipped, or fails when CI=true.
func faultCLI(t testing.TB) string {
	t.Helper()
	bin := redistest.ServerBinary(t)
	if p := filepath.Join(filepath.Dir(bin), "redis-cli"); faultExecutable(p) {
		return p
	}
	if p, err := exec.LookPath("redis-cli"); err == nil {
		return p
	}
	msg := "redis-cli not found next to " + bin + " nor on PATH"
	if ci, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("CI"))); ci {
		t.Fatal(msg + " but CI=true: this test must not be skipped in CI")
	}
	t.Skip(msg)
	return ""
}

func faultExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0
}

// faultClusterNodeTimeout is the fault clusters' cluster-node-timeout: a
// dead master is flagged failed a little over it after its death, and its
// replica, when it has one, takes over 0.5–1 s later.
const faultClusterNodeTimeout = 1000 * time.Millisecond

// startFaultCluster starts a cluster of the test's own, 3 masters with
// replicas replicas each, and waits until every node reports it healthy
// and every replica is in sync. A master's loss stops only its own slots
// (cluster-require-full-coverage no); a replica takes over from a dead
// master within about 3 s (faultClusterNodeTimeout).
func startFaultCluster(t testing.TB, replicas int) []*faultServer {
	t.Helper()
	cli := faultCLI(t)
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(faultClusterNodeTimeout.Milliseconds())),
		"--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0"}
	nodes := make([]*faultServer, 3*(1+replicas))
	create := []string{"--cluster", "create"}
	for i := range nodes {
		nodes[i] = startFaultServer(t, true, args...)
		create = append(create, nodes[i].Addr())
	}
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	known := fmt.Sprintf("cluster_known_nodes:%d", len(nodes))
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		deadline := time.Now().Add(15 * time.Second)
		for {
			// Healthy: every slot served, every node known, and this
			// node's view of the roles final (3 masters serving slots,
			// replicas following them); a replica in sync.
			info, err := c.ClusterInfo(context.Background()).Result()
			healthy := err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_slots_ok:16384") && strings.Contains(info, known)
			var view []faultClusterNode
			if healthy {
				view, err = faultClusterNodes(context.Background(), n.Addr())
				masters, following := 0, 0
				for _, v := range view {
					if v.Is("master") && v.Slots {
						masters++
					}
					if v.Is("slave") && v.Master != "" {
						following++
					}
					if v.Is("myself") && v.Is("slave") {
						repl, err := c.Info(context.Background(), "replication").Result()
						healthy = healthy && err == nil && strings.Contains(repl, "master_link_status:up")
					}
				}
				healthy = healthy && err == nil && masters == 3 && following == 3*replicas
			}
			if healthy {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("cluster node %s not healthy within 15s: %v %q %+v", n.Addr(), err, info, view)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nodes
}

// faultClusterNode is one line of CLUSTER NODES.
type faultClusterNode struct {
	ID, Addr, Master string // Master: the master's id for a replica
	Flags            []string
	Slots            bool // serves at least one slot
}

// Is reports whether the node has flag f (master, slave, fail, myself, ...).
func (n faultClusterNode) Is(f string) bool {
	for _, x := range n.Flags {
		if x == f {
			return true
		}
	}
	return false
}

// faultClusterNodes asks the node at addr for CLUSTER NODES, on a new
// connection with a short timeout.
func faultClusterNodes(ctx context.Context, addr string) ([]faultClusterNode, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, MaxRetries: -1})
	defer func() { _ = c.Close() }()
	out, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var nodes []faultClusterNode
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		nodes = append(nodes, faultClusterNode{ID: f[0], Addr: addr, Flags: strings.Split(f[2], ","),
			Master: strings.TrimPrefix(f[3], "-"), Slots: len(f) > 8})
	}
	return nodes, nil
}

// faultClientOptions configures a client against every recommendation for
// the store: no context deadlines on sockets, a long read timeout and
// retries. The store must bound its latency anyway.
func faultClientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: false,
		DialTimeout:           5 * time.Second,
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          5 * time.Second,
		MaxRetries:            3,
	}
}

// faultProxy is an in-process Toxiproxy proxy on loopback in front of one
// Redis server.
type faultProxy struct {
	proxy *toxiproxy.Proxy
}

// quietToxiproxy silences the toxics that log through zerolog's global
// logger.
var quietToxiproxy sync.Once

// startFaultProxy starts a proxy to upstream and stops it when the test
// ends.
func startFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	quietToxiproxy.Do(func() { zlog.Logger = zerolog.Nop() })
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	if err := srv.Collection.Add(p, true); err != nil {
		t.Fatalf("starting toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{proxy: p}
}

// Addr returns the address clients connect to.
func (f *faultProxy) Addr() string {
	f.proxy.Lock()
	defer f.proxy.Unlock()
	return f.proxy.Listen
}

// faultToxic describes one toxic to add.
type faultToxic struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	Stream     string         `json:"stream"`
	Toxicity   float64        `json:"toxicity"`
	Attributes map[string]any `json:"attributes"`
}

// Add adds toxics to every current and future connection. It may be called
// from any goroutine.
func (f *faultProxy) Add(t testing.TB, toxics ...faultToxic) {
	t.Helper()
	for _, x := range toxics {
		if x.Toxicity == 0 {
			x.Toxicity = 1
		}
		body, err := json.Marshal(x)
		if err == nil {
			_, err = f.proxy.Toxics.AddToxicJson(bytes.NewReader(body))
		}
		if err != nil {
			t.Errorf("adding toxic %s: %v", body, err)
		}
	}
}

// Reset removes every toxic.
func (f *faultProxy) Reset() { f.proxy.Toxics.ResetToxics(context.Background()) }

// Disable closes the listener and every proxied connection; Enable listens
// again on the same address.
func (f *faultProxy) Disable() { f.proxy.Stop() }

// Enable starts the proxy again after Disable.
func (f *faultProxy) Enable(t testing.TB) {
	t.Helper()
	if err := f.proxy.Start(); err != nil && !errors.Is(err, toxiproxy.ErrProxyAlreadyStarted) {
		t.Errorf("restarting toxiproxy: %v", err)
	}
}
