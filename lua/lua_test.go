package lua_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/lua"
)

// Every script's header names its purpose, keys, arguments and replies.
func TestHeadersDescribeTheContract(t *testing.T) {
	keyPattern := regexp.MustCompile(`(?m)^-- KEYS\[\d+\]\s+<ns>:\{<ns>(:<pp>|:<id>)?\}:\S+\s+(hash|string|zset|list)\s+\S`)
	for _, s := range lua.All() {
		t.Run(s.Name, func(t *testing.T) {
			assert.True(t, strings.HasPrefix(s.File, "-- "+s.Name+".lua: "), "first line names the script")
			assert.Positive(t, s.Keys)
			assert.Len(t, keyPattern.FindAllString(s.File, -1), s.Keys, "each key names its pattern and type")
			assert.Contains(t, s.File, "-- Reply:")
			assert.NotContains(t, s.Source, "#!lua", "miniredis runs plain Lua 5.1 only")
			assert.Regexp(t, `^[0-9a-f]{40}$`, s.Hash())
		})
	}
}

// Scripts keep every variable local, as miniredis and Redis both require of
// globals.
func TestScriptsDeclareNoGlobals(t *testing.T) {
	assignment := regexp.MustCompile(`(?m)^([A-Za-z_][A-Za-z0-9_]*)\s*=[^=]`)
	for _, s := range lua.All() {
		for _, m := range assignment.FindAllStringSubmatch(s.Source, -1) {
			assert.Contains(t, s.Source, "local "+m[1], "%s assigns %s without declaring it local", s.Name, m[1])
		}
	}
}

func TestRunRefusesAWrongKeyOrArgumentCount(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()

	before := mr.CommandCount()
	err := lua.Clear.Run(ctx, c, []string{"a", "b"}).Err()
	require.ErrorContains(t, err, "clear takes 3 keys and 0 args, called with 2 and 0")
	err = lua.Abort.Run(ctx, c, []string{"a"}).Err()
	require.ErrorContains(t, err, "abort takes 3 keys and 1 args")
	assert.Equal(t, before, mr.CommandCount(), "nothing reached the server")

	n, err := lua.Clear.Run(ctx, c, []string{"ns:{ns:00}:o:m:x", "ns:{ns:00}:lru", "ns:{ns:00}:acct"}).Int()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestVariadicScriptsTakeTrailingArguments(t *testing.T) {
	assert.True(t, lua.SessionSave.Variadic)
	assert.Equal(t, 5, lua.SessionSave.Args)
	assert.False(t, lua.Reserve.Variadic)
}
