package lua_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/yuin/gopher-lua/ast"
	"github.com/yuin/gopher-lua/parse"

	"github.com/contstore/contstore/internal/lua"
)

// Every script's header names its purpose, keys, arguments and replies.
func TestHeadersDescribeTheContract(t *testing.T) {
	keyPattern := regexp.MustCompile(`(?m)^-- KEYS\[\d+\]\s+<ns>:\{<ns>(:<pp>|:<id>)?\}:\S+\s+(hash|string|zset|list)\s+\S`)
	for _, s := range lua.All() {
		t.Run(s.Name, func(t *testing.T) {
			assert.True(t, strings.HasPrefix(s.File, "-- "+s.Name+".lua: "), "first line names the script")
			assert.Positive(t, s.Keys)
			assert.Len(t, keyPattern.FindAllString(s.File, -1), s.Keys, "each key names its pattern and type")
			assert.Contains(t, s.File, "-- Reply:")
			assert.NotContains(t, s.Source, "#!lua", "miniredis runs plain Lua 5.1 only")
			assert.Regexp(t, `^[0-9a-f]{40}$`, s.Hash())
		})
	}
}

// Scripts keep every variable local: Redis refuses a script that assigns
// a global, but only when the assignment runs.
func TestScriptsDeclareNoGlobals(t *testing.T) {
	for _, s := range lua.All() {
		globals, err := globalAssignments(s.Source)
		require.NoError(t, err, s.Name)
		assert.Empty(t, globals, "%s assigns globals", s.Name)
	}
}

// The check finds every way of assigning a global, wherever it is.
func TestGlobalAssignmentsAreFound(t *testing.T) {
	const script = `
local a, b = 1, 2
top = 1
local function helper(p)
  p = p + 1
  helper = nil
  inner = p
  return p
end
if a then
  a = 2
  foo = 1
  x, y = 1, 2
  do
    local scoped = 1
    scoped = 2
  end
  scoped = 3
end
for i = 1, 3 do i = i + 1; loopvar = i end
for k, v in pairs({}) do k, v = v, k end
i = 0
while b do b = nil; local w = 1 end
w = 2
repeat local r = 1 until r == 1
r = 2
function global_fn() end
function helper2() end
local t = {}
function t.field() end
t.x, t[1] = 1, 2
KEYS[1] = "k"
local f = function(q) q = 1; late = q end
`
	globals, err := globalAssignments(script)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"top (line 3)", "inner (line 7)", "foo (line 12)", "x (line 13)", "y (line 13)",
		"scoped (line 18)", "loopvar (line 20)", "i (line 22)", "w (line 24)", "r (line 26)",
		"global_fn (line 27)", "helper2 (line 28)", "late (line 33)",
	}, globals)

	_, err = globalAssignments("local x = = 1")
	assert.Error(t, err, "a script that does not parse fails the check")
}

// globalAssignments returns the globals src assigns, as "name (line n)":
// assignments to a name that no enclosing block declares local, and
// function statements that name such a name. Writing a field of a table
// (t.x, KEYS[1]) assigns no global.
func globalAssignments(src string) ([]string, error) {
	chunk, err := parse.Parse(strings.NewReader(src), "script")
	if err != nil {
		return nil, err
	}
	g := &globalFinder{}
	g.block(chunk, &luaScope{})
	return g.found, g.err
}

// luaScope is the local names of one block and of the blocks around it.
type luaScope struct {
	names map[string]bool
	outer *luaScope
}

func (s *luaScope) inner(names ...string) *luaScope {
	in := &luaScope{names: map[string]bool{}, outer: s}
	for _, n := range names {
		in.names[n] = true
	}
	return in
}

func (s *luaScope) local(name string) bool {
	for ; s != nil; s = s.outer {
		if s.names[name] {
			return true
		}
	}
	return false
}

// globalFinder walks a chunk, noting the globals it assigns (found), the
// free names it reads (reads: names no enclosing block declares local, in
// the order read) and the lines of its unlisted deletions: DEL or UNLINK
// calls on a key not given as KEYS[i] (or whose command is no literal).
type globalFinder struct {
	found []string
	reads []luaName
	// unlisted are the lines of its unlisted deletions and writes (a DEL or
	// a SET of a key not given as KEYS[i]), by kind.
	unlisted [unlistedKinds][]int
	err      error
}

// luaName is a name a chunk reads, with the line of its first read.
type luaName struct {
	name string
	line int
}

func (g *globalFinder) assign(name string, line int, sc *luaScope) {
	if !sc.local(name) {
		g.found = append(g.found, fmt.Sprintf("%s (line %d)", name, line))
	}
}

// block walks stmts in a new block inside sc, with names declared local.
func (g *globalFinder) block(stmts []ast.Stmt, sc *luaScope, names ...string) {
	in := sc.inner(names...)
	for _, st := range stmts {
		g.stmt(st, in)
	}
}

