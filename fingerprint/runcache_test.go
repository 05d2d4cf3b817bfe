package fingerprint

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/agentchat"
)

// runBodies returns the bodies of conversations that test the run cache,
// in the order a gateway would see them: histories that grow by two items
// a turn, are resent, branch, end in a number that the next body extends,
// are followed by what is not an item's end, change in the middle with
// their first and last bytes kept, use every kind of item (strings,
// numbers, references) and odd whitespace.
func runBodies() [][]byte {
	hist := agentchat.History(40)
	items := make([]string, len(hist))
	for i, it := range hist {
		items[i] = string(it)
	}
	items[5] = `"a string item"`
	items[9] = `{"type":"item_reference","id":"msg_1"}`
	items[13] = `{"id":"rs_7","type":"reasoning","summary":[]}`
	body := func(sep string, its ...string) []byte {
		return []byte(`{"model":"m","input":[` + strings.Join(its, sep) + `]}`)
	}
	bodies := [][]byte{}
	for n := 10; n <= 40; n += 2 {
		bodies = append(bodies, body(",", items[:n]...))
	}
	bodies = append(bodies,
		body(",", items[:40]...),                                   // resent
		body(",", append(items[:30:30], `"other"`)...),             // a branch
		body(",", append(items[:20:20], `1`)...),                   // ends in a number
		body(",", append(items[:20:20], `12`)...),                  // that goes on
		body(",", append(items[:20:20], `1`, `2`)...),              // or is followed
		body(" ,\n", items[:24]...),                                // odd whitespace
		body(" ,\n", items[:26]...),                                // that grows
		[]byte(`{"input":[`+strings.Join(items[:26], " ,\n")+` }`), // no item after
		[]byte(`{"input":[`+strings.Join(items[:26], " ,\n")+`,`),  // no end
		body(",", items[:24]...),                                   // other separators

		// A second input array, which the parse refuses when the body
		// ends, after a first that a run matches.
		[]byte(`{"model":"m","input":[`+strings.Join(items[:24], ",")+`],"stream":true,"input":[{"a":1},{"b":2}]}`),
	)
	// The same first and last bytes, another middle of the same length.
	middle := slices.Clone(items[:30])
	middle[12] = strings.Replace(middle[12], "Step", "Stop", 1)
	bodies = append(bodies, body(",", middle...), body(",", append(middle, items[30:32]...)...))
	return bodies
}

// The run cache never changes a result: every body parses as it does
// without any cache, under both profiles (TestRunCacheStaysBounded shows
// that runs are taken).
func TestRunCacheNeverChangesAResult(t *testing.T) {
	bodies := runBodies()
	for _, profile := range []Profile{V2(), V3(), V4()} {
		cached := mustParser(profile, testKey)
		plain := mustParser(profile, testKey)
		plain.items, plain.runs = nil, nil
		for i, b := range bodies {
			want, wantErr := plain.Parse(b)
			got, err := cached.Parse(b)
			assertParsedAlike(t, want, wantErr, got, err, fmt.Sprintf("body %d", i))
		}
	}
}

// Parses of conversations at once, on one parser, give what a parser
// without caches gives.
func TestRunCacheConcurrentParses(t *testing.T) {
	bodies := runBodies()
	plain := mustParser(V4(), testKey)
	plain.items, plain.runs = nil, nil
	want := make([]*Request, len(bodies))
	for i, b := range bodies {
		want[i], _ = plain.Parse(b)
	}
	cached := mustParser(V4(), testKey)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := range 200 {
				k := (g*7 + n) % len(bodies)
				got, err := cached.Parse(bodies[k])
				if want[k] == nil {
					assert.Error(t, err, "body %d", k)
					continue
				}
				if assert.NoError(t, err, "body %d", k) {
					assert.Equal(t, want[k].prefix, got.prefix, "body %d", k)
					assert.Equal(t, want[k].Items(), got.Items(), "body %d", k)
				}
			}
		})
	}
	wg.Wait()
}

// A conversation keeps one run, its latest: each run goes when the next
// turn's extends it. The cache stays within its items however many runs
// come, and within its ways for conversations that open alike.
func TestRunCacheStaysBounded(t *testing.T) {
	p := mustParser(V2(), testKey)
	hist := agentchat.History(60)
	body := func(first string, n int) []byte {
		its := []string{first}
		for _, it := range hist[:n] {
			its = append(its, string(it))
		}
		return []byte(`{"input":[` + strings.Join(its, ",") + `]}`)
	}
	for n := 10; n <= 60; n += 2 {
		_, err := p.Parse(body(`"conversation"`, n))
		require.NoError(t, err)
	}
	c := p.runs
	assert.Equal(t, 1, c.order.Len(), "one run for one conversation")
	assert.Equal(t, 61, c.items)

	c.limit = 300
	for k := range 20 {
		_, err := p.Parse(body(fmt.Sprintf(`"conversation %d"`, k), 30))
		require.NoError(t, err)
		assert.LessOrEqual(t, c.items, c.limit)
	}
	assert.Equal(t, 9, c.order.Len(), "the latest runs that fit, 31 items each")
	// A run of more than an eighth of the cache is not kept: it would
	// empty it.
	_, err := p.Parse(body(`"a long conversation"`, 60))
	require.NoError(t, err)
	assert.Equal(t, 9, c.order.Len())
	// Conversations that open alike share a head.
	c.limit = runCacheItems
	long := strings.Repeat("x", 2*runHead)
	for k := range 3 * runWays {
		_, err := p.Parse(body(fmt.Sprintf(`"%s %d"`, long, k), 20))
		require.NoError(t, err)
	}
	for head, runs := range c.heads {
		assert.LessOrEqual(t, len(runs), runWays, "head %x", head)
	}
	held := 0
	for e := c.order.Front(); e != nil; e = e.Next() {
		held += len(e.Value.(*run).digests)
	}
	assert.Equal(t, c.items, held)
}
