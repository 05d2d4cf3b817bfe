package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/rediskeys"
)

var validNamespace = regexp.MustCompile(`^[A-Za-z0-9-]{1,24}$`)

func TestNamespaceValid(t *testing.T) {
	ns := Namespace(t)
	assert.Regexp(t, validNamespace, ns)
	assert.True(t, strings.HasPrefix(ns, "NamespaceValid-"), ns)

	names := []string{
		"TestX",
		"Test",
		"TestAVeryLongTestNameThatGoesOnAndOn/with_a_subtest",
		"TestWeird/{tag}:colon*star?[x]\\",
		"Test/ünïcödé/名前",
		"Test_underscore__runs",
		"BenchmarkSave/size=1024",
		"FuzzDecode/seed#0",
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			ns := Namespace(t)
			assert.Regexp(t, validNamespace, ns, "test name %q", t.Name())
			assert.NotContains(t, ns, "--")
			assert.NotContains(t, ns, "{")
			assert.NotContains(t, ns, "}")
			assert.NotContains(t, ns, ":")
		})
	}
}

func TestNamespaceUnique(t *testing.T) {
	seen := make(map[string]bool)
	for i := 0; i < 1000; i++ {
		ns := Namespace(t)
		require.False(t, seen[ns], "duplicate namespace %q", ns)
		seen[ns] = true
	}
}

func TestSanitizeName(t *testing.T) {
	cases := map[string]string{
		"TestSaveLoad":                      "SaveLoad",
		"Test":                              "Test",
		"TestSave/sub_test":                 "Save-sub-test",
		"TestA//B":                          "A-B",
		"Test/x":                            "x",
		"Test___":                           "t",
		"Testing":                           "ing",
		"BenchmarkPut/n=10":                 "BenchmarkPut-n",
		"TestAVeryLongNameIndeedThatIsLong": "AVeryLongNameI",
		"TestAbcdefghijklm/x":               "Abcdefghijklm",
		"":                                  "t",
	}
	for in, want := range cases {
		assert.Equal(t, want, sanitizeName(in), "sanitizeName(%q)", in)
	}
}

func TestMissing(t *testing.T) {
	for _, ci := range []string{"", "false", "0", "no"} {
		t.Setenv("CI", ci)
		skip, msg := missing(EnvAddr)
		assert.True(t, skip, "CI=%q", ci)
		assert.Contains(t, msg, EnvAddr)
		assert.Contains(t, msg, "make test")
	}
	for _, ci := range []string{"true", "TRUE", "1"} {
		t.Setenv("CI", ci)
		skip, msg := missing(EnvClusterAddrs)
		assert.False(t, skip, "CI=%q", ci)
		assert.Contains(t, msg, EnvClusterAddrs)
		assert.Contains(t, msg, "make test")
	}
}

// TestLookupHelper is run in a subprocess by TestLookupSkipOrFail.
func TestLookupHelper(t *testing.T) {
	if os.Getenv("REDISTEST_LOOKUP_HELPER") != "1" {
		t.Skip("helper for TestLookupSkipOrFail")
	}
	Standalone(t)
	t.Log("reached end of helper")
}

// TestLookupSkipOrFail checks the behaviour of a helper with the address
// unset, end to end: skipped normally, failed under CI.
func TestLookupSkipOrFail(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a subprocess")
	}
	var base []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CONTSTORE_") || strings.HasPrefix(kv, "CI=") {
			continue
		}
		base = append(base, kv)
	}
	run := func(extra ...string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLookupHelper$", "-test.v", "-test.count=1")
		cmd.Env = append(append(append([]string(nil), base...), "REDISTEST_LOOKUP_HELPER=1"), extra...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run()
	require.NoError(t, err, out)
	assert.Contains(t, out, "--- SKIP: TestLookupHelper", out)
	assert.Contains(t, out, "make test", out)
	assert.NotContains(t, out, "reached end of helper", out)

	// With EnvSkipLog set, each skip appends a line to the file; a failure
	// under CI appends none.
	skipLog := filepath.Join(t.TempDir(), "skips")
	for range 2 {
		out, err = run(EnvSkipLog + "=" + skipLog)
		require.NoError(t, err, out)
	}
	logged, err := os.ReadFile(skipLog)
	require.NoError(t, err)
	line := "github.com/contstore/contstore/internal/redistest\tTestLookupHelper\t" + EnvAddr + "\n"
	assert.Equal(t, line+line, string(logged))

	out, err = run("CI=true", EnvSkipLog+"="+skipLog)
	require.Error(t, err, out)
	assert.Contains(t, out, "--- FAIL: TestLookupHelper", out)
	assert.Contains(t, out, EnvAddr, out)
	assert.NotContains(t, out, "reached end of helper", out)
	logged, err = os.ReadFile(skipLog)
	require.NoError(t, err)
	assert.Equal(t, line+line, string(logged), "a failed test is not listed as skipped")
}

func TestMiniredis(t *testing.T) {
	m, c := Miniredis(t)
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	got, err := m.Get("k")
	require.NoError(t, err)
	assert.Equal(t, "v", got)
}

func TestCleanupNamespaceMiniredis(t *testing.T) {
	m, c := Miniredis(t)
	ctx := context.Background()
	ns := Namespace(t)
	other := Namespace(t)
	for i := 0; i < 2500; i++ {
		m.Set(fmt.Sprintf("%s:{%s}:%d", ns, ns, i), "x")
	}
	m.Set(other+":keep", "x")
	m.Set("unrelated", "x")

	require.NoError(t, rediskeys.DeletePrefix(ctx, c, ns))
	assert.Equal(t, []string{other + ":keep", "unrelated"}, m.Keys())
}

func TestCleanupNamespaceEmpty(t *testing.T) {
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		CleanupNamespace(ft, nil, "")
	}()
	assert.True(t, ft.fatal, "empty namespace must be refused")
}

type fatalRecorder struct {
	testing.TB
	fatal bool
}

func (f *fatalRecorder) Fatal(args ...any) {
	f.fatal = true
	panic("fatal")
}

func TestCleanupNamespaceStandalone(t *testing.T) {
	c := Standalone(t)
	ctx := context.Background()
	ns := Namespace(t)
	for i := 0; i < 50; i++ {
		require.NoError(t, c.Set(ctx, fmt.Sprintf("%s:%d", ns, i), "x", 0).Err())
	}
	keep := Namespace(t) + ":keep"
	require.NoError(t, c.Set(ctx, keep, "x", 0).Err())
	CleanupNamespace(t, c, keep)

	require.NoError(t, rediskeys.DeletePrefix(ctx, c, ns))
	n, err := c.Exists(ctx, fmt.Sprintf("%s:0", ns), fmt.Sprintf("%s:49", ns)).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = c.Exists(ctx, keep).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
}

func TestCleanupNamespaceCluster(t *testing.T) {
	c := Cluster(t)
	ctx := context.Background()
	ns := Namespace(t)
	const n = 200 // spread over many slots and all masters
	for i := 0; i < n; i++ {
		require.NoError(t, c.Set(ctx, fmt.Sprintf("%s:%d", ns, i), "x", 0).Err())
	}

	countKeys := func() int {
		var mu sync.Mutex
		total := 0
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			keys, err := node.Keys(ctx, ns+"*").Result()
			if err != nil {
				return err
			}
			mu.Lock() // ForEachMaster calls this concurrently
			total += len(keys)
			mu.Unlock()
			return nil
		})
		require.NoError(t, err)
		return total
	}
	require.Equal(t, n, countKeys())
	require.NoError(t, rediskeys.DeletePrefix(ctx, c, ns))
	assert.Zero(t, countKeys())
}
