package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/rediskeys"
)

// Audit is the result of [Store.Audit]: the live owner states found and
// every discrepancy between them, the LRU and the accounting.
type Audit struct {
	// Owners counts live owner states.
	Owners int64
	// Problems describes each discrepancy; empty when the store is sound.
	Problems []string
}

// Audit compares every partition's LRU and accounting with the owner states
// it holds and checks the limits: the stored bytes equal the sum of the
// LRU entries' sizes, the LRU holds exactly the live states (each in its own
// partition), the published count matches the states holding a
// continuation, and neither limit is exceeded. Run it after Sweep on a
// namespace no one is writing to; it reads every key (O(n)), so it is an
// operator's tool, not a hot-path call.
func (s *Store) Audit(ctx context.Context) (Audit, error) {
	a, err := s.backend.audit(ctx)
	if err != nil {
		return Audit{}, unavailable("audit", err)
	}
	return a, nil
}

// auditEntry is one LRU entry as an audit sees it.
type auditEntry struct {
	key          string
	score        score
	live         bool  // the state exists
	hasContinuer bool  // the state holds a continuation
	copied       score // the state's copy of its LRU score
}

// checkPartition appends the problems of partition p to a.
func (o Options) checkPartition(a *Audit, p int, entries []auditEntry, liveKeys []string, bytes, published int64, keyOf func(identity.Owner) string) {
	problem := func(format string, args ...any) {
		a.Problems = append(a.Problems, fmt.Sprintf("partition %d: ", p)+fmt.Sprintf(format, args...))
	}
	var sumBytes, sumPublished int64
	inLRU := map[string]bool{}
	for _, e := range entries {
		inLRU[e.key] = true
		sumBytes += e.score.size()
		if e.score.published() {
			sumPublished++
		}
		if !e.live {
			problem("LRU entry %q has no live state", e.key)
		} else if e.hasContinuer != e.score.published() {
			problem("LRU entry %q says published=%v, the state says %v", e.key, e.score.published(), e.hasContinuer)
		} else if e.copied != e.score {
			problem("LRU entry %q has score %d, the state's copy says %d", e.key, e.score, e.copied)
		}
	}
	for _, k := range liveKeys {
		a.Owners++
		if !inLRU[k] {
			problem("state %q is missing from the LRU", k)
		}
		if owner, ok := ownerFromKey(k); !ok || keyOf(owner) != k {
			problem("state %q does not belong to this partition", k)
		}
	}
	if sumBytes != bytes {
		problem("stored bytes are %d, the LRU entries sum to %d", bytes, sumBytes)
	}
	if sumPublished != published {
		problem("published count is %d, the LRU entries hold %d", published, sumPublished)
	}
	if n := int64(len(entries)); n > int64(o.partitionOwners()) {
		problem("%d owners, over the limit of %d", n, o.partitionOwners())
	}
	if bytes > o.partitionBytes() {
		problem("%d stored bytes, over the limit of %d", bytes, o.partitionBytes())
	}
}

// ownerFromKey parses the owner out of a state key "<prefix>:o:<owner key>".
func ownerFromKey(key string) (identity.Owner, bool) {
	i := strings.Index(key, "}:o:")
	if i < 0 {
		return identity.Owner{}, false
	}
	o, err := identity.ParseKey(key[i+len("}:o:"):])
	return o, err == nil
}

func (m *memory) audit(context.Context) (Audit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var a Audit
	now := m.opts.Now()
	keys := m.keys
	// Named as in Redis, so that a state filed under the wrong partition
	// shows.
	keyOf := func(o identity.Owner) string { return keys.owner(o.Partition(m.opts.Partitions), o) }
	for i := range m.parts {
		p := &m.parts[i]
		var entries []auditEntry
		var live []string
		for _, st := range p.lru {
			alive := !m.expired(st, now) && p.owners[st.owner] == st
			entries = append(entries, auditEntry{key: keys.owner(i, st.owner), score: st.score, live: alive, hasContinuer: st.kept > 0, copied: st.score})
		}
		for owner, st := range p.owners {
			if !m.expired(st, now) {
				live = append(live, keys.owner(i, owner))
			}
		}
		sort.Strings(live)
		m.opts.checkPartition(&a, i, entries, live, p.bytes, p.published, keyOf)
	}
	return a, nil
}

func (r *redisBackend) audit(ctx context.Context) (Audit, error) {
	var a Audit
	for p := range r.opts.Partitions {
		node := redis.Cmdable(r.client)
		if cc, ok := r.client.(*redis.ClusterClient); ok {
			n, err := cc.MasterForKey(ctx, r.keys.lru(p))
			if err != nil {
				return Audit{}, err
			}
			node = n
		}
		var found []string
		err := rediskeys.Scan(ctx, node, rediskeys.EscapeGlob(r.keys.ownerPrefix(p))+"*", func(keys []string) error {
			found = append(found, keys...)
			return nil
		})
		if err != nil {
			return Audit{}, err
		}
		zs, err := node.ZRangeWithScores(ctx, r.keys.lru(p), 0, -1).Result()
		if err != nil {
			return Audit{}, err
		}
		acct, err := node.HMGet(ctx, r.keys.part(p), "bytes", "published").Result()
		if err != nil {
			return Audit{}, err
		}
		entries := make([]auditEntry, len(zs))
		for i, z := range zs {
			member, _ := z.Member.(string)
			entries[i] = auditEntry{key: r.keys.ownerPrefix(p) + member, score: score(z.Score)}
		}
		// Read every state the LRU names or the scan found.
		keys := append(slices.Clone(found), make([]string, 0, len(entries))...)
		for _, e := range entries {
			keys = append(keys, e.key)
		}
		fields, err := readTurns(ctx, node, keys)
		if err != nil {
			return Audit{}, err
		}
		var live []string
		for i, k := range found {
			if fields[i].live {
				live = append(live, k)
			}
		}
		for i := range entries {
			f := fields[len(found)+i]
			entries[i].live, entries[i].hasContinuer, entries[i].copied = f.live, f.published, f.score
		}
		r.opts.checkPartition(&a, p, entries, live, parseCount(acct, 0), parseCount(acct, 1), func(o identity.Owner) string {
			return r.keys.owner(o.Partition(r.opts.Partitions), o)
		})
	}
	return a, nil
}

// turnFields says whether a key holds a live state, whether that state
// holds a continuation (published by its current turn or the one before),
// and its copy of its LRU score.
type turnFields struct {
	live, published bool
	score           score
}

// readTurns reads the fields t, c and s of keys in one pipeline.
func readTurns(ctx context.Context, node redis.Cmdable, keys []string) ([]turnFields, error) {
	out := make([]turnFields, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	pipe := node.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "t", "c", "s")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	for i, c := range cmds {
		v := c.Val()
		out[i].live = v[0] != nil
		out[i].published = v[0] != nil && v[1] != nil
		if s, ok := v[2].(string); ok {
			n, _ := strconv.ParseInt(s, 10, 64)
			out[i].score = score(n)
		}
	}
	return out, nil
}

func parseCount(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	s, _ := v[i].(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
