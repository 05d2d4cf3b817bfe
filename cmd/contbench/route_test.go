package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The replicas go where the gateway's route policy says. The test builds
// contbench a second time with a deliberate change to the policy's source
// (internal/route never forwards, through go build's -overlay, the
// repository untouched): that build forwards nothing and loses its
// socket-bound continuations elsewhere, where the shipped policy forwards
// and continues them on the same workload.
func TestReplicasFollowTheRoutePolicy(t *testing.T) {
	const turns = 2000
	args := []string{"-op-timeout", testOpTimeout, "-backend", "memory", "-turns", "2000", "-baselines=false", "-quiet"}
	never := runMutated(t, args, "case o.Forwarding:\n\t\treturn Forward", "case o.Forwarding:\n\t\treturn Full")
	assert.Zero(t, never.Violations, "violations: %+v", never.Examples)
	assert.Equal(t, int64(turns), never.Turns)
	assert.Zero(t, never.Forwarding.Forwarded)
	assert.Zero(t, never.Forwarding.Lookup.Count)
	assert.Greater(t, never.Misses[missOriginElsewhere], never.Turns/4)

	b := runBench(t, args...)
	requireSound(t, b, turns)
	r := b.report.Run
	requireSameWorkload(t, r, &never)
	t.Logf("deployment: hit rate %.3f, %d forwarded under the rule; hit rate %.3f, %d forwarded, %d %s under a policy that never forwards",
		r.HitRate, r.Forwarding.Forwarded, never.HitRate, never.Forwarding.Forwarded, never.Misses[missOriginElsewhere], missOriginElsewhere)
	require.Positive(t, r.Forwarding.Forwarded)
	assert.Zero(t, r.Misses[missOriginElsewhere])
	assert.Equal(t, r.Forwarding.Forwarded, r.Forwarding.Lookup.Count, "one lookup per forwarded turn")
	assert.Greater(t, r.HitRate, never.HitRate+0.25)
}

// runMutated runs contbench with args, built with old replaced by new in
// internal/route/route.go, and returns its run's figures.
func runMutated(t *testing.T, args []string, old, new string) runResult {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "..", "internal", "route", "route.go"))
	require.NoError(t, err)
	text, err := os.ReadFile(src)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(text), old), "the change applies once to %s", src)
	dir := t.TempDir()
	mutated := filepath.Join(dir, "route.go")
	require.NoError(t, os.WriteFile(mutated, []byte(strings.Replace(string(text), old, new, 1)), 0o644))
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {src: mutated}})
	require.NoError(t, err)
	overlayPath := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(overlayPath, overlay, 0o644))

	reportPath := filepath.Join(dir, "report.json")
	cmd := exec.Command("go", append([]string{"run", "-overlay", overlayPath, "."}, append(args, "-json", reportPath)...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(reportPath)
	require.NoError(t, err)
	var rep report
	require.NoError(t, json.Unmarshal(data, &rep))
	return rep.Run
}
