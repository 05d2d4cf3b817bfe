package redisconn

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/lua"
)

// How a server answers for the scripts' library decides how calls go on:
// one that lacks it is given it and the call is sent again; one that
// refuses it for good (no FCALL or no FUNCTION, an ACL) gets EVALSHA from
// then on; one that cannot take it yet (loading its data) fails the call
// and is asked again by the next.
func TestFunctionsFollowTheServersAnswer(t *testing.T) {
	const notFound = "-ERR Function not found\r\n"
	for _, tc := range []struct {
		name        string
		fcall, load string // the answers to FCALL before the library is loaded, and to FUNCTION LOAD
		fails       bool   // the first call fails
		first, then string // the commands the first call and the next send
		elsewhere   bool   // the load reaches another node: FCALL still finds no library
	}{
		{"the load reaches another node than the call", notFound, "$4\r\nname\r\n", false, "fcall function fcall evalsha", "fcall function fcall evalsha", true},
		{"a proxy in front has no FCALL", "-ERR unsupported command 'fcall'\r\n", "", false, "fcall evalsha", "evalsha", false},
		{"the user may not read a key", "-NOPERM No permissions to access a key\r\n", "", true, "fcall", "fcall", false},
		{"the server cannot persist for now", notFound, "-MISCONF Errors writing to the AOF file\r\n", true, "fcall function", "fcall function", false},
		{"the server lacks the library", notFound, "$4\r\nname\r\n", false, "fcall function fcall", "fcall", false},
		{"another client loaded it meanwhile", notFound, "-ERR Library 'x' already exists\r\n", false, "fcall function fcall", "fcall", false},
		{"the server has no FCALL", "-ERR unknown command 'fcall', with args beginning with: \r\n", "", false, "fcall evalsha", "evalsha", false},
		{"the user may not call functions", "-NOPERM this user has no permissions to run the 'fcall' command\r\n", "", false, "fcall evalsha", "evalsha", false},
		{"the server has no FUNCTION", notFound, "-ERR unknown command 'function', with args beginning with: \r\n", false, "fcall function evalsha", "evalsha", false},
		{"the user may not load functions", notFound, "-NOPERM this user has no permissions to run the 'function|load' command\r\n", false, "fcall function evalsha", "evalsha", false},
		{"the server cannot compile it", notFound, "-ERR Error compiling function: user_function:1: '=' expected\r\n", false, "fcall function evalsha", "evalsha", false},
		{"the server is loading its data", notFound, "-LOADING Redis is loading the dataset in memory\r\n", true, "fcall function", "fcall function", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var loaded atomic.Bool
			f := startFakeRedis(t, func(cmd []string) string {
				switch strings.ToLower(cmd[0]) {
				case "fcall":
					if loaded.Load() {
						return ":1\r\n"
					}
					return tc.fcall
				case "function":
					loaded.Store(!tc.elsewhere && (strings.HasPrefix(tc.load, "$") || strings.Contains(tc.load, "already exists")))
					return tc.load
				case "evalsha":
					return ":1\r\n"
				}
				return "-ERR unexpected\r\n"
			})
			c := redis.NewClient(&redis.Options{Addr: f.addr(), MaxRetries: -1, DisableIdentity: true})
			t.Cleanup(func() { _ = c.Close() })
			conn := GoRedis(c)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			// call makes a call and returns the script commands it sent.
			call := func() (string, error) {
				before := len(f.received())
				_, err := conn.Eval(ctx, lua.Inspect, []string{"{ns:00}:o:a", "{ns:00}:lru"}, nil)
				var sent []string
				for _, cmd := range f.received()[before:] {
					if cmd != "hello" {
						sent = append(sent, cmd)
					}
				}
				return strings.Join(sent, " "), err
			}
			sent, err := call()
			if tc.fails {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.first, sent)
			sent, _ = call()
			require.Equal(t, tc.then, sent)
		})
	}
}

// A load outlives the caller that started it, for the callers waiting for
// it: that caller's cancellation fails only its own call, and the load
// keeps that caller's deadline.
func TestALoadOutlivesItsCaller(t *testing.T) {
	var f functions
	started, release := make(chan struct{}), make(chan struct{})
	loadErr := make(chan error, 1)
	load := func(ctx context.Context) error {
		close(started)
		<-release
		if _, ok := ctx.Deadline(); !ok {
			loadErr <- errors.New("the load lost its caller's deadline")
		} else {
			loadErr <- ctx.Err()
		}
		return nil
	}
	first, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan error, 1)
	go func() { done <- f.load(first, "a", load) }()
	<-started
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	close(release)
	require.NoError(t, <-loadErr)
}
