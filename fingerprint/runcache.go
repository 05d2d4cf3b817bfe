package fingerprint

import (
	"container/list"
	"crypto/rand"
	"encoding/binary"
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
// names up to runWays runs (conversations that open alike), told apart by
// their tails, a hash of their last runHead bytes, before the whole is
// hashed. The cache holds runCacheItems items in all: the oldest runs go
// first, and a run goes as soon as a run that extends it comes.
type runCache struct {
	key   [32]byte
	mu    sync.Mutex
	heads map[[2]uint64][]*run // newest first
	order list.List            // of *run, oldest first
	items int
	limit int // runCacheItems
}

const (
	runHead       = 256     // bytes hashed for a run's head and tail
	runWays       = 8       // runs a head names at most
	runCacheItems = 1 << 19 // items held at most, 24 bytes each
	runMinItems   = 8       // fewer items parse faster than a run is kept
)

// run is what the items of one input array gave, from its '[' to the end
// of its last item.
type run struct {
	head, tail, sum [2]uint64
	size            int      // bytes, from the '[' to the end of the last item
	spans           []uint32 // item i is [spans[2i], spans[2i+1]) from the '['
	digests, chain  []uint64 // chain[i] is h(i+1)
	refs            []bool   // nil when no item is an item_reference
	canonical       int64    // the items' canonical bytes
	at              *list.Element
}

func newRunCache() *runCache {
	c := &runCache{heads: map[[2]uint64][]*run{}, limit: runCacheItems}
	_, _ = rand.Read(c.key[:]) // never fails on the platforms Go supports
	return c
}

// sum128 returns the keyed hash of b.
func (c *runCache) sum128(b []byte) [2]uint64 {
	s := highwayhash.Sum128(b, c.key[:])
	return [2]uint64{binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])}
}

// candidate returns the longest run under head whose bytes could begin
// arr, an input array from its '[': it fits, an item's end may follow it,
// and its tail matches. The caller checks the whole.
func (c *runCache) candidate(head [2]uint64, arr []byte) *run {
	var fit [runWays]*run
	n := 0
	c.mu.Lock()
	for _, r := range c.heads[head] {
		if r.size < len(arr) && endsItem(arr[r.size]) && n < len(fit) {
			fit[n] = r
			n++
		}
	}
	c.mu.Unlock()
	slices.SortFunc(fit[:n], func(a, b *run) int { return b.size - a.size })
	for _, r := range fit[:n] {
		if c.sum128(arr[r.size-runHead:r.size]) == r.tail {
			return r // else another conversation that opens alike
		}
	}
	return nil
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
	key    *[32]byte
	hashed int // bytes written
	buf    [16]byte
}

// start starts a hash under key.
func (h *runHasher) start(key *[32]byte) {
	if h.key != key {
		h.h, _ = highwayhash.New128(key[:]) // the key is 32 bytes
		h.key = key
	} else {
		h.h.Reset()
	}
	h.hashed = 0
}

// sum returns the hash of arr[:n], n at least what was hashed before.
func (h *runHasher) sum(arr []byte, n int) [2]uint64 {
	_, _ = h.h.Write(arr[h.hashed:n])
	h.hashed = n
	s := h.h.Sum(h.buf[:0])
	return [2]uint64{binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])}
}

// resume takes the first items of the input array that opens at
// p.inputStart from the run cache, when a run's bytes begin it: it records
// them as item would have, moves p.pos after the last, and returns how
// many it took (0 when none).
func (p *scanner) resume() int {
	p.run = nil
	if p.parser == nil || p.parser.runs == nil || len(p.data)-p.inputStart <= runHead {
		return 0
	}
	c, arr := p.parser.runs, p.data[p.inputStart:]
	p.hasher.start(&c.key)
	p.runHead = c.sum128(arr[:runHead])
	r := c.candidate(p.runHead, arr)
	if r == nil || p.hasher.sum(arr, r.size) != r.sum {
		return 0
	}
	p.run = r
	for i := range r.digests {
		start, end := p.inputStart+int(r.spans[2*i]), p.inputStart+int(r.spans[2*i+1])
		p.itemRaw = append(p.itemRaw, p.data[start:end:end])
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
// resumed (resume started the hash) unless it is too short to be kept.
func (p *scanner) keepRun(req *Request) {
	c := p.parser.runs
	n := len(req.digests)
	if c == nil || p.inputStart < 0 || p.data[p.inputStart] != '[' || n < runMinItems {
		return
	}
	arr := p.data[p.inputStart:]
	size := int(p.itemSpans[2*n-1])
	if size <= runHead || size >= len(arr) {
		return
	}
	r := &run{
		head:      p.runHead,
		tail:      c.sum128(arr[size-runHead : size]),
		sum:       p.hasher.sum(arr, size),
		size:      size,
		spans:     slices.Clone(p.itemSpans),
		digests:   req.digests,
		chain:     req.prefix[1:],
		refs:      req.refs,
		canonical: req.bytes,
	}
	c.add(r, p.run)
}
