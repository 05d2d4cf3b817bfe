package fingerprint

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKey keys the digests of the tests.
var testKey = Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}

// testParser parses with the default profile under testKey.
var testParser = mustParser(V2(), testKey)

func mustParser(p Profile, k Key) *Parser {
	ps, err := New(p, k)
	if err != nil {
		panic(err)
	}
	return ps
}

func sumString(s string) uint64 { return testParser.sum([]byte(s)) }

// canonicalExact is the canonical form with no item or profile rule.
func canonicalExact(b []byte) ([]byte, error) { return canonical(b, nil, placeExact) }

// canonicalItem is the canonical form of an item with the function_call
// rule alone.
func canonicalItem(b []byte) ([]byte, error) { return canonical(b, nil, placeItem) }

// fp is the fingerprint of the input alone.
func (r *Request) fp() Transcript {
	t, err := r.Transcript(nil)
	if err != nil {
		panic(err)
	}
	return t
}

// assertParsedAlike asserts that got and err are what want and wantErr,
// the same body's parse without caches, are: the same error, or the same
// items, digests, chain digests, references, canonical bytes and
// signature. It reports whether the body parsed.
func assertParsedAlike(t *testing.T, want *Request, wantErr error, got *Request, err error, name string) bool {
	t.Helper()
	if wantErr != nil {
		require.Error(t, err, name)
		assert.Equal(t, wantErr.Error(), err.Error(), name)
		return false
	}
	require.NoError(t, err, name)
	assert.Equal(t, want.Items(), got.Items(), name)
	assert.Equal(t, want.digests, got.digests, name)
	assert.Equal(t, want.prefix, got.prefix, name)
	assert.Equal(t, want.refs, got.refs, name)
	assert.Equal(t, want.bytes, got.bytes, name)
	assert.Equal(t, want.signature, got.signature, name)
	return true
}
