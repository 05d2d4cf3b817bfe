//go:build race

package docscheck

// The binaries are built with -race when the test is, so that they reuse
// the packages go test -race already compiled.
func init() { raceBuild = true }
