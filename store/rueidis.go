package store

import (
	"fmt"

	"github.com/redis/rueidis"

	"github.com/contstore/contstore/internal/redisconn"
)

// NewRueidis returns a store like NewRedis's on a rueidis client of one
// Redis server or of a Redis Cluster: the same scripts, keys and answers,
// so replicas on either library share a namespace. The store runs each call
// on a goroutine of its own and stops waiting at OpTimeout, since a call
// waiting for another caller's dial does not watch its own deadline. Give
// the client DisableCache; docs/operating.md ("rueidis") gives the other
// settings, and when to prefer rueidis to go-redis.
func NewRueidis(client rueidis.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil rueidis client", ErrInvalidOptions)
	}
	return newRedisStore(redisconn.Rueidis(client), false, opts)
}
