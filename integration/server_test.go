package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/contstore/contstore/internal/redistest"
)

// privateServer starts a redis-server of this test's own (no persistence,
// loopback, a free port) for measurements that other tests' traffic would
// disturb, and stops it when the test ends.
func privateServer(t testing.TB) *redis.Client { return startPrivateServer(t, -1) }

// pinnedServer is privateServer on a CPU of its own (taskset), for
// server-time measurements: the highest CPU this process may not run on.
// Run the benchmark under taskset on the other CPUs; it fails when the
// process may run on every CPU, which would leave the server none of its
// own.
func pinnedServer(t testing.TB) *redis.Client {
	t.Helper()
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatalf("reading this process's CPUs: %v", err)
	}
	for cpu := 1023; cpu >= 0; cpu-- {
		if !mine.IsSet(cpu) && cpuOnline(cpu) {
			return startPrivateServer(t, cpu)
		}
	}
	t.Fatal("no CPU left for redis-server: run the benchmark under taskset on fewer CPUs (taskset -c 0 ...)")
	return nil
}

// cpuOnline reports whether the machine has CPU cpu online.
func cpuOnline(cpu int) bool {
	if cpu == 0 {
		return true // cpu0 has no "online" file on most kernels
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", cpu))
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func startPrivateServer(t testing.TB, cpu int) *redis.Client {
	t.Helper()
	var under []string
	if cpu >= 0 {
		taskset, err := exec.LookPath("taskset")
		if err != nil {
			t.Fatalf("pinning redis-server to CPU %d: %v", cpu, err)
		}
		under = []string{taskset, "-c", strconv.Itoa(cpu)}
	}
	c, _ := startServerUnder(t, under...)
	return c
}

// startServerUnder starts a private redis-server as the last argument of
// the command under (none: on its own), and returns a client of it and its
// process id.
func startServerUnder(t testing.TB, under ...string) (*redis.Client, int) {
	t.Helper()
	const attempts = 5
	for range attempts {
		if c, pid := tryPrivateServer(t, under); c != nil {
			return c, pid
		}
	}
	t.Fatalf("redis-server did not start on a free port in %d attempts", attempts)
	return nil, 0
}

// tryPrivateServer starts redis-server on a port that was free a moment
// before, and returns a client of it, or nil when the server exited (the
// port was taken meanwhile). The server that answers must be the one
// started here: its process id is checked, so that a test never runs on
// somebody else's server.
func tryPrivateServer(t testing.TB, under []string) (*redis.Client, int) {
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
	args = append(slices.Clone(under), args...)
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { _ = c.Close() })
	ours := "process_id:" + strconv.Itoa(cmd.Process.Pid) // taskset execs redis-server, valgrind runs it: same pid
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			t.Logf("redis-server on port %d exited at once (the port was taken?); starting again", port)
			_ = c.Close()
			return nil, 0
		default:
		}
		if info, err := c.Info(context.Background(), "server").Result(); err == nil {
			if !strings.Contains(info, ours+"\r\n") {
				t.Logf("another server (not %s) answers on port %d; starting again", ours, port)
				_ = cmd.Process.Kill()
				_ = c.Close()
				return nil, 0
			}
			return c, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d did not answer within 30s", port)
		}
	}
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

// median returns the median of xs (the mean of the middle two for an even
// count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
