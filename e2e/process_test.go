//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	// clientTimeout bounds one client run.
	clientTimeout = 120 * time.Second
	// stopTimeout is how long a process has to exit after SIGTERM before
	// its process group is killed.
	stopTimeout = 10 * time.Second
	// startTimeout bounds a server's start, until it serves.
	startTimeout = 60 * time.Second
	// logLines is how much of a process's log a failed test prints.
	logLines = 60
)

// process is a command a test started, in a process group of its own (so
// that what it starts is stopped with it), with its standard output and
// error in files.
type process struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr string // file paths
	done           chan struct{}
	err            error // the exit status, once done is closed
	// killed tells that the test killed the process on purpose.
	killed atomic.Bool
}

// startProcess starts bin with args in dir, with the environment env and
// no standard input, its output going to logDir/name.stdout and
// logDir/name.stderr (appended to).
func startProcess(name, logDir, dir string, env []string, bin string, args ...string) (*process, error) {
	p := &process{
		name:   name,
		stdout: filepath.Join(logDir, name+".stdout"),
		stderr: filepath.Join(logDir, name+".stderr"),
		done:   make(chan struct{}),
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close() // the child has its own copies
		}
	}()
	for _, path := range []string{p.stdout, p.stderr} {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = files[0], files[1]
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited tells whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's group, unless the process has been
// seen to exit (its id, the group's, could be reused then).
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// stop sends SIGTERM to the process group, waits up to stopTimeout for the
// process to exit, then kills the group. It returns the exit status.
func (p *process) stop() error {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(stopTimeout):
	}
	p.signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("no exit within %v of SIGTERM, killed: %v", stopTimeout, p.err)
}

// kill kills the process group with SIGKILL, as a crash would end it, and
// waits up to stopTimeout for the process to be gone.
func (p *process) kill() error {
	p.killed.Store(true)
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("%s still runs %v after SIGKILL", p.name, stopTimeout)
	}
}

// wait waits up to timeout for the process to exit by itself, then stops
// it; it returns the exit status, or an error saying it timed out.
func (p *process) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
	}
	err := p.stop()
	return fmt.Errorf("not finished within %v, stopped (%v)", timeout, err)
}

// logs returns the last logLines lines of the process's standard error.
func (p *process) logs() string {
	return tail(p.stderr, logLines)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if err := sc.Err(); err != nil {
		lines = append(lines, "reading the log: "+err.Error())
	}
	return strings.Join(lines, "\n")
}

// startServer starts a server process for the test and supervises it
// (see supervise).
func startServer(t *testing.T, name, dir string, bin string, args ...string) *process {
	t.Helper()
	p, err := startProcess(name, dir, dir, os.Environ(), bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	supervise(t, p, bin, args)
	return p
}

// supervise stops the server process p (bin with args) when the test ends:
// it must exit cleanly on SIGTERM, unless the test killed it. When the test
// failed, the end of its log is printed.
func supervise(t *testing.T, p *process, bin string, args []string) {
	t.Helper()
	cmdline := filepath.Base(bin) + " " + strings.Join(args, " ")
	t.Cleanup(func() {
		if err := p.stop(); err != nil && !p.killed.Load() {
			t.Errorf("%s (%s): %v", p.name, cmdline, err)
		}
		if t.Failed() {
			t.Logf("--- %s (%s), the end of its log:\n%s", p.name, cmdline, p.logs())
		}
	})
}

// clientEnv is the environment of a client run: the test's environment
// without OpenAI or Codex settings that could send the client elsewhere,
// with extra added.
func clientEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPENAI_") && !strings.HasPrefix(kv, "CODEX_") {
			env = append(env, kv)
		}
	}
	return append(append(env, "OPENAI_AGENTS_DISABLE_TRACING=1"), extra...)
}

// runClient runs one client command in dir for at most clientTimeout, its
// output going to files in logDir, and returns its standard output; the
// error includes the end of its standard error.
func runClient(name, logDir, dir string, env []string, bin string, args ...string) (string, error) {
	return runClientFor(clientTimeout, name, logDir, dir, env, bin, args...)
}

// runClientFor is runClient with a timeout of its own, for a client
// command that runs several client sessions.
func runClientFor(timeout time.Duration, name, logDir, dir string, env []string, bin string, args ...string) (string, error) {
	p, err := startProcess(name, logDir, dir, env, bin, args...)
	if err != nil {
		return "", err
	}
	err = p.wait(timeout)
	out, readErr := os.ReadFile(p.stdout)
	if err == nil && readErr != nil {
		err = readErr
	}
	if err != nil {
		return string(out), fmt.Errorf("%s: %w; the end of its output:\n%s\nand of its standard error:\n%s",
			name, err, clip(string(out), 4000), tail(p.stderr, logLines))
	}
	return string(out), nil
}

// clip returns the last n bytes of s.
func clip(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
