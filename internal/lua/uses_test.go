package lua_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/yuin/gopher-lua/ast"
	"github.com/yuin/gopher-lua/parse"

	"github.com/contstore/contstore/internal/lua"
)

// redisGlobals are the globals Redis gives a script: Lua 5.1's base
// functions and libraries that Redis loads, and its own.
var redisGlobals = map[string]bool{
	"redis": true, "KEYS": true, "ARGV": true,
	"assert": true, "error": true, "getmetatable": true, "ipairs": true, "loadstring": true,
	"next": true, "pairs": true, "pcall": true, "rawequal": true, "rawget": true, "rawset": true,
	"select": true, "setmetatable": true, "tonumber": true, "tostring": true, "type": true,
	"unpack": true, "xpcall": true,
	"bit": true, "cjson": true, "cmsgpack": true, "math": true, "os": true, "string": true,
	"struct": true, "table": true,
}

// sharedFile is what a shared file (oplog.lua, lru.lua) gives the scripts
// that name it in their uses line.
type sharedFile struct {
	// defines are its top-level locals: functions and constants.
	defines map[string]bool
	// changers are, by kind, its functions that make an unlisted deletion
	// or write (a DEL or a SET of a key not given as KEYS[i]), themselves
	// or through another of its functions.
	changers [unlistedKinds]map[string]bool
	// reads are the free names it reads.
	reads []luaName
}

// parseShared reads a shared file's definitions.
func parseShared(src string) (*sharedFile, error) {
	chunk, err := parse.Parse(strings.NewReader(src), "shared")
	if err != nil {
		return nil, err
	}
	all := &globalFinder{}
	all.block(chunk, &luaScope{})
	if all.err != nil {
		return nil, all.err
	}
	f := &sharedFile{defines: map[string]bool{}, changers: [unlistedKinds]map[string]bool{{}, {}}, reads: all.reads}
	calls := map[string][]string{} // function → the names its body reads
	for _, st := range chunk {
		local, ok := st.(*ast.LocalAssignStmt)
		if !ok {
			continue
		}
		for i, name := range local.Names {
			f.defines[name] = true
			if i >= len(local.Exprs) {
				continue
			}
			fn, ok := local.Exprs[i].(*ast.FunctionExpr)
			if !ok {
				continue
			}
			// Walked alone, the body reads the file's other top-level
			// names as free names.
			g := &globalFinder{}
			g.function(fn, &luaScope{})
			if g.err != nil {
				return nil, g.err
			}
			for k, lines := range g.unlisted {
				if len(lines) > 0 {
					f.changers[k][name] = true
				}
			}
			for _, r := range g.reads {
				calls[name] = append(calls[name], r.name)
			}
		}
	}
	for _, changers := range f.changers {
		for changed := true; changed; {
			changed = false
			for fn, names := range calls {
				if !changers[fn] && slices.ContainsFunc(names, func(n string) bool { return changers[n] && f.defines[n] }) {
					changers[fn], changed = true, true
				}
			}
		}
	}
	return f, nil
}