func (g *globalFinder) stmt(st ast.Stmt, sc *luaScope) {
	switch st := st.(type) {
	case *ast.AssignStmt:
		g.exprs(st.Rhs, sc)
		for _, e := range st.Lhs {
			if id, ok := e.(*ast.IdentExpr); ok {
				g.assign(id.Value, id.Line(), sc)
			} else {
				g.expr(e, sc)
			}
		}
	case *ast.LocalAssignStmt:
		// "local function f" is parsed as "local f = function": f is
		// declared before its body, as "local function f" declares it.
		if len(st.Names) == 1 && len(st.Exprs) == 1 {
			if _, ok := st.Exprs[0].(*ast.FunctionExpr); ok {
				sc.names[st.Names[0]] = true
			}
		}
		g.exprs(st.Exprs, sc)
		for _, n := range st.Names {
			sc.names[n] = true
		}
	case *ast.FuncCallStmt:
		g.expr(st.Expr, sc)
	case *ast.DoBlockStmt:
		g.block(st.Stmts, sc)
	case *ast.WhileStmt:
		g.expr(st.Condition, sc)
		g.block(st.Stmts, sc)
	case *ast.RepeatStmt:
		// The condition sees the block's locals.
		in := sc.inner()
		for _, s := range st.Stmts {
			g.stmt(s, in)
		}
		g.expr(st.Condition, in)
	case *ast.IfStmt:
		g.expr(st.Condition, sc)
		g.block(st.Then, sc)
		g.block(st.Else, sc)
	case *ast.NumberForStmt:
		g.exprs([]ast.Expr{st.Init, st.Limit, st.Step}, sc)
		g.block(st.Stmts, sc, st.Name)
	case *ast.GenericForStmt:
		g.exprs(st.Exprs, sc)
		g.block(st.Stmts, sc, st.Names...)
	case *ast.FuncDefStmt:
		if id, ok := st.Name.Func.(*ast.IdentExpr); ok {
			g.assign(id.Value, st.Line(), sc)
		} else {
			g.expr(st.Name.Func, sc)
		}
		g.expr(st.Name.Receiver, sc)
		self := []string{}
		if st.Name.Receiver != nil {
			self = append(self, "self")
		}
		g.function(st.Func, sc, self...)
	case *ast.ReturnStmt:
		g.exprs(st.Exprs, sc)
	case *ast.BreakStmt, *ast.LabelStmt, *ast.GotoStmt:
	default:
		g.err = fmt.Errorf("line %d: statement %T not walked", st.Line(), st)
	}
}

func (g *globalFinder) function(f *ast.FunctionExpr, sc *luaScope, extra ...string) {
	g.block(f.Stmts, sc, append(extra, f.ParList.Names...)...)
}

func (g *globalFinder) exprs(es []ast.Expr, sc *luaScope) {
	for _, e := range es {
		g.expr(e, sc)
	}
}

func (g *globalFinder) expr(e ast.Expr, sc *luaScope) {
	switch e := e.(type) {
	case *ast.IdentExpr:
		if !sc.local(e.Value) {
			g.reads = append(g.reads, luaName{e.Value, e.Line()})
		}
	case nil, *ast.TrueExpr, *ast.FalseExpr, *ast.NilExpr, *ast.NumberExpr, *ast.StringExpr, *ast.Comma3Expr:
	case *ast.AttrGetExpr:
		g.exprs([]ast.Expr{e.Object, e.Key}, sc)
	case *ast.TableExpr:
		for _, f := range e.Fields {
			g.exprs([]ast.Expr{f.Key, f.Value}, sc)
		}
	case *ast.FuncCallExpr:
		if k, ok := unlistedChange(e); ok {
			g.unlisted[k] = append(g.unlisted[k], e.Line())
		}
		g.exprs([]ast.Expr{e.Func, e.Receiver}, sc)
		g.exprs(e.Args, sc)
	case *ast.LogicalOpExpr:
		g.exprs([]ast.Expr{e.Lhs, e.Rhs}, sc)
	case *ast.RelationalOpExpr:
		g.exprs([]ast.Expr{e.Lhs, e.Rhs}, sc)
	case *ast.StringConcatOpExpr:
		g.exprs([]ast.Expr{e.Lhs, e.Rhs}, sc)
	case *ast.ArithmeticOpExpr:
		g.exprs([]ast.Expr{e.Lhs, e.Rhs}, sc)
	case *ast.UnaryMinusOpExpr:
		g.expr(e.Expr, sc)
	case *ast.UnaryNotOpExpr:
		g.expr(e.Expr, sc)
	case *ast.UnaryLenOpExpr:
		g.expr(e.Expr, sc)
	case *ast.FunctionExpr:
		g.function(e, sc)
	default:
		g.err = fmt.Errorf("line %d: expression %T not walked", e.Line(), e)
	}
}

