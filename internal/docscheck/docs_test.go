package docscheck

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// docPatterns are the documents checked, relative to the repository root.
var docPatterns = []string{"README.md", "docs/*.md", "PROTOCOL.md", "BENCHMARKS.md", "RELIABILITY.md"}

// ownDocs are the documents whose code spans and diagrams must name only
// code that exists (the others quote history and other languages too).
var ownDocs = []string{"README.md", "docs/*.md"}

// raceBuild tells whether the test runs with -race (race_test.go).
var raceBuild bool

// tools are the commands whose flags the documents use.
var tools = []string{"contproxy", "contbench"}

// A problem is something a document gets wrong, where.
type problem struct {
	file string
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.msg) }

// checker checks documents against the repository at root.
type checker struct {
	root string
	// flags maps "contproxy", "contbench" and "contbench replay" to their
	// flags.
	flags map[string]map[string]flagInfo
	// makeTargets are the Makefile's targets.
	makeTargets map[string]bool
	// anchors caches the anchors of the markdown files links point at.
	anchors map[string]map[string]bool
	// idents maps a package name to the names its non-test files declare:
	// top-level names, and Type.Member for methods and fields.
	idents map[string]map[string]bool
	// tests are the test, benchmark, fuzz and example functions.
	tests map[string]bool
	// topLevel are the entries of the repository's root directory.
	topLevel map[string]bool

	problems []problem
	// seen counts what was checked, by kind, so that a check that finds
	// nothing to check fails instead of passing.
	seen map[string]int
}

func (c *checker) report(file string, line int, format string, args ...any) {
	c.problems = append(c.problems, problem{file, line, fmt.Sprintf(format, args...)})
}

// flagInfo is a flag as -h lists it.
type flagInfo struct {
	takesValue bool
	def        string // the "(default ...)" text, "" when -h gives none
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at the repository root %s: %v", root, err)
	}
	return root
}

// docs returns the documents' paths relative to root, sorted.
func docs(t *testing.T, root string, patterns []string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			out = append(out, filepath.ToSlash(rel))
		}
	}
	sort.Strings(out)
	return out
}

func newChecker(t *testing.T, root string) *checker {
	t.Helper()
	c := &checker{root: root, anchors: map[string]map[string]bool{}, makeTargets: map[string]bool{}, topLevel: map[string]bool{},
		seen: map[string]int{}}
	if mk, err := os.ReadFile(filepath.Join(root, "Makefile")); err == nil {
		c.makeTargets = makeTargets(string(mk))
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		c.topLevel[e.Name()] = true
	}
	return c
}

// expect fails t unless each kind of thing was checked at least once.
func (c *checker) expect(t *testing.T, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		if c.seen[k] == 0 {
			t.Errorf("the documents hold no %s to check: the document parser is broken, or they lost it", k)
		}
	}
}

// fail fails t with every problem, one a line.
func (c *checker) fail(t *testing.T) {
	t.Helper()
	if len(c.problems) == 0 {
		return
	}
	var b strings.Builder
	for _, p := range c.problems {
		b.WriteString("\n\t" + p.String())
	}
	t.Errorf("%d problems in the documents:%s", len(c.problems), b.String())
}

func (c *checker) read(t *testing.T, doc string) markdown {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(c.root, doc))
	if err != nil {
		t.Fatal(err)
	}
	return parseMarkdown(string(src))
}

// TestLinks checks that every relative link of the documents names a file
// that exists and, with an #anchor into a markdown file, one of its
// headings.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	c := newChecker(t, root)
	for _, doc := range docs(t, root, docPatterns) {
		md := c.read(t, doc)
		c.anchors[doc] = md.anchors
		for _, l := range md.links {
			c.link(doc, l)
		}
	}
	c.goComments(t)
	c.expect(t, "link", "anchor", "Go comment's reference to docs/")
	c.fail(t)
}

// docsRef is a Go comment's reference to a document of docs/, with the
// heading it names, if any: docs/operating.md ("rueidis").
var docsRef = regexp.MustCompile(`(docs/[\w.-]+\.md)(?:,? \(?"([^"]+)")?`)

