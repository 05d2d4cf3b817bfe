package fingerprint

import (
	"container/list"
	"crypto/rand"
	"hash"
	"slices"
	"sync"

	"github.com/minio/highwayhash"
)

// A client resends its whole history every turn, so a request's input
// array usually begins with every byte of the input array of the
// conversation's previous request. The run cache remembers what the items
// of recent requests' input arrays gave (their spans, digests, chain
// digests and references) under a keyed 128-bit hash of the array's bytes
// up to the end of its last item: a run. A request whose input array
// begins with a run's bytes, followed by the end of that last item, takes
// the run's items for one hash pass over those bytes, instead of a skip, a
// hash and a lookup in the item cache for every item. An item is a
// function of its bytes, and the same bytes from the array's start split
// into the same items, so a run gives exactly what parsing its bytes
// gives.
//
// A run is found by its head, a hash of its first runHead bytes. One head
// names up to runWays runs (conversations that open alike); an array's
// bytes are hashed once, from its '[' on, and each run under its head is
// checked as the hash passes its end (runMatch), so that a body can be
// checked while it arrives (Parser.ReadRequest). The cache holds
// runCacheItems items in all: the oldest runs go first, and a run goes as
// soon as a run that extends it comes.
type runCache struct {
	key   [32]byte
	mu    sync.Mutex
	heads map[[2]uint64][]*run // newest first
	order list.List            // of *run, oldest first
	items int
	limit int // runCacheItems
}

const (
	runHead       = 256     // bytes hashed for a run's head
	runWays       = 8       // runs a head names at most
	runCacheItems = 1 << 19 // items held at most, 24 bytes each
	runMinItems   = 8       // fewer items parse faster than a run is kept
)

// run is what the items of one input array gave, from its '[' to the end
// of its last item.
type run struct {
	head, sum      [2]uint64
	size           int      // bytes, from the '[' to the end of the last item
	spans          []uint32 // item i is [spans[2i], spans[2i+1]) from the '['
	digests, chain []uint64 // chain[i] is h(i+1)
	refs           []bool   // nil when no item is an item_reference
	canonical      int64    // the items' canonical bytes
	at             *list.Element
}

func newRunCache() *runCache {
	c := &runCache{heads: map[[2]uint64][]*run{}, limit: runCacheItems}
	_, _ = rand.Read(c.key[:]) // never fails on the platforms Go supports
	return c
}

// under returns the runs under head, by size.
func (c *runCache) under(head [2]uint64) []*run {
	c.mu.Lock()
	runs := slices.Clone(c.heads[head])
	c.mu.Unlock()
	slices.SortFunc(runs, func(a, b *run) int { return a.size - b.size })
	return runs
}

// endsItem reports whether c may follow an item of an array.
func endsItem(c byte) bool {
	return c == ',' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// add adds r, which replaces old (nil when none): old's bytes begin r's.
func (c *runCache) add(r, old *run) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old != nil && old.at != nil {
		c.remove(old)
	}
	for _, o := range c.heads[r.head] {
		if o.size == r.size && o.sum == r.sum {
			return // the same request again
		}
	}
	if runs := c.heads[r.head]; len(runs) >= runWays {
		c.remove(runs[len(runs)-1]) // the oldest of its head
	}
	c.heads[r.head] = append([]*run{r}, c.heads[r.head]...)
	r.at = c.order.PushBack(r)
	c.items += len(r.digests)
	for c.items > c.limit {
		c.remove(c.order.Front().Value.(*run))
	}
}

// remove removes r, which the cache holds; c.mu is held.
func (c *runCache) remove(r *run) {
	runs := slices.DeleteFunc(c.heads[r.head], func(o *run) bool { return o == r })
	if len(runs) == 0 {
		delete(c.heads, r.head)
	} else {
		c.heads[r.head] = runs
	}
	c.order.Remove(r.at)
	r.at = nil
	c.items -= len(r.digests)
}

// runHasher hashes an input array's bytes from its '[' as far as a parse
// has read them, once: a run's check and the next run's sum share the
// pass.
type runHasher struct {
	h      hash.Hash
	key    [32]byte // h's key (a copy: a pooled scanner keeps no cache alive)
	hashed int      // bytes written
	buf    [16]byte
}

