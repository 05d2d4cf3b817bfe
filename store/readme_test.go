package store_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The README's "Use it from a gateway" snippet is the body of turn in
// example_test.go, which Example runs.
func TestReadmeSnippetIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	start := strings.Index(string(src), "func turn(")
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(string(src[start:]), "\n}\n")
	require.Greater(t, end, 0)
	fn := string(src[start : start+end+2])
	section := strings.SplitN(string(readme), "## Use it from a gateway", 2)
	require.Len(t, section, 2, "README has a section \"Use it from a gateway\"")
	block := strings.SplitN(section[1], "```go\n", 2)
	require.Len(t, block, 2)
	snippet := strings.SplitN(block[1], "```", 2)[0]
	require.Contains(t, snippet, fn, "README's snippet holds func turn of store/example_test.go exactly")
}