// goComments checks that the references Go comments make to docs/ name
// files and headings that exist.
func (c *checker) goComments(t *testing.T) {
	t.Helper()
	err := filepath.WalkDir(c.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != c.root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(c.root, p)
		rel = filepath.ToSlash(rel)
		for i, l := range strings.Split(string(src), "\n") {
			if !strings.Contains(l, "//") {
				continue
			}
			for _, m := range docsRef.FindAllStringSubmatch(l, -1) {
				c.seen["Go comment's reference to docs/"]++
				target := m[1]
				if m[2] != "" {
					target += "#" + slugify(m[2])
				}
				c.linkFrom(rel, ".", located{target, i + 1})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

func (c *checker) link(doc string, l located) { c.linkFrom(doc, path.Dir(doc), l) }

// linkFrom checks a link of doc whose relative paths start at dir.
func (c *checker) linkFrom(doc, dir string, l located) {
	target := l.text
	if target == "" || scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return
	}
	c.seen["link"]++
	p, anchor, _ := strings.Cut(target, "#")
	file := doc
	if p != "" {
		u, err := url.PathUnescape(p)
		if err != nil {
			c.report(doc, l.line, "link %s: %v", target, err)
			return
		}
		file = path.Clean(path.Join(dir, u))
		if file == ".." || strings.HasPrefix(file, "../") {
			c.report(doc, l.line, "link %s: outside the repository", target)
			return
		}
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(file))); err != nil {
			c.report(doc, l.line, "link %s: %s does not exist", target, file)
			return
		}
	}
	if anchor == "" || !strings.HasSuffix(file, ".md") {
		return
	}
	anchors, ok := c.anchors[file]
	if !ok {
		src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(file)))
		if err != nil {
			c.report(doc, l.line, "link %s: %v", target, err)
			return
		}
		anchors = parseMarkdown(string(src)).anchors
		c.anchors[file] = anchors
	}
	c.seen["anchor"]++
	if !anchors[anchor] {
		c.report(doc, l.line, "link %s: %s has no heading with the anchor #%s%s", target, file, anchor, nearest(anchor, anchors))
	}
}

// nearest suggests the anchor that shares the longest prefix with a.
func nearest(a string, anchors map[string]bool) string {
	best, n := "", 0
	for h := range anchors {
		k := 0
		for k < len(a) && k < len(h) && a[k] == h[k] {
			k++
		}
		if k > n || k == n && h < best {
			best, n = h, k
		}
	}
	if n < 3 {
		return ""
	}
	return " (did you mean #" + best + "?)"
}

// TestCommands checks the commands of the documents' sh blocks and inline
// code spans: the flags of contproxy and contbench against their -h
// output, the packages and test patterns of go commands, and the scripts
// and make targets they run.
func TestCommands(t *testing.T) {
	root := repoRoot(t)
	c := newChecker(t, root)
	c.flags = cachedToolFlags(t, root)
	own := map[string]bool{}
	for _, doc := range docs(t, root, ownDocs) {
		own[doc] = true
	}
	for _, doc := range docs(t, root, docPatterns) {
		md := c.read(t, doc)
		if own[doc] {
			c.loneFlags(doc, md)
		}
		for _, b := range md.blocks {
			switch b.lang {
			case "sh", "bash", "shell":
				for _, cmd := range lexShell(b.code) {
					c.command(doc, b.line+cmd[0].line, cmd)
				}
			}
		}
		for _, s := range md.spans {
			cmds := lexShell(s.text)
			if len(cmds) > 0 && startsCommand(stripPrefix(cmds[0])) {
				for _, cmd := range cmds {
					c.command(doc, s.line, cmd)
				}
			}
		}
	}
	c.expect(t, "contproxy command", "contbench command", "contbench replay command", "go test command", "make command", "script")
	c.fail(t)
}

