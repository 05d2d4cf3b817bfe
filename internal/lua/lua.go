// Package lua holds the Redis scripts of the continuation store and the
// session store, one file a script, embedded at build time.
//
// Each script starts with a header naming its purpose, the shared files it
// uses, every KEYS[i] with its key pattern and Redis type, every ARGV[i] with
// its units, and every reply. [Script] reads the KEYS and ARGV counts from
// that header, so a caller that passes a different number is refused before
// anything reaches Redis.
//
// The shared files (oplog.lua, lru.lua) define local functions and
// constants only. A script names the ones it uses in one header line,
//
//	-- uses: oplog, lru
//
// ("-- uses: none" for none), and is sent to Redis as those files, in that
// order, each followed by "\n", then the script's own file. [Library]
// holds every script as a function of one Redis function library, which
// defines the shared files once.
package lua

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Library is every script as a function of one Redis function library
// (Redis 7 and later: FUNCTION LOAD once, then FCALL), which defines the
// shared files once, when it is loaded, instead of in every call.
var Library = newLibrary()

// FunctionLibrary is a Redis function library: its name and its text.
type FunctionLibrary struct {
	// Name is "contstore_" followed by 16 hexadecimal digits: the first
	// of the SHA1 of the text after its first line as it reads with
	// sixteen zeros in their place. A library whose scripts differ has
	// another name, and so have its functions.
	Name string
	// Source is the text FUNCTION LOAD takes: the line
	// "#!lua name=<Name>", the line "local KEYS, ARGV", each shared file
	// followed by "\n", then, for each script in the order of All, the
	// line "redis.register_function{function_name = '<Name>_<script>',
	// flags = {<its Flags, each quoted in ', joined by ", ">}, callback =
	// function(keys, args)", the line "KEYS, ARGV = keys, args", the
	// script's file and the line "end}". The scripts read KEYS and ARGV
	// as under EVAL.
	Source string
}

// newLibrary composes Library and names each script's function in it.
func newLibrary() FunctionLibrary {
	const unnamed = "contstore_0000000000000000"
	var b strings.Builder
	b.WriteString("local KEYS, ARGV\n")
	var shared []string
	for _, s := range All() {
		for _, lib := range s.Uses {
			if !slices.Contains(shared, lib) {
				shared = append(shared, lib)
				b.WriteString(read(lib) + "\n")
			}
		}
	}
	for _, s := range All() {
		quoted := make([]string, len(s.Flags))
		for i, f := range s.Flags {
			quoted[i] = "'" + f + "'"
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = '%s_%s', flags = {%s}, callback = function(keys, args)\n"+
			"KEYS, ARGV = keys, args\n%send}\n", unnamed, s.Name, strings.Join(quoted, ", "), s.File)
	}
	sum := sha1.Sum([]byte(b.String()))
	name := "contstore_" + hex.EncodeToString(sum[:8])
	for _, s := range All() {
		s.function = name + "_" + s.Name
	}
	return FunctionLibrary{Name: name, Source: "#!lua name=" + name + "\n" + strings.ReplaceAll(b.String(), unnamed, name)}
}

// Script is one embedded script with the argument counts its header declares.
type Script struct {
	// Name is the file name without ".lua".
	Name string
	// Keys and Args are the number of KEYS and ARGV entries the header
	// names. When Variadic, the header's last ARGV line reads "ARGV[n+]"
	// and the script takes Args or more arguments.
	Keys, Args int
	Variadic   bool
	// Uses names the shared files the header's "-- uses:" line lists, in
	// its order, without ".lua".
	Uses []string
	// Flags are the Redis function flags the header's "-- flags:" line
	// lists ("no-writes", "allow-oom"), which its function in Library is
	// registered with; none when it has no such line.
	Flags []string
	// Source is the script as sent to Redis: each file of Uses followed by
	// "\n", then File.
	Source string
	// File is the script file's own text, header first.
	File string

	script   *redis.Script
	function string // in Library
}

// The store's scripts.
var (
	Reserve = load("reserve")
	Record  = load("record")
	Abort   = load("abort")
	Clear   = load("clear")
	Inspect = load("inspect")
	Prune   = load("prune")
	Schema  = load("schema")
	Scan    = load("scan")

	SessionSave = load("session_save")
	SessionLoad = load("session_load")
)

// All lists every script.
func All() []*Script {
	return []*Script{Reserve, Record, Abort, Clear, Inspect, Prune, Schema, Scan, SessionSave, SessionLoad}
}

var (
	keysLine = regexp.MustCompile(`(?m)^-- KEYS\[(\d+)\]`)
	argvLine = regexp.MustCompile(`(?m)^-- ARGV\[(\d+)\+?\]`)
	variadic = regexp.MustCompile(`(?m)^-- ARGV\[\d+\+\]`)
	usesLine = regexp.MustCompile(`(?m)^-- uses: (.*)$`)
	flagLine = regexp.MustCompile(`(?m)^-- flags: (.*)$`)
	usedName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// load reads name.lua and places before it the shared files its header's
// uses line names.
func load(name string) *Script {
	file := read(name)
	libs := uses(name, file)
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
		Uses:     libs,
		Flags:    flags(name, file),
		Source:   src,
		File:     file,
		script:   redis.NewScript(src),
	}
	if s.Variadic {
		s.Args-- // "ARGV[n+]" may be empty
	}
	return s
}