// sharedFiles reads every file of this directory that is no script of
// lua.All(): the shared files, by name, parsed and as text.
func sharedFiles(t *testing.T) (map[string]*sharedFile, map[string]string) {
	t.Helper()
	paths, err := filepath.Glob("*.lua")
	require.NoError(t, err)
	parsed, texts := map[string]*sharedFile{}, map[string]string{}
	for _, p := range paths {
		name := strings.TrimSuffix(p, ".lua")
		if slices.ContainsFunc(lua.All(), func(s *lua.Script) bool { return s.Name == name }) {
			continue
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		parsed[name], err = parseShared(string(b))
		require.NoError(t, err, name)
		texts[name] = string(b)
	}
	require.NotEmpty(t, parsed)
	return parsed, texts
}

// The kinds of unlisted changes a script may make: deleting owners' states
// named by an LRU member (evictions), and writing the answer keys of other
// calls (internal/lua/oplog.lua), neither of which is in its KEYS.
const (
	unlistedDeletes = iota
	unlistedWrites
	unlistedKinds
)

// unlistedKind describes a kind of unlisted change: the commands that make
// it, whether only their first argument is a key, and the header line a
// script that makes it must have. The lines after that line that continue
// it ("--" and an indent) give the reason.
var unlistedKind = [unlistedKinds]struct {
	name     string
	commands []string
	firstKey bool
	line     *regexp.Regexp
}{
	{"DELETES", []string{"DEL", "UNLINK"}, false, regexp.MustCompile(`(?m)^-- DELETES  <ns>:\{<ns>:<pp>\}:o:<member>\s+hash\s+\S.*\n(--   +\S.*\n)*`)},
	{"WRITES", []string{"SET"}, true, regexp.MustCompile(`(?m)^-- WRITES   <ns>:\{<ns>:<pp>\}:q:<member>:<op>\s+string\s+\S.*\n(--   +\S.*\n)*`)},
}

// useProblems returns what is wrong with what a script says it uses and
// touches: file is its text, declared the shared files its uses line names
// (as the loader reads it). A script must name every shared file whose
// functions or constants it reads and no other, read no name that is
// neither Redis's nor a shared file's, and have a DELETES header line
// (which says why that is safe in Redis Cluster) exactly when it makes an
// unlisted deletion, itself or through a shared function.
func useProblems(file string, declared []string, shared map[string]*sharedFile) ([]string, error) {
	chunk, err := parse.Parse(strings.NewReader(file), "script")
	if err != nil {
		return nil, err
	}
	g := &globalFinder{}
	g.block(chunk, &luaScope{})
	if g.err != nil {
		return nil, g.err
	}
	var problems []string
	for _, lib := range declared {
		if shared[lib] == nil {
			problems = append(problems, fmt.Sprintf("the uses line names %s.lua, which is no shared file", lib))
		}
	}
	used := map[string]bool{}
	var changes [unlistedKinds][]string
	for k, lines := range g.unlisted {
		for _, l := range lines {
			changes[k] = append(changes[k], fmt.Sprintf("line %d", l))
		}
	}
	seen := map[string]bool{}
	for _, r := range g.reads {
		if seen[r.name] || redisGlobals[r.name] {
			continue
		}
		seen[r.name] = true
		var from []string
		for lib, f := range shared {
			if f.defines[r.name] {
				from = append(from, lib)
			}
		}
		switch {
		case len(from) == 0:
			problems = append(problems, fmt.Sprintf("%s (line %d): neither Redis's nor a shared file's", r.name, r.line))
		case len(from) > 1:
			slices.Sort(from)
			problems = append(problems, fmt.Sprintf("%s (line %d): defined by %s", r.name, r.line, strings.Join(from, " and ")))
		case !slices.Contains(declared, from[0]):
			problems = append(problems, fmt.Sprintf("%s (line %d): %s.lua's, which the uses line does not name", r.name, r.line, from[0]))
		default:
			used[from[0]] = true
		}
		for k := range changes {
			if len(from) == 1 && shared[from[0]].changers[k][r.name] {
				changes[k] = append(changes[k], fmt.Sprintf("%s (line %d)", r.name, r.line))
			}
		}
	}
	for _, lib := range declared {
		if shared[lib] != nil && !used[lib] {
			problems = append(problems, fmt.Sprintf("the uses line names %s.lua, which it does not use", lib))
		}
	}
	for k, kind := range unlistedKind {
		verb := strings.ToLower(kind.name)
		block := kind.line.FindString(header(file))
		switch {
		case len(changes[k]) > 0 && block == "":
			problems = append(problems, fmt.Sprintf("%s keys not in KEYS (%s) but has no %s header line", verb, strings.Join(changes[k], ", "), kind.name))
		case len(changes[k]) == 0 && block != "":
			problems = append(problems, fmt.Sprintf("has a %s header line but %s no key outside KEYS", kind.name, verb))
		case block != "":
			for _, want := range []string{"not in KEYS", "hash tag {<ns>:<pp>}", "Redis Cluster", "slot"} {
				if !strings.Contains(strings.Join(strings.Fields(block), " "), want) {
					problems = append(problems, fmt.Sprintf("the %s header line does not say %q", kind.name, want))
				}
			}
		}
	}
	return problems, nil
}

// header returns the comment lines src starts with.
func header(src string) string {
	end := 0
	for _, line := range strings.SplitAfter(src, "\n") {
		if !strings.HasPrefix(line, "--") {
			break
		}
		end += len(line)
	}
	return src[:end]
}

// unlistedChange reports whether e is a call redis.call or redis.pcall
// that makes an unlisted change (unlistedKind), and of which kind: whether
// it deletes or writes a key not given as KEYS[i], or its command is no
// literal (a deletion).
func unlistedChange(e *ast.FuncCallExpr) (int, bool) {
	f, ok := e.Func.(*ast.AttrGetExpr)
	if !ok {
		return 0, false
	}
	obj, ok1 := f.Object.(*ast.IdentExpr)
	method, ok2 := f.Key.(*ast.StringExpr)
	if !ok1 || !ok2 || obj.Value != "redis" || (method.Value != "call" && method.Value != "pcall") || len(e.Args) == 0 {
		return 0, false
	}
	cmd, ok := e.Args[0].(*ast.StringExpr)
	if !ok {
		return unlistedDeletes, true
	}
	for k, kind := range unlistedKind {
		if !slices.Contains(kind.commands, strings.ToUpper(cmd.Value)) {
			continue
		}
		keys := e.Args[1:]
		if kind.firstKey && len(keys) > 0 {
			keys = keys[:1]
		}
		for _, a := range keys {
			k2, ok := a.(*ast.AttrGetExpr)
			if !ok {
				return k, true
			}
			if id, ok := k2.Object.(*ast.IdentExpr); !ok || id.Value != "KEYS" {
				return k, true
			}
		}
		return 0, false
	}
	return 0, false
}

// Every script names in its uses line exactly the shared files it calls,
// is sent as that line says, and says in its header when it deletes keys
// that are not in its KEYS.
func TestScriptsDeclareWhatTheyUse(t *testing.T) {
	shared, texts := sharedFiles(t)
	for _, s := range lua.All() {
		t.Run(s.Name, func(t *testing.T) {
			problems, err := useProblems(s.File, s.Uses, shared)
			require.NoError(t, err)
			assert.Empty(t, problems)
			assert.Equal(t, s.Uses, lua.UsesOf(s.Name, s.File))
			want := ""
			for _, lib := range s.Uses {
				want += texts[lib] + "\n"
			}
			assert.Equal(t, want+s.File, s.Source, "sent as the uses line says")
		})
	}
}

// The shared files need nothing but Redis, define each name once, are each
// used by some script, and the check sees which of their functions delete
// keys outside KEYS.
func TestSharedFilesStandAlone(t *testing.T) {
	shared, _ := sharedFiles(t)
	defined := map[string]string{}
	for lib, f := range shared {
		for _, r := range f.reads {
			assert.True(t, redisGlobals[r.name], "%s.lua reads %s (line %d), which is not Redis's", lib, r.name, r.line)
		}
		for name := range f.defines {
			if other, ok := defined[name]; ok {
				t.Errorf("%s is defined by %s.lua and %s.lua", name, other, lib)
			}
			defined[name] = lib
		}
		assert.True(t, slices.ContainsFunc(lua.All(), func(s *lua.Script) bool { return slices.Contains(s.Uses, lib) }),
			"no script uses %s.lua", lib)
	}
	require.Contains(t, shared, "lru")
	assert.True(t, shared["lru"].changers[unlistedDeletes]["prune"], "prune deletes states named by an LRU member")
	assert.False(t, shared["lru"].changers[unlistedDeletes]["lru"], "lru's remove deletes KEYS[1] only")
	require.Contains(t, shared, "oplog")
	assert.True(t, shared["oplog"].changers[unlistedWrites]["spills"], "spills writes the answer keys of other calls")
	assert.False(t, shared["oplog"].changers[unlistedWrites]["oplog"], "oplog's claim writes a key of KEYS")
}

// The check catches a script that calls a shared function its uses line
// does not name, names a shared file it does not use, reads an undefined
// name, or deletes or writes keys outside KEYS without saying so; it
// accepts a local that shadows a shared function.
func TestUndeclaredUsesAreCaught(t *testing.T) {
	shared, _ := sharedFiles(t)
	const deletes = `-- DELETES  <ns>:{<ns>:<pp>}:o:<member>  hash  evicted states, not in KEYS:
--          the hash tag {<ns>:<pp>} of KEYS[1], so in its Redis Cluster slot.
`
	const writes = `-- WRITES   <ns>:{<ns>:<pp>}:q:<member>:<op>  string  other calls' answers,
--          not in KEYS: the hash tag {<ns>:<pp>} of KEYS[1], so in its Redis Cluster slot.
`
	// planted returns a script with a header of 6 lines and deletesBlock,
	// an empty line and body: without deletesBlock, the body's first line
	// is line 8.
	planted := func(uses, deletesBlock, body string) string {
		return "-- planted.lua: a script for the check to judge.\n--\n-- uses: " + uses + "\n--\n" +
			"-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state\n" + deletesBlock +
			"-- Reply: integer\n\n" + body
	}
	for _, c := range []struct {
		name, uses, deletes, body string
		want                      []string
	}{{
		name: "an undeclared shared function",
		uses: "oplog",
		body: "if deadline(ARGV[1], 1, 0) > 0 then return 1 end\nlocal d = pack_score(0, 0, 0)\noplog().claim(1, 'x', 1)\nreturn d\n",
		want: []string{"pack_score (line 9): lru.lua's, which the uses line does not name"},
	}, {
		name: "an undeclared shared constant",
		uses: "none",
		body: "return PUBLISHED\n",
		want: []string{"PUBLISHED (line 8): lru.lua's, which the uses line does not name"},
	}, {
		name: "a shared file declared but not used",
		uses: "oplog, lru",
		body: "return deadline(ARGV[1], 1, 0)\n",
		want: []string{"the uses line names lru.lua, which it does not use"},
	}, {
		name: "a local that shadows a shared function",
		uses: "none",
		body: "local function pack_score(k) return redis.call('EXISTS', k) end\nreturn pack_score(KEYS[1])\n",
	}, {
		name: "a shared function used before a local shadows it",
		uses: "none",
		body: "local n = pack_score(KEYS[1])\nlocal pack_score = 1\nreturn n + pack_score\n",
		want: []string{"pack_score (line 8): lru.lua's, which the uses line does not name"},
	}, {
		name: "an undefined name",
		uses: "none",
		body: "return tuoch(KEYS[1])\n",
		want: []string{"tuoch (line 8): neither Redis's nor a shared file's"},
	}, {
		name: "eviction without a DELETES line",
		uses: "lru",
		body: "return prune(KEYS[1], KEYS[2], ARGV[1], false, 0, '0:0:1', nil, nil)\n",
		want: []string{"deletes keys not in KEYS (prune (line 8)) but has no DELETES header line"},
	}, {
		name: "a key deleted by name without a DELETES line",
		uses: "none",
		body: "redis.call('DEL', KEYS[1])\nreturn redis.call('UNLINK', ARGV[1] .. ARGV[2])\n",
		want: []string{"deletes keys not in KEYS (line 9) but has no DELETES header line"},
	}, {
		name:    "a DELETES line for deletions it does not make",
		uses:    "none",
		deletes: deletes,
		body:    "return redis.call('DEL', KEYS[1])\n",
		want:    []string{"has a DELETES header line but deletes no key outside KEYS"},
	}, {
		name:    "a DELETES line without its reason",
		uses:    "lru",
		deletes: "-- DELETES  <ns>:{<ns>:<pp>}:o:<member>  hash  evicted states, not in KEYS\n",
		body:    "return prune(KEYS[1], KEYS[2], ARGV[1], false, 0, '0:0:1', nil, nil)\n",
		want: []string{`the DELETES header line does not say "hash tag {<ns>:<pp>}"`,
			`the DELETES header line does not say "Redis Cluster"`, `the DELETES header line does not say "slot"`},
	}, {
		name:    "a DELETES line with its reason",
		uses:    "lru",
		deletes: deletes,
		body:    "return prune(KEYS[1], KEYS[2], ARGV[1], false, 0, '0:0:1', nil, nil)\n",
	}, {
		name: "answers moved out of a state without a WRITES line",
		uses: "oplog",
		body: "spills().record(ARGV[1], 0, ARGV[2])\nreturn 1\n",
		want: []string{"writes keys not in KEYS (spills (line 8)) but has no WRITES header line"},
	}, {
		name: "a key written by name without a WRITES line",
		uses: "none",
		body: "redis.call('SET', KEYS[1], ARGV[1])\nreturn redis.call('SET', ARGV[1] .. ARGV[2], KEYS[1])\n",
		want: []string{"writes keys not in KEYS (line 9) but has no WRITES header line"},
	}, {
		name:    "a WRITES line with its reason",
		uses:    "oplog",
		deletes: writes,
		body:    "spills().record(ARGV[1], 0, ARGV[2])\nreturn 1\n",
	}, {
		name:    "a WRITES line for writes it does not make",
		uses:    "oplog",
		deletes: writes,
		body:    "return oplog().claim(1, 'x', 1)\n",
		want:    []string{"has a WRITES header line but writes no key outside KEYS"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			file := planted(c.uses, c.deletes, c.body)
			problems, err := useProblems(file, lua.UsesOf("planted", file), shared)
			require.NoError(t, err)
			assert.Equal(t, c.want, problems)
		})
	}

	_, err := useProblems("local x = = 1", nil, shared)
	assert.Error(t, err, "a script that does not parse fails the check")
}

// The loader refuses a script without exactly one uses line, or whose uses
// line names a file twice, a file that does not exist, or a script.
func TestUsesLinesAreRead(t *testing.T) {
	file := func(header string) string { return "-- x.lua: x\n" + header + "-- KEYS[1]  k\n\nreturn 1\n" }
	assert.Equal(t, []string{"oplog", "lru"}, lua.UsesOf("x", file("-- uses: oplog, lru\n")))
	assert.Equal(t, []string{"lru", "oplog"}, lua.UsesOf("x", file("-- uses: lru,oplog\n")), "in the order named")
	assert.Equal(t, []string{}, lua.UsesOf("x", file("-- uses: none\n")))
	for name, header := range map[string]string{
		"no uses line":          "",
		"two uses lines":        "-- uses: oplog\n-- uses: lru\n",
		"an empty uses line":    "-- uses: \n",
		"a file named twice":    "-- uses: lru, lru\n",
		"a missing file":        "-- uses: lur\n",
		"a script":              "-- uses: abort\n",
		"a name with .lua":      "-- uses: lru.lua\n",
		"none with another":     "-- uses: none, lru\n",
		"the script's own name": "-- uses: x\n",
	} {
		assert.Panics(t, func() { lua.UsesOf("x", file(header)) }, name)
	}
	// A uses line after the header is no header line.
	assert.Panics(t, func() { lua.UsesOf("x", "-- x.lua: x\n\n-- uses: lru\nreturn 1\n") })
}
