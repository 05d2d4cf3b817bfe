package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCodeNames checks that the code spans and text diagrams of README.md
// and docs/*.md name Go identifiers, test functions and files that exist.
func TestCodeNames(t *testing.T) {
	root := repoRoot(t)
	c := newChecker(t, root)
	c.idents, c.tests = declared(t, root)
	for _, doc := range docs(t, root, ownDocs) {
		md := c.read(t, doc)
		for _, s := range md.spans {
			c.names(doc, s.line, s.text)
		}
		for _, b := range md.blocks {
			if b.lang != "text" {
				continue
			}
			for i, l := range strings.Split(b.code, "\n") {
				c.names(doc, b.line+i, l)
			}
		}
	}
	c.expect(t, "Go identifier", "test function", "file path")
	c.fail(t)
}

var (
	// identRef is pkg.Name or pkg.Type.Member, not inside a path or a
	// longer dotted name.
	identRef = regexp.MustCompile(`(?:^|[^\w./$-])([a-z][a-z0-9]*)\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?`)
	testRef  = regexp.MustCompile(`\b((?:Test|Benchmark|Fuzz)[A-Z0-9_]\w*)`)
	// pathRef is a slash-separated path.
	pathRef = regexp.MustCompile(`(?:^|[^\w./*$-])([\w.*-]+(?:/[\w.*-]*)+)`)
	// fileExts are the name parts that make pkg.name a file name.
	fileExts = map[string]bool{"go": true, "md": true, "lua": true, "json": true, "jsonl": true, "sh": true,
		"yml": true, "yaml": true, "toml": true, "mod": true, "sum": true, "txt": true, "test": true}
)

// names checks the code names in text.
func (c *checker) names(doc string, line int, text string) {
	for _, m := range identRef.FindAllStringSubmatch(text, -1) {
		pkg, name, member := m[1], m[2], m[3]
		decl, ok := c.idents[pkg]
		if !ok || fileExts[name] {
			continue // not a package of this module, or a file name
		}
		c.seen["Go identifier"]++
		switch {
		case !decl[name]:
			c.report(doc, line, "%s.%s: package %s declares no %s", pkg, name, pkg, name)
		case member != "" && !decl[name+"."+member] && !fileExts[member]:
			c.report(doc, line, "%s.%s.%s: %s.%s has no method or field %s", pkg, name, member, pkg, name, member)
		}
	}
	for _, m := range testRef.FindAllStringSubmatch(text, -1) {
		c.seen["test function"]++
		if !c.tests[m[1]] {
			c.report(doc, line, "%s: no test function of that name", m[1])
		}
	}
	for _, m := range pathRef.FindAllStringSubmatch(text, -1) {
		p := strings.TrimPrefix(m[1], "./")
		first, _, _ := strings.Cut(p, "/")
		if strings.Contains(p, "...") || !c.topLevel[first] || first == "." || first == ".." {
			continue
		}
		c.seen["file path"]++
		full := filepath.Join(c.root, filepath.FromSlash(p))
		if strings.Contains(p, "*") {
			if found, _ := filepath.Glob(full); len(found) == 0 {
				c.report(doc, line, "%s: no file matches", p)
			}
		} else if _, err := os.Stat(full); err != nil {
			c.report(doc, line, "%s does not exist", p)
		}
	}
}

// declared parses the module's Go files and returns, by package name, the
// names their non-test files declare (top-level names, and Type.Member for
// methods, fields and interface methods), and the names of the test,
// benchmark and fuzz functions of the test files.
func declared(t *testing.T, root string) (map[string]map[string]bool, map[string]bool) {
	t.Helper()
	idents := map[string]map[string]bool{}
	tests := map[string]bool{}
	testFunc := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "node_modules" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, "_test.go") {
			for _, m := range testFunc.FindAllSubmatch(src, -1) {
				tests[string(m[1])] = true
			}
			return nil
		}
		f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
		if err != nil || f.Name.Name == "main" {
			return nil // a file being edited, or a command: nothing a document names by package
		}
		decl := idents[f.Name.Name]
		if decl == nil {
			decl = map[string]bool{}
			idents[f.Name.Name] = decl
		}
		addDecls(decl, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return idents, tests
}

// addDecls adds the names f declares to decl.
func addDecls(decl map[string]bool, f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				decl[d.Name.Name] = true
				continue
			}
			if recv := receiverType(d.Recv.List[0].Type); recv != "" {
				decl[recv+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					decl[s.Name.Name] = true
					addMembers(decl, s.Name.Name, s.Type)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						decl[n.Name] = true
					}
				}
			}
		}
	}
}