// uses returns the shared files the uses line of script name (its text
// file) lists. It panics unless the header holds exactly one such line and
// each name it lists, once, is a shared file: one with no uses line and no
// KEYS of its own.
func uses(name, file string) []string {
	lines := usesLine.FindAllStringSubmatch(header(file), -1)
	if len(lines) != 1 {
		panic(fmt.Sprintf("lua: %s.lua has %d \"-- uses:\" header lines, want 1", name, len(lines)))
	}
	list := strings.TrimSpace(lines[0][1])
	if list == "none" {
		return []string{}
	}
	var libs []string
	for _, lib := range strings.Split(list, ",") {
		lib = strings.TrimSpace(lib)
		if !usedName.MatchString(lib) || slices.Contains(libs, lib) || lib == name {
			panic(fmt.Sprintf("lua: %s.lua uses %q: not a shared file's name, or named twice", name, lib))
		}
		if text := read(lib); usesLine.MatchString(header(text)) || keysLine.MatchString(text) {
			panic(fmt.Sprintf("lua: %s.lua uses %s.lua, which is a script, not a shared file", name, lib))
		}
		libs = append(libs, lib)
	}
	return libs
}

// flags returns the function flags the flags line of script name (its
// text file) lists. It panics on a flag other than no-writes and
// allow-oom, the two a script may need: one that only reads runs on a
// server out of memory with no-writes, one that frees memory with
// allow-oom.
func flags(name, file string) []string {
	lines := flagLine.FindAllStringSubmatch(header(file), -1)
	if len(lines) > 1 {
		panic(fmt.Sprintf("lua: %s.lua has %d \"-- flags:\" header lines", name, len(lines)))
	}
	var out []string
	for _, l := range lines {
		for _, f := range strings.Split(l[1], ",") {
			f = strings.TrimSpace(f)
			if f != "no-writes" && f != "allow-oom" || slices.Contains(out, f) {
				panic(fmt.Sprintf("lua: %s.lua flags %q: not no-writes or allow-oom, or named twice", name, f))
			}
			out = append(out, f)
		}
	}
	return out
}

// header returns the comment lines a file starts with: up to the first line
// that does not start with "--".
func header(file string) string {
	end := 0
	for end < len(file) && strings.HasPrefix(file[end:], "--") {
		nl := strings.IndexByte(file[end:], '\n')
		if nl < 0 {
			return file
		}
		end += nl + 1
	}
	return file[:end]
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

// CallIDSize is the length of a call id, which oplog.lua calls an op.
const CallIDSize = 9

// MaxDeadline is how long after a call starts its deadline may be at most
// (oplog.lua): the scripts read a deadline further ahead as passed.
const MaxDeadline = time.Hour

// NewCallID returns the id of a call that changes state (the scripts' op,
// oplog.lua): 5 random bytes, then the low 32 bits of the call's deadline,
// in milliseconds since 2025-01-01T00:00:00Z on the server's clock,
// big-endian. A client that re-sends the call re-sends its id, and the
// script answers the repeat as its first run did.
func NewCallID(deadline int64) string {
	var b [CallIDSize + 3]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	binary.BigEndian.PutUint32(b[5:], uint32(deadline))
	return string(b[:CallIDSize])
}

// CallIDKey returns a call id in lowercase hex, as the name of the call's
// answer key ends.
func CallIDKey(id string) string { return string(AppendCallIDKey(nil, id)) }

// AppendCallIDKey appends CallIDKey(id) to b.
func AppendCallIDKey(b []byte, id string) []byte { return hex.AppendEncode(b, []byte(id)) }

// Function returns the name of the script's function in Library, as
// FCALL names it.
func (s *Script) Function() string { return s.function }

// Hash returns the script's SHA1, as EVALSHA names it.
func (s *Script) Hash() string { return s.script.Hash() }

// Check returns an error naming the script unless a call with keys keys
// and args arguments matches its header's counts.
func (s *Script) Check(keys, args int) error {
	if keys == s.Keys && args >= s.Args && (s.Variadic || args == s.Args) {
		return nil
	}
	more := ""
	if s.Variadic {
		more = " or more"
	}
	return fmt.Errorf("lua: %s takes %d keys and %d args%s, called with %d and %d",
		s.Name, s.Keys, s.Args, more, keys, args)
}

// Run runs the script with EVALSHA, falling back to EVAL when the server
// answers NOSCRIPT. It refuses a call whose key or argument count differs
// from the header's.
func (s *Script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if err := s.Check(len(keys), len(args)); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return s.script.Run(ctx, c, keys, args...)
}
