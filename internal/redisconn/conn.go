// Package redisconn is what the continuation store (package store) and the
// session store (package session) share of talking to Redis: one interface
// over the client libraries (go-redis and rueidis), calls bounded by a
// timeout and guarded by circuit breakers, and the rule for sending a call
// again when Redis refused it for its deadline.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/contstore/contstore/internal/lua"
)

// Evaluator runs scripts.
type Evaluator interface {
	// Eval runs s as its function in lua.Library with FCALL, loading the
	// library where the server lacks it; on servers without functions
	// (before Redis 7), or that refuse to load them, it runs s with
	// EVALSHA, or with EVAL when the server lacks the script. It checks
	// the counts of keys and args against s's header first. The reply is
	// int64, string, float64, nil or []any of them (the scripts give no
	// others); a nil reply is nil, not an error.
	Eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error)
}

// Conn is what a backend needs of a client library: scripts and pipelined
// commands, each sent to the master that serves its first key, and a
// connection of its own for writes that must be waited for.
type Conn interface {
	Evaluator
	// Do sends cmds, each a command name, its key, then its arguments, in
	// one round trip per node and returns their replies in order (as Eval
	// gives them), or the first error.
	Do(ctx context.Context, cmds ...[]string) ([]any, error)
	// Pin calls fn with one connection to the master that serves key,
	// held for fn alone, so that Wait counts the replicas that acknowledged
	// fn's writes.
	Pin(ctx context.Context, key string, fn func(Pinned) error) error
}

// Pinned is one connection to one master (Conn.Pin).
type Pinned interface {
	Evaluator
	// Wait sends WAIT: it blocks until replicas replicas acknowledged the
	// connection's writes or timeout passed, and returns how many did.
	Wait(ctx context.Context, replicas int, timeout time.Duration) (int64, error)
}

// GoRedis returns a Conn on a go-redis client (a *redis.Client or a
// *redis.ClusterClient; Pin needs one of the two). On a cluster it reloads
// the client's slot map after errors that say it may be stale.
func GoRedis(client redis.UniversalClient) Conn {
	return goRedis{client: client, refresh: newClusterRefresher(client), functions: new(functions)}
}

// HonoursDeadlines reports whether client ends every command at its
// context's deadline (ContextTimeoutEnabled: reads, writes, the pool wait and
// retry backoff all watch the context). Call may then run a call on the
// caller's goroutine; otherwise each call runs on a goroutine of its own, so
// that its timeout bounds it whatever the client does.
func HonoursDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// goRedis is a Conn on a go-redis client.
type goRedis struct {
	client redis.UniversalClient
	// refresh reloads a cluster client's slot map after errors that say
	// it may be stale (nil for a client of one server).
	refresh   *clusterRefresher
	functions *functions
}

func (g goRedis) Eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	return g.eval(ctx, g.client, s, keys, args)
}

// processor is what eval needs of a go-redis client or connection.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// eval sends FCALL, loading lua.Library where the server lacks it (on a
// cluster, on the master that serves the first key), or EVALSHA, then
// EVAL when the server lacks the script, as go-redis's Script.Run does,
// with the keys and args boxed in the command's own slice.
func (g goRedis) eval(ctx context.Context, c processor, s *lua.Script, keys, args []string) (any, error) {
	if err := s.Check(len(keys), len(args)); err != nil {
		return nil, err
	}
	cmdArgs := make([]any, 3+len(keys)+len(args))
	cmdArgs[2] = len(keys)
	for i, k := range keys {
		cmdArgs[3+i] = k
	}
	for i, a := range args {
		cmdArgs[3+len(keys)+i] = a
	}
	var cmd *redis.Cmd
	// send sends cmdArgs as name and what it names; a command sent before
	// keeps its own slice, which hooks may keep.
	send := func(name, what string) error {
		if cmd != nil {
			cmdArgs = slices.Clone(cmdArgs)
		}
		cmdArgs[0], cmdArgs[1] = name, what
		cmd = evalCmd(ctx, cmdArgs, len(keys))
		_ = c.Process(ctx, cmd)
		return cmd.Err()
	}
	stands, err := g.functions.call(func() error { return send("fcall", s.Function()) },
		func() error { return g.load(ctx, c, keys[0]) })
	if err != nil {
		return g.reply(nil, err)
	}
	if stands {
		return g.reply(cmd.Result())
	}
	if err := send("evalsha", s.Hash()); redis.HasErrorPrefix(err, "NOSCRIPT") {
		_ = send("eval", s.Source)
	}
	return g.reply(cmd.Result())
}

