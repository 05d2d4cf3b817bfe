package fingerprint

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"sync/atomic"

	"github.com/minio/highwayhash"
)

// A client sends the whole conversation every turn, so most of a
// request's items are byte for byte the ones of its previous request. The
// item cache remembers what canonicalising an object item gave, by a
// keyed 128-bit hash of its raw bytes: an item seen before costs a
// structural skip and a hash instead of a canonical pass. A digest depends
// only on the item's bytes, the profile and the key, all fixed for a
// Parser, so the cache never changes a result; the hash key is random per
// Parser, so that no one can aim two different items at one entry.
//
// The cache is set-associative, without locks: an item's hash chooses a
// set of itemCacheWays slots, and the item takes a free one or, when all
// are taken, the one its hash names. Its slots are allocated at the first
// item put, so that a Parser that parses nothing costs nothing.
type itemCache struct {
	key  [32]byte
	sets atomic.Pointer[[itemCacheSets][itemCacheWays]atomic.Pointer[cachedItem]]
}

// The cache holds itemCacheSets × itemCacheWays items at most (about 56
// bytes each, and 8 a slot).
const (
	itemCacheSets = 1 << 13
	itemCacheWays = 16
)

// cachedItem is what an item's canonical pass gave, under its cache key.
type cachedItem struct {
	key       [2]uint64
	digest    uint64
	canonical int64 // the canonical form's length
	reference bool  // an item_reference
}

func newItemCache() *itemCache {
	c := &itemCache{}
	_, _ = rand.Read(c.key[:]) // never fails on the platforms Go supports
	return c
}

// hash returns the cache key of raw.
func (c *itemCache) hash(raw []byte) [2]uint64 {
	s := highwayhash.Sum128(raw, c.key[:])
	return [2]uint64{binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])}
}

func (c *itemCache) get(h [2]uint64) (cachedItem, bool) {
	sets := c.sets.Load()
	if sets == nil {
		return cachedItem{}, false
	}
	for i := range sets[h[0]%itemCacheSets] {
		if it := sets[h[0]%itemCacheSets][i].Load(); it != nil && it.key == h {
			return *it, true
		}
	}
	return cachedItem{}, false
}

func (c *itemCache) put(h [2]uint64, it cachedItem) {
	sets := c.sets.Load()
	if sets == nil {
		c.sets.CompareAndSwap(nil, new([itemCacheSets][itemCacheWays]atomic.Pointer[cachedItem]))
		sets = c.sets.Load()
	}
	it.key = h
	set := &sets[h[0]%itemCacheSets]
	for i := range set {
		if set[i].CompareAndSwap(nil, &it) {
			return
		}
	}
	set[h[1]%itemCacheWays].Store(&it)
}

// skipObject returns the end of the object whose '{' is at data[i], by
// its brackets and strings alone, without validating anything, or -1 when
// the data ends first. It finds the end of an object that is valid JSON;
// of anything else, some position or -1.
func skipObject(data []byte, i int) int {
	depth := 0
	for i < len(data) {
		switch data[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		case '"':
			if i = skipString(data, i+1); i < 0 {
				return -1
			}
			continue
		}
		i++
	}
	return -1
}

// skipString returns the position after the closing quote of the string
// whose content starts at data[i], or -1 when the data ends first. A quote
// closes the string when an even number of backslashes precedes it.
func skipString(data []byte, i int) int {
	for {
		j := bytes.IndexByte(data[i:], '"')
		if j < 0 {
			return -1
		}
		j += i
		k := j
		for k > i && data[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			return j + 1
		}
		i = j + 1
	}
}
