// Package directory lets gateway replicas find each other. Each replica
// announces the address its peers reach it at, and keeps renewing the
// announcement, which lives TTL without renewal; a lookup answers the
// address of a live replica, cached briefly in process (an absent one is
// not). A replica that dies stops renewing and drops out within TTL; while
// the directory cannot be reached, a lookup answers the address it last
// found, for a while (Options.StaleFor).
//
// A replica is announced by its name and found by its name or by its
// reference ('#' and the 16 hex digits of the name's digest), which is how
// the store names another replica's socket (store.Socket). On Redis the
// directory lives in the continuation store's namespace, one string per
// replica, outside the store's stored-bytes budget (a few dozen bytes per
// replica):
//
//	<ns>:{<ns>}:replica:<replica reference>   string   the replica's address, with TTL
//
// Lookups fail open in the callers' sense: an error or an unknown replica
// means "serve the turn here".
package directory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/rediskeys"
)

// Errors.
var (
	// ErrInvalid is wrapped by the errors of calls given an invalid
	// namespace, replica id, address or option.
	ErrInvalid = errors.New("directory: invalid argument")
	// ErrUnavailable wraps the errors of a directory that cannot be
	// reached.
	ErrUnavailable = errors.New("directory: unavailable")
)

// Options configure a Directory. A zero field takes its default.
type Options struct {
	// TTL is how long an announcement lives without renewal; Run renews
	// it every TTL/3. Default 6s.
	TTL time.Duration
	// CacheTTL is how long a lookup's answer is reused in process.
	// Default 1s.
	CacheTTL time.Duration
	// StaleFor is how long a lookup's answer stands in for the
	// directory's while the directory cannot be reached: on a Cluster its
	// keys share one slot, whose master may be failing over while the
	// owners' partitions are served. A replica forwarded to that no longer
	// holds the turn's socket refuses it, and the turn is served where it
	// landed. Default 30s, a failover with Redis's default
	// cluster-node-timeout (15 s) and its election.
	StaleFor time.Duration
	// OpTimeout bounds each call to Redis. Default 200ms.
	OpTimeout time.Duration
	// Now is the clock of the cache, of Run's reports and of the in-process
	// backend. Default time.Now.
	Now func() time.Time
}

// Directory maps replica ids to addresses. It is safe for concurrent use.
type Directory struct {
	opts Options
	b    backend

	mu    sync.Mutex
	cache map[string]cached
}

// cached is a lookup's answer, when it goes stale and when it was read.
type cached struct {
	addr        string
	until, read time.Time
}

// backend stores announcements.
type backend interface {
	set(ctx context.Context, replica, addr string, ttl time.Duration) error
	get(ctx context.Context, replica string) (string, error) // "" when none
	del(ctx context.Context, replica string) error
}

// NewRedis returns the directory of namespace on client.
func NewRedis(client redis.UniversalClient, namespace string, opts Options) (*Directory, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: no Redis client", ErrInvalid)
	}
	if err := validNamespace(namespace); err != nil {
		return nil, err
	}
	return newDirectory(opts, &redisBackend{c: client, prefix: rediskeys.Namespace(namespace).Shared("replica:")})
}

// NewMemory returns a directory in process, for replicas of one process.
func NewMemory(opts Options) (*Directory, error) {
	return newDirectory(opts, &memoryBackend{entries: map[string]entry{}})
}

func newDirectory(opts Options, b backend) (*Directory, error) {
	if opts.TTL < 0 || opts.CacheTTL < 0 || opts.StaleFor < 0 || opts.OpTimeout < 0 {
		return nil, fmt.Errorf("%w: negative option (TTL %v, CacheTTL %v, StaleFor %v, OpTimeout %v)", ErrInvalid,
			opts.TTL, opts.CacheTTL, opts.StaleFor, opts.OpTimeout)
	}
	opts.TTL = cmp.Or(opts.TTL, 6*time.Second)
	opts.CacheTTL = cmp.Or(opts.CacheTTL, time.Second)
	opts.StaleFor = cmp.Or(opts.StaleFor, 30*time.Second)
	opts.OpTimeout = cmp.Or(opts.OpTimeout, 200*time.Millisecond)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if m, ok := b.(*memoryBackend); ok {
		m.now = opts.Now
	}
	return &Directory{opts: opts, b: b, cache: map[string]cached{}}, nil
}

// Announce says that replica (a name) is reachable at addr, for TTL.
func (d *Directory) Announce(ctx context.Context, replica, addr string) error {
	if err := validName(replica); err != nil {
		return err
	}
	if addr == "" || strings.ContainsFunc(addr, unicode.IsSpace) {
		return fmt.Errorf("%w: address %q", ErrInvalid, addr)
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.OpTimeout)
	defer cancel()
	return unavailable(d.b.set(ctx, ref(replica), addr, d.opts.TTL))
}

