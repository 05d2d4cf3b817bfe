// Package rediskeys names the keys of a namespace (Namespace), for every
// package that keeps keys in Redis, and finds and deletes keys by prefix on
// a Redis server or on every master of a Redis Cluster.
package rediskeys

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// EscapeGlob quotes the characters that are special in a MATCH pattern.
func EscapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// EachServer calls fn on every master of a cluster, every shard of a ring,
// or the one server.
func EachServer(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	switch cc := c.(type) {
	case *redis.ClusterClient:
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	case *redis.Ring:
		return cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	default:
		return fn(ctx, c)
	}
}

// Scan calls fn with each batch of keys of one server matching pattern.
func Scan(ctx context.Context, c redis.Cmdable, pattern string, fn func([]string) error) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return fmt.Errorf("SCAN MATCH %s: %w", pattern, err)
		}
		if len(keys) > 0 {
			if err := fn(keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// DeletePrefix removes every key whose name starts with prefix, on every
// server of c. Keys are unlinked one per command, pipelined, because one
// multi-key UNLINK over several slots is refused on a cluster. It never
// flushes a database.
func DeletePrefix(ctx context.Context, c redis.UniversalClient, prefix string) error {
	if prefix == "" {
		return errors.New("rediskeys: an empty prefix would match every key")
	}
	pattern := EscapeGlob(prefix) + "*"
	return EachServer(ctx, c, func(ctx context.Context, n redis.Cmdable) error {
		return Scan(ctx, n, pattern, func(keys []string) error {
			cmds, err := n.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			if err != nil {
				var errs []error
				for _, cmd := range cmds {
					errs = append(errs, cmd.Err())
				}
				return fmt.Errorf("UNLINK: %w", errors.Join(append(errs, err)...))
			}
			return nil
		})
	})
}
