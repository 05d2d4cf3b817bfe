package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/internal/serverclock"
)

// redisStore keeps each session under its own hash tag "{<ns>:<id>}":
//
//	<ns>:{<ns>:<id>}:head  hash  v (version); d (snapshot JSON) or h (journal header JSON) and n (message count); e (expiry on StoreOptions.Now)
//	<ns>:{<ns>:<id>}:log   list  journal messages, oldest first
//	<ns>:{<ns>:<id>}:q:<op> string  a save's answer, for a re-sent copy until the save's deadline (internal/lua/oplog.lua)
type redisStore struct {
	client redis.UniversalClient
	opts   StoreOptions
	// servers estimates the servers' clock, on which saves carry their
	// deadlines.
	servers *serverclock.Clock
}

// NewRedisStore returns a Store on Redis (a *redis.Client or a
// *redis.ClusterClient). It makes no connections of its own beyond the
// client's pool.
func NewRedisStore(client redis.UniversalClient, opts StoreOptions) (Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalid)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return observe(&redisStore{client: client, opts: opts, servers: serverclock.New(1, nil)}, opts.Observer), nil
}

// keys returns a session's head and log keys, and, when op is not empty,
// the answer key of that save (internal/lua/oplog.lua).
func (r *redisStore) keys(id, op string) []string {
	tag := rediskeys.Namespace(r.opts.Namespace).Slot(id)
	if op == "" {
		return []string{tag + "head", tag + "log"}
	}
	return []string{tag + "head", tag + "log", tag + "q:" + lua.OpKey(op)}
}

// saveArgs returns the script arguments publishing s as the call of op.
func (r *redisStore) saveArgs(s *Session, rewrite bool, op string) ([]any, error) {
	args := []any{strconv.FormatUint(s.Version, 10), "snapshot", r.opts.TTL.Milliseconds()}
	if r.opts.Mode == Snapshot {
		doc, err := encodeSession(s)
		if err != nil {
			return nil, err
		}
		return append(args, doc, 0, op, r.now()), nil
	}
	header := *s
	header.Messages = nil
	doc, err := encodeSession(&header)
	if err != nil {
		return nil, err
	}
	from := 0
	args[1] = "rewrite"
	if !rewrite && s.Version > 0 && extends(s.Messages, s.saved) {
		args[1] = "append"
		from = len(s.saved)
	}
	args = append(args, doc, len(s.Messages), op, r.now())
	for _, m := range s.Messages[from:] {
		b, err := compactMessage(m)
		if err != nil {
			return nil, invalidMessage(s, from, err)
		}
		args = append(args, b)
	}
	return args, nil
}

// extends reports whether msgs starts with the messages of saved, byte for
// byte.
func extends(msgs, saved []json.RawMessage) bool {
	if len(msgs) < len(saved) {
		return false
	}
	for i, m := range saved {
		if !bytes.Equal(m, msgs[i]) {
			return false
		}
	}
	return true
}

// now is the scripts' clock argument: StoreOptions.Now in milliseconds
// since the Unix epoch, or "0" for the server's clock.
func (r *redisStore) now() string {
	if r.opts.Now == nil {
		return "0"
	}
	return strconv.FormatInt(r.opts.Now().UnixMilli(), 10)
}

// save runs the save script on c; on success s.Version is the new version.
func (r *redisStore) save(ctx context.Context, c redis.Scripter, s *Session) error {
	if err := validSession(s); err != nil {
		return err
	}
	// A refused append wrote nothing: its rewrite may reuse the op. A save
	// refused for its deadline is sent once more as a new call, while the
	// caller still waits, when the refusal allows it (serverclock Refused).
	deadline := r.servers.Deadline(ctx, 0, r.opts.OpTimeout)
	op := lua.NewOp(deadline)
	rewrite, resent := false, false
	for {
		args, err := r.saveArgs(s, rewrite, op)
		if err != nil {
			return err
		}
		reply, err := lua.SessionSave.Run(ctx, c, r.keys(s.ID, op), args...).StringSlice()
		if err != nil {
			return fmt.Errorf("%w: save %q: %w", ErrUnavailable, s.ID, err)
		}
		if len(reply) != 2 {
			return fmt.Errorf("%w: save %q: malformed reply %q", ErrUnavailable, s.ID, reply)
		}
		switch reply[0] {
		case "ok":
			v, err := strconv.ParseUint(reply[1], 10, 64)
			if err != nil {
				return fmt.Errorf("%w: save %q: version %q", ErrUnavailable, s.ID, reply[1])
			}
			s.Version = v
			s.saved = slices.Clone(s.Messages)
			return nil
		case "conflict":
			return fmt.Errorf("%w: session %q is at version %s, this copy at %d", ErrConflict, s.ID, reply[1], s.Version)
		case "rewrite":
			if rewrite {
				return fmt.Errorf("%w: save %q: journal refused a rewrite", ErrUnavailable, s.ID)
			}
			rewrite = true
		case "expired":
			server, err := strconv.ParseInt(reply[1], 10, 64)
			if err != nil || !r.servers.Refused(0, server, deadline, r.opts.OpTimeout) || resent || ctx.Err() != nil {
				return fmt.Errorf("%w: save %q reached Redis after its deadline", ErrUnavailable, s.ID)
			}
			deadline = r.servers.Deadline(ctx, 0, r.opts.OpTimeout)
			op, resent = lua.NewOp(deadline), true
		default:
			return fmt.Errorf("%w: save %q: unexpected status %q", ErrUnavailable, s.ID, reply[0])
		}
	}
}

