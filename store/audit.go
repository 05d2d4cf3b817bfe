package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
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
	key       string
	score     score
	live      bool  // the state exists
	published bool  // the state holds a continuation, so its LRU entry must say published
	size      int64 // the stored bytes the state's fields make (internal/lua/lru.lua)
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
		} else if e.published != e.score.published() {
			problem("LRU entry %q says published=%v, the state says %v", e.key, e.score.published(), e.published)
		} else if e.size != e.score.size() {
			problem("LRU entry %q says %d bytes, the state holds %d", e.key, e.score.size(), e.size)
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
	ok, found := rediskeys.StateOwner(key)
	if !found {
		return identity.Owner{}, false
	}
	o, err := identity.ParseKey(ok)
	return o, err == nil
}

func (m *memory) audit(context.Context) (Audit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var a Audit
	now := m.opts.now()
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
			entries = append(entries, auditEntry{key: keys.owner(i, st.owner), score: st.score, live: alive, published: st.kept > 0,
				size: min(keys.stateBytes(i, st.owner)+st.kept, maxStateBytes)})
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
		found, err := r.scan(ctx, p)
		if err != nil {
			return Audit{}, err
		}
		replies, err := r.conn.Do(ctx, []string{"ZRANGE", r.keys.lru(p), "0", "-1", "WITHSCORES"},
			[]string{"HMGET", r.keys.part(p), "bytes", "published"})
		if err != nil {
			return Audit{}, err
		}
		members, scores, err := scoredMembers(replies[0])
		if err != nil {
			return Audit{}, fmt.Errorf("partition %d LRU: %w", p, err)
		}
		acct, ok := replies[1].([]any)
		if !ok {
			return Audit{}, fmt.Errorf("%w: partition %d accounting: %v", errBadReply, p, replies[1])
		}
		entries := make([]auditEntry, len(members))
		for i, m := range members {
			entries[i] = auditEntry{key: r.keys.ownerPrefix(p) + m, score: score(scores[i])}
		}
		// Read every state the LRU names or the scan found.
		keys := append(slices.Clone(found), make([]string, 0, len(entries))...)
		for _, e := range entries {
			keys = append(keys, e.key)
		}
		states, err := r.readStates(ctx, p, keys)
		if err != nil {
			return Audit{}, err
		}
		var live []string
		for i, k := range found {
			if states[i].live {
				live = append(live, k)
			}
		}
		for i := range entries {
			f := states[len(found)+i]
			entries[i].live, entries[i].published, entries[i].size = f.live, f.published, f.size
		}
		r.opts.checkPartition(&a, p, entries, live, parseCount(acct, 0), parseCount(acct, 1), func(o identity.Owner) string {
			return r.keys.owner(o.Partition(r.opts.Partitions), o)
		})
	}
	return a, nil
}

// scan lists the keys of partition p's owner states, on the node that
// holds the partition (internal/lua/scan.lua).
func (r *redisBackend) scan(ctx context.Context, p int) ([]string, error) {
	pattern := rediskeys.EscapeGlob(r.keys.ownerPrefix(p)) + "*"
	var found []string
	for cursor := "0"; ; {
		step, err := slice(r.conn.Eval(ctx, lua.Scan, []string{r.keys.lru(p)}, []string{cursor, pattern, "1000"}))
		if err != nil {
			return nil, fmt.Errorf("SCAN MATCH %s: %w", pattern, err)
		}
		if len(step) != 2 {
			return nil, fmt.Errorf("%w: SCAN MATCH %s: %v", errBadReply, pattern, step)
		}
		next, ok1 := step[0].(string)
		keys, ok2 := step[1].([]any)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: SCAN MATCH %s: %v", errBadReply, pattern, step)
		}
		for _, k := range keys {
			s, _ := k.(string)
			found = append(found, s)
		}
		if cursor = next; cursor == "0" {
			return found, nil
		}
	}
}

// scoredMembers reads the reply of ZRANGE … WITHSCORES: members and scores
// in turn (RESP2), or [member, score] pairs (RESP3).
func scoredMembers(v any) ([]string, []float64, error) {
	flat, ok := v.([]any)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %T, want an array", errBadReply, v)
	}
	if len(flat) > 0 {
		if _, paired := flat[0].([]any); paired {
			var pairs []any
			for _, pair := range flat {
				two, _ := pair.([]any)
				if len(two) != 2 {
					return nil, nil, fmt.Errorf("%w: %v, want a member and its score", errBadReply, pair)
				}
				pairs = append(pairs, two...)
			}
			flat = pairs
		}
	}
	if len(flat)%2 != 0 {
		return nil, nil, fmt.Errorf("%w: %d elements, want members and scores", errBadReply, len(flat))
	}
	members := make([]string, len(flat)/2)
	scores := make([]float64, len(flat)/2)
	for i := range members {
		m, ok := flat[2*i].(string)
		var err error
		switch sc := flat[2*i+1].(type) {
		case float64:
			scores[i] = sc
		case string:
			scores[i], err = strconv.ParseFloat(sc, 64)
		default:
			err = fmt.Errorf("score is %T", sc)
		}
		if !ok || err != nil {
			return nil, nil, fmt.Errorf("%w: LRU member %v, score %v", errBadReply, flat[2*i], flat[2*i+1])
		}
		members[i] = m
	}
	return members, scores, nil
}

// stateFacts is what an audit reads of one key: whether it holds a live
// state, whether that state holds a continuation (published by its current
// turn or the one before), and the stored bytes its fields make, as its LRU
// entry must say.
type stateFacts struct {
	live, published bool
	size            int64
}

// readStates reads the fields t and c of the states at keys of partition p
// in one pipeline.
func (r *redisBackend) readStates(ctx context.Context, p int, keys []string) ([]stateFacts, error) {
	out := make([]stateFacts, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	cmds := make([][]string, len(keys))
	for i, k := range keys {
		cmds[i] = []string{"HMGET", k, "t", "c"}
	}
	replies, err := r.conn.Do(ctx, cmds...)
	if err != nil {
		return nil, err
	}
	for i, reply := range replies {
		v, _ := reply.([]any)
		if len(v) != 2 {
			return nil, fmt.Errorf("%w: state %s: %v", errBadReply, keys[i], reply)
		}
		c, _ := v[1].(string)
		out[i].live = v[0] != nil
		out[i].published = v[0] != nil && v[1] != nil
		if owner, ok := ownerFromKey(keys[i]); ok {
			out[i].size = min(r.keys.stateBytes(p, owner)+int64(len(c)), maxStateBytes)
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