// start starts a hash under key.
func (h *runHasher) start(key *[32]byte) {
	if h.h == nil || h.key != *key {
		h.h, _ = highwayhash.New128(key[:]) // the key is 32 bytes
		h.key = *key
	} else {
		h.h.Reset()
	}
	h.hashed = 0
}

// write hashes arr[:n], n at least what was hashed before.
func (h *runHasher) write(arr []byte, n int) {
	_, _ = h.h.Write(arr[h.hashed:n])
	h.hashed = n
}

// sum returns the hash of arr[:n], n at least what was hashed before.
func (h *runHasher) sum(arr []byte, n int) [2]uint64 {
	h.write(arr, n)
	s := h.h.Sum(h.buf[:0])
	return words128(s)
}

// runMatch finds the longest run whose bytes begin an input array, as the
// array's bytes come: once its head is in, the head's runs are checked in
// order of size, each when the byte after its end is in, on one hash of
// the array's bytes.
type runMatch struct {
	started bool
	head    [2]uint64
	waiting []*run // the head's runs not yet checked, by size
	found   *run
	hasher  runHasher
}

// feed takes arr, the array's bytes so far from its '[', all of them when
// whole is set.
func (m *runMatch) feed(c *runCache, arr []byte, whole bool) {
	if !m.started {
		if len(arr) <= runHead {
			return
		}
		m.started = true
		m.head = sum128(&c.key, arr[:runHead])
		m.waiting = c.under(m.head)
		m.hasher.start(&c.key)
	}
	for len(m.waiting) > 0 && m.waiting[0].size < len(arr) {
		r := m.waiting[0]
		m.waiting = m.waiting[1:]
		if endsItem(arr[r.size]) && m.hasher.sum(arr, r.size) == r.sum {
			m.found = r
		}
	}
	if whole {
		m.waiting = nil // the rest are longer than the array
	}
	if len(m.waiting) > 0 { // hashed no further than the longest needs
		m.hasher.write(arr, min(len(arr), m.waiting[len(m.waiting)-1].size))
	}
}

// resume takes the first items of the input array that opens at
// p.inputStart from the run cache, when a run's bytes begin it: it records
// them as item would have, moves p.pos after the last, and returns how
// many it took (0 when none). A match the body's arrival settled
// (Parser.ReadRequest) is taken as it is.
func (p *scanner) resume() int {
	if p.parser == nil || p.parser.runs == nil {
		return 0
	}
	arr := p.data[p.inputStart:]
	m := &p.match
	if a := p.arrival; a != nil && a.input == p.inputStart {
		*m = a.match
	} else {
		*m = runMatch{hasher: m.hasher} // a second input array, refused later, matches afresh
	}
	m.feed(p.parser.runs, arr, true)
	r := m.found
	if r == nil {
		return 0
	}
	p.itemSpans = append(p.itemSpans, r.spans...)
	p.itemDigest = append(p.itemDigest, r.digests...)
	p.itemChain = append(p.itemChain, r.chain...)
	if r.refs != nil {
		p.itemRef = append(p.itemRef, r.refs...)
	} else {
		n := len(p.itemRef)
		p.itemRef = slices.Grow(p.itemRef, len(r.digests))[:n+len(r.digests)]
		clear(p.itemRef[n:])
	}
	p.itemBytes += r.canonical
	p.pos = p.inputStart + r.size
	p.misses = 0
	return len(r.digests)
}

// keepRun keeps the input array that req, just parsed from p, has as a
// run, in place of the run that the parse resumed from. The array was
// resumed (its match started) unless it is too short to be kept.
func (p *scanner) keepRun(req *Request) {
	c := p.parser.runs
	n := len(req.digests)
	if c == nil || p.inputStart < 0 || p.data[p.inputStart] != '[' || n < runMinItems {
		return
	}
	arr := p.data[p.inputStart:]
	size := int(p.itemSpans[2*n-1])
	m := &p.match
	if size <= runHead || size >= len(arr) || !m.started || n > c.limit/8 {
		return // too short, or so long that it would empty the cache
	}
	if m.hasher.hashed > size { // a run checked ran past the last item
		m.hasher.start(&c.key)
	}
	r := &run{
		head:      m.head,
		sum:       m.hasher.sum(arr, size),
		size:      size,
		spans:     req.spans,
		digests:   req.digests,
		chain:     req.prefix[1:],
		refs:      req.refs,
		canonical: req.bytes,
	}
	c.add(r, m.found)
}
