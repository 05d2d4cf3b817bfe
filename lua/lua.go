// Package lua holds the Redis scripts of the continuation store and the
// session store, one file a script, embedded at build time.
//
// Each script starts with a header naming its purpose, every KEYS[i] with its
// key pattern and Redis type, every ARGV[i] with its units, and every reply.
// [Script] reads the KEYS and ARGV counts from that header, so a caller that
// passes a different number is refused before anything reaches Redis.
package lua

import (
	"context"
	"embed"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Script is one embedded script with the argument counts its header declares.
type Script struct {
	// Name is the file name without ".lua".
	Name string
	// Keys and Args are the number of KEYS and ARGV entries the header
	// names. When Variadic, the header's last ARGV line reads "ARGV[n+]"
	// and the script takes Args or more arguments.
	Keys, Args int
	Variadic   bool
	// Source is the script as sent to Redis: the file, after the shared
	// functions (oplog.lua, lru.lua) it uses.
	Source string
	// File is the script file's own text, header first.
	File string

	script *redis.Script
}

// The store's scripts.
var (
	Reserve = load("reserve", "oplog", "lru")
	Record  = load("record", "oplog", "lru")
	Abort   = load("abort", "oplog", "lru")
	Clear   = load("clear", "oplog", "lru")
	Inspect = load("inspect", "lru")
	Prune   = load("prune", "lru")
	Schema  = load("schema")

	SessionSave = load("session_save", "oplog")
	SessionLoad = load("session_load")
)

// All lists every script, for tests and tools.
func All() []*Script {
	return []*Script{Reserve, Record, Abort, Clear, Inspect, Prune, Schema, SessionSave, SessionLoad}
}

var (
	keysLine = regexp.MustCompile(`(?m)^-- KEYS\[(\d+)\]`)
	argvLine = regexp.MustCompile(`(?m)^-- ARGV\[(\d+)\+?\]`)
	variadic = regexp.MustCompile(`(?m)^-- ARGV\[\d+\+\]`)
)

// load reads name.lua, placing the named libraries' functions before it.
func load(name string, libs ...string) *Script {
	file := read(name)
	src := ""
	for _, lib := range libs {
		src += read(lib) + "\n"
	}
	src += file
	s := &Script{
		Name:     name,
		Keys:     count(keysLine, file),
		Args:     count(argvLine, file),
		Variadic: variadic.MatchString(file),
		Source:   src,
		File:     file,
		script:   redis.NewScript(src),
	}
	if s.Variadic {
		s.Args-- // "ARGV[n+]" may be empty
	}
	return s
}

func read(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("lua: embedded script %s missing: %v", name, err))
	}
	return string(b)
}

// count returns how many numbered header lines match re, requiring them to be
// numbered 1, 2, … in order so a gap in the header is caught at start-up.
func count(re *regexp.Regexp, src string) int {
	n := 0
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		if m[1] != fmt.Sprint(n+1) {
			panic(fmt.Sprintf("lua: header line %s out of order", m[0]))
		}
		n++
	}
	return n
}

// NewOpID returns a random operation id for a script that changes state
// (oplog.lua): 12 lowercase hex digits, which name the key of its answer. A
// client that re-sends the script re-sends the key, and the script answers
// the repeat from it.
func NewOpID() string {
	return strconv.FormatUint(rand.Uint64()>>16|1<<48, 16)[1:]
}

// AnswerTTL is how long a script's answer stays (oplog.lua) for a caller
// whose operations time out after opTimeout: long past any re-send of the
// script, at least 10 seconds.
func AnswerTTL(opTimeout time.Duration) time.Duration {
	return max(10*time.Second, 10*opTimeout)
}

// Hash returns the script's SHA1, as EVALSHA names it.
func (s *Script) Hash() string { return s.script.Hash() }

// Run runs the script with EVALSHA, falling back to EVAL when the server
// answers NOSCRIPT. It refuses a call whose key or argument count differs
// from the header's.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if len(keys) != s.Keys || len(args) < s.Args || (!s.Variadic && len(args) > s.Args) {
		more := ""
		if s.Variadic {
			more = " or more"
		}
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(fmt.Errorf("lua: %s takes %d keys and %d args%s, called with %d and %d",
			s.Name, s.Keys, s.Args, more, len(keys), len(args)))
		return cmd
	}
	return s.script.Run(ctx, c, keys, args...)
}