// stripPrefix drops the shell keywords and variable assignments that may
// come before a command's name.
func stripPrefix(ws []word) []word {
	for len(ws) > 0 {
		switch w := ws[0].text; {
		case w == "do" || w == "then" || w == "else" || w == "if" || w == "while" || w == "until" || w == "!" || w == "{" || w == "time":
		case assignment.MatchString(w):
		default:
			return ws
		}
		ws = ws[1:]
	}
	return ws
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// startsCommand reports whether ws is a command the check reads.
func startsCommand(ws []word) bool {
	if len(ws) == 0 {
		return false
	}
	name := ws[0].text
	switch {
	case name == "go" || name == "make":
		return len(ws) > 1
	case isTool(name) != "":
		return true
	case isScript(name):
		return true
	}
	return false
}

// isTool returns which of tools name runs, "" for none.
func isTool(name string) string {
	base := path.Base(name)
	for _, t := range tools {
		if base == t {
			return t
		}
	}
	return ""
}

func isScript(name string) bool { return strings.HasPrefix(strings.TrimPrefix(name, "./"), "scripts/") }

// wrappers run the command that follows their own options.
var wrappers = map[string]bool{"taskset": true, "timeout": true, "env": true, "nice": true, "nohup": true, "sudo": true, "exec": true, "xargs": true}

// command checks one simple command, found at line of doc.
func (c *checker) command(doc string, line int, ws []word) {
	ws = stripPrefix(ws)
	if len(ws) == 0 {
		return
	}
	name := ws[0].text
	switch {
	case ws[0].expanded:
	case name == "go" && len(ws) > 1:
		c.goCommand(doc, line, ws[1].text, ws[2:])
	case isTool(name) != "":
		c.toolArgs(doc, line, isTool(name), ws[1:])
	case name == "make":
		c.seen["make command"]++
		for _, w := range ws[1:] {
			if w.expanded || strings.HasPrefix(w.text, "-") || strings.Contains(w.text, "=") {
				continue
			}
			if !c.makeTargets[w.text] {
				c.report(doc, line, "make %s: the Makefile has no target %q", w.text, w.text)
			}
		}
	case isScript(name):
		c.seen["script"]++
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(name))); err != nil {
			c.report(doc, line, "%s does not exist", name)
		}
		c.command(doc, line, ws[1:]) // scripts/redis-env.sh runs its arguments
	case (name == "bash" || name == "sh") && len(ws) > 2 && ws[1].text == "-c":
		for _, cmd := range lexShell(ws[2].text) {
			c.command(doc, line, cmd)
		}
	case wrappers[name]:
		for i := 1; i < len(ws); i++ {
			if startsCommand(ws[i:]) {
				c.command(doc, line, ws[i:])
				return
			}
		}
	case strings.HasSuffix(name, ".test"):
		c.testBinary(doc, line, ws[1:])
	}
}

// goValueFlags are the go command's flags (build and test) that take a
// value; -test. forms are accepted too.
var goValueFlags = map[string]bool{
	"run": true, "bench": true, "skip": true, "list": true, "benchtime": true, "count": true, "cpu": true,
	"timeout": true, "parallel": true, "p": true, "exec": true, "fuzz": true, "fuzztime": true,
	"fuzzminimizetime": true, "coverprofile": true, "covermode": true, "coverpkg": true, "memprofile": true,
	"memprofilerate": true, "cpuprofile": true, "blockprofile": true, "blockprofilerate": true,
	"mutexprofile": true, "mutexprofilefraction": true, "trace": true, "outputdir": true, "shuffle": true,
	"o": true, "tags": true, "ldflags": true, "gcflags": true, "asmflags": true, "vet": true, "mod": true,
	"modfile": true, "overlay": true, "pgo": true, "buildmode": true, "compiler": true, "installsuffix": true,
	"pkgdir": true, "toolexec": true, "C": true,
}

// regexpFlags take a regular expression.
var regexpFlags = map[string]bool{"run": true, "bench": true, "skip": true, "list": true}