func TestRunRefusesAWrongKeyOrArgumentCount(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	cs, as := lua.Clear, lua.Abort
	require.False(t, as.Variadic)

	before := mr.CommandCount()
	err := cs.Run(ctx, c, make([]string, cs.Keys-1), args(cs.Args)...).Err()
	require.ErrorContains(t, err, fmt.Sprintf("clear takes %d keys and %d args", cs.Keys, cs.Args))
	assert.ErrorContains(t, err, fmt.Sprintf("called with %d and %d", cs.Keys-1, cs.Args))
	err = as.Run(ctx, c, make([]string, as.Keys), args(as.Args+1)...).Err()
	require.ErrorContains(t, err, fmt.Sprintf("abort takes %d keys and %d args, called with %d and %d",
		as.Keys, as.Args, as.Keys, as.Args+1))
	assert.Equal(t, before, mr.CommandCount(), "nothing reached the server")

	// The right counts reach the server.
	keys := make([]string, cs.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns:{ns:00}:k%d", i)
	}
	err = cs.Run(ctx, c, keys, args(cs.Args)...).Err()
	if err != nil {
		assert.NotContains(t, err.Error(), "clear takes")
	}
	assert.Greater(t, mr.CommandCount(), before)
}

// args returns n arguments.
func args(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = "0"
	}
	return out
}

// A variadic script takes its header's arguments and any more; the others
// take exactly theirs.
func TestVariadicScriptsTakeTrailingArguments(t *testing.T) {
	assert.True(t, lua.SessionSave.Variadic, "session_save takes the messages to push")
	assert.False(t, lua.Reserve.Variadic)
	ctx := context.Background()
	for _, s := range lua.All() {
		refused := func(n int) bool {
			err := s.Run(ctx, answersNil{}, make([]string, s.Keys), args(n)...).Err()
			return err != nil && strings.Contains(err.Error(), s.Name+" takes")
		}
		assert.False(t, refused(s.Args), "%s with %d args", s.Name, s.Args)
		assert.Equal(t, !s.Variadic, refused(s.Args+1), "%s with %d args", s.Name, s.Args+1)
		assert.Equal(t, !s.Variadic, refused(s.Args+3), "%s with %d args", s.Name, s.Args+3)
		if s.Args > 0 {
			assert.True(t, refused(s.Args-1), "%s with %d args", s.Name, s.Args-1)
		}
	}
}

// answersNil runs no script: it answers nil to every EVALSHA.
type answersNil struct{ redis.Scripter }

func (answersNil) EvalSha(context.Context, string, []string, ...any) *redis.Cmd {
	return redis.NewCmdResult(nil, nil)
}

// Clear of an owner with neither state nor LRU entry answers 0, leaves the
// partition's accounting alone and writes nothing but its answer, which a
// copy of the call finds: no turn fences a clear, so a copy that found
// none would remove a turn reserved after the first run.
func TestClearWithNothingToDeleteWritesOnlyItsAnswer(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	op := lua.NewCallID(time.Now().Add(time.Minute).UnixMilli() - 1735689600000)
	keys := []string{"ns:{ns:00}:o:m", "ns:{ns:00}:lru", "ns:{ns:00}:part", "ns:{ns:00}:q:m:" + lua.CallIDKey(op)}
	args := []any{op}
	require.NoError(t, c.HSet(ctx, keys[2], "bytes", 7, "published", 1).Err())

	n, err := c.Eval(ctx, lua.Clear.Source, keys, args...).Int()
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	assert.Equal(t, map[string]string{"bytes": "7", "published": "1"}, c.HGetAll(ctx, keys[2]).Val())
	assert.ElementsMatch(t, []string{keys[2], keys[3]}, mr.Keys())
	assert.Equal(t, "0", c.Get(ctx, keys[3]).Val())

	require.NoError(t, c.HSet(ctx, keys[0], "t", 5, "o", op+"2").Err()) // a turn reserved since
	n, err = c.Eval(ctx, lua.Clear.Source, keys, args...).Int()
	require.NoError(t, err)
	assert.Equal(t, 0, n, "a copy answers as the first run")
	assert.True(t, mr.Exists(keys[0]), "and leaves the turn reserved since alone")
}

// The function library holds every script once, under its function's
// name, after the shared files, and assigns no global.
func TestLibraryHoldsEveryScript(t *testing.T) {
	first, body, _ := strings.Cut(lua.Library.Source, "\n")
	require.Regexp(t, `^contstore_[0-9a-f]{16}$`, lua.Library.Name)
	require.Equal(t, "#!lua name="+lua.Library.Name, first)
	names := map[string]bool{}
	for _, s := range lua.All() {
		require.True(t, strings.HasSuffix(s.File, "\n"), s.Name)
		require.Equal(t, lua.Library.Name+"_"+s.Name, s.Function())
		flags := ""
		for i, f := range s.Flags {
			if i > 0 {
				flags += ", "
			}
			flags += "'" + f + "'"
		}
		fn := "redis.register_function{function_name = '" + s.Function() + "', flags = {" + flags +
			"}, callback = function(keys, args)\nKEYS, ARGV = keys, args\n" + s.File + "end}\n"
		require.Equal(t, 1, strings.Count(body, fn), s.Name)
		for _, shared := range s.Uses {
			require.Less(t, strings.Index(body, "\n-- "+shared+".lua: "), strings.Index(body, fn), "%s before %s", shared, s.Name)
		}
		names[s.Function()] = true
	}
	require.Len(t, names, len(lua.All()))
	globals, err := globalAssignments(body)
	require.NoError(t, err)
	require.Empty(t, globals)
}
