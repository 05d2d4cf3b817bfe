package redisconn

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"golang.org/x/sync/singleflight"

	"github.com/contstore/contstore/internal/lua"
)

// functions is whether a Conn's servers run the scripts as the functions
// of lua.Library, shared by the Conn's copies: until a server shows it
// cannot (it has no FCALL, or refuses to load the library), every call
// goes by FCALL; after that, by EVALSHA. It also holds the loads of the
// library in flight.
type functions struct {
	off     atomic.Bool
	loading singleflight.Group // by the node, or nodes, loaded
}

// load runs fn, which loads the library on the node or nodes that node
// names, or waits for the load of them in flight: a burst of callers that
// find no library, as after a restart, sends it once, not once each. The
// load keeps ctx's deadline but not its cancellation, which would fail
// the others' calls with the caller's; a caller whose ctx ends stops
// waiting.
func (f *functions) load(ctx context.Context, node string, fn func(context.Context) error) error {
	done := f.loading.DoChan(node, func() (any, error) {
		lctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
		if d, ok := ctx.Deadline(); ok {
			lctx, cancel = context.WithDeadline(lctx, d)
		}
		defer cancel()
		return nil, fn(lctx)
	})
	select {
	case r := <-done:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *functions) on() bool { return !f.off.Load() }

// call runs fcall, which sends a call by FCALL and returns its error,
// by the rule of the functions: where the server lacks the library, load
// loads it and fcall runs once more. It reports whether fcall's last
// reply stands; false, with no error, when the call is to go by EVALSHA
// instead (functions are off, or the node that ran the call still lacks
// the library: the load reached another, as while a slot moves; the call
// did not run); and the error of a load that may pass.
func (f *functions) call(fcall, load func() error) (stands bool, err error) {
	if !f.on() {
		return false, nil
	}
	after := f.after(fcall())
	if after == reload {
		if err := f.loaded(load()); err != nil {
			return false, err
		}
		if f.on() {
			after = f.after(fcall())
		}
	}
	return after == answered, nil
}

// rueidisFcall returns the FCALL of s's function with keys and args.
func rueidisFcall(b rueidis.Builder, s *lua.Script, keys, args []string) rueidis.Completed {
	return b.Fcall().Function(s.Function()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// isReadOnly reports whether err is a replica's refusal to write.
func isReadOnly(err error) bool {
	msg, ok := serverError(err)
	return ok && strings.HasPrefix(msg, "READONLY")
}

// fcallAfter is what the error of an FCALL calls for.
type fcallAfter int

const (
	// answered: the server ran the function, or failed the call for a
	// reason of its own; the reply stands.
	answered fcallAfter = iota
	// reload: the server lacks the library (it restarted without it, or
	// a new master never had it): load it and call again.
	reload
	// fallback: the server has no functions; the call goes by EVALSHA.
	fallback
)

// after returns what err, an FCALL's error, calls for, and turns
// functions off on a server that has none or will not let the user call
// them.
func (f *functions) after(err error) fcallAfter {
	msg, ok := serverError(err)
	switch {
	case !ok:
		return answered
	case strings.HasPrefix(msg, "Function not found"):
		return reload
	case strings.HasPrefix(msg, "unknown command"), strings.Contains(msg, "unsupported command"),
		strings.HasPrefix(msg, "NOPERM") && strings.Contains(strings.ToLower(msg), "'fcall'"):
		f.off.Store(true) // no FCALL here (a server, a proxy in front), or not for this user
		return fallback
	}
	return answered
}

// loaded takes the error of loading the library (loadError) and returns
// the one to fail the call with: none when the library was loaded, or
// when the server refused it otherwise than for a while (it has no
// FUNCTION, the user may not load functions, it cannot compile the
// library), which turns functions off; the error itself when it may pass
// (a network error, a server loading its data, out of memory or unable
// to persist, a stale slot map). An unknown refusal turns functions off:
// the scripts then cost the server more, where failing every call would
// cost the gateway its continuations.
func (f *functions) loaded(err error) error {
	if err == nil {
		return nil
	}
	msg, ok := serverError(err)
	if !ok {
		return err
	}
	for _, passing := range []string{"LOADING", "BUSY", "OOM", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK",
		"MISCONF", "NOREPLICAS"} {
		if strings.HasPrefix(msg, passing+" ") {
			return err
		}
	}
	f.off.Store(true)
	return nil
}

// loadError returns the error of FUNCTION LOAD, nil when the server
// already had the library.
func loadError(err error) error {
	if msg, ok := serverError(err); ok && strings.HasPrefix(msg, "Library ") && strings.HasSuffix(msg, " already exists") {
		return nil
	}
	return err
}

// serverError returns the message of an error reply from the server,
// without the "ERR " that some clients keep and others do not, and false
// for any other error.
func serverError(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	msg := ""
	var gr redis.Error
	if rr, ok := rueidis.IsRedisErr(err); ok && !rr.IsNil() {
		msg = rr.Error()
	} else if errors.As(err, &gr) && !errors.Is(err, redis.Nil) {
		msg = gr.Error()
	} else {
		return "", false
	}
	return strings.TrimPrefix(msg, "ERR "), true
}
