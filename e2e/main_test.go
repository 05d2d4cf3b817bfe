//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/internal/redistest"
)

// Environment variables read by the tests.
const (
	// envReport names a file to write the measured tables to, as markdown
	// (relative to the module root).
	envReport = "E2E_REPORT"
	// envGo is the go command to build the binaries with (default: go on PATH).
	envGo = "GO"
)

// buildTimeout bounds building the binaries.
const buildTimeout = 10 * time.Minute

// repoRoot is the module's root directory, relative to this package.
const repoRoot = ".."

// clientsDir holds the node drivers and the pinned clients, relative to the
// module root.
const clientsDir = "testdata/clients"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "contstore-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if err := report.write(reportPath(os.Getenv(envReport))); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: writing the report: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// binary is a command under test, built once per test binary.
type binary struct {
	pkg  string // the package, relative to the module root
	once sync.Once
	path string
	err  error
}

// The binaries under test.
var (
	contproxyBin    = &binary{pkg: "./cmd/contproxy"}
	fakeupstreamBin = &binary{pkg: "./internal/cmd/fakeupstream"}
)

// binDir is the temporary directory the binaries are built into, made by
// TestMain.
var binDir string

// reportPath resolves the E2E_REPORT path: a relative one is relative to
// the module root, where make runs the tests from; "" stays "".
func reportPath(path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(repoRoot, path)
}

// build builds the binary (go build) on first use and returns its path.
func (b *binary) build(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		goCmd := os.Getenv(envGo)
		if goCmd == "" {
			goCmd = "go"
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		b.path = filepath.Join(binDir, filepath.Base(b.pkg))
		cmd := exec.CommandContext(ctx, goCmd, "build", "-o", b.path, b.pkg)
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// need skips the test, naming what is missing, or fails it when CI=true:
// a CI run must not pass without running these tests.
func need(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if ci, _ := strconv.ParseBool(strings.TrimSpace(os.Getenv("CI"))); ci {
		t.Fatalf("%s, but CI=true: the end-to-end tests must not be skipped in CI", msg)
	}
	t.Skipf("skipped: %s", msg)
}

// redisAddr returns the address of the Redis server at
// CONTSTORE_REDIS_ADDR, after checking that it answers.
func redisAddr(t *testing.T) string {
	t.Helper()
	addr := strings.TrimSpace(os.Getenv(redistest.EnvAddr))
	if addr == "" {
		need(t, "%s is not set (make e2e runs the tests with scripts/redis-env.sh, which starts a Redis server and sets it)",
			redistest.EnvAddr)
	}
	c := redisClient(t, addr)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s=%s is not reachable: %v", redistest.EnvAddr, addr, err)
	}
	return addr
}

// cleanNamespace registers the deletion of the keys of namespace ns on the
// Redis server at addr when the test ends.
func cleanNamespace(t *testing.T, addr, ns string) {
	t.Helper()
	redistest.CleanupNamespace(t, redisClient(t, addr), ns)
}

// redisClient returns a client for the Redis server at addr, closed when
// the test ends.
func redisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// nodeTools are the node clients' commands.
type nodeTools struct {
	node  string // the node command
	codex string // the codex command
	dir   string // the absolute path of testdata/clients, with the drivers
}

// opencodePackages are the packages of the opencode binary pinned in
// testdata/clients/package.json's optionalDependencies, for Linux x64 CPUs
// with and without AVX2; opencode.mjs runs the first that runs here.
var opencodePackages = []string{"opencode-linux-x64", "opencode-linux-x64-baseline"}

// needOpencode checks that one of opencodePackages is installed in
// tools.dir/node_modules at its pinned version, with its binary.
func needOpencode(t *testing.T, tools nodeTools) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(tools.dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Optional map[string]string `json:"optionalDependencies"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatalf("%s/package.json: %v", clientsDir, err)
	}
	var found []string
	for _, name := range opencodePackages {
		want := pkg.Optional[name]
		if want == "" {
			t.Fatalf("%s/package.json pins no %s in optionalDependencies", clientsDir, name)
		}
		var installed struct {
			Version string `json:"version"`
		}
		raw, err := os.ReadFile(filepath.Join(tools.dir, "node_modules", name, "package.json"))
		if err != nil || json.Unmarshal(raw, &installed) != nil || installed.Version != want {
			continue
		}
		if fi, err := os.Stat(filepath.Join(tools.dir, "node_modules", name, "bin", "opencode")); err == nil && fi.Mode().Perm()&0o111 != 0 {
			found = append(found, name)
		}
	}
	if len(found) == 0 {
		need(t, "opencode is not installed in %s/node_modules: none of %s at its pinned version (make e2e installs them with npm ci, on Linux x64)",
			clientsDir, strings.Join(opencodePackages, ", "))
	}
}

// nodeClients checks that node and the clients pinned in
// testdata/clients/package.json are installed, and returns their commands.
func nodeClients(t *testing.T) nodeTools {
	t.Helper()
	var tools nodeTools
	var err error
	if tools.node, err = exec.LookPath("node"); err != nil {
		need(t, "node is not installed (Debian: apt-get install nodejs npm)")
	}
	if tools.dir, err = filepath.Abs(filepath.Join(repoRoot, clientsDir)); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(tools.dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatalf("%s/package.json: %v", clientsDir, err)
	}
	for name, want := range pkg.Dependencies {
		var installed struct {
			Version string `json:"version"`
		}
		raw, err := os.ReadFile(filepath.Join(tools.dir, "node_modules", name, "package.json"))
		if err == nil {
			err = json.Unmarshal(raw, &installed)
		}
		switch {
		case err != nil:
			need(t, "the client %s is not installed in %s/node_modules (make e2e installs it with npm ci)", name, clientsDir)
		case installed.Version != want:
			need(t, "the client %s in %s/node_modules is version %s, not the pinned %s (make e2e installs it with npm ci)",
				name, clientsDir, installed.Version, want)
		}
	}
	tools.codex = filepath.Join(tools.dir, "node_modules", ".bin", "codex")
	if fi, err := os.Stat(tools.codex); err != nil || fi.Mode().Perm()&0o111 == 0 {
		need(t, "%s/node_modules/.bin/codex is not an executable (make e2e installs it with npm ci)", clientsDir)
	}
	return tools
}
