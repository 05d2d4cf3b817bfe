package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The checks themselves: each kind of mistake is found, with its line, and
// what is right passes.
func TestCheckerFindsMistakes(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Makefile", "test: vet ## run\n\tgo test ./...\nvet:\n\tgo vet\nX := 1\n")
	write("scripts/env.sh", "#!/bin/sh\n")
	write("cmd/contproxy/main.go", "package main\n\nfunc main() {}\n")
	write("docs/x.md", "# X\n")
	write("pkg/a.go", "package pkg\n\ntype T struct{ F int }\n\nfunc (T) M() {}\n\nfunc New() {}\n")
	write("pkg/a_test.go", "package pkg\n\nfunc TestThing(t *testing.T) {}\n")
	write("docs/b.md", "# B\n\n## Same\n\n## Same\n\n## `Code` and [link](x.md): too\n")
	write("README.md", strings.Join([]string{
		"# Top",                                  // 1
		"[ok](docs/b.md) [ok](docs/b.md#same-1)", // 2
		"[ok](#top) [ok](docs/b.md#code-and-link-too) [ok](https://example.com/x)",         // 3
		"[gone](docs/c.md) and [bad anchor](docs/b.md#nope)",                               // 4
		"`[not a link](nowhere.md)` `pkg.New` `pkg.T.M` `pkg.T.F` `pkg.Gone` `pkg.T.Gone`", // 5
		"`TestThing` `TestGone` `pkg/a.go` `pkg/gone.go` `-listen` `-nope`",                // 6
		"```sh", // 7
		"contproxy -listen :1 -nope                   # comment -bad",         // 8
		"go run ./cmd/contproxy -listen :1 \\",                                // 9
		"    -verbose",                                                        // 10
		"go test -run '(' ./pkg/ ./gone/ && make test vet lint",               // 11
		"scripts/env.sh bash -c 'contbench replay -json x.json -bad t.jsonl'", // 12
		"scripts/gone.sh",                                                     // 13
		"X=1 contbench -seed \"$S\" -turns=5 -bad2",                           // 14
		"```",                    // 15
		"```text",                // 16
		"pkg.New -> pkg.Missing", // 17
		"```",                    // 18
	}, "\n")+"\n")
	c := newChecker(t, root)
	c.flags = map[string]map[string]flagInfo{
		"contproxy":        {"listen": {takesValue: true}},
		"contbench":        {"seed": {takesValue: true}, "turns": {takesValue: true}},
		"contbench replay": {"json": {takesValue: true}},
	}
	c.idents, c.tests = declared(t, root)
	for _, doc := range []string{"README.md", "docs/b.md"} {
		md := c.read(t, doc)
		c.anchors[doc] = md.anchors
		for _, l := range md.links {
			c.link(doc, l)
		}
		for _, s := range md.spans {
			c.names(doc, s.line, s.text)
		}
		c.loneFlags(doc, md)
		for _, b := range md.blocks {
			switch b.lang {
			case "sh":
				for _, cmd := range lexShell(b.code) {
					c.command(doc, b.line+cmd[0].line, cmd)
				}
			case "text":
				for i, l := range strings.Split(b.code, "\n") {
					c.names(doc, b.line+i, l)
				}
			}
		}
	}
	want := []string{
		"README.md:4: link docs/c.md: docs/c.md does not exist",
		"README.md:4: link docs/b.md#nope: docs/b.md has no heading with the anchor #nope",
		"README.md:5: pkg.Gone: package pkg declares no Gone",
		"README.md:5: pkg.T.Gone: pkg.T has no method or field Gone",
		"README.md:6: TestGone: no test function of that name",
		"README.md:6: pkg/gone.go does not exist",
		"README.md:6: `-nope`: neither contproxy, contbench nor contbench replay has a flag -nope",
		"README.md:8: contproxy: no flag -nope (contproxy -h lists the flags)",
		"README.md:9: contproxy: no flag -verbose (contproxy -h lists the flags)",
		`README.md:11: go test -run "(": error parsing regexp: missing closing ): ` + "`(`",
		"README.md:11: go test ./gone/: no Go package in gone",
		`README.md:11: make lint: the Makefile has no target "lint"`,
		"README.md:12: contbench replay: no flag -bad (contbench replay -h lists the flags)",
		"README.md:13: scripts/gone.sh does not exist",
		"README.md:14: contbench: no flag -bad2 (contbench -h lists the flags)",
		"README.md:17: pkg.Missing: package pkg declares no Missing",
	}
	var got []string
	for _, p := range c.problems {
		got = append(got, p.String())
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			if strings.HasPrefix(g, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("missing problem %q", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d:\n\t%s", len(got), len(want), strings.Join(got, "\n\t"))
	}
}

func TestParseHelp(t *testing.T) {
	help := "Usage: x\n\nFlags:\n" +
		"  -b\tone-letter boolean\n" +
		"  -fake\n    \ta boolean\n" +
		"  -listen address\n    \twhere (default \"127.0.0.1:8080\")\n" +
		"  -max int\n    \tmost;\n    \tsecond line (default 4096)\n"
	got := parseHelp(help)
	want := map[string]flagInfo{
		"b": {}, "fake": {},
		"listen": {takesValue: true, def: `"127.0.0.1:8080"`},
		"max":    {takesValue: true, def: "4096"},
	}
	if len(got) != len(want) {
		t.Fatalf("parseHelp = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("flag %s = %+v, want %+v", k, got[k], v)
		}
	}
}

func TestSameDefault(t *testing.T) {
	for _, tc := range []struct {
		help, cell string
		same       bool
	}{
		{"2m0s", "2m", true},
		{"200ms", "200ms", true},
		{"1m0s", "2m", false},
		{"67108864", "64 MiB", true},
		{"268435456", "256 MiB", true},
		{"4096", "4096", true},
		{"1024", "1,024", true},
		{"16", "17", false},
		{`"127.0.0.1:9090"`, "`127.0.0.1:9090`", true},
		{`"info"`, "`debug`", false},
	} {
		if got := sameDefault(tc.help, tc.cell); got != tc.same {
			t.Errorf("sameDefault(%q, %q) = %v, want %v", tc.help, tc.cell, got, tc.same)
		}
	}
}

func TestSlugify(t *testing.T) {
	for in, want := range map[string]string{
		"2.4 Owners a gateway derives":              "24-owners-a-gateway-derives",
		"Run the gateway: contproxy":                "run-the-gateway-contproxy",
		"Flags, limits and timeouts":                "flags-limits-and-timeouts",
		"Client settings (go-redis)":                "client-settings-go-redis",
		"Real clients through contproxy (make e2e)": "real-clients-through-contproxy-make-e2e",
		"`Code` and [link](x.md)":                   "code-and-link",
	} {
		if got := slugify(in); got != want {
			t.Errorf("slugify(%q) = %q, want %q", in, got, want)
		}
	}
}
