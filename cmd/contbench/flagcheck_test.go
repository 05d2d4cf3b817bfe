package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// -redis takes what redis.ParseURL takes, and says so in the terms of
// the flag, quoting nothing of the value (which may hold a password).
func TestRedisFlagWantsAURL(t *testing.T) {
	for _, ok := range []string{"redis://127.0.0.1:6379", "redis://:pw@127.0.0.1:6379/2", "rediss://host:6380/0", "unix:///tmp/redis.sock"} {
		_, err := parseConfig([]string{"-redis", ok}, io.Discard)
		assert.NoError(t, err, ok)
	}
	for _, tc := range []struct{ url, detail string }{
		{"127.0.0.1:6379", ""},
		{"user:secret@127.0.0.1:6379", ""},
		{"http://127.0.0.1:6379", "invalid URL scheme: http"},
		{"redis://127.0.0.1:port", `invalid port ":port" after host`},
		{"redis://:secret@127.0.0.1:6379/x", `invalid database number: "x"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"-redis", tc.url}, &stdout, &stderr)
		assert.Equal(t, exitUsage, code, tc.url)
		msg := stderr.String()
		assert.True(t, strings.HasPrefix(msg, "contbench: -redis wants a URL such as redis://127.0.0.1:6379"), msg)
		assert.Contains(t, msg, tc.detail)
		assert.NotContains(t, msg, "first path segment", "no URL parser's words")
		assert.NotContains(t, msg, "secret")
		assert.Empty(t, stdout.String())
	}
}

// -json is checked before anything runs: a report that cannot be written
// costs no run.
func TestJSONPathIsCheckedBeforeTheRun(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "old.json")
	require.NoError(t, os.WriteFile(existing, []byte("{}"), 0o644))
	for _, tc := range []struct {
		path, want string
	}{
		{filepath.Join(dir, "missing", "r.json"), "no such file or directory"},
		{dir, "it is a directory"},
		{filepath.Join(existing, "r.json"), "is not a directory"},
	} {
		for _, command := range [][]string{
			{"-backend", "memory", "-json", tc.path},
			{"replay", "-json", tc.path, "trace.jsonl"},
		} {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), command, &stdout, &stderr)
			assert.Equal(t, exitUsage, code, command)
			assert.Contains(t, stderr.String(), "-json: cannot write "+tc.path, command)
			assert.Contains(t, stderr.String(), tc.want, command)
			assert.Empty(t, stdout.String(), "nothing ran: %v", command)
		}
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "checking writes no file")

	_, err = parseConfig([]string{"-json", existing}, io.Discard)
	assert.NoError(t, err, "an existing file is overwritten")
	data, err := os.ReadFile(existing)
	require.NoError(t, err)
	assert.Equal(t, "{}", string(data), "but not by the check")
	_, err = parseConfig([]string{"-json", filepath.Join(dir, "new.json")}, io.Discard)
	assert.NoError(t, err)
	assert.NoFileExists(t, filepath.Join(dir, "new.json"))
}
