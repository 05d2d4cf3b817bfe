package identity_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
)

func mustMain(t testing.TB, s string) identity.Owner {
	t.Helper()
	o, err := identity.Main(s)
	require.NoError(t, err)
	return o
}

func mustAgent(t testing.TB, s, a string) identity.Owner {
	t.Helper()
	o, err := identity.Agent(s, a)
	require.NoError(t, err)
	return o
}

// The key is part of the Redis schema: these values must never change.
func TestKeysAreStable(t *testing.T) {
	cases := []struct {
		owner     identity.Owner
		key       string
		partition int // of 16
	}{
		{mustMain(t, "session-a"), "m:session-a", 3},
		{mustAgent(t, "session-a", "agent-one"), "a:session-a:agent-one", 9},
		{mustMain(t, "a:b"), "m:a%3Ab", 6},
		{mustAgent(t, "a", "b"), "a:a:b", 13},
		{mustAgent(t, "a:b", "c"), "a:a%3Ab:c", 15},
		{mustAgent(t, "a", "b:c"), "a:a:b%3Ac", 11},
		{mustMain(t, "100%"), "m:100%25", 7},
		{mustMain(t, "%3A"), "m:%253A", 10},
		{mustMain(t, "{tag} x"), "m:{tag} x", 1},
		{mustMain(t, "é—ü"), "m:é—ü", 7},
	}
	for _, c := range cases {
		t.Run(c.key, func(t *testing.T) {
			assert.Equal(t, c.key, c.owner.Key())
			assert.Equal(t, c.partition, c.owner.Partition(16))
			back, err := identity.ParseKey(c.key)
			require.NoError(t, err)
			assert.Equal(t, c.owner, back)
		})
	}
}

func TestKeysNeverCollide(t *testing.T) {
	ids := []string{"a", "b", "a:b", "b:c", "a:b:c", "%", "%3A", "%25", ":", "::", "a%3Ab", "{", "}", "{a}", " ", "a b", "m", "a:"}
	seen := map[string]identity.Owner{}
	add := func(o identity.Owner) {
		if prev, ok := seen[o.Key()]; ok {
			t.Fatalf("%v and %v share key %q", prev, o, o.Key())
		}
		seen[o.Key()] = o
	}
	for _, s := range ids {
		add(mustMain(t, s))
		for _, a := range ids {
			add(mustAgent(t, s, a))
		}
	}
}

func TestInvalidIDsAreRefusedNamingFieldAndRule(t *testing.T) {
	long := strings.Repeat("x", identity.MaxIDBytes+1)
	cases := []struct {
		name, session, agent, want string
	}{
		{"empty session", "", "a", "session id is empty"},
		{"empty agent", "s", "", "agent id is empty"},
		{"long session", long, "a", "session id is 257 bytes"},
		{"long agent", "s", long, "agent id is 257 bytes"},
		{"invalid utf8", "s\xff", "a", "session id is not valid UTF-8"},
		{"control char", "s", "a\nb", "agent id has a control character U+000A"},
		{"DEL", "s\x7f", "a", "control character U+007F"},
		{"C1 control", "s\u0085", "a", "control character U+0085"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := identity.Agent(c.session, c.agent)
			require.ErrorIs(t, err, identity.ErrInvalid)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, err := identity.Main("")
	require.ErrorIs(t, err, identity.ErrInvalid)
	_, err = identity.Main(strings.Repeat("é", identity.MaxIDBytes/2))
	require.NoError(t, err, "MaxIDBytes counts bytes and is inclusive")
}

func TestParseKeyRefusesOtherSpellings(t *testing.T) {
	for _, key := range []string{
		"", "m:", "a:", "a:s", "a:s:", "a::x", "x:s", "m:a:b", "a:s:a:b",
		"m:%3a", "m:%41", "m:%", "m:%2", "m:\x00", "m:\xff", "M:s",
	} {
		_, err := identity.ParseKey(key)
		assert.ErrorIs(t, err, identity.ErrInvalid, "key %q", key)
	}
}

func TestOwnerAccessors(t *testing.T) {
	var zero identity.Owner
	assert.True(t, zero.IsZero())
	assert.Equal(t, "", zero.Key())
	assert.Equal(t, "none", zero.String())

	m := mustMain(t, "s")
	assert.False(t, m.IsZero())
	assert.False(t, m.IsAgent())
	assert.Equal(t, "s", m.Session())
	assert.Equal(t, "", m.AgentID())
	assert.Equal(t, `main("s")`, m.String())

	a := mustAgent(t, "s", "x")
	assert.True(t, a.IsAgent())
	assert.Equal(t, "x", a.AgentID())
	assert.Equal(t, `agent("s"/"x")`, a.String())
	assert.NotEqual(t, m, a)
}

func TestPartitionIsInRange(t *testing.T) {
	counts := make([]int, 16)
	for i := 0; i < 1600; i++ {
		o := mustMain(t, "session-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("y", i/26))
		p := o.Partition(16)
		require.True(t, p >= 0 && p < 16)
		counts[p]++
	}
	for p, n := range counts {
		assert.Greater(t, n, 40, "partition %d is starved", p)
	}
	assert.Equal(t, 0, mustMain(t, "s").Partition(0))
	assert.Equal(t, 0, mustMain(t, "s").Partition(1))
}

func FuzzKeyRoundTrip(f *testing.F) {
	f.Add("s", "")
	f.Add("a:b", "c")
	f.Add("%3A", "%25")
	f.Add("{x}", " ")
	f.Fuzz(func(t *testing.T, session, agent string) {
		var o identity.Owner
		var err error
		if agent == "" {
			o, err = identity.Main(session)
		} else {
			o, err = identity.Agent(session, agent)
		}
		if err != nil {
			if !errors.Is(err, identity.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		back, err := identity.ParseKey(o.Key())
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", o.Key(), err)
		}
		if back != o {
			t.Fatalf("ParseKey(%q) = %v, want %v", o.Key(), back, o)
		}
	})
}

func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"m:s", "a:s:x", "m:a%3Ab", "a:%25:%3A", "m:%3a", "a::", "x"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		o, err := identity.ParseKey(key)
		if err != nil {
			if !errors.Is(err, identity.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if o.Key() != key {
			t.Fatalf("ParseKey(%q) = %v whose key is %q", key, o, o.Key())
		}
	})
}
