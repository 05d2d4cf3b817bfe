package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// CommandHook is a go-redis hook that calls itself with every command its
// client sends, alone or in a pipeline, before sending it.
type CommandHook func(cmd redis.Cmder)

// DialHook dials as the client would.
func (f CommandHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook sees a command sent alone.
func (f CommandHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook sees each command of a pipeline.
func (f CommandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			f(cmd)
		}
		return next(ctx, cmds)
	}
}
