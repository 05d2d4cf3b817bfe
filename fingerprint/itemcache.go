package fingerprint

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

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
// An entry also keeps the chain digest h(k) = H(le64(h(k-1)) || le64(d))
// that its item gave where it was put. An item found again after the same
// h(k-1), as it is when a client resends its history, takes h(k) from it:
// the same function of the same input, compared in full.
//
// The cache is set-associative, without locks: an item's hash chooses a
// set of itemCacheWays slots and its home in the set. The item takes its
// home when it is free, else a free slot, else, when all are taken, its
// home, and the item there moves to another slot; a lookup reads the item
// at its home first, so that it usually reads one item. A slot holds its
// item in place, under a sequence number (a seqlock), so that the cache
// holds no pointers for the garbage collector to follow and a put
// allocates nothing.
//
// The cache grows with what it is given: its first table of sets is
// allocated at the first item put, so that a Parser that parses nothing
// costs nothing, and holds firstCacheSets sets. The first put that finds
// its set full makes a table cacheGrowth times larger, up to
// itemCacheSets sets, which takes the full one's place at once; on a
// goroutine of its own, the new table's pages are touched and the items
// of the table it replaced copied in, while lookups that miss in it look
// there too. A table grows at its first full set even while its own
// items are still being copied in, so that puts never wait on a copy
// that was not given the processor: the copy into the larger table waits
// for that one instead. So a gateway with few conversations takes a few
// hundred kilobytes, nothing put is lost to a growth, and most pages of a
// new table are the process's before the items of turns land on them.
type itemCache struct {
	key   [32]byte
	slots atomic.Pointer[cacheSlots]
	grows sync.WaitGroup // the tables being filled (cacheSlots.grow)
	// background runs a grown table's grow: on a goroutine of grows.
	background func(grow func())
}

// cacheSet is one set of a cache's table.
type cacheSet [itemCacheWays]cacheSlot

// cacheSlots is a table of the cache's sets, and which of them are full: a
// set, once full, stays full (an item only ever replaces another), so that
// a put into it need not look at every slot for a free one.
type cacheSlots struct {
	sets    []cacheSet
	full    []atomic.Bool
	growing atomic.Bool // a larger table took this one's place
	// from is the table this one took the place of, while its items are
	// copied in (grow); filled is closed once they are.
	from   atomic.Pointer[cacheSlots]
	filled chan struct{}
}

// A set holds itemCacheWays items (a 64-byte slot each: a kilobyte). A
// cache's first table holds firstCacheSets sets (128 KiB); each table it
// grows to, cacheGrowth times as many, up to itemCacheSets (8 MiB). All
// are powers of two.
const (
	itemCacheWays  = 16
	firstCacheSets = 1 << 7
	itemCacheSets  = 1 << 13
	cacheGrowth    = 4
)

// newCacheSlots returns a table of sets sets that takes the place of
// from, or the cache's first table when from is nil.
func newCacheSlots(sets int, from *cacheSlots) *cacheSlots {
	s := &cacheSlots{sets: make([]cacheSet, sets), full: make([]atomic.Bool, sets), filled: make(chan struct{})}
	if from == nil {
		close(s.filled)
	} else {
		s.from.Store(from)
	}
	return s
}

// cachedItem is what an item's canonical pass gave, under its cache key,
// and the chain digest it gave there: next = H(le64(prev) || le64(digest)).
type cachedItem struct {
	key        [2]uint64
	digest     uint64
	canonical  int64 // the canonical form's length
	reference  bool  // an item_reference
	linked     bool  // prev and next are set
	prev, next uint64
}

// cacheSlot holds one cachedItem. seq is even while the slot is stable
// (0 while it has never held an item) and odd while a put writes it: a
// reader that sees it change, or odd, reads nothing.
type cacheSlot struct {
	seq atomic.Uint64
	// key[0], key[1], digest, the canonical length with the flags in its
	// low bits (slotReference, slotLinked), prev, next.
	w [6]atomic.Uint64
	_ uint64 // a slot fills a 64-byte cache line
}

const (
	slotReference = 1 << iota
	slotLinked
	slotFlags = 2
)

// find returns the slot's item if it holds one whose key is h.
func (s *cacheSlot) find(h [2]uint64) (cachedItem, bool) {
	if s.w[0].Load() != h[0] {
		return cachedItem{}, false
	}
	it, ok := s.load()
	return it, ok && it.key == h
}

// load returns the slot's item, read whole, and whether it holds one.
func (s *cacheSlot) load() (cachedItem, bool) {
	seq := s.seq.Load()
	if seq == 0 || seq&1 != 0 {
		return cachedItem{}, false
	}
	meta := s.w[3].Load()
	it := cachedItem{
		key:       [2]uint64{s.w[0].Load(), s.w[1].Load()},
		digest:    s.w[2].Load(),
		canonical: int64(meta >> slotFlags),
		reference: meta&slotReference != 0,
		linked:    meta&slotLinked != 0,
		prev:      s.w[4].Load(),
		next:      s.w[5].Load(),
	}
	return it, s.seq.Load() == seq
}

// store writes it into the slot, unless another put is writing it (a
// cache may drop what it is given).
func (s *cacheSlot) store(it cachedItem) {
	seq := s.seq.Load()
	if seq&1 != 0 || !s.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	meta := uint64(it.canonical) << slotFlags
	if it.reference {
		meta |= slotReference
	}
	if it.linked {
		meta |= slotLinked
	}
	s.w[0].Store(it.key[0])
	s.w[1].Store(it.key[1])
	s.w[2].Store(it.digest)
	s.w[3].Store(meta)
	s.w[4].Store(it.prev)
	s.w[5].Store(it.next)
	s.seq.Store(seq + 2)
}