// goCommand checks go sub args.
func (c *checker) goCommand(doc string, line int, sub string, args []word) {
	switch sub {
	case "test", "build", "vet", "list", "install", "run":
	default:
		return // go doc, go mod, go work, ...: nothing to check
	}
	c.seen["go "+sub+" command"]++
	for i := 0; i < len(args); i++ {
		a := args[i]
		if sub == "test" && a.text == "-args" {
			return
		}
		if name, value, hasValue, ok := flagWord(a.text); ok {
			name = strings.TrimPrefix(name, "test.")
			if !hasValue && goValueFlags[name] && i+1 < len(args) {
				i++
				value, hasValue = args[i].text, true
			}
			if hasValue && regexpFlags[name] && sub == "test" {
				c.testRegexp(doc, line, "go test -"+name, value)
			}
			continue
		}
		c.pkg(doc, line, "go "+sub, a)
		if sub == "run" {
			if t := c.runsTool(a.text); t != "" {
				c.toolArgs(doc, line, t, args[i+1:])
			}
			return // the rest are the program's arguments
		}
	}
}

// runsTool returns the tool a go run target builds, "" for none.
func (c *checker) runsTool(target string) string {
	p := path.Clean(target)
	for _, t := range tools {
		if p == "cmd/"+t {
			return t
		}
	}
	return ""
}

// flagWord splits a command line word that is a flag: -name, --name,
// -name=value.
func flagWord(s string) (name, value string, hasValue, ok bool) {
	if len(s) < 2 || s[0] != '-' || s == "--" {
		return "", "", false, false
	}
	name = strings.TrimPrefix(strings.TrimPrefix(s, "-"), "-")
	name, value, hasValue = strings.Cut(name, "=")
	return name, value, hasValue, name != ""
}

// pkg checks that a package argument of a go command that names a
// directory of this repository names one that exists and holds Go files.
func (c *checker) pkg(doc string, line int, what string, a word) {
	p := a.text
	if a.expanded || !(p == "." || strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../")) {
		return // an import path, or a word the shell builds
	}
	if strings.HasSuffix(p, ".go") {
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(p))); err != nil {
			c.report(doc, line, "%s %s: no such file", what, p)
		}
		return
	}
	dir, pattern := strings.CutSuffix(p, "/...")
	if dir == "..." {
		dir, pattern = ".", true
	}
	full := filepath.Join(c.root, filepath.FromSlash(dir))
	if pattern {
		if st, err := os.Stat(full); err != nil || !st.IsDir() {
			c.report(doc, line, "%s %s: no directory %s", what, p, dir)
		}
		return
	}
	goFiles, _ := filepath.Glob(filepath.Join(full, "*.go"))
	if len(goFiles) == 0 {
		c.report(doc, line, "%s %s: no Go package in %s", what, p, path.Clean(dir))
	}
}

// testRegexp checks a -run, -bench, -skip or -list pattern as go test
// reads it: split at slashes outside brackets and parentheses, each part
// a regular expression.
func (c *checker) testRegexp(doc string, line int, what, pattern string) {
	if _, err := regexp.Compile(pattern); err != nil {
		c.report(doc, line, "%s %q: %v", what, pattern, err)
		return
	}
	for _, part := range splitTestRegexp(pattern) {
		if _, err := regexp.Compile(part); err != nil {
			c.report(doc, line, "%s %q: the part %q: %v", what, pattern, part, err)
		}
	}
}