func (r *redisStore) Save(ctx context.Context, s *Session) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.OpTimeout)
	defer cancel()
	return r.save(ctx, r.client, s)
}

// SaveDurable runs the save and WAIT on one connection to the session's
// master: WAIT counts the replicas that acknowledged the writes of its own
// connection.
func (r *redisStore) SaveDurable(ctx context.Context, s *Session) error {
	if r.opts.MinReplicas == 0 {
		return r.Save(ctx, s)
	}
	if err := validSession(s); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.OpTimeout+r.opts.DurableTimeout)
	defer cancel()
	node, err := r.master(ctx, r.keys(s.ID, "")[0])
	if err != nil {
		return fmt.Errorf("%w: save %q: %w", ErrUnavailable, s.ID, err)
	}
	conn := node.Conn()
	defer conn.Close()
	if err := r.save(ctx, conn, s); err != nil {
		return err
	}
	acked, err := conn.Wait(ctx, r.opts.MinReplicas, r.opts.DurableTimeout).Result()
	if err != nil {
		return fmt.Errorf("%w: session %q version %d: WAIT: %v", ErrNotDurable, s.ID, s.Version, err)
	}
	if acked < int64(r.opts.MinReplicas) {
		return fmt.Errorf("%w: session %q version %d: %d of %d replicas within %v",
			ErrNotDurable, s.ID, s.Version, acked, r.opts.MinReplicas, r.opts.DurableTimeout)
	}
	return nil
}

// master returns the client of the master serving key.
func (r *redisStore) master(ctx context.Context, key string) (*redis.Client, error) {
	switch c := r.client.(type) {
	case *redis.Client:
		return c, nil
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	default:
		return nil, fmt.Errorf("durable saves need a *redis.Client or *redis.ClusterClient, not %T", r.client)
	}
}

func (r *redisStore) Load(ctx context.Context, id string) (*Session, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.OpTimeout)
	defer cancel()
	reply, err := lua.SessionLoad.Run(ctx, r.client, r.keys(id, ""), r.now()).Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: load %q: %w", ErrUnavailable, id, err)
	}
	if len(reply) == 0 {
		return nil, fmt.Errorf("%w: session %q", ErrNotFound, id)
	}
	s, err := decodeHead(id, reply)
	if err != nil {
		return nil, err
	}
	s.saved = slices.Clone(s.Messages)
	return s, nil
}

// decodeHead decodes the reply of internal/lua/session_load.lua.
func decodeHead(id string, reply []any) (*Session, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: session %q: %s", ErrCorrupt, id, fmt.Sprintf(format, args...))
	}
	if len(reply) != 5 {
		return nil, corrupt("head has %d parts, want 5", len(reply))
	}
	vs, _ := reply[0].(string)
	version, err := strconv.ParseUint(vs, 10, 64)
	if err != nil || version == 0 {
		return nil, corrupt("version %v", reply[0])
	}
	var s *Session
	if doc, ok := reply[1].(string); ok {
		if s, err = decodeSession(id, []byte(doc)); err != nil {
			return nil, err
		}
	} else {
		doc, ok := reply[2].(string)
		if !ok {
			return nil, corrupt("head holds neither a snapshot nor a journal header")
		}
		if s, err = decodeSession(id, []byte(doc)); err != nil {
			return nil, err
		}
		ns, _ := reply[3].(string)
		n, err := strconv.Atoi(ns)
		log, ok := reply[4].([]any)
		if err != nil || !ok || len(log) != n {
			return nil, corrupt("journal holds %d messages, its header says %v", len(log), reply[3])
		}
		s.Messages = nil
		for i, m := range log {
			str, ok := m.(string)
			if !ok || !json.Valid([]byte(str)) {
				return nil, corrupt("journal message %d is not JSON", i)
			}
			s.Messages = append(s.Messages, json.RawMessage(str))
		}
	}
	s.Version = version
	return s, nil
}

func (r *redisStore) Delete(ctx context.Context, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.OpTimeout)
	defer cancel()
	if err := r.client.Del(ctx, r.keys(id, "")...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: delete %q: %w", ErrUnavailable, id, err)
	}
	return nil
}