// load loads lua.Library through c: on a cluster, on the master that
// serves key, else on c's server.
func (g goRedis) load(ctx context.Context, c processor, key string) error {
	node := ""
	if cc, ok := c.(*redis.ClusterClient); ok {
		master, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		c, node = master, master.Options().Addr
	}
	return g.functions.load(ctx, node, func(ctx context.Context) error {
		cmd := redis.NewStringCmd(ctx, "function", "load", lua.Library.Source)
		_ = c.Process(ctx, cmd)
		return loadError(cmd.Err())
	})
}

// evalCmd returns the command of an FCALL, EVAL or EVALSHA with args,
// routed on a cluster by its first key when it has keys.
func evalCmd(ctx context.Context, args []any, keys int) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if keys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// Do sends each node's commands in one pipeline. On a cluster it sends
// them to the slot's master, whatever the client's read routing
// (ReadOnly, RouteByLatency, RouteRandomly): a read must see what the
// scripts, which run on the master, wrote.
func (g goRedis) Do(ctx context.Context, cmds ...[]string) ([]any, error) {
	byNode := map[redis.Cmdable][]int{}
	for i, c := range cmds {
		node := redis.Cmdable(g.client)
		if cc, ok := g.client.(*redis.ClusterClient); ok {
			master, err := cc.MasterForKey(ctx, c[1])
			if _, err = g.reply(nil, err); err != nil {
				return nil, err
			}
			node = master
		}
		byNode[node] = append(byNode[node], i)
	}
	out := make([]any, len(cmds))
	for node, indices := range byNode {
		pipe := node.Pipeline()
		sent := make([]*redis.Cmd, len(indices))
		for j, i := range indices {
			sent[j] = pipe.Do(ctx, anys(cmds[i])...)
		}
		_, _ = pipe.Exec(ctx) // each command holds its own error
		for j, c := range sent {
			v, err := g.reply(c.Result())
			if err != nil {
				return nil, err
			}
			out[indices[j]] = v
		}
	}
	return out, nil
}

func (g goRedis) Pin(ctx context.Context, key string, fn func(Pinned) error) error {
	var node *redis.Client
	switch c := g.client.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		master, err := c.MasterForKey(ctx, key)
		if _, err = g.reply(nil, err); err != nil {
			return err
		}
		node = master
	default:
		return fmt.Errorf("a connection of its own needs a *redis.Client or a *redis.ClusterClient, not %T", g.client)
	}
	conn := node.Conn()
	defer conn.Close()
	return fn(goRedisPinned{g: g, conn: conn})
}

// goRedisPinned is a Pinned on a go-redis connection.
type goRedisPinned struct {
	g    goRedis
	conn *redis.Conn
}

func (p goRedisPinned) Eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	return p.g.eval(ctx, p.conn, s, keys, args)
}

func (p goRedisPinned) Wait(ctx context.Context, replicas int, timeout time.Duration) (int64, error) {
	n, err := p.conn.Wait(ctx, replicas, timeout).Result()
	_, err = p.g.reply(nil, err)
	return n, err
}

// reply passes on a command's reply, with redis.Nil as a nil reply, after
// showing its error to the slot map refresher.
func (g goRedis) reply(v any, err error) (any, error) {
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	g.refresh.observe(err)
	return v, err
}

