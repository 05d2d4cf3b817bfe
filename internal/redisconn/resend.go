package redisconn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/contstore/contstore/internal/serverclock"
)

// ErrPastDeadline marks a call that reached Redis after its deadline and
// changed nothing (internal/lua/oplog.lua).
var ErrPastDeadline = errors.New("call reached Redis after its deadline")

// ResendExpired runs call, a call to server i of clock that changes state:
// call draws a new call id (lua.NewCallID) with a deadline at most limit
// away (clock.Deadline), sends it, and returns the reply and that deadline.
// When the reply is {"expired", server clock}, Redis refused the call for
// its deadline and nothing changed: if the refusal allows it
// (serverclock.Clock.Refused: no copy of the call can have run) and the
// caller still waits, ResendExpired runs call once more, as a new call;
// otherwise the refusal is ErrPastDeadline. Any other reply is returned as
// it is.
func ResendExpired(ctx context.Context, clock *serverclock.Clock, i int, limit time.Duration, call func() (reply any, deadline int64, err error)) (any, error) {
	for tries := 0; ; tries++ {
		reply, deadline, err := call()
		if err != nil {
			return nil, err
		}
		server, ok := expired(reply)
		if !ok {
			return reply, nil
		}
		if !clock.Refused(i, server, deadline, limit) || tries > 0 || ctx.Err() != nil {
			return nil, fmt.Errorf("%w (the server's clock read %s)", ErrPastDeadline,
				time.UnixMilli(server+serverclock.EpochMillis).UTC().Format(time.RFC3339Nano))
		}
	}
}

// expired reads a refusal for the deadline, {"expired", the server's clock
// in milliseconds since serverclock.EpochMillis}, and reports whether reply
// is one.
func expired(reply any) (server int64, ok bool) {
	a, _ := reply.([]any)
	if len(a) != 2 || a[0] != "expired" {
		return 0, false
	}
	server, ok = a[1].(int64)
	return server, ok
}
