// Package docscheck holds the test that keeps the repository's documents
// working: README.md, docs/*.md, PROTOCOL.md, BENCHMARKS.md and
// RELIABILITY.md. It has no code of its own; go test ./internal/docscheck
// runs the check, and make test runs it with every other test.
//
// The test fails, naming the file and line, when
//
//   - a relative link, or its #anchor, names a file or heading that does
//     not exist (anchors are GitHub's heading slugs);
//   - a command in a fenced sh block, or in an inline code span, passes
//     contproxy, contbench or contbench replay a flag that the binary's
//     own -h output does not list; names a package directory that does not
//     exist (go test, go build, go run); gives -run, -bench, -skip or
//     -list a regular expression that does not compile; or names a
//     scripts/ file or a make target that does not exist;
//   - in README.md and docs/*.md, a code span or a text diagram names a Go
//     identifier (pkg.Name, pkg.Type.Member), a test function or a file of
//     this repository that does not exist, or a lone flag that no binary
//     takes;
//   - docs/operating.md's flag tables miss a contproxy flag, or give a
//     default other than the one contproxy -h prints;
//   - a Go comment names a file of docs/, or a heading in it
//     (docs/operating.md ("rueidis")), that does not exist.
//
// The flags come from contproxy and contbench built into a temporary
// directory (with -race when the test runs with it, so that make test
// reuses what it compiled). Each check also fails when it finds nothing
// to check, so that a broken parser cannot pass.
package docscheck
