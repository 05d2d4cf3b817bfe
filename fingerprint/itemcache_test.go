package fingerprint

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cacheCorpus returns request bodies of every kind the tests know: the
// vectors' requests, each canonical vector's input as a body's only item
// (valid or not), the real clients' traces and the synthetic bodies.
func cacheCorpus(t *testing.T) [][]byte {
	var bodies [][]byte
	var vec struct {
		Canonical []struct {
			Input json.RawMessage `json:"input"`
		} `json:"canonical"`
		Requests []struct {
			Body json.RawMessage `json:"body"`
		} `json:"requests"`
	}
	data, err := os.ReadFile(vecPath)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &vec))
	for _, r := range vec.Requests {
		var s string // a body that is not valid JSON is stored as a string
		if json.Unmarshal(r.Body, &s) == nil {
			bodies = append(bodies, []byte(s))
		} else {
			bodies = append(bodies, r.Body)
		}
	}
	for _, c := range vec.Canonical {
		var s string
		if json.Unmarshal(c.Input, &s) == nil {
			bodies = append(bodies, []byte(`{"input":[`+s+`, {"role":"user","content":"next"}]}`))
		}
	}
	traces, err := filepath.Glob(filepath.Join("..", "testdata", "clients", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, traces)
	for _, path := range traces {
		f, err := os.Open(path)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var line struct {
				Request json.RawMessage `json:"request"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && len(line.Request) > 0 {
				bodies = append(bodies, line.Request)
			}
		}
		require.NoError(t, sc.Err())
		_ = f.Close()
	}
	bodies = append(bodies, syntheticBody(100, 200<<10), syntheticBody(500, 1<<20))
	return bodies
}

// The item cache never changes a result: every body of the corpus parses
// to the same request, or fails with the same error, with the cache empty,
// with every item seen before, and without a cache, under both profiles.
func TestItemCacheNeverChangesAResult(t *testing.T) {
	bodies := cacheCorpus(t)
	t.Logf("%d bodies", len(bodies))
	for _, profile := range []Profile{V2(), V3(), V4()} {
		cached := mustParser(profile, testKey)
		plain := mustParser(profile, testKey)
		plain.items, plain.runs = nil, nil
		hits := 0
		for i, body := range bodies {
			want, wantErr := plain.Parse(body)
			for pass := range 2 {
				got, err := cached.Parse(body)
				if !assertParsedAlike(t, want, wantErr, got, err, fmt.Sprintf("body %d, pass %d", i, pass)) {
					continue
				}
				if pass == 1 {
					hits += got.Len()
				}
			}
		}
		assert.Positive(t, hits)
	}
}

// rekey gives c a new key: the items it holds are never found again, and
// new ones take their slots.
func (c *itemCache) rekey() { _, _ = rand.Read(c.key[:]) }

// fill puts item(i) for i in [from, to) into c, as a parser does (those
// it does not find), until a round of puts leaves c's table as it was:
// items put while a table is made may be lost.
func fill(c *itemCache, from, to int, item func(i int) cachedItem) {
	for {
		before := c.slots.Load()
		for i := from; i < to; i++ {
			if it := item(i); !holds(c, it) {
				c.put(it.key, it)
			}
		}
		c.grows.Wait()
		if c.slots.Load() == before {
			return
		}
	}
}

// holds reports whether c holds it.
func holds(c *itemCache, it cachedItem) bool {
	got, ok := c.get(it.key)
	return ok && got == it
}

// The cache holds what it was given while it has room, and stays within
// its slots however many items go by: half as many items as it has slots
// at most are all found again; three times as many leave it full, the
// latest found more often than not.
func TestItemCacheHoldsWhatFitsAndStaysBounded(t *testing.T) {
	const slots = itemCacheSets * itemCacheWays
	c := newItemCache()
	key := func(i int) [2]uint64 { return c.hash([]byte{byte(i), byte(i >> 8), byte(i >> 16)}) }
	item := func(i int) cachedItem { return cachedItem{key: key(i), digest: uint64(i)} }
	found := func(from, to int) (n int) {
		for i := from; i < to; i++ {
			if it, ok := c.get(key(i)); ok && it.digest == uint64(i) {
				n++
			}
		}
		return n
	}
	fill(c, 0, slots/2, item)
	require.Len(t, c.slots.Load().sets, itemCacheSets)
	assert.Greater(t, found(0, slots/2), slots/2*99/100, "half full: nearly every item found")
	for i := slots / 2; i < 3*slots; i++ {
		c.put(key(i), cachedItem{digest: uint64(i)})
	}
	assert.Greater(t, found(3*slots-slots/4, 3*slots), slots/4/2, "the latest items mostly found")
	c.grows.Wait()
	require.Len(t, c.slots.Load().sets, itemCacheSets, "the cache grows no further")
	// Every set holds as many items as were put in it, up to its ways.
	var put [itemCacheSets]int
	for i := range 3 * slots {
		s, _ := slot(key(i), itemCacheSets)
		put[s]++
	}
	held, fits := 0, 0
	sets := c.slots.Load().sets
	for i := range sets {
		for j := range sets[i] {
			if !sets[i][j].free() {
				held++
			}
		}
		fits += min(put[i], itemCacheWays)
	}
	assert.Equal(t, fits, held)
	assert.LessOrEqual(t, held, slots)
}

// A cache takes its first, small table at its first item, and grows by
// cacheGrowth when a set of its table is full: the items of the table it
// had are found in the one it grew to, and its size follows what it holds.
func TestItemCacheGrowsWithWhatItHolds(t *testing.T) {
	c := newItemCache()
	assert.Nil(t, c.slots.Load(), "no table before the first item")
	key := func(i int) [2]uint64 { return c.hash([]byte{byte(i), byte(i >> 8), byte(i >> 16), 'g'}) }
	item := func(i int) cachedItem {
		return cachedItem{key: key(i), digest: uint64(i), linked: true, prev: uint64(i) * 3, next: uint64(i) * 5}
	}
	c.put(key(0), item(0))
	require.Len(t, c.slots.Load().sets, firstCacheSets)
	n, grown := 0, 0
	for sets := firstCacheSets; sets < itemCacheSets; sets *= cacheGrowth {
		table := c.slots.Load()
		for ; c.slots.Load() == table; n++ {
			require.Less(t, n, sets*itemCacheWays, "a table of %d sets full without growing", sets)
			c.put(key(n), item(n))
			if table.growing.Load() {
				c.grows.Wait()
			}
		}
		require.Len(t, c.slots.Load().sets, sets*cacheGrowth)
		grown++
		// A table grows at its first full set, at about 4 items a set on
		// average; at 2 a set, once in millions of keys.
		assert.Greater(t, n, sets*itemCacheWays/8, "a table of %d sets grew with %d items", sets, n)
		lost := 0
		for i := range n {
			if it, ok := c.get(key(i)); !ok {
				lost++
			} else {
				want := item(i)
				assert.Equal(t, want, it, "item %d", i)
			}
		}
		// Each set that filled up lost one item; none was put while the
		// next table was made.
		assert.LessOrEqual(t, lost, grown, "items lost growing to %d sets", sets*cacheGrowth)
	}
	fill(c, 0, 2*itemCacheSets*itemCacheWays, item)
	assert.Len(t, c.slots.Load().sets, itemCacheSets, "no larger than itemCacheSets sets")
}

// skipObject finds the end of valid objects, strings with escapes and
// brackets inside included, and reports data that ends first.
func TestSkipObject(t *testing.T) {
	for _, s := range []string{
		`{}`, `{"a":1}`, `{"a":"}"}`, `{"a":"\"}"}`, `{"a":"\\"}`, `{"a":[1,{"b":"]"}],"c":{}}`,
		`{"text":"a long string that goes on for more than eight bytes \\ \" \n é 日本語"}`,
		`{"a":"x\\\"y","b":"\\\\"}`, `{"a":"\"\""}`,
	} {
		assert.Equal(t, len(s), skipObject([]byte(s+`, {"next":1}`), 0), s)
		assert.Equal(t, -1, skipObject([]byte(s[:len(s)-1]), 0), s)
	}
	assert.Equal(t, -1, skipObject([]byte(`{"a":"\`), 0))
}

// A scanner that parsed a body of many small items holds per-item slices
// far larger than the body: it is not kept in scannerCache, which garbage
// collection never empties.
func TestScannersOfManyItemsAreNotKept(t *testing.T) {
	body := []byte(`{"input":[{}` + strings.Repeat(`,{}`, 300_000) + `]}`)
	_, err := testParser.Parse(body)
	require.NoError(t, err)
	for {
		select {
		case p := <-scannerCache:
			assert.LessOrEqual(t, p.retained(), cacheMaxBuffer)
			continue
		default:
		}
		break
	}
}

// An item the cache holds gives the chain digest it gave where it was put
// only after the same chain digest: found again after other items, at
// other positions, or in another order, by goroutines at once, it gives
// what a parser without a cache gives.
func TestItemCacheChainLinks(t *testing.T) {
	items := make([]string, 8)
	for i := range items {
		items[i] = fmt.Sprintf(`{"role":"user","content":"message %d"}`, i)
	}
	body := func(order ...int) []byte {
		var parts []string
		for _, i := range order {
			parts = append(parts, items[i])
		}
		return []byte(`{"input":[` + strings.Join(parts, ",") + `]}`)
	}
	bodies := [][]byte{
		body(0, 1, 2, 3), body(0, 1, 2, 3, 4, 5), body(1, 2, 3), body(3, 2, 1, 0),
		body(0, 0, 0, 0), body(4, 0, 1, 2, 3), body(0, 1, 5, 2, 3), body(2),
	}
	plain := mustParser(V2(), testKey)
	plain.items, plain.runs = nil, nil
	want := make([][]uint64, len(bodies))
	for i, b := range bodies {
		r, err := plain.Parse(b)
		require.NoError(t, err)
		want[i] = r.prefix
	}
	cached := mustParser(V2(), testKey)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := range 50 {
				k := (g + n) % len(bodies)
				r, err := cached.Parse(bodies[k])
				if assert.NoError(t, err) {
					assert.Equal(t, want[k], r.prefix, "body %d", k)
				}
			}
		})
	}
	wg.Wait()
}