// receiverType returns the name of a method's receiver type.
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// addMembers adds typ's fields or interface methods as name.Member.
func addMembers(decl map[string]bool, name string, typ ast.Expr) {
	var fields *ast.FieldList
	switch t := typ.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			decl[name+"."+n.Name] = true
		}
		if len(f.Names) == 0 { // embedded: its name is the type's
			if n := receiverType(f.Type); n != "" {
				decl[name+"."+n] = true
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				decl[name+"."+sel.Sel.Name] = true
			} else if st, ok := f.Type.(*ast.StarExpr); ok {
				if sel, ok := st.X.(*ast.SelectorExpr); ok {
					decl[name+"."+sel.Sel.Name] = true
				}
			}
		}
	}
}

// The tools' flags, built once for the tests that need them.
var (
	flagsMu sync.Mutex
	flagsOf map[string]map[string]flagInfo
)

func cachedToolFlags(t *testing.T, root string) map[string]map[string]flagInfo {
	t.Helper()
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if flagsOf == nil {
		flagsOf = toolFlags(t, root)
	}
	return flagsOf
}

// loneFlag is a code span holding one flag, and maybe its value.
var loneFlag = regexp.MustCompile(`^-{1,2}([A-Za-z][\w.-]*)(?:=\S*)?(?: \S+)?$`)

// goFlags are the go command's own flags a document may name alone.
var goFlags = map[string]bool{"race": true, "short": true, "v": true, "benchmem": true, "failfast": true,
	"json": true, "cover": true, "x": true, "n": true, "a": true, "trimpath": true, "args": true}

// loneFlags checks that each code span of doc that holds one flag names a
// flag of contproxy, contbench or the go command.
func (c *checker) loneFlags(doc string, md markdown) {
	for _, s := range md.spans {
		m := loneFlag.FindStringSubmatch(s.text)
		if m == nil {
			continue
		}
		name := m[1]
		if name == "h" || goFlags[name] || goValueFlags[strings.TrimPrefix(name, "test.")] {
			continue
		}
		known := false
		for _, set := range c.flags {
			if _, ok := set[name]; ok {
				known = true
			}
		}
		if !known {
			c.report(doc, s.line, "`%s`: neither contproxy, contbench nor contbench replay has a flag -%s", s.text, name)
		}
	}
}

// flagRow is a row of a flag table: the flag, then its default.
var flagRow = regexp.MustCompile("(?m)^\\|\\s*`-([\\w-]+)`\\s*\\|\\s*([^|]*?)\\s*\\|")

// TestFlagTables checks that docs/operating.md's tables list every
// contproxy flag, each with the default contproxy -h gives.
func TestFlagTables(t *testing.T) {
	root := repoRoot(t)
	c := newChecker(t, root)
	const doc = "docs/operating.md"
	src, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	flags := cachedToolFlags(t, root)["contproxy"]
	lineAt := lineCounter(string(src))
	rows := map[string]bool{}
	for _, m := range flagRow.FindAllStringSubmatchIndex(string(src), -1) {
		name, cell := string(src[m[2]:m[3]]), string(src[m[4]:m[5]])
		line := lineAt(m[0])
		rows[name] = true
		f, ok := flags[name]
		switch {
		case !ok:
			c.report(doc, line, "-%s: contproxy has no such flag", name)
		case f.def != "" && !sameDefault(f.def, cell):
			c.report(doc, line, "-%s: the table says %q, contproxy -h says (default %s)", name, cell, f.def)
		}
	}
	for name := range flags {
		if !rows[name] {
			c.report(doc, 1, "-%s: contproxy has the flag, no table row gives its default", name)
		}
	}
	c.fail(t)
}

// sameDefault reports whether a table cell gives the default that -h
// prints: the same string, duration, number (64 MiB is 67108864) or
// boolean.
func sameDefault(help, cell string) bool {
	cell = strings.TrimSpace(strings.ReplaceAll(cell, "`", ""))
	if s, err := strconv.Unquote(help); err == nil {
		return cell == s
	}
	if d, err := time.ParseDuration(help); err == nil {
		cd, err := time.ParseDuration(cell)
		return err == nil && cd == d
	}
	if n, err := strconv.ParseInt(help, 10, 64); err == nil {
		cn, ok := parseSize(cell)
		return ok && cn == n
	}
	return cell == help
}

// parseSize reads 4096, 4,096, 64 KiB, 64 MiB or 1 GiB.
func parseSize(s string) (int64, bool) {
	num, unit, _ := strings.Cut(s, " ")
	n, err := strconv.ParseInt(strings.ReplaceAll(num, ",", ""), 10, 64)
	if err != nil {
		return 0, false
	}
	switch unit {
	case "":
		return n, true
	case "KiB":
		return n << 10, true
	case "MiB":
		return n << 20, true
	case "GiB":
		return n << 30, true
	}
	return 0, false
}
