package integration

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/internal/redistest"
)

// privateServer starts a redis-server of this test's own (no persistence,
// loopback, a free port) for measurements that other tests' traffic would
// disturb, and stops it when the test ends.
func privateServer(t testing.TB) *redis.Client { return startPrivateServer(t, -1) }

// pinnedServer is privateServer on CPU cpu alone (taskset), for server-time
// measurements: run the benchmark itself on the other CPUs.
func pinnedServer(t testing.TB, cpu int) *redis.Client { return startPrivateServer(t, cpu) }

func startPrivateServer(t testing.TB, cpu int) *redis.Client {
	t.Helper()
	bin := redistest.ServerBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	args := []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log")}
	if cpu >= 0 {
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			t.Fatalf("pinning redis-server to CPU %d: %v", cpu, err)
		}
		args = append([]string{taskset, "-c", strconv.Itoa(cpu)}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d did not answer within 10s", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// commandStats returns INFO commandstats as command → (calls, usec_per_call).
func commandStats(t testing.TB, c redis.UniversalClient) map[string]cmdStat {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec_per_call":
				st.usecPerCall, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

type cmdStat struct {
	calls       int64
	usecPerCall float64
}