// Withdraw removes the announcement of replica (a name).
func (d *Directory) Withdraw(ctx context.Context, replica string) error {
	if err := validName(replica); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.OpTimeout)
	defer cancel()
	return unavailable(d.b.del(ctx, ref(replica)))
}

// Run announces replica at addr, renews the announcement every TTL/3
// until ctx ends, then withdraws it. A failed announcement is retried
// TTL/24 after it failed, until one succeeds, so that a directory Redis
// lost (a master restarted empty, a failover) names the replica again
// soon; errors go to failed (which may be nil), one every TTL/3 at most.
func (d *Directory) Run(ctx context.Context, replica, addr string, failed func(error)) error {
	var reported time.Time // when an error last went to failed
	// wait returns how long until the next announcement, after one that
	// ended with err.
	wait := func(err error) time.Duration {
		if err == nil {
			return d.opts.TTL / 3
		}
		if now := d.opts.Now(); failed != nil && ctx.Err() == nil && now.Sub(reported) >= d.opts.TTL/3 {
			failed(err)
			reported = now
		}
		return d.opts.TTL / 24
	}
	err := d.Announce(ctx, replica, addr)
	if errors.Is(err, ErrInvalid) {
		return err
	}
	t := time.NewTimer(wait(err))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return d.Withdraw(context.WithoutCancel(ctx), replica)
		case <-t.C:
			t.Reset(wait(d.Announce(ctx, replica, addr)))
		}
	}
}

// Lookup returns the address replica (a name or a reference) announced, or
// "" when it has no live announcement. When the directory cannot be
// reached, it returns the address it read less than StaleFor ago, if any,
// and answers it again without asking for CacheTTL.
func (d *Directory) Lookup(ctx context.Context, replica string) (string, error) {
	if !names.IsReplicaRef(replica) {
		if err := validName(replica); err != nil {
			return "", err
		}
	}
	replica = ref(replica)
	now := d.opts.Now()
	d.mu.Lock()
	c, ok := d.cache[replica]
	d.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.addr, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.OpTimeout)
	defer cancel()
	addr, err := d.b.get(ctx, replica)
	if err != nil {
		if ok && now.Sub(c.read) < d.opts.StaleFor {
			// Each lookup would wait OpTimeout for a directory failing over.
			c.until = now.Add(d.opts.CacheTTL)
			d.mu.Lock()
			d.cache[replica] = c
			d.mu.Unlock()
			return c.addr, nil
		}
		return "", unavailable(err)
	}
	if addr == "" {
		// Not kept, so that a replica announced again is found at once,
		// and forgotten, so that a replica found gone does not come back
		// from a stale answer.
		d.mu.Lock()
		delete(d.cache, replica)
		d.mu.Unlock()
		return "", nil
	}
	d.mu.Lock()
	if len(d.cache) > 4096 {
		clear(d.cache) // replica ids come from stored state: bound what they cost here
	}
	d.cache[replica] = cached{addr: addr, until: now.Add(d.opts.CacheTTL), read: now}
	d.mu.Unlock()
	return addr, nil
}

// unavailable wraps a backend error in ErrUnavailable.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// validName checks a replica name as the store does.
func validName(name string) error {
	if err := names.Replica(name); err != nil {
		return fmt.Errorf("%w: replica name %q %v", ErrInvalid, name, err)
	}
	return nil
}

// ref returns the reference of a replica name or reference: the
// announcements' key.
func ref(replica string) string { return names.ReplicaRef(names.ReplicaDigest(replica)) }

// validNamespace checks a namespace as the store does.
func validNamespace(ns string) error {
	if err := names.Namespace(ns); err != nil {
		return fmt.Errorf("%w: namespace %q %v", ErrInvalid, ns, err)
	}
	return nil
}

// redisBackend keeps announcements as strings with a TTL.
type redisBackend struct {
	c      redis.UniversalClient
	prefix string
}

func (b *redisBackend) set(ctx context.Context, replica, addr string, ttl time.Duration) error {
	return b.c.Set(ctx, b.prefix+replica, addr, ttl).Err()
}

func (b *redisBackend) get(ctx context.Context, replica string) (string, error) {
	addr, err := b.c.Get(ctx, b.prefix+replica).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return addr, err
}

func (b *redisBackend) del(ctx context.Context, replica string) error {
	return b.c.Del(ctx, b.prefix+replica).Err()
}

// memoryBackend keeps announcements in a map.
type memoryBackend struct {
	now     func() time.Time
	mu      sync.Mutex
	entries map[string]entry
}

type entry struct {
	addr  string
	until time.Time
}

func (b *memoryBackend) set(_ context.Context, replica, addr string, ttl time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.entries[replica] = entry{addr: addr, until: b.now().Add(ttl)}
	return nil
}

func (b *memoryBackend) get(_ context.Context, replica string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[replica]
	if !ok || !b.now().Before(e.until) {
		delete(b.entries, replica)
		return "", nil
	}
	return e.addr, nil
}

func (b *memoryBackend) del(_ context.Context, replica string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, replica)
	return nil
}