// Puts and gets at once on one set never give an item made of two: every
// item found is whole, each of its words a function of its key.
func TestItemCacheNeverGivesATornItem(t *testing.T) {
	c := newItemCache()
	c.put([2]uint64{}, cachedItem{}) // allocates the slots
	whole := func(k uint64) cachedItem {
		return cachedItem{digest: k * 3, canonical: int64(k % 1000), reference: k%2 == 0, linked: true, prev: k * 5, next: k * 7}
	}
	// Keys of one set in every table, with many homes: they displace one
	// another, and the cache grows while they are read and written.
	key := func(k uint64) [2]uint64 { return [2]uint64{k << 60, k} }
	var wg sync.WaitGroup
	var found atomic.Int64
	for g := range 4 {
		wg.Go(func() {
			for n := range 300_000 {
				k := uint64(1 + (n*7+g)%64)
				if g%2 == 0 {
					c.put(key(k), whole(k))
					continue
				}
				if it, ok := c.get(key(k)); ok {
					found.Add(1)
					want := whole(k)
					want.key = key(k)
					if it != want {
						t.Errorf("key %d gave %+v", k, it)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	c.grows.Wait()
	assert.Positive(t, found.Load())
}

// Items put one after another while the cache grows, as a parser puts a
// request's new items, are found afterwards: the table that takes a full
// one's place does so at once, and the full one's items are copied in.
// That holds also when the copies get no processor until the puts are
// done, as on a busy machine: a table still being filled grows all the
// same, and is copied into the larger one once it is filled.
func TestItemCacheLosesNothingToAGrowth(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("copies held back=%v", held), func(t *testing.T) {
			c := newItemCache()
			var copies []func()
			if held {
				c.background = func(grow func()) { copies = append(copies, grow) }
			}
			key := func(i int) [2]uint64 { return c.hash([]byte{byte(i), byte(i >> 8), 'l'}) }
			const n = 8 << 10
			for i := range n {
				c.put(key(i), cachedItem{digest: uint64(i)})
			}
			if held {
				require.GreaterOrEqual(t, len(copies), 2, "grew twice with the first copy held back")
				for _, grow := range slices.Backward(copies) {
					c.grows.Go(grow)
				}
			}
			c.grows.Wait()
			require.Greater(t, len(c.slots.Load().sets), firstCacheSets, "the cache grew")
			assert.Nil(t, c.slots.Load().from.Load(), "the copies are done")
			lost := 0
			for i := range n {
				if it, ok := c.get(key(i)); !ok || it.digest != uint64(i) {
					lost++
				}
			}
			assert.LessOrEqual(t, lost, n/100, "items lost to growing to %d sets", len(c.slots.Load().sets))
		})
	}
}

// Touching a table's pages, which the cache does to a table it grows to
// before the table takes its place, changes none of its items, also
// while they are read and written.
func TestItemCacheTouchChangesNothing(t *testing.T) {
	c := newItemCache()
	const n = 4 << 10
	key := func(i int) [2]uint64 { return c.hash([]byte{byte(i), byte(i >> 8)}) }
	fill(c, 0, n, func(i int) cachedItem {
		return cachedItem{key: key(i), digest: uint64(i), linked: true, prev: uint64(i) * 3, next: uint64(i) * 5}
	})
	before := make(map[int]cachedItem)
	for i := range n {
		if it, ok := c.get(key(i)); ok {
			before[i] = it
		}
	}
	require.Greater(t, len(before), n*99/100)
	var wg sync.WaitGroup
	wg.Go(c.slots.Load().touch)
	for i, want := range before {
		it, ok := c.get(key(i))
		assert.True(t, ok && it == want, "item %d: %+v, want %+v", i, it, want)
	}
	wg.Wait()
	for i, want := range before {
		it, ok := c.get(key(i))
		assert.True(t, ok && it == want, "item %d after the touch: %+v, want %+v", i, it, want)
	}
}