// touch writes to every page of the table once, leaving what it holds as
// it is. Items land on pages at random, and a page the process has not
// used costs a fault on its first read and another on its first write
// (12–80 µs each on a 2-vCPU virtual machine): without it the items of
// the turns after the table took its place would pay for it page by
// page, as those that come while it runs do.
func (s *cacheSlots) touch() {
	const setsPerPage = 4096 / int(unsafe.Sizeof(cacheSet{}))
	for i := 0; i < len(s.sets); i += setsPerPage {
		s.sets[i][0].seq.Add(0)
	}
}

// free reports whether the slot has never held an item.
func (s *cacheSlot) free() bool { return s.seq.Load() == 0 }

func newItemCache() *itemCache {
	c := &itemCache{}
	c.background = c.grows.Go
	_, _ = rand.Read(c.key[:]) // never fails on the platforms Go supports
	return c
}

// hash returns the cache key of raw.
func (c *itemCache) hash(raw []byte) [2]uint64 { return sum128(&c.key, raw) }

// sum128 returns the HighwayHash-128 of b under key, as two words.
func sum128(key *[32]byte, b []byte) [2]uint64 {
	s := highwayhash.Sum128(b, key[:])
	return words128(s[:])
}

// words128 reads a 128-bit hash as two little-endian words.
func words128(s []byte) [2]uint64 {
	return [2]uint64{binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])}
}

// slot returns the set of the cache key h in a table of sets sets, and its
// home in the set: disjoint bits of its hash.
func slot(h [2]uint64, sets int) (set, home uint64) {
	return h[0] & uint64(sets-1), h[0] >> 60
}

// get returns the item of cache key h, if the cache holds it: in its
// table, or in those it took the place of while their items are copied.
func (c *itemCache) get(h [2]uint64) (cachedItem, bool) {
	for s := c.slots.Load(); s != nil; s = s.from.Load() {
		if it, ok := s.get(h); ok {
			return it, true
		}
	}
	return cachedItem{}, false
}

// get returns the item of cache key h, if the table holds it.
func (s *cacheSlots) get(h [2]uint64) (cachedItem, bool) {
	i, home := slot(h, len(s.sets))
	set := &s.sets[i]
	if it, ok := set[home].find(h); ok {
		return it, true
	}
	for j := range set {
		if it, ok := set[j].find(h); ok {
			return it, true
		}
	}
	return cachedItem{}, false
}

// put stores it under cache key h, and puts the next table in place when
// it found its set full.
func (c *itemCache) put(h [2]uint64, it cachedItem) {
	slots := c.slots.Load()
	if slots == nil {
		c.slots.CompareAndSwap(nil, newCacheSlots(firstCacheSets, nil))
		slots = c.slots.Load()
	}
	it.key = h
	if slots.put(it) && len(slots.sets) < itemCacheSets && slots.growing.CompareAndSwap(false, true) {
		to := newCacheSlots(len(slots.sets)*cacheGrowth, slots)
		c.slots.Store(to)
		c.background(to.grow)
	}
}

// grow touches the table's pages and, once the table it took the place
// of holds its own predecessor's items, copies in those it does not hold,
// then looks there no more.
func (s *cacheSlots) grow() {
	s.touch()
	from := s.from.Load()
	<-from.filled
	for i := range from.sets {
		for j := range from.sets[i] {
			if it, ok := from.sets[i][j].load(); ok {
				if _, held := s.get(it.key); !held {
					s.put(it)
				}
			}
		}
	}
	s.from.Store(nil)
	close(s.filled)
}

// put stores it under its key, and reports whether its set was full (an
// item made way for it).
func (s *cacheSlots) put(it cachedItem) (full bool) {
	i, home := slot(it.key, len(s.sets))
	set := &s.sets[i]
	if !s.full[i].Load() {
		if set[home].free() {
			set[home].store(it)
			return false
		}
		for j := range set {
			if set[j].free() {
				set[j].store(it)
				return false
			}
		}
		s.full[i].Store(true)
	}
	// The set is full: the item takes its home, and the one it displaces
	// another slot, named by the rest of the key, so that two items of one
	// conversation with the same home do not evict each other turn after
	// turn.
	old, ok := set[home].load()
	set[home].store(it)
	if ok {
		set[(home+1+it.key[1]%(itemCacheWays-1))%itemCacheWays].store(old)
	}
	return true
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
// whose content starts at data[i], or -1 when the data ends first. A
// backslash escapes the byte after it. Most strings of an item are short:
// it reads their first 16 bytes eight at a time, then searches for quotes.
func skipString(data []byte, i int) int {
	for end := i + 16; i < end && i+8 <= len(data); {
		m := quoteOrBackslash(binary.LittleEndian.Uint64(data[i:]))
		if m == 0 {
			i += 8
			continue
		}
		i += bits.TrailingZeros64(m) >> 3
		if data[i] == '"' {
			return i + 1
		}
		i += 2
	}
	for i <= len(data) {
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
	return -1
}

// quoteOrBackslash returns a mask whose lowest set bit is the high bit of
// the first byte of x, in little-endian order, that is a quote or a
// backslash, or 0 when there is none.
func quoteOrBackslash(x uint64) uint64 {
	q := x ^ ones*'"'
	b := x ^ ones*'\\'
	return ((q-ones)&^q | (b-ones)&^b) & highs
}