// splitTestRegexp splits a test pattern as package testing does.
func splitTestRegexp(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[', '(':
			depth++
		case ']', ')':
			if depth > 0 {
				depth--
			}
		case '\\':
			i++
		case '/':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// testBinary checks the patterns given to a compiled test binary.
func (c *checker) testBinary(doc string, line int, args []word) {
	for i := 0; i < len(args); i++ {
		name, value, hasValue, ok := flagWord(args[i].text)
		if !ok || !strings.HasPrefix(name, "test.") {
			continue
		}
		name = strings.TrimPrefix(name, "test.")
		if !hasValue && goValueFlags[name] && i+1 < len(args) {
			i++
			value, hasValue = args[i].text, true
		}
		if hasValue && regexpFlags[name] {
			c.testRegexp(doc, line, "-test."+name, value)
		}
	}
}

// toolArgs checks the flags of a contproxy or contbench command line as
// package flag parses them: up to the first argument that is not a flag,
// "replay" first switching contbench to its subcommand's flags.
func (c *checker) toolArgs(doc string, line int, tool string, args []word) {
	set := tool
	defer func() { c.seen[set+" command"]++ }()
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a.expanded {
			return
		}
		if i == 0 && set == "contbench" && a.text == "replay" {
			set = "contbench replay"
			args = args[1:]
			i = -1
			continue
		}
		name, _, hasValue, ok := flagWord(a.text)
		if !ok {
			return // the first argument that is not a flag ends them
		}
		if name == "h" || name == "help" {
			return
		}
		f, known := c.flags[set][name]
		if !known {
			c.report(doc, line, "%s: no flag -%s (%s -h lists the flags)%s", set, name, set, nearestFlag(name, c.flags[set]))
			return
		}
		if f.takesValue && !hasValue {
			if i+1 >= len(args) {
				c.report(doc, line, "%s: -%s wants a value", set, name)
				return
			}
			i++
		}
	}
}

// nearestFlag suggests a flag whose name contains name or is contained in
// it.
func nearestFlag(name string, flags map[string]flagInfo) string {
	var near []string
	for f := range flags {
		if strings.Contains(f, name) || strings.Contains(name, f) && len(f) > 2 {
			near = append(near, "-"+f)
		}
	}
	if len(near) == 0 {
		return ""
	}
	sort.Strings(near)
	return "; did you mean " + strings.Join(near, " or ") + "?"
}

// toolFlags builds the tools into a temporary directory and reads their
// flags from their -h output.
func toolFlags(t *testing.T, root string) map[string]map[string]flagInfo {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build %v: %v", tools, err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if raceBuild {
		args = append(args, "-race")
	}
	for _, tool := range tools {
		args = append(args, "./cmd/"+tool)
	}
	build := exec.CommandContext(ctx, goCmd, args...)
	build.Dir = root
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %v in %v", tools, time.Since(start).Round(time.Millisecond))
	flags := map[string]map[string]flagInfo{}
	for _, name := range []string{"contproxy", "contbench", "contbench replay"} {
		bin, sub, _ := strings.Cut(name, " ")
		var cmdArgs []string
		if sub != "" {
			cmdArgs = append(cmdArgs, sub)
		}
		cmd := exec.CommandContext(ctx, filepath.Join(dir, bin), append(cmdArgs, "-h")...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s -h: %v\n%s", name, err, out.String())
		}
		flags[name] = parseHelp(out.String())
		if len(flags[name]) == 0 {
			t.Fatalf("%s -h lists no flags:\n%s", name, out.String())
		}
	}
	return flags
}

var (
	helpFlag    = regexp.MustCompile(`^  -([^\s=]+)( [^\s]+)?(?:\t|$)`)
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
)

// parseHelp reads the flags package flag's PrintDefaults lists: a line
// "  -name" (a boolean) or "  -name type", then the usage, whose last line
// may end with "(default value)".
func parseHelp(help string) map[string]flagInfo {
	flags := map[string]flagInfo{}
	var name string
	for _, l := range strings.Split(help, "\n") {
		if m := helpFlag.FindStringSubmatch(l); m != nil {
			name = m[1]
			flags[name] = flagInfo{takesValue: m[2] != ""}
		}
		if name == "" {
			continue
		}
		if m := helpDefault.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			f := flags[name]
			f.def = m[1]
			flags[name] = f
		}
	}
	return flags
}

// makeTargets returns the targets a Makefile's rules name.
func makeTargets(mk string) map[string]bool {
	targets := map[string]bool{}
	rule := regexp.MustCompile(`(?m)^([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*::?(?:[^=]|$)`)
	for _, m := range rule.FindAllStringSubmatch(mk, -1) {
		for _, n := range strings.Fields(m[1]) {
			targets[n] = true
		}
	}
	return targets
}
