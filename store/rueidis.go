package store

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/contstore/contstore/internal/lua"
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
	c := rueidisConn{client: client, scripts: map[*lua.Script]*rueidis.Lua{}}
	for _, s := range lua.All() {
		c.scripts[s] = rueidis.NewLuaScript(s.Source)
	}
	return newRedisStore(c, false, opts)
}

// rueidisConn is a redisConn on a rueidis client.
type rueidisConn struct {
	client  rueidis.Client
	scripts map[*lua.Script]*rueidis.Lua // read-only after NewRueidis
}

func (c rueidisConn) eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	if err := s.Check(len(keys), len(args)); err != nil {
		return nil, err
	}
	return anyOf(c.scripts[s].Exec(ctx, c.client, keys, args))
}

func (c rueidisConn) do(ctx context.Context, cmds ...[]string) ([]any, error) {
	built := make(rueidis.Commands, len(cmds))
	for i, cmd := range cmds {
		built[i] = c.client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()
	}
	out := make([]any, len(cmds))
	for i, r := range c.client.DoMulti(ctx, built...) {
		v, err := anyOf(r)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// anyOf returns a reply as a redisConn promises it, with a nil reply as nil.
func anyOf(r rueidis.RedisResult) (any, error) {
	v, err := r.ToAny()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	return v, err
}
