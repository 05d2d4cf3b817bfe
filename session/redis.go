package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redisconn"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/internal/serverclock"
)

// NewRedis returns a store on Redis, shared by every replica that opens the
// same namespace, whose only connections are those of client: a
// *redis.Client or a *redis.ClusterClient.
func NewRedis(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalid)
	}
	return newRedisStore(redisconn.GoRedis(client), redisconn.HonoursDeadlines(client), opts)
}

// NewRueidis returns a store like NewRedis's on a rueidis client (with
// DisableCache) of one server or of a Cluster.
func NewRueidis(client rueidis.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil rueidis client", ErrInvalid)
	}
	return newRedisStore(redisconn.Rueidis(client), false, opts)
}

// newRedisStore returns a store on conn; inline says whether conn ends every
// call at its context's deadline.
func newRedisStore(conn redisconn.Conn, inline bool, opts Options) (*Store, error) {
	return newStore(opts, inline, func(o Options) backend {
		return &redisBackend{conn: conn, opts: o, servers: serverclock.New(1, nil)}
	})
}

// redisBackend keeps each session under its own hash tag "{<ns>:<id>}":
//
//	<ns>:{<ns>:<id>}:head  hash  v (version); d (snapshot JSON) or h (journal header JSON) and n (message count)
//	<ns>:{<ns>:<id>}:log   list  journal messages, oldest first
//	<ns>:{<ns>:<id>}:q:<call id> string  a save's answer, for a re-sent copy until the save's deadline (internal/lua/oplog.lua)
//
// A session expires with its keys' TTL, on the server's clock.
type redisBackend struct {
	conn redisconn.Conn
	opts Options
	// servers estimates the servers' clock, on which saves carry their
	// deadlines.
	servers *serverclock.Clock
}

// keys returns a session's head and log keys, and, when id is not empty,
// the answer key of the save with that call id (internal/lua/oplog.lua).
func (r *redisBackend) keys(session, id string) []string {
	tag := rediskeys.Namespace(r.opts.Namespace).Slot(session)
	if id == "" {
		return []string{tag + "head", tag + "log"}
	}
	return []string{tag + "head", tag + "log", tag + "q:" + lua.CallIDKey(id)}
}

// saveArgs returns the script arguments publishing s as the call with id.
func (r *redisBackend) saveArgs(s *Session, rewrite bool, id string) ([]string, error) {
	args := []string{strconv.FormatUint(s.Version, 10), "snapshot", strconv.FormatInt(r.opts.TTL.Milliseconds(), 10)}
	if r.opts.Mode == Snapshot {
		doc, err := encodeSession(s)
		if err != nil {
			return nil, err
		}
		return append(args, doc, "0", id), nil
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
	msgs, err := compactMessages(s, from)
	if err != nil {
		return nil, err
	}
	return append(append(args, doc, strconv.Itoa(len(s.Messages)), id), msgs...), nil
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

// errBadReply marks a Redis reply that does not have the shape a script's
// header promises.
var errBadReply = errors.New("session: malformed reply")

func (r *redisBackend) save(ctx context.Context, s *Session, durable bool) (uint64, error) {
	if !durable {
		return r.publish(ctx, r.conn, s)
	}
	// WAIT counts the replicas that acknowledged the writes of its own
	// connection: the save and WAIT go on one connection to the master.
	var version uint64
	err := r.conn.Pin(ctx, r.keys(s.ID, "")[0], func(c redisconn.Pinned) error {
		var err error
		if version, err = r.publish(ctx, c, s); err != nil {
			return err
		}
		acked, err := c.Wait(ctx, r.opts.MinReplicas, r.opts.DurableTimeout)
		if err != nil {
			return fmt.Errorf("%w: session %q version %d: WAIT: %v", ErrNotDurable, s.ID, version, err)
		}
		if acked < int64(r.opts.MinReplicas) {
			return fmt.Errorf("%w: session %q version %d: %d of %d replicas within %v",
				ErrNotDurable, s.ID, version, acked, r.opts.MinReplicas, r.opts.DurableTimeout)
		}
		return nil
	})
	return version, err
}

// publish runs the save script on c and returns the version it published.
// A refused append wrote nothing: its rewrite goes with the same call id. A
// save refused for its deadline is sent once more as a new call when the
// refusal allows it (redisconn.ResendExpired).
func (r *redisBackend) publish(ctx context.Context, c redisconn.Evaluator, s *Session) (uint64, error) {
	rewrite := false
	reply, err := redisconn.ResendExpired(ctx, r.servers, 0, r.opts.OpTimeout, func() (any, int64, error) {
		deadline := r.servers.Deadline(ctx, 0, r.opts.OpTimeout)
		id := lua.NewCallID(deadline)
		for {
			args, err := r.saveArgs(s, rewrite, id)
			if err != nil {
				return nil, 0, err
			}
			reply, err := c.Eval(ctx, lua.SessionSave, r.keys(s.ID, id), args)
			if a, _ := reply.([]any); err != nil || rewrite || len(a) == 0 || a[0] != "rewrite" {
				return reply, deadline, err
			}
			rewrite = true
		}
	})
	if err != nil {
		return 0, err
	}
	a, _ := reply.([]any)
	if len(a) != 2 {
		return 0, fmt.Errorf("%w: save %q: %v", errBadReply, s.ID, reply)
	}
	switch version, _ := a[1].(string); a[0] {
	case "ok":
		v, err := strconv.ParseUint(version, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: save %q: version %v", errBadReply, s.ID, a[1])
		}
		return v, nil
	case "conflict":
		return 0, fmt.Errorf("%w: session %q is at version %v, this copy at %d", ErrConflict, s.ID, a[1], s.Version)
	case "rewrite":
		return 0, fmt.Errorf("%w: save %q: the journal refused a rewrite", errBadReply, s.ID)
	default:
		return 0, fmt.Errorf("%w: save %q: unexpected status %v", errBadReply, s.ID, a[0])
	}
}

func (r *redisBackend) load(ctx context.Context, id string) (*Session, error) {
	reply, err := r.conn.Eval(ctx, lua.SessionLoad, r.keys(id, ""), nil)
	if err != nil {
		return nil, err
	}
	head, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: load %q: %T, want an array", errBadReply, id, reply)
	}
	if len(head) == 0 {
		return nil, fmt.Errorf("%w: session %q", ErrNotFound, id)
	}
	return decodeHead(id, head)
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
		if s, err = decodeSession(id, doc); err != nil {
			return nil, err
		}
	} else {
		doc, ok := reply[2].(string)
		if !ok {
			return nil, corrupt("head holds neither a snapshot nor a journal header")
		}
		if s, err = decodeSession(id, doc); err != nil {
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

func (r *redisBackend) remove(ctx context.Context, id string) error {
	_, err := r.conn.Do(ctx, append([]string{"DEL"}, r.keys(id, "")...))
	return err
}