func anys(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// Rueidis returns a Conn on a rueidis client of one Redis server or of a
// Redis Cluster: the same scripts, keys and replies as GoRedis's. The
// client's calls do not all end at their context's deadline (a call
// waiting for another caller's dial does not watch its own): run them
// through Call with inline false.
func Rueidis(client rueidis.Client) Conn {
	c := rueidisConn{client: client, scripts: map[*lua.Script]*rueidis.Lua{}, functions: new(functions)}
	for _, s := range lua.All() {
		c.scripts[s] = rueidis.NewLuaScript(s.Source)
	}
	return c
}

// rueidisConn is a Conn on a rueidis client.
type rueidisConn struct {
	client    rueidis.Client
	scripts   map[*lua.Script]*rueidis.Lua // read-only after Rueidis
	functions *functions
}

func (c rueidisConn) Eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	if err := s.Check(len(keys), len(args)); err != nil {
		return nil, err
	}
	var r rueidis.RedisResult
	fcall := func() error { r = c.client.Do(ctx, rueidisFcall(c.client.B(), s, keys, args)); return r.Error() }
	if stands, err := c.functions.call(fcall, func() error { return c.load(ctx) }); err != nil {
		return nil, err
	} else if stands {
		return anyOf(r)
	}
	return anyOf(c.scripts[s].Exec(ctx, c.client, keys, args))
}

// load loads lua.Library on every node the client knows: a replica
// refuses it (READONLY) and has it from its master. It fails only when no
// node took it: a node that is down does not keep the others from
// running the scripts.
func (c rueidisConn) load(ctx context.Context) error {
	return c.functions.load(ctx, "", c.loadEverywhere)
}

// loadEverywhere is load without waiting for a load in flight.
func (c rueidisConn) loadEverywhere(ctx context.Context) error {
	var first error
	took := false
	for _, node := range c.client.Nodes() {
		err := loadError(node.Do(ctx, node.B().FunctionLoad().FunctionCode(lua.Library.Source).Build()).Error())
		took = took || err == nil
		if err != nil && !isReadOnly(err) && first == nil {
			first = err
		}
	}
	if took {
		return nil
	}
	return first
}

func (c rueidisConn) Do(ctx context.Context, cmds ...[]string) ([]any, error) {
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

// Pin holds a dedicated connection: on a cluster, to the master of the
// slot of the first command with a key, which Pinned.Eval sends.
func (c rueidisConn) Pin(ctx context.Context, key string, fn func(Pinned) error) error {
	return c.client.Dedicated(func(d rueidis.DedicatedClient) error {
		return fn(rueidisPinned{c: d, functions: c.functions})
	})
}

// rueidisPinned is a Pinned on a rueidis dedicated connection, which
// rueidis.Lua cannot run scripts on: Eval sends EVALSHA and EVAL itself.
type rueidisPinned struct {
	c         rueidis.DedicatedClient
	functions *functions
}

func (p rueidisPinned) Eval(ctx context.Context, s *lua.Script, keys, args []string) (any, error) {
	if err := s.Check(len(keys), len(args)); err != nil {
		return nil, err
	}
	var r rueidis.RedisResult
	fcall := func() error { r = p.c.Do(ctx, rueidisFcall(p.c.B(), s, keys, args)); return r.Error() }
	load := func() error {
		return loadError(p.c.Do(ctx, p.c.B().FunctionLoad().FunctionCode(lua.Library.Source).Build()).Error())
	}
	if stands, err := p.functions.call(fcall, load); err != nil {
		return nil, err
	} else if stands {
		return anyOf(r)
	}
	r = p.c.Do(ctx, p.c.B().Evalsha().Sha1(s.Hash()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if err, ok := rueidis.IsRedisErr(r.Error()); ok && err.IsNoScript() {
		r = p.c.Do(ctx, p.c.B().Eval().Script(s.Source).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return anyOf(r)
}

func (p rueidisPinned) Wait(ctx context.Context, replicas int, timeout time.Duration) (int64, error) {
	return p.c.Do(ctx, p.c.B().Wait().Numreplicas(int64(replicas)).Timeout(timeout.Milliseconds()).Build()).AsInt64()
}

// anyOf returns a reply as a Conn promises it, with a nil reply as nil.
func anyOf(r rueidis.RedisResult) (any, error) {
	v, err := r.ToAny()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	return v, err
}
