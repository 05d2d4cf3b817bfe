package identity_test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
)

// The owner vectors of testdata/vectors.json (PROTOCOL.md). The store
// package's TestVectors writes the file; this test only reads it.
type ownerVectors struct {
	Owners []struct {
		Name          string                     `json:"name"`
		Session       *string                    `json:"session"`
		SessionHex    string                     `json:"session_hex"`
		Agent         *string                    `json:"agent"`
		AgentHex      string                     `json:"agent_hex"`
		Valid         bool                       `json:"valid"`
		Key           string                     `json:"key"`
		KeyHash       *struct{ Hex, Dec string } `json:"key_hash"`
		Partition16   *int                       `json:"partition_16"`
		Partition1024 *int                       `json:"partition_1024"`
	} `json:"owners"`
	OwnerKeys []struct {
		Key     string  `json:"key"`
		Valid   bool    `json:"valid"`
		Session *string `json:"session"`
		Agent   *string `json:"agent"`
	} `json:"owner_keys"`
}

func vectorText(t *testing.T, s *string, h string) (string, bool) {
	t.Helper()
	if s != nil {
		return *s, true
	}
	if h == "" {
		return "", false
	}
	b, err := hex.DecodeString(h)
	require.NoError(t, err)
	return string(b), true
}

func TestOwnerVectors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "vectors.json"))
	require.NoError(t, err)
	var f ownerVectors
	require.NoError(t, json.Unmarshal(data, &f))
	require.NotEmpty(t, f.Owners)
	require.NotEmpty(t, f.OwnerKeys)

	for _, v := range f.Owners {
		t.Run(v.Name, func(t *testing.T) {
			session, ok := vectorText(t, v.Session, v.SessionHex)
			require.True(t, ok, "vector has a session")
			var o identity.Owner
			var err error
			if agent, isAgent := vectorText(t, v.Agent, v.AgentHex); isAgent {
				o, err = identity.Agent(session, agent)
			} else {
				o, err = identity.Main(session)
			}
			if !v.Valid {
				require.ErrorIs(t, err, identity.ErrInvalid)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, v.Key, o.Key())
			sum := xxhash.Sum64String(o.Key())
			require.NotNil(t, v.KeyHash)
			assert.Equal(t, v.KeyHash.Hex, fmt.Sprintf("%016x", sum))
			assert.Equal(t, v.KeyHash.Dec, strconv.FormatInt(int64(sum), 10))
			assert.Equal(t, *v.Partition16, o.Partition(16))
			assert.Equal(t, *v.Partition1024, o.Partition(1024))
			back, err := identity.ParseKey(v.Key)
			require.NoError(t, err)
			assert.Equal(t, o, back)
		})
	}

	for _, v := range f.OwnerKeys {
		o, err := identity.ParseKey(v.Key)
		if !v.Valid {
			assert.ErrorIs(t, err, identity.ErrInvalid, "key %q", v.Key)
			continue
		}
		require.NoError(t, err, "key %q", v.Key)
		assert.Equal(t, *v.Session, o.Session(), "key %q", v.Key)
		if v.Agent == nil {
			assert.False(t, o.IsAgent(), "key %q", v.Key)
		} else {
			assert.Equal(t, *v.Agent, o.AgentID(), "key %q", v.Key)
		}
		assert.Equal(t, v.Key, o.Key())
	}
}
