package session_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/session"
)

func u64(v uint64) *uint64 { return &v }

func TestExamplePriceTableParses(t *testing.T) {
	b, err := os.ReadFile("prices.example.json")
	require.NoError(t, err)
	prices, err := session.ParsePrices(b)
	require.NoError(t, err)
	large := prices["example-large"]
	assert.Equal(t, 1.25*large.Input, large.CacheWrite5m, "5-minute writes at 1.25× input")
	assert.Equal(t, 2*large.Input, large.CacheWrite1h, "1-hour writes at 2× input")
}

func TestCostBillsEachKindOfToken(t *testing.T) {
	prices := session.Prices{"m": {Input: 1, Output: 2, CacheRead: 0.1, CacheWrite5m: 1.25, CacheWrite1h: 2}}
	for _, c := range []struct {
		name  string
		usage session.Usage
		want  float64
		known bool
	}{
		{"plain", session.Usage{Model: "m", Tokens: session.Tokens{Input: 1_000_000, Output: 1_000_000}}, 3, true},
		{"cache read", session.Usage{Model: "m", Tokens: session.Tokens{CacheRead: 1_000_000}}, 0.1, true},
		{"unknown split bills at 5m", session.Usage{Model: "m", Tokens: session.Tokens{CacheCreation: 1_000_000}}, 1.25, true},
		{"split", session.Usage{Model: "m", Tokens: session.Tokens{CacheCreation: 3_000_000}, CacheCreation5m: u64(1_000_000), CacheCreation1h: u64(2_000_000)}, 1.25 + 4, true},
		{"only 1h known", session.Usage{Model: "m", Tokens: session.Tokens{CacheCreation: 1_000_000}, CacheCreation1h: u64(1_000_000)}, 2, true},
		{"unknown model", session.Usage{Model: "other", Tokens: session.Tokens{Input: 1_000_000}}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, known := prices.Cost(c.usage)
			assert.InDelta(t, c.want, got, 1e-9)
			assert.Equal(t, c.known, known)
		})
	}
}

func TestBadPriceTablesAreRefused(t *testing.T) {
	for _, doc := range []string{`{`, `{"models":{"m":{"input":-1}}}`, `{"models":{"m":{"inptu":1}}}`, `[]`} {
		_, err := session.ParsePrices([]byte(doc))
		assert.ErrorIs(t, err, session.ErrInvalid, doc)
	}
}

func TestNewConversationClampsKeepWarm(t *testing.T) {
	s := session.New("m", "", "")
	s.Tokens = session.Tokens{Input: 10, Output: 10, CacheRead: 10, CacheCreation: 10}
	s.KeepWarmTokens = session.Tokens{Input: 20, Output: 5, CacheRead: 11, CacheCreation: 0}
	s.Cost, s.KeepWarmCost = 1, 3
	c := session.NewConversation(s, session.Deps{})
	assert.Equal(t, session.Tokens{Input: 10, Output: 5, CacheRead: 10}, c.Session.KeepWarmTokens)
	assert.Equal(t, 1.0, c.Session.KeepWarmCost)
	s.KeepWarmCost = -2
	assert.Zero(t, session.NewConversation(s, session.Deps{}).Session.KeepWarmCost)
}
